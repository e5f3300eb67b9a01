"""Atomic file writes and checked, pickle-free loading of weights.

Every file circuitfade writes goes through :func:`atomic_write`: the bytes go to
a temporary file in the same directory, are flushed and fsynced, and only then
renamed over the final name, so a crash never leaves a half-written file under
the name a reader looks for (a crash can leave a ``.NAME.*.tmp`` file beside it;
the trainer removes those when it next takes the run's lock). Files get the
permissions any new file gets (``0o666`` minus the umask, so ``0644`` under the
usual umask ``022``). :func:`check_outputs` checks, before any work is done, that
output files can be written and that none would be replaced without ``force``. Weights are read with safetensors, or with
``torch.load(weights_only=True)`` for ``.pt``/``.pth`` files, so loading never
runs code from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

__all__ = [
    "CheckpointError",
    "OutputError",
    "atomic_write",
    "check_outputs",
    "default_output_dir",
    "peek_shapes",
    "check_header",
    "write_json",
    "write_text",
    "write_csv",
    "read_json",
    "save_tensors",
    "load_tensors",
    "check_state_dict",
]


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, foreign, or does not fit the model."""


class OutputError(ValueError):
    """An output file cannot be written, or exists and would be replaced without ``force``."""


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask can only be read by setting it)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), mode ``0o666 & ~umask``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_outputs(paths, *, force: bool = False) -> list[Path]:
    """Check, before computing anything, that every file in ``paths`` can be written.

    Creates the parent folders, refuses a path that is a folder or whose parent is
    a file, probes each folder with a temp file (so a read-only or full disk is
    found now, not after the work), and refuses files that already exist unless
    ``force`` (then they are replaced). Raises :class:`OutputError` naming the
    first problem (with ``--force`` advice for existing files).
    """
    paths = [Path(p) for p in paths]
    for p in paths:
        if p.is_dir():
            raise OutputError(f"{p}: is a directory; expected an output file name")
        if p.exists() and not force:
            raise OutputError(f"{p} exists; pass --force (force=True) to replace it, or choose another --out")
    for folder in dict.fromkeys(p.parent for p in paths):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe.", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
        except (FileExistsError, NotADirectoryError):
            raise OutputError(f"{folder}: cannot be used as an output folder (a file is in the way)") from None
        except OSError as e:
            raise OutputError(f"{folder}: cannot write output files here ({e.strerror or e})") from None
    return paths


def default_output_dir(source: str | os.PathLike, kind: str) -> Path:
    """Where a command writes by default: ``reports/<source name>-<kind>/`` in the current folder,
    never inside the source itself (a run directory or a shipped folder stays as it is)."""
    return Path("reports") / f"{Path(source).resolve().name}-{kind}"


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, text.encode())


def write_csv(path: str | os.PathLike, df) -> Path:
    """Write a DataFrame ``df`` as CSV (no index) to ``path`` atomically."""
    return atomic_write(path, df.to_csv(index=False).encode())


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def content_hash(payload: Any) -> str:
    """sha256 (hex) of ``payload`` as canonical JSON (sorted keys): the same data, the same hash."""
    import hashlib

    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata=None) -> Path:
    """Save a flat ``name -> tensor`` dict as safetensors, atomically."""
    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    return atomic_write(path, save(flat, metadata=metadata))


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load weights without unpickling code: safetensors, or ``torch.load(weights_only=True)``.

    Raises :class:`CheckpointError` naming the file when it is missing,
    truncated, or not a weights file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            return load_file(str(path))
        if suffix in (".pt", ".pth", ".bin"):
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        else:
            raise CheckpointError(
                f"{path}: unknown checkpoint format {suffix!r}; expected .safetensors, .pt or .pth"
            )
    except CheckpointError:
        raise
    except (SafetensorError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or foreign file?): {e}") from None
    except Exception as e:  # torch.load's weights_only unpickler raises UnpicklingError
        raise CheckpointError(f"{path}: refused to load (not a plain weights file): {e}") from None
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to tensors")
    return dict(obj)


def peek_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a weights file, reading headers only (no tensor data
    for safetensors and zip-format ``.pt``); :class:`CheckpointError` naming the file if unreadable."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    if path.suffix.lower() == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # SafetensorError, OSError
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or foreign?): {e}") from None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise CheckpointError(f"{path}: not a readable checkpoint (truncated or foreign file?): {e}") from None
        obj = load_tensors(path)  # legacy (non-zip) torch.save format: read it in full
    except Exception as e:  # UnpicklingError for pickled code, EOFError, OSError, ...
        raise CheckpointError(f"{path}: refused to load (not a plain weights file): {e}") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to tensors")
    return {k: tuple(v.shape) for k, v in obj.items()}


class _Shape:  # check_state_dict only reads ``.shape``
    def __init__(self, shape):
        self.shape = torch.Size(shape)


def check_header(path: str | os.PathLike, expected: Mapping[str, Any]) -> None:
    """Raise :class:`CheckpointError` naming ``path`` unless its tensor names/shapes (headers only)
    fit ``expected`` (a state dict, or ``name -> shape``)."""
    want = {k: _Shape(getattr(v, "shape", v)) for k, v in expected.items()}
    check_state_dict({k: _Shape(s) for k, s in peek_shapes(path).items()}, want, str(path))


def check_state_dict(
    loaded: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    source: str,
    ignore: tuple[str, ...] = (),
) -> None:
    """Raise :class:`CheckpointError` naming ``source`` if keys or shapes differ."""

    def keep(k: str) -> bool:
        return not any(k.endswith(s) for s in ignore)

    missing = sorted(k for k in expected if k not in loaded and keep(k))
    unexpected = sorted(k for k in loaded if k not in expected and keep(k))
    shapes = [
        f"{k}: file {tuple(loaded[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in expected
        if k in loaded and keep(k) and loaded[k].shape != expected[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensors (e.g. {missing[:4]})")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensors (e.g. {unexpected[:4]})")
    if shapes:
        problems.append("shape mismatch: " + "; ".join(shapes[:4]))
    if problems:
        raise CheckpointError(f"{source}: weights do not fit the config: " + ", ".join(problems))


# ------------------------------------------------------------------ typed text values
_NONE = ("none", "null")
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def parse_typed(what: str, text: str, tp):
    """User text (a CLI flag, a ``KEY=VALUE``) as a typed value; ``ValueError`` naming ``what``.

    ``text`` as a value of type ``tp`` (int, float, bool, str, X | None, tuple[...], list[...])."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in _NONE and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return parse_typed(what, text, a)
            except ValueError:
                continue
        raise ValueError(f"{what}: cannot read {text!r} as {tp}")
    if tp is bool:
        if text.lower() not in _BOOLS:
            raise ValueError(f"{what}: expected true or false, got {text!r}")
        return _BOOLS[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ValueError(f"{what}: expected {'an integer' if tp is int else 'a number'}, got {text!r}") from None
    if tp is str:
        return text
    if origin in (tuple, list) or tp in (tuple, list):
        try:
            items = json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t]
        except json.JSONDecodeError as e:
            raise ValueError(f"{what}: not a JSON list ({e.msg})") from None
        elem = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis or len(set(args)) == 1) else None
        if elem is not None:
            items = [parse_typed(what, str(x), elem) if isinstance(x, str) else x for x in items]
        return (tuple if (origin or tp) is tuple else list)(items)
    try:  # anything else (Any, dicts, unannotated): JSON, else the string
        return json.loads(text)
    except json.JSONDecodeError:
        return text
