"""attach(): dispatch on the source kind; state-dict files and folders, in-memory models,
step parsing and eager header validation."""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors import safe_open
from torch import Tensor

from circuitfade import compat
from circuitfade.io import CheckpointError, check_state_dict, load_tensors, read_json
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

from .hf import _HF_WEIGHT_FILES, _hf_config, _hf_series
from .runs import is_run_dir, open_run
from .series import CheckpointSeries, Snapshot

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".pt", ".pth", ".bin")
"""File suffixes :func:`attach` treats as state-dict checkpoints."""


# --------------------------------------------------------------------------------------
# user state-dict checkpoints
# --------------------------------------------------------------------------------------
_INT = re.compile(r"\d+")


def _step_from_name(name: str) -> int | None:
    nums = _INT.findall(name)
    return int(nums[-1]) if nums else None


def _natural_key(name: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]


def _stem(p: Path) -> str:
    return p.name[: -len(p.suffix)] if p.suffix else p.name


def _label_steps(items: list[Path], steps: Sequence[int] | None, what: str) -> list[int]:
    """Steps for ``items`` (already in natural order): ``steps`` or the last integer in each name."""
    if steps is not None:
        steps = list(steps)
        if len(steps) != len(items):
            raise ValueError(
                f"steps= has {len(steps)} entries but there are {len(items)} {what}: "
                f"{[p.name for p in items][:10]}"
            )
        return [int(s) for s in steps]
    out = []
    for p in items:
        s = _step_from_name(_stem(p) if p.is_file() else p.name)
        if s is None:
            if len(items) == 1:
                s = 0  # a lone checkpoint without a number is step 0
            else:
                raise CheckpointError(f"{p}: no step number in the name; pass steps=[...] explicitly")
        out.append(s)
    dup = sorted({s for s in out if out.count(s) > 1})
    if dup:
        names = [p.name for p, s in zip(items, out) if s in dup]
        raise CheckpointError(f"{what} share step numbers {dup} ({names}); pass steps=[...] explicitly")
    return out


def _as_torch_dtype(v):
    if isinstance(v, str):
        name = v.removeprefix("torch.")
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown dtype {v!r}")
        return dt
    return v


def _build_config(config, source: str):
    """A ``HookedTransformerConfig`` (or ``SoftPriorConfig``; on TransformerLens 4 a
    ``TransformerBridgeConfig``) from an object, dict or JSON file."""
    if compat.is_config(config):
        return config
    if isinstance(config, (str, Path)):
        f = Path(config)
        d = read_json(f)
        if not isinstance(d, dict):
            raise CheckpointError(f"{f}: expected a JSON object with HookedTransformerConfig fields")
        if d.get("class") == "SoftPriorTransformer" and "config" in d:  # SoftPriorTransformer.save_pretrained
            return SoftPriorConfig.from_json_dict(d["config"], source=str(f))
        return _build_config(d, str(f))
    if isinstance(config, Mapping):
        d = dict(config)
        if "priors" in d and "gate_modes" in d:
            return SoftPriorConfig.from_json_dict(d, source=source)
        unknown = sorted(set(d) - compat.config_fields())
        if unknown:
            raise CheckpointError(f"{source}: unknown {compat.config_class_name()} fields {unknown}")
        try:
            if "dtype" in d:
                d["dtype"] = _as_torch_dtype(d["dtype"])
            return compat.make_config(d)
        except (TypeError, ValueError, AssertionError) as e:
            raise CheckpointError(f"{source}: invalid {compat.config_class_name()}: {e}") from None
    raise ValueError(
        "config= must be a HookedTransformerConfig (or SoftPriorConfig), a dict of its fields, "
        f"or a path to a JSON file with them; got {type(config).__name__}"
    )


def _new_model(cfg, device: str = "cpu", *, shapes_only: bool = False) -> nn.Module:
    """An untrained model for ``cfg`` on ``device``; its weights are to be overwritten.

    Plain models (:func:`circuitfade.compat.plain_model`) skip the random init, and with
    ``shapes_only`` are built on the meta device (no memory), for header checks.
    """
    if isinstance(cfg, SoftPriorConfig):
        return SoftPriorTransformer(dataclasses.replace(cfg, device=device))
    return compat.plain_model(cfg, device, init_weights=False, meta=shapes_only)


def _native(sd: Mapping, model: nn.Module, source: str) -> dict:
    """A ``HookedTransformer``-format state dict in ``model``'s own form (see
    :func:`circuitfade.compat.native_state_dict`; unchanged on TransformerLens 3)."""
    try:
        return compat.native_state_dict(sd, model)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None


