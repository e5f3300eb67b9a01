"""Atomic file writes and checked, pickle-free loading of weights.

Every file circuitfade writes goes through :func:`atomic_write`: the bytes go to
a temporary file in the same directory, are flushed and fsynced, and only then
renamed over the final name, so a crash never leaves a half-written file under
the name a reader looks for. Weights are read with safetensors, or with
``torch.load(weights_only=True)`` for ``.pt``/``.pth`` files, so loading never
runs code from the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

__all__ = [
    "CheckpointError",
    "atomic_write",
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


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
