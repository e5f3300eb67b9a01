"""Atomic file writes and checked, pickle-free loading of weights.

Every file circuitfade writes goes through :func:`atomic_write`: the bytes go to
a temporary file in the same directory, are flushed and fsynced, and only then
renamed over the final name, so a crash never leaves a half-written file under
the name a reader looks for (a crash can leave a ``.NAME.XXXXXXXX.cftmp`` file beside it,
``XXXXXXXX`` eight hex digits: :func:`is_temp_file` recognises exactly these, and the trainer
removes them, and only them, when it next takes the run's lock). Files get the
permissions any new file gets (``0o666`` minus the umask, so ``0644`` under the
usual umask ``022``). :func:`check_outputs` checks, before any work is done, that
output files can be written and that none would be replaced without ``force``. Weights are read with safetensors, or with
``torch.load(weights_only=True)`` for ``.pt``/``.pth`` files, so loading never
runs code from the file. Every safetensors file written by :func:`save_tensors` records a
checksum of its tensors and metadata (:func:`checksum_of`), checked by :func:`verify_checksum`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
import types
import typing
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

__all__ = [
    "CheckpointError",
    "OutputError",
    "atomic_write",
    "is_temp_file",
    "TEMP_SUFFIX",
    "CHECKSUM_KEY",
    "checksum_of",
    "verify_checksum",
    "check_outputs",
    "default_output_dir",
    "peek_shapes",
    "read_header",
    "WeightsHeader",
    "check_file",
    "check_header",
    "dtype_fits",
    "MODEL_STATE_KEYS",
    "STEP_KEYS",
    "MAX_STEP",
    "write_json",
    "write_text",
    "write_csv",
    "read_json",
    "freeze_payload",
    "load_frozen",
    "save_tensors",
    "load_tensors",
    "check_state_dict",
    "check_finite",
    "CONFIG_ENTRY_KEYS",
    "SHAPE_FIELDS",
]


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, foreign, or does not fit the model."""


class OutputError(ValueError):
    """An output file cannot be written, or exists and would be replaced without ``force``."""


TEMP_SUFFIX = ".cftmp"
"""Suffix of :func:`atomic_write`'s temp files: ``.NAME.XXXXXXXX.cftmp`` (``XXXXXXXX``: 8 hex digits)."""

_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))


def is_temp_file(name: str) -> bool:
    """Whether the file name ``name`` is one of :func:`atomic_write`'s temp files
    (``.NAME.XXXXXXXX.cftmp``): the only files scratch cleanup may delete."""
    return _TEMP_NAME.fullmatch(name) is not None