def _peek_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a weights file, without reading tensor data."""
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
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
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to tensors")
    return {k: tuple(v.shape) for k, v in obj.items()}


class _Shape:  # check_state_dict only reads ``.shape``
    def __init__(self, shape):
        self.shape = torch.Size(shape)


def _file_series(files: list[Path], steps: list[int], config, device, metadata, source: str) -> CheckpointSeries:
    cfg = _build_config(config, "config")
    skeleton = _new_model(cfg, shapes_only=True)
    shapes = {k: _Shape(v.shape) for k, v in skeleton.state_dict().items()}
    for f in files:  # eager, header-only validation
        peeked = {k: torch.empty(s, device="meta") for k, s in _peek_shapes(f).items()}
        check_state_dict(_native(peeked, skeleton, str(f)), shapes, str(f))

    def loader(file: Path) -> Callable[[], nn.Module]:
        def load() -> nn.Module:
            model = _new_model(cfg, device or "cpu")
            sd = _native(load_tensors(file), model, str(file))
            check_state_dict(sd, model.state_dict(), str(file))
            model.load_state_dict(sd, strict=True)
            return model.to(device or "cpu", print_details=False)
        return load

    snaps = [Snapshot(s, loader(f), str(f)) for f, s in zip(files, steps)]
    return CheckpointSeries(snaps, metadata, source=source)


def _weight_files(folder: Path, pattern: str | None) -> list[Path]:
    files = [p for p in folder.glob(pattern or "*") if p.is_file() and not p.name.startswith(".")
             and p.suffix.lower() in WEIGHT_SUFFIXES]
    return sorted(files, key=lambda p: _natural_key(p.name))


# --------------------------------------------------------------------------------------
# attach: dispatch on the source kind
# --------------------------------------------------------------------------------------
_ACCEPTED = (
    "a circuitfade run directory; a local Hugging Face model directory; a folder of Hugging Face "
    "model directories (one per revision); a folder of .pt/.pth/.bin/.safetensors state dicts (with "
    "config=); a state-dict file or a list of them; a dict {step: file}; a model, a list/tuple of "
    "models or a dict {step: model} (HookedTransformer / SoftPriorTransformer / any nn.Module)"
)


def _is_pathlike(x) -> bool:
    return isinstance(x, (str, Path))


def _models_series(models: list[nn.Module], steps: list[int], device, metadata) -> CheckpointSeries:
    def loader(m: nn.Module) -> Callable[[], nn.Module]:
        return lambda: m.to(device) if device is not None else m

    snaps = [Snapshot(s, loader(m), f"in-memory {type(m).__name__} #{i}")
             for i, (m, s) in enumerate(zip(models, steps))]
    return CheckpointSeries(snaps, metadata, source=f"{len(models)} in-memory models")


def attach(
    source,
    *,
    config=None,
    steps: Sequence[int] | None = None,
    pattern: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> CheckpointSeries:
    """A :class:`CheckpointSeries` over any kind of checkpoints (see the module docstring).

    Args:
        source: a run directory, a Hugging Face model folder or folder of them, a folder
            of state-dict files, a file, a list of files, a dict ``{step: file}``, a
            model, a list/tuple of models, or a dict ``{step: model}``.
        config: for state-dict files only: a ``HookedTransformerConfig`` (or
            ``SoftPriorConfig``), a dict of its fields, or a JSON file of them
            (``dtype`` may be a string such as ``"float32"``). Default: ``config.json``
            next to the files.
        steps: step labels, in natural-sort order of the file/folder names (for lists:
            list order); for sources that carry their own steps (run directories,
            dicts) a subset to select.
        pattern: glob pattern restricting the files / subfolders of a folder source.
        metadata: extra metadata merged over the defaults (``run``, ``run_dir``, ...).
        device: where loaded models go (default ``"cpu"``); in-memory models are moved
            (in place, ``nn.Module.to``) only if ``device`` is given.

    Raises:
        CheckpointError: a path that does not exist, or a file that is not a checkpoint
            or does not fit the config (named in the message).
        ValueError: an unknown source kind (message lists the accepted kinds), or
            inconsistent arguments.
    """
    meta = dict(metadata or {})

    def done(series: CheckpointSeries, own_steps: bool) -> CheckpointSeries:
        if own_steps and steps is not None:
            series = series.select(steps)
        return series

    def no_config(kind: str):
        if config is not None:
            raise ValueError(f"config= applies to state-dict files only, not to {kind}")

    # -- in-memory models ----------------------------------------------------------------
    if isinstance(source, nn.Module):
        source = [source]
    if isinstance(source, Mapping):
        items = sorted(source.items(), key=lambda kv: kv[0])
        keys = [k for k, _ in items]
        if not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in keys):
            raise ValueError(f"a dict source needs integer step keys, got {keys[:5]}")
        vals = [v for _, v in items]
        if vals and all(isinstance(v, nn.Module) for v in vals):
            no_config("in-memory models")
            return done(_models_series(vals, keys, device, meta), True)
        if vals and all(_is_pathlike(v) for v in vals):
            files = [Path(v) for v in vals]
            _check_files_exist(files)
            cfg = config if config is not None else _sibling_config(files[0].parent)
            src = str(files[0].parent)
            meta = {"run": files[0].parent.resolve().name, "run_dir": str(files[0].parent.resolve()), **meta}
            return done(_file_series(files, [int(k) for k in keys], cfg, device, meta, src), True)
        raise ValueError(f"a dict source maps steps to models or to files; accepted sources: {_ACCEPTED}")
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("empty list of checkpoints")
        if all(isinstance(m, nn.Module) for m in source):
            no_config("in-memory models")
            labels = list(range(len(source))) if steps is None else [int(s) for s in steps]
            if len(labels) != len(source):
                raise ValueError(f"steps= has {len(labels)} entries for {len(source)} models")
            return _models_series(list(source), labels, device, meta)
        if all(_is_pathlike(p) for p in source):
            files = [Path(p) for p in source]
            _check_files_exist(files)
            labels = _label_steps(files, steps, "files")
            cfg = config if config is not None else _sibling_config(files[0].parent)
            meta = {"run": files[0].parent.resolve().name, "run_dir": str(files[0].parent.resolve()), **meta}
            return _file_series(files, labels, cfg, device, meta, str(files[0].parent))
        raise ValueError(f"a list source must hold only models or only file paths; accepted sources: {_ACCEPTED}")
    if not _is_pathlike(source):
        raise ValueError(f"cannot attach a {type(source).__name__}; accepted sources: {_ACCEPTED}")

    # -- paths --------------------------------------------------------------------------
    path = Path(source)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory (sources are local paths, never hub ids)")
    base_meta = {"run": path.resolve().name if path.is_dir() else path.resolve().parent.name,
                 "run_dir": str(path.resolve() if path.is_dir() else path.resolve().parent)}
    if path.is_file():
        if path.suffix.lower() not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{path}: not a checkpoint file (expected {', '.join(WEIGHT_SUFFIXES)})")
        labels = _label_steps([path], steps, "files")
        cfg = config if config is not None else _sibling_config(path.parent)
        return _file_series([path], labels, cfg, device, {**base_meta, **meta}, str(path))

    if is_run_dir(path):
        no_config("a circuitfade run directory")
        series = open_run(path, device=device)
        series.metadata.update(meta)
        return done(series, True)
    d = _hf_config(path)
    if d is not None and any((path / w).is_file() for w in _HF_WEIGHT_FILES):
        no_config("Hugging Face model directories")
        labels = _label_steps([path], steps, "model directories")
        return _hf_series([path], labels, device, {**base_meta, **meta}, str(path))
    subdirs = sorted((p for p in path.glob(pattern or "*") if p.is_dir() and not p.name.startswith(".")
                      and _hf_config(p) is not None), key=lambda p: _natural_key(p.name))
    if subdirs:
        no_config("Hugging Face model directories")
        labels = _label_steps(subdirs, steps, "model directories")
        return _hf_series(subdirs, labels, device, {**base_meta, **meta}, str(path))
    files = _weight_files(path, pattern)
    if files:
        labels = _label_steps(files, steps, "files")
        cfg = config if config is not None else _sibling_config(path)
        return _file_series(files, labels, cfg, device, {**base_meta, **meta}, str(path))
    raise CheckpointError(
        f"{path}: no checkpoints found{f' matching {pattern!r}' if pattern else ''}; accepted sources: {_ACCEPTED}"
    )


def _check_files_exist(files: list[Path]) -> None:
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: checkpoint file not found")
        if f.suffix.lower() not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{f}: not a checkpoint file (expected {', '.join(WEIGHT_SUFFIXES)})")


def _sibling_config(folder: Path) -> Path:
    f = folder / "config.json"
    if f.is_file():
        return f
    raise CheckpointError(
        f"{folder}: state-dict checkpoints need a model config: pass config= (HookedTransformerConfig, "
        "dict, or JSON file) or put config.json next to the files"
    )
