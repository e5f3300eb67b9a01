"""attach(): one constructor per source kind (:func:`from_run`, :func:`from_hf`,
:func:`from_state_dicts`, :func:`from_models`) and the dispatcher over them; step
parsing and eager header validation."""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from circuitfade import compat
from circuitfade.io import CheckpointError, check_state_dict, load_tensors, peek_shapes, read_json
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

from .hf import _HF_WEIGHT_FILES, _hf_config, _hf_series
from .runs import is_run_dir, open_run
from .series import CheckpointSeries, Snapshot

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".pt", ".pth", ".bin")
"""File suffixes :func:`attach` treats as state-dict checkpoints."""


# --------------------------------------------------------------------------------------
# user state-dict checkpoints
# --------------------------------------------------------------------------------------
_INT = re.compile(r"(?<![A-Za-z0-9.])-\d+|\d+")  # "-5" is negative only after a separator: "step_-5", not "ckpt-5"


def _step_from_name(name: str) -> int | None:
    nums = _INT.findall(name)
    return int(nums[-1]) if nums else None


def _check_steps(steps, what: str) -> list[int]:
    """Integer, non-negative step labels (``ValueError`` naming the bad one)."""
    out = []
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise ValueError(f"{what}: steps must be integers, got {s!r}")
        if s < 0:
            raise ValueError(f"{what}: negative step {s}; training steps are >= 0")
        out.append(int(s))
    return out


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
        return _check_steps(steps, "steps=")
    out = []
    for p in items:
        s = _step_from_name(_stem(p) if p.is_file() else p.name)
        if s is None:
            if len(items) == 1:
                s = 0  # a lone checkpoint without a number is step 0
            else:
                raise CheckpointError(f"{p}: no step number in the name; pass steps=[...] explicitly")
        if s < 0:
            raise CheckpointError(f"{p}: negative step {s} in the name; steps are >= 0 (pass steps=[...])")
        out.append(s)
    dup = sorted({s for s in out if out.count(s) > 1})
    if dup:
        names = [p.name for p, s in zip(items, out) if s in dup]
        raise CheckpointError(f"{what} share step numbers {dup} ({names}); pass steps=[...] explicitly")
    return out


def _as_torch_dtype(v, source: str):
    if isinstance(v, str):
        dt = getattr(torch, v.removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype):
            raise CheckpointError(f"{source}: field 'dtype': unknown torch dtype {v!r} (e.g. 'float32')")
        return dt
    return v


_INT_FIELDS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "d_vocab_out")


def _check_fields(d: Mapping, source: str) -> None:
    """Missing required fields and wrongly typed integer fields, named with the file."""
    missing = [k for k in (*compat.config_required_fields(), "d_vocab") if k not in d]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing} ({compat.config_class_name()} needs them)")
    for k in _INT_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise CheckpointError(f"{source}: field {k!r} must be an integer, got {v!r}")


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
        _check_fields(d, source)
        if "dtype" in d:
            d["dtype"] = _as_torch_dtype(d["dtype"], source)
        try:
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


def _file_series(files: list[Path], steps: list[int], config, device, metadata, source: str) -> CheckpointSeries:
    cfg = _build_config(config, "config")
    skeleton = _new_model(cfg, shapes_only=True)
    expected = skeleton.state_dict()
    for f in files:  # eager, header-only validation (meta tensors: names and shapes only)
        peeked = {k: torch.empty(s, device="meta") for k, s in peek_shapes(f).items()}
        check_state_dict(_native(peeked, skeleton, str(f)), expected, str(f))

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
# one constructor per source kind; attach() dispatches to them
# --------------------------------------------------------------------------------------
_ACCEPTED = (
    "a circuitfade run directory; a local Hugging Face model directory; a folder of Hugging Face "
    "model directories (one per revision); a folder of .pt/.pth/.bin/.safetensors state dicts (with "
    "config=); a state-dict file or a list of them; a dict {step: file}; a model, a list/tuple of "
    "models or a dict {step: model} (HookedTransformer / SoftPriorTransformer / any nn.Module)"
)


def _is_pathlike(x) -> bool:
    return isinstance(x, (str, Path))