def _new_temp(folder: Path, name: str) -> tuple[int, Path]:
    """Create ``folder/.name.XXXXXXXX.cftmp`` exclusively, mode ``0o666 & ~umask``: ``(fd, path)``."""
    while True:
        tmp = folder / f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # pragma: no cover - a 1 in 4e9 collision
            continue


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), mode ``0o666 & ~umask``.

    The temp file is ``.NAME.XXXXXXXX.cftmp`` beside ``path`` (see :func:`is_temp_file`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp(path.parent, path.name)
    try:
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
            fd, probe = _new_temp(folder, "write-probe")
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
    """The parsed JSON file ``path``; :class:`CheckpointError` naming it when it is missing,
    unreadable, empty or not JSON."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied (the file is not readable)") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read as text ({e})") from None
    if not text.strip():
        raise CheckpointError(f"{path}: empty file, expected JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def content_hash(payload: Any) -> str:
    """sha256 (hex) of ``payload`` as canonical JSON (sorted keys): the same data, the same hash."""
    import hashlib

    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def freeze_payload(path: str | os.PathLike, payload: Any, *, what: str = "frozen constants") -> dict:
    """Write ``{"payload": payload, "sha256": content_hash(payload)}`` to ``path`` (JSON,
    atomically) and return it: constants fitted once and frozen before they are used, so a
    later reader can tell they were not refitted or edited (:func:`load_frozen`).

    Writing the same payload again is a no-op; a file holding a *different* payload is never
    replaced (``ValueError`` naming ``what``, e.g. ``"frozen constants"``: delete it to refit).
    """
    doc = {"payload": payload, "sha256": content_hash(payload)}
    path = Path(path)
    if path.is_file() and read_json(path).get("sha256") != doc["sha256"]:
        raise ValueError(f"{path} holds different {what}; delete it (or choose another --out) to refit")
    write_json(path, doc)
    return doc


def load_frozen(path: str | os.PathLike, *, what: str = "frozen constants") -> Any:
    """The payload :func:`freeze_payload` wrote to ``path``, after checking its content hash
    (``ValueError`` naming ``what`` when the payload was edited; :class:`CheckpointError` when
    the file is missing or not JSON)."""
    doc = read_json(Path(path))
    if not isinstance(doc, dict) or "payload" not in doc:
        raise ValueError(f"{path}: not a file of {what} (no payload)")
    if content_hash(doc["payload"]) != doc.get("sha256"):
        raise ValueError(f"{path}: content hash mismatch (the {what} were edited)")
    return doc["payload"]


CHECKSUM_KEY = "checksum"
"""Safetensors metadata key of :func:`checksum_of`'s value, written by :func:`save_tensors`."""


def checksum_of(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> str:
    """``"sha256:<hex>"`` over every tensor and every metadata entry but the checksum itself.

    For each name in sorted order: ``[name, dtype, shape]`` as JSON, then the tensor's raw
    bytes (C order, native little-endian); then the metadata (without :data:`CHECKSUM_KEY`)
    as sorted-key JSON. So a changed byte of tensor data, a renamed, added or removed
    tensor, a changed dtype or shape, or an edited metadata value changes the checksum.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)]).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    meta = {k: v for k, v in (metadata or {}).items() if k != CHECKSUM_KEY}
    h.update(json.dumps(meta, sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


def verify_checksum(path: str | os.PathLike, *, tensors: Mapping[str, torch.Tensor] | None = None,
                    metadata: Mapping[str, str] | None = None) -> bool:
    """Check a safetensors file against the checksum it records (:func:`checksum_of`).

    Returns ``True`` when the file records a checksum and it matches, ``False`` when it
    records none (written by another tool, or before checksums were written); raises
    :class:`CheckpointError` naming ``path`` when it does not match or the file cannot be
    read. ``tensors`` and ``metadata``: the file's content when the caller has already read
    it (then the file is not read again).
    """
    path = Path(path)
    if tensors is None or metadata is None:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except PermissionError:
            raise CheckpointError(f"{path}: permission denied (the file is not readable)") from None
        except Exception as e:  # SafetensorError, OSError
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or foreign?): {e}") from None
    recorded = metadata.get(CHECKSUM_KEY)
    if recorded is None:
        return False
    if checksum_of(tensors, metadata) != recorded:
        raise CheckpointError(f"{path}: checksum mismatch: its tensors or metadata changed after it was written "
                              "(flipped bytes, or an edited or re-saved file)")
    return True


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata=None) -> Path:
    """Save a flat ``name -> tensor`` dict as safetensors, atomically, with its checksum
    (:func:`checksum_of`) in the metadata under :data:`CHECKSUM_KEY`; the header's keys are
    sorted, so the same tensors and metadata always give the same bytes."""
    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {k: str(v) for k, v in (metadata or {}).items() if k != CHECKSUM_KEY}
    meta[CHECKSUM_KEY] = checksum_of(flat, meta)
    return atomic_write(path, _sorted_header(save(flat, metadata=meta)))


def _sorted_header(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its JSON header's keys sorted, so that the same tensors
    and metadata give the same bytes (safetensors writes metadata in hash-map order)."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # tensor data stays 8-byte aligned, as safetensors pads it
    return len(header).to_bytes(8, "little") + header + data[8 + n:]


MODEL_STATE_KEYS: tuple[str, ...] = ("model", "state_dict", "model_state_dict")
"""Keys under which a full training checkpoint (``torch.save({"model": sd, "optimizer": ...,
"step": s})``) holds the model's state dict; :func:`load_tensors` finds it there (``key=``
names any other)."""

STEP_KEYS: tuple[str, ...] = ("step", "global_step", "iter_num", "iteration")
"""Keys of a full checkpoint (or safetensors metadata: ``step``) read as its training step."""

CONFIG_ENTRY_KEYS: tuple[str, ...] = ("config", "cfg", "model_config", "hyper_parameters", "hparams", "args")
"""Entries of a full checkpoint (or of its ``hyper_parameters``, as PyTorch Lightning saves them)
whose :data:`SHAPE_FIELDS` :func:`read_header` reads as the shape the file records."""

SHAPE_FIELDS: tuple[str, ...] = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx")
"""Config fields a file may record beside its weights (:data:`CONFIG_ENTRY_KEYS`, or safetensors
metadata), checked against the config the weights are attached with."""

MAX_STEP = 2**63 - 1
"""The largest step label (``int64``): steps are stored as ``int64`` in every trace."""

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
    **{k: getattr(torch, v) for k, v in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
                                         ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"))
       if isinstance(getattr(torch, v, None), torch.dtype)},
}


def check_file(path: str | os.PathLike) -> Path:
    """``path`` if it is a regular file this process can read, else :class:`CheckpointError`
    naming it and saying why: not found, a dangling symlink, a symlink loop, a directory, or
    permission denied (never reported as "not found")."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise CheckpointError(f"{path}: dangling symlink (points to {os.readlink(path)}, which does not exist)") from None
        raise CheckpointError(f"{path}: checkpoint file not found") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied (cannot look up the file)") from None
    except OSError as e:  # ELOOP: a symlink loop; ENAMETOOLONG, ...
        why = "symlink loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise CheckpointError(f"{path}: {why}; expected a checkpoint file") from None
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file (a device, pipe or socket); expected a checkpoint file")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"{path}: permission denied (the file is not readable)")
    return path


def _step_value(v, path: Path, key: str) -> int:
    """A full checkpoint's ``step`` entry as an int in ``[0, MAX_STEP]``."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point() and v.dtype != torch.bool:
        v = int(v.item())
    elif isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, bool) or not isinstance(v, int):
        raise CheckpointError(f"{path}: entry {key!r} should be the training step (an integer), got {v!r}")
    if not 0 <= v <= MAX_STEP:
        raise CheckpointError(f"{path}: entry {key!r} = {v} is not a step (expected 0 <= step <= {MAX_STEP})")
    return v


def _recorded_fields(obj, depth: int = 0) -> dict[str, int]:
    """The :data:`SHAPE_FIELDS` a loaded full checkpoint records under :data:`CONFIG_ENTRY_KEYS`
    (searched two levels deep: ``hyper_parameters["config"]``), first found wins."""
    out: dict[str, int] = {}
    if not isinstance(obj, Mapping) or depth > 2:
        return out
    if depth > 0:
        for k in SHAPE_FIELDS:
            v = obj.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                out[k] = v
    for k in CONFIG_ENTRY_KEYS:
        for f, v in _recorded_fields(obj.get(k), depth + 1).items():
            out.setdefault(f, v)
    return out


def _is_tensor_map(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, torch.Tensor) for v in obj.values())


def _unwrap(obj, path: Path, key: str | None) -> tuple[dict, str | None, int | None]:
    """``(state dict, the key it was under or None, the step entry or None)`` of a loaded ``.pt`` object.

    A bare state dict (names -> tensors) is itself; a full training checkpoint gives the
    entry ``key`` (or the one of :data:`MODEL_STATE_KEYS` it has) and its step entry
    (first of :data:`STEP_KEYS`). Anything else: :class:`CheckpointError` listing the keys found.
    """
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: expected a state dict (parameter name -> tensor) or a full checkpoint "
                              f"dict, got {type(obj).__name__}")
    keys = [str(k) for k in obj]
    shown = keys[:12] + (["..."] if len(keys) > 12 else [])
    if key is None and _is_tensor_map(obj):
        return dict(obj), None, None
    if key is not None:
        if key not in obj:
            raise CheckpointError(f"{path}: no entry {key!r} (key=); entries found: {shown}")
        if not _is_tensor_map(obj[key]):
            raise CheckpointError(f"{path}: entry {key!r} (key=) is not a state dict (parameter name -> tensor)")
        found = key
    else:
        hits = [k for k in MODEL_STATE_KEYS if k in obj and _is_tensor_map(obj[k])]
        if not hits:
            raise CheckpointError(
                f"{path}: expected a state dict (parameter name -> tensor) or a full checkpoint with the model's "
                f"state dict under one of {list(MODEL_STATE_KEYS)}; entries found: {shown}. Pass key='...' to "
                "name the entry that holds the model's state dict"
            )
        if len(hits) > 1:
            raise CheckpointError(f"{path}: several entries look like the model's state dict ({hits}); "
                                  "pass key='...' to choose one")
        found = hits[0]
    step = next((_step_value(obj[k], path, k) for k in STEP_KEYS if k in obj), None)
    return dict(obj[found]), found, step


@dataclass(frozen=True)
class WeightsHeader:
    """What a weights file says about itself, read without its tensor data where possible
    (:func:`read_header`): ``tensors`` maps each name to ``(shape, dtype)``; ``step`` is the
    step the file records (a full checkpoint's ``step`` entry, a safetensors ``step``
    metadata value) or ``None``; ``key`` the full-checkpoint entry holding the state dict
    (``None`` for a bare state dict or a safetensors file); ``entries`` the file's top-level keys;
    ``fields`` the :data:`SHAPE_FIELDS` the file records beside its weights (a full
    checkpoint's :data:`CONFIG_ENTRY_KEYS` entries, safetensors metadata)."""

    path: Path
    tensors: Mapping[str, tuple[tuple[int, ...], torch.dtype | str]]
    step: int | None = None
    key: str | None = None
    entries: tuple[str, ...] = ()
    fields: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: s for k, (s, _) in self.tensors.items()}


def _torch_load(path: Path, *, mmap: bool):
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied (the file is not readable)") from None
    except RuntimeError as e:
        if mmap and "mmap" in str(e):
            return _torch_load(path, mmap=False)  # legacy (non-zip) torch.save format: read it in full
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or foreign file?): {e}") from None
    except (EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or foreign file?): {e}") from None
    except Exception as e:  # torch.load's weights_only unpickler raises UnpicklingError for pickled code
        raise CheckpointError(f"{path}: refused to load (not a plain weights file): {_pickle_reason(e, path)}") from None