def _folder_meta(folder: Path, metadata: Mapping | None) -> dict:
    """Default metadata of a source on disk (``run``: folder name, ``run_dir``), overridden by ``metadata``."""
    folder = folder.resolve()
    return {"run": folder.name, "run_dir": str(folder), **dict(metadata or {})}


def _step_items(source: Mapping) -> list[tuple[int, Any]]:
    """``{step: x}`` items sorted by step; keys must be non-negative integers."""
    keys = list(source)
    bad = [k for k in keys if isinstance(k, bool) or not isinstance(k, numbers.Integral)]
    if bad:
        raise ValueError(f"a dict source needs integer step keys, got {bad[:5]!r} among {keys[:5]!r}")
    _check_steps(keys, "dict source")
    return sorted(((int(k), v) for k, v in source.items()), key=lambda kv: kv[0])


def _select(series: CheckpointSeries, steps: Sequence[int] | None) -> CheckpointSeries:
    return series.select(steps) if steps is not None else series


def from_run(run_dir: str | Path, *, steps: Sequence[int] | None = None, metadata: Mapping | None = None,
             device: str | None = None) -> CheckpointSeries:
    """A circuitfade run directory (:func:`open_run`); ``steps`` selects a subset."""
    series = open_run(run_dir, device=device)
    series.metadata.update(metadata or {})
    return _select(series, steps)


def from_models(models, *, steps: Sequence[int] | None = None, metadata: Mapping | None = None,
                device: str | None = None) -> CheckpointSeries:
    """In-memory models: one, a list/tuple (steps ``0..n-1`` unless ``steps=``) or a dict ``{step: model}``.

    Models are moved (in place, ``nn.Module.to``) only if ``device`` is given.
    """
    if isinstance(models, nn.Module):
        models = [models]
    own_steps = isinstance(models, Mapping)
    if own_steps:
        items = _step_items(models)
        labels, models = [k for k, _ in items], [m for _, m in items]
    else:
        models = list(models)
        labels = list(range(len(models))) if steps is None else _check_steps(steps, "steps=")
        if len(labels) != len(models):
            raise ValueError(f"steps= has {len(labels)} entries for {len(models)} models")
    if not models or not all(isinstance(m, nn.Module) for m in models):
        raise ValueError("from_models needs one or more nn.Module models")

    def loader(m: nn.Module) -> Callable[[], nn.Module]:
        return lambda: m.to(device) if device is not None else m

    snaps = [Snapshot(s, loader(m), f"in-memory {type(m).__name__} #{i}")
             for i, (m, s) in enumerate(zip(models, labels))]
    series = CheckpointSeries(snaps, dict(metadata or {}), source=f"{len(models)} in-memory models")
    return _select(series, steps) if own_steps else series


def from_state_dicts(files, *, config=None, steps: Sequence[int] | None = None, pattern: str | None = None,
                     metadata: Mapping | None = None, device: str | None = None) -> CheckpointSeries:
    """State-dict files of a ``HookedTransformer`` / ``SoftPriorTransformer``: a folder of them
    (``pattern`` filters), one file, a list of files, or a dict ``{step: file}``.

    ``config`` (default: ``config.json`` next to the files) is a
    ``HookedTransformerConfig``, a dict of its fields or a JSON file of them. Every
    file's header is checked against it now.
    """
    own_steps = isinstance(files, Mapping)
    if own_steps:
        items = _step_items(files)
        if not items or not all(_is_pathlike(v) for _, v in items):
            raise ValueError(f"a dict source maps steps to models or to files; accepted sources: {_ACCEPTED}")
        paths, labels = [Path(v) for _, v in items], [k for k, _ in items]
        _check_files_exist(paths)
        folder = paths[0].parent
    elif _is_pathlike(files) and Path(files).is_dir():
        folder = Path(files)
        paths = _weight_files(folder, pattern)
        if not paths:
            raise CheckpointError(f"{folder}: no state-dict files{f' matching {pattern!r}' if pattern else ''} "
                                  f"(expected {', '.join(WEIGHT_SUFFIXES)})")
        labels = _label_steps(paths, steps, "files")
    else:
        paths = [Path(files)] if _is_pathlike(files) else [Path(p) for p in files]
        if not paths:
            raise ValueError("empty list of checkpoints")
        _check_files_exist(paths)
        labels = _label_steps(paths, steps, "files")
        folder = paths[0].parent
    cfg = config if config is not None else _sibling_config(folder)
    source = str(paths[0]) if _is_pathlike(files) and not Path(files).is_dir() else str(folder)
    series = _file_series(paths, labels, cfg, device, _folder_meta(folder, metadata), source)
    return _select(series, steps) if own_steps else series