def _pickle_reason(e: Exception, path: Path) -> str:
    """One line for torch's (multi-line) weights-only refusal: the object it would have had to run,
    and for a Lightning ``.ckpt`` (whose ``hyper_parameters`` may hold such objects) the way out."""
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    what = f"it holds a pickled {m.group(1)} object, which loading without running code cannot build" if m else \
        str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if path.suffix.lower() == ".ckpt":
        what += ("; if it is a PyTorch Lightning checkpoint whose hyper_parameters hold such objects, save its "
                 "weights alone from a copy you trust: torch.save(torch.load(f, weights_only=False)['state_dict'], "
                 "'model.pt')")
    return what


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".safetensors", ".pt", ".pth", ".bin", ".ckpt"):
        raise CheckpointError(f"{path}: unknown checkpoint format {suffix!r}; expected .safetensors, .pt, .pth, "
                              ".bin or .ckpt")
    return suffix


def read_header(path: str | os.PathLike, *, key: str | None = None) -> WeightsHeader:
    """Names, shapes, dtypes and recorded step of the tensors in a weights file (:class:`WeightsHeader`).

    Safetensors: the header only (its ``step`` metadata, if any, is the step); the
    header is checked to cover the file exactly, so a truncated file fails here. ``.pt``/
    ``.pth``/``.bin``: a memory-mapped ``torch.load(weights_only=True)`` (no tensor data
    read for zip-format files), unwrapped as :func:`load_tensors` does. Every failure is a
    :class:`CheckpointError` naming the file.
    """
    path = check_file(path)
    if _suffix(path) == ".safetensors":
        if key is not None:
            raise CheckpointError(f"{path}: key={key!r} applies to .pt/.pth/.bin full checkpoints, not safetensors")
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                tensors = {}
                for k in f.keys():
                    sl = f.get_slice(k)
                    dt = sl.get_dtype()
                    tensors[k] = (tuple(sl.get_shape()), _SAFETENSORS_DTYPES.get(dt, dt))
                meta = f.metadata() or {}
        except PermissionError:
            raise CheckpointError(f"{path}: permission denied (the file is not readable)") from None
        except Exception as e:  # SafetensorError, OSError
            raise CheckpointError(f"{path}: not a readable safetensors file (truncated or foreign?): {e}") from None
        step = _step_value(meta["step"], path, "step (metadata)") if "step" in meta else None
        fields = {k: int(meta[k]) for k in SHAPE_FIELDS if str(meta.get(k, "")).strip().isdigit()}
        return WeightsHeader(path, tensors, step, None, tuple(tensors), fields)
    obj = _torch_load(path, mmap=True)
    sd, found, step = _unwrap(obj, path, key)
    entries = tuple(str(k) for k in obj) if isinstance(obj, Mapping) else ()
    fields = _recorded_fields(obj) if found is not None else {}
    return WeightsHeader(path, {k: (tuple(v.shape), v.dtype) for k, v in sd.items()}, step, found, entries, fields)


def load_tensors(path: str | os.PathLike, *, key: str | None = None) -> dict[str, torch.Tensor]:
    """Load weights without unpickling code: safetensors, or ``torch.load(weights_only=True)``.

    A ``.pt``/``.pth``/``.bin`` file may hold a bare state dict or a full training
    checkpoint: the state dict is then the entry ``key``, else the one of
    :data:`MODEL_STATE_KEYS` (``model``, ``state_dict``, ``model_state_dict``) present.
    Raises :class:`CheckpointError` naming the file when it is missing, unreadable,
    truncated, not a weights file, or holds no state dict (listing the entries found).
    """
    path = check_file(path)
    if _suffix(path) == ".safetensors":
        if key is not None:
            raise CheckpointError(f"{path}: key={key!r} applies to .pt/.pth/.bin full checkpoints, not safetensors")
        try:
            return load_file(str(path))
        except PermissionError:
            raise CheckpointError(f"{path}: permission denied (the file is not readable)") from None
        except (SafetensorError, RuntimeError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: not a readable checkpoint (truncated or foreign file?): {e}") from None
    sd, _, _ = _unwrap(_torch_load(path, mmap=False), path, key)
    return sd


def peek_shapes(path: str | os.PathLike, *, key: str | None = None) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a weights file, reading headers only
    (:func:`read_header`); :class:`CheckpointError` naming the file if unreadable."""
    return read_header(path, key=key).shapes


class _Shape:  # check_state_dict only reads ``.shape`` (and ``.dtype`` when known)
    def __init__(self, shape, dtype=None):
        self.shape = torch.Size(shape)
        self.dtype = dtype


def check_header(path: str | os.PathLike, expected: Mapping[str, Any], *, key: str | None = None) -> WeightsHeader:
    """Raise :class:`CheckpointError` naming ``path`` unless its tensor names, shapes and dtypes
    (headers only) fit ``expected`` (a state dict, or ``name -> shape``); returns the header."""
    header = read_header(path, key=key)
    want = {k: _Shape(getattr(v, "shape", v), getattr(v, "dtype", None)) for k, v in expected.items()}
    check_state_dict({k: _Shape(s, d) for k, (s, d) in header.tensors.items()}, want, str(path))
    return header


def dtype_fits(found, expected) -> bool:
    """Whether a tensor of dtype ``found`` may be loaded where ``expected`` is: any floating
    dtype for a floating one (``load_state_dict`` casts), else exactly ``expected``; unknown
    (``None``) fits anything."""
    if found is None or expected is None:
        return True
    if not isinstance(found, torch.dtype):  # a safetensors dtype torch does not know
        return False
    if expected.is_floating_point:
        return found.is_floating_point
    return found == expected


def check_state_dict(
    loaded: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    source: str,
    ignore: tuple[str, ...] = (),
    *,
    exact_dtype: bool = False,
) -> None:
    """Raise :class:`CheckpointError` naming ``source`` if keys, shapes or dtypes differ.

    Dtypes are compared where both sides have one (:func:`dtype_fits`): a floating
    parameter must be stored as some floating dtype (an ``int64`` or ``bool`` copy of a
    model is refused), any other tensor as exactly its dtype. With ``exact_dtype`` every
    tensor must have exactly the expected dtype (a ``bfloat16`` file for a ``float32`` model
    is refused, not upcast).
    """

    def keep(k: str) -> bool:
        return not any(k.endswith(s) for s in ignore)

    missing = sorted(k for k in expected if k not in loaded and keep(k))
    unexpected = sorted(k for k in loaded if k not in expected and keep(k))
    shapes = [
        f"{k}: file {tuple(loaded[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in expected
        if k in loaded and keep(k) and loaded[k].shape != expected[k].shape
    ]
    def dtype_differs(found, want) -> bool:
        if exact_dtype and found is not None and want is not None:
            return found != want
        return not dtype_fits(found, want)

    dtypes = [
        f"{k}: file {getattr(loaded[k], 'dtype', None)} vs model {getattr(expected[k], 'dtype', None)}"
        for k in expected
        if k in loaded and keep(k)
        and dtype_differs(getattr(loaded[k], "dtype", None), getattr(expected[k], "dtype", None))
    ]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensors (e.g. {missing[:4]})")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensors (e.g. {unexpected[:4]})")
    if shapes:
        problems.append("shape mismatch: " + "; ".join(shapes[:4]))
    if dtypes:
        problems.append(f"dtype mismatch in {len(dtypes)} tensors: " + "; ".join(dtypes[:4]))
    if problems:
        raise CheckpointError(f"{source}: weights do not fit the config: " + ", ".join(problems))


def check_finite(tensors: Mapping[str, torch.Tensor], source: str, *, skip: tuple[str, ...] = ("IGNORE",)) -> None:
    """Raise :class:`CheckpointError` naming ``source`` and the first tensor that holds NaN or
    inf values (weights of a diverged or damaged run give meaningless analyses). Tensors whose
    name ends with one of ``skip`` (TransformerLens's ``-inf`` attention-mask constant
    ``IGNORE``) and non-floating tensors are not checked."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or name.endswith(skip) or t.is_meta:
            continue
        with torch.no_grad():
            if bool(torch.isfinite(t.sum())):  # one pass, no mask: any NaN or inf makes the sum non-finite
                continue
            finite = torch.isfinite(t)  # the sum overflowed, or a value is not finite: look closely
        if not bool(finite.all()):
            bad = t[~finite]
            counts = (("NaN", int(torch.isnan(bad).sum())), ("inf", int(torch.isinf(bad).sum())))
            kinds = " and ".join(w for w, n in counts if n)
            raise CheckpointError(f"{source}: tensor {name} holds {int((~finite).sum())} {kinds} values "
                                  f"(of {t.numel()}); weights that are not finite cannot be analysed")


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