def from_hf(folder: str | Path, *, steps: Sequence[int] | None = None, pattern: str | None = None,
            metadata: Mapping | None = None, device: str | None = None) -> CheckpointSeries:
    """A local Hugging Face model directory, or a folder of them (one per revision; ``pattern`` filters)."""
    path = Path(folder)
    if _hf_config(path) is not None and any((path / w).is_file() for w in _HF_WEIGHT_FILES):
        dirs = [path]
    else:
        dirs = sorted((p for p in path.glob(pattern or "*") if p.is_dir() and not p.name.startswith(".")
                       and _hf_config(p) is not None), key=lambda p: _natural_key(p.name))
        if not dirs:
            raise CheckpointError(f"{path}: no Hugging Face model directories{f' matching {pattern!r}' if pattern else ''}")
    labels = _label_steps(dirs, steps, "model directories")
    return _hf_series(dirs, labels, device, _folder_meta(path, metadata), str(path))


def _kind(source, pattern: str | None) -> str:
    """Which constructor a source goes to: "models", "files", "run", "hf" (or ValueError / CheckpointError)."""
    if isinstance(source, nn.Module):
        return "models"
    if isinstance(source, Mapping):
        vals = [v for _, v in _step_items(source)]
        if vals and all(isinstance(v, nn.Module) for v in vals):
            return "models"
        if vals and all(_is_pathlike(v) for v in vals):
            return "files"
        raise ValueError(f"a dict source maps steps to models or to files; accepted sources: {_ACCEPTED}")
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("empty list of checkpoints")
        if all(isinstance(m, nn.Module) for m in source):
            return "models"
        if all(_is_pathlike(p) for p in source):
            return "files"
        raise ValueError(f"a list source must hold only models or only file paths; accepted sources: {_ACCEPTED}")
    if not _is_pathlike(source):
        raise ValueError(f"cannot attach a {type(source).__name__}; accepted sources: {_ACCEPTED}")
    path = Path(source)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory (sources are local paths, never hub ids)")
    if path.is_file():
        if path.suffix.lower() not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{path}: not a checkpoint file (expected {', '.join(WEIGHT_SUFFIXES)})")
        return "files"
    if is_run_dir(path):
        return "run"
    if _hf_config(path) is not None and any((path / w).is_file() for w in _HF_WEIGHT_FILES):
        return "hf"
    if any(p.is_dir() and not p.name.startswith(".") and _hf_config(p) is not None for p in path.glob(pattern or "*")):
        return "hf"
    if _weight_files(path, pattern):
        return "files"
    raise CheckpointError(
        f"{path}: no checkpoints found{f' matching {pattern!r}' if pattern else ''}; accepted sources: {_ACCEPTED}"
    )


_CONSTRUCTORS = {"run": from_run, "models": from_models, "files": from_state_dicts, "hf": from_hf}
_KIND_NAMES = {"run": "a circuitfade run directory", "models": "in-memory models", "hf": "Hugging Face model directories"}


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

    Dispatches to one constructor per source kind: :func:`from_run`,
    :func:`from_hf`, :func:`from_state_dicts`, :func:`from_models`.

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
    kind = _kind(source, pattern)
    kw = dict(steps=steps, metadata=metadata, device=device)
    if kind == "files":
        return from_state_dicts(source, config=config, pattern=pattern, **kw)
    if config is not None:
        raise ValueError(f"config= applies to state-dict files only, not to {_KIND_NAMES[kind]}")
    if kind == "hf":
        kw["pattern"] = pattern
    return _CONSTRUCTORS[kind](source, **kw)


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
