"""Checkpoint series: circuitfade runs and anyone's own checkpoints, traced the same way.

A :class:`CheckpointSeries` is a lazy, ordered sequence of ``(step, model)``
snapshots. Each snapshot is a :class:`Snapshot` (a step, a zero-argument loader
and a ``source`` string for error messages); a model is built only when asked
for, so iterating holds one model in memory at a time::

    series = attach("runs/fade600-s0")          # a circuitfade run directory
    series = attach("my_ckpts/", config=cfg)    # your HookedTransformer state dicts
    series = attach("pythia-revisions/")        # local Hugging Face model folders
    series = attach([model_a, model_b])         # models already in memory

    for step, model in series.range(0, 1200):   # eval-mode models, loaded one by one
        ...
    df = trace(series, {"loss": loss_fn, "prev": prev_token_scores}, task)

Source kinds :func:`attach` accepts (dispatched in this order):

1. a **circuitfade run directory** (``config.json`` with the run keys and a
   ``checkpoints/`` folder; :func:`open_run`);
2. a **single local Hugging Face model directory** (``config.json`` with
   ``model_type``/``architectures`` and weights written by ``save_pretrained``);
3. a **folder of Hugging Face model directories**, one per revision
   (``step1000/``, ``step2000/``, ...; :func:`load_hf_local`);
4. a **folder of state-dict files** (``.pt``/``.pth``/``.bin``/``.safetensors``)
   of a ``HookedTransformer`` (or ``SoftPriorTransformer``) whose config is given
   with ``config=`` or sits next to them as ``config.json``; a single such file; a
   list of such files; a dict ``{step: file}``;
5. **in-memory models**: one model, a list/tuple (steps ``0..n-1`` unless
   ``steps=``), or a dict ``{step: model}``.

Steps of files and folders are the last integer in the file stem / folder name
(``ckpt_step1200.pt`` -> 1200, ``model-000300.safetensors`` -> 300,
``revision-2000/`` -> 2000) unless ``steps=`` gives them, in natural-sort order
of the names.

Validation is **eager and cheap**: :func:`attach` reads every state-dict file's
*header* (names and shapes; safetensors header or a memory-mapped weights-only
``torch.load``, no tensor data) and checks it against the config, and reads every
Hugging Face ``config.json``, so a foreign, truncated, pickled-code or
wrongly-shaped file fails at attach time with a :class:`~circuitfade.io.CheckpointError`
naming the file. Weights are read in full (and checked again) only when a
snapshot is loaded. Nothing here touches the network: Hugging Face folders are
read with ``local_files_only=True`` and a hub id is never passed anywhere.

:func:`trace` maps metric functions over a series into one tidy DataFrame with
columns ``step, layer, head, metric, value, note`` plus the series metadata
(``run, run_dir, path, seed, task`` for circuitfade runs).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import numbers
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from jaxtyping import Float, Int
from safetensors import safe_open
from torch import Tensor
from tqdm import tqdm
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuitfade.evaluation import NoGatesError
from circuitfade.io import CheckpointError, check_state_dict, load_tensors, read_json
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.schedules import GatePath
from circuitfade.tasks import Batch, Task, eval_set
from circuitfade.training import CKPT_DIR, EVAL_SEED, RunConfig

__all__ = [
    "Snapshot",
    "CheckpointSeries",
    "NoGates",
    "NoGatesError",
    "open_run",
    "is_run_dir",
    "attach",
    "load_hf_local",
    "SUPPORTED_HF_ARCHITECTURES",
    "WEIGHT_SUFFIXES",
    "trace",
    "TRACE_COLUMNS",
    "PerHead",
    "MetricOutput",
]

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".pt", ".pth", ".bin")
"""File suffixes :func:`attach` treats as state-dict checkpoints."""

SUPPORTED_HF_ARCHITECTURES: tuple[str, ...] = ("GPTNeoXForCausalLM", "GPT2LMHeadModel")
"""Hugging Face ``architectures[0]`` values :func:`load_hf_local` converts (tested to 1e-4 on logits)."""

TRACE_COLUMNS: tuple[str, ...] = ("step", "layer", "head", "metric", "value", "note")
"""Leading columns of every :func:`trace` DataFrame (metadata columns follow)."""

PerHead = Float[Tensor, "layer head"]
"""A per-head metric value: shape ``[n_layers, n_heads]``."""

MetricOutput = float | PerHead | Mapping | pd.DataFrame
"""What a :func:`trace` metric returns (see :func:`trace`)."""

_RUN_KEYS = frozenset({"path", "task", "model", "train", "seed"})
_HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


# Raised by a metric that needs gates when given a model without any: trace() records
# such a metric as one row with value NaN and note "no gates" (see skip_errors).
NoGates = NoGatesError


# --------------------------------------------------------------------------------------
# the series
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """One checkpoint of a series: its ``step``, a zero-argument ``load`` that builds the
    model, and ``source`` (a file, folder or description) named in error messages."""

    step: int
    load: Callable[[], nn.Module]
    source: str

    def __post_init__(self):
        if isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral):
            raise ValueError(f"Snapshot.step must be an integer, got {self.step!r} ({self.source})")
        object.__setattr__(self, "step", int(self.step))
        if not callable(self.load):
            raise ValueError(f"Snapshot.load must be a zero-argument callable, got {self.load!r}")


def _fmt_steps(steps: Sequence[int], limit: int = 8) -> str:
    if len(steps) <= limit:
        return "[" + ", ".join(map(str, steps)) + "]"
    head = ", ".join(map(str, steps[: limit - 2]))
    return f"[{head}, ..., {steps[-1]}]"


class CheckpointSeries:
    """A lazy, step-ordered sequence of ``(step, model)`` snapshots.

    * ``len(series)``, ``series.steps`` (sorted list of ints);
    * ``for step, model in series`` loads each model when reached (in eval mode),
      so only one is alive at a time unless the caller keeps references; every
      access loads afresh (no cache), so callers may modify what they get;
    * ``series[step]`` -> the model at ``step`` (``KeyError`` listing the available
      steps otherwise);
    * ``series.range(start, stop, every)`` and ``series.select(steps)`` -> sub-series
      sharing loaders, metadata, task and gate information;
    * ``series.metadata``: a dict of scalars describing the series (for circuitfade
      runs ``run``, ``run_dir``, ``path`` (the gate path), ``seed``, ``task``);
      :func:`trace` adds each key as a column;
    * ``series.task``: the run's :class:`~circuitfade.tasks.Task` (circuitfade runs) or ``None``;
    * ``series.gate_path``: the run's :class:`~circuitfade.schedules.GatePath` or ``None``,
      ``series.gate_value(step)`` its prescribed gate, ``series.gate_zero_step()``.

    ``gate_span = (first_step, last_step)`` is the training span of the run the gate
    path applies to (``(parent_step, train.steps)`` for a branch).
    """

    def __init__(
        self,
        snapshots: Iterable[Snapshot],
        metadata: Mapping[str, Any] | None = None,
        *,
        task: Task | None = None,
        gate_path: GatePath | None = None,
        gate_span: tuple[int, int] | None = None,
        source: str | None = None,
    ):
        snaps = list(snapshots)
        for s in snaps:
            if not isinstance(s, Snapshot):
                raise ValueError(f"CheckpointSeries expects Snapshot objects, got {type(s).__name__}")
        snaps.sort(key=lambda s: s.step)
        seen: dict[int, str] = {}
        for s in snaps:
            if s.step in seen:
                raise ValueError(f"duplicate step {s.step}: {seen[s.step]} and {s.source}")
            seen[s.step] = s.source
        if gate_path is not None and not isinstance(gate_path, GatePath):
            raise ValueError(f"gate_path must be a GatePath or None, got {type(gate_path).__name__}")
        if gate_path is not None and gate_path.mode != "learned" and gate_span is None:
            raise ValueError("a fixed or scheduled gate_path needs gate_span=(first_step, last_step)")
        self._snapshots: tuple[Snapshot, ...] = tuple(snaps)
        self._by_step = {s.step: s for s in snaps}
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.task = task
        self.gate_path = gate_path
        self.gate_span = None if gate_span is None else (int(gate_span[0]), int(gate_span[1]))
        if source is None:
            srcs = {s.source for s in snaps}
            source = srcs.pop() if len(srcs) == 1 else f"{len(snaps)} snapshots"
        self.source = source

    # -- sequence protocol ------------------------------------------------------------
    @property
    def snapshots(self) -> tuple[Snapshot, ...]:
        return self._snapshots

    @property
    def steps(self) -> list[int]:
        return [s.step for s in self._snapshots]

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[tuple[int, nn.Module]]:
        for snap in self._snapshots:
            model = _load_snapshot(snap)
            yield snap.step, model
            del model

    def __contains__(self, step) -> bool:
        return step in self._by_step

    def snapshot(self, step: int) -> Snapshot:
        """The :class:`Snapshot` at ``step`` (``KeyError`` listing the steps if absent)."""
        try:
            return self._by_step[step]
        except (KeyError, TypeError):
            raise KeyError(
                f"no checkpoint at step {step!r} in {self.source}; available steps: {_fmt_steps(self.steps, 50)}"
            ) from None

    def __getitem__(self, step: int) -> nn.Module:
        return _load_snapshot(self.snapshot(step))

    def __repr__(self) -> str:
        return f"CheckpointSeries({len(self)} snapshots, steps={_fmt_steps(self.steps)}, source={self.source!r})"

    # -- sub-series ----------------------------------------------------------------------
    def _sub(self, snaps: Iterable[Snapshot]) -> "CheckpointSeries":
        return CheckpointSeries(
            snaps, self.metadata, task=self.task, gate_path=self.gate_path, gate_span=self.gate_span,
            source=self.source,
        )

    def range(self, start: int | None = None, stop: int | None = None, every: int | None = None) -> "CheckpointSeries":
        """Snapshots with ``start <= step <= stop`` (both inclusive, ``None`` = unbounded)
        and, if ``every`` is given, ``(step - (start or 0)) % every == 0``."""
        if every is not None and (isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1):
            raise ValueError(f"every must be a positive integer, got {every!r}")
        origin = start if start is not None else 0
        keep = [
            s for s in self._snapshots
            if (start is None or s.step >= start)
            and (stop is None or s.step <= stop)
            and (every is None or (s.step - origin) % every == 0)
        ]
        return self._sub(keep)

    def select(self, steps: Iterable[int]) -> "CheckpointSeries":
        """The snapshots at exactly ``steps`` (``KeyError`` naming any step not present)."""
        steps = list(steps)
        missing = [s for s in steps if s not in self._by_step]
        if missing:
            raise KeyError(
                f"steps {missing} not in {self.source}; available steps: {_fmt_steps(self.steps, 50)}"
            )
        return self._sub(self._by_step[s] for s in dict.fromkeys(steps))

    # -- gate schedule -----------------------------------------------------------------
    def gate_value(self, step: int) -> float | None:
        """The gate value the run's path prescribes at ``step`` (``None`` for learned gates
        or series without a gate path)."""
        if self.gate_path is None or self.gate_path.mode == "learned":
            return None
        return self.gate_path.value_at(step)

    def gate_zero_step(self) -> int | None:
        """First training step ``s`` in ``gate_span`` with gate 0 at every step ``s..last``.

        A training step, not necessarily a checkpoint step. ``None`` for learned gates,
        series without a gate path, or a gate that is not 0 at the last step. For a
        path ``fade5+5->0`` (0.5 until 5, linear to 0 over 5 steps) it is 10; for
        ``forced_zero`` it is the first step of the span.
        """
        if self.gate_path is None or self.gate_path.mode == "learned" or self.gate_span is None:
            return None
        first, last = self.gate_span
        if self.gate_path.value_at(last) != 0.0:
            return None
        if self.gate_path.mode == "fixed":
            return first
        s = last
        while s > first and self.gate_path.value_at(s - 1) == 0.0:
            s -= 1
        return s


def _load_snapshot(snap: Snapshot) -> nn.Module:
    model = snap.load()
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{snap.source}: loader returned {type(model).__name__}, not a torch model")
    return model.eval()


# --------------------------------------------------------------------------------------
# circuitfade runs
# --------------------------------------------------------------------------------------
def _read_run_config(run_dir: Path) -> RunConfig | None:
    f = run_dir / "config.json"
    if not f.is_file():
        return None
    try:
        d = read_json(f)
    except CheckpointError:
        return None
    if not isinstance(d, dict) or not _RUN_KEYS <= set(d):
        return None
    try:
        return RunConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{f}: looks like a circuitfade run config but is invalid: {e}") from None


def is_run_dir(path: str | Path) -> bool:
    """True if ``path`` is a directory with a circuitfade run ``config.json``."""
    path = Path(path)
    return path.is_dir() and _read_run_config(path) is not None


_RUN_WEIGHTS = re.compile(r"step_(\d+)\.safetensors")


def _run_weight_files(ckpt_dir: Path) -> dict[int, Path]:
    """``{step: file}`` of the weight files ``step_XXXXXX.safetensors`` in ``ckpt_dir`` (state files excluded)."""
    if not ckpt_dir.is_dir():
        return {}
    found = {int(m.group(1)): f for f in ckpt_dir.iterdir() if (m := _RUN_WEIGHTS.fullmatch(f.name)) and f.is_file()}
    return dict(sorted(found.items()))


def open_run(run_dir: str | Path, *, device: str | None = None) -> CheckpointSeries:
    """The checkpoints of a circuitfade run directory as a :class:`CheckpointSeries`.

    The snapshots are the weight files ``checkpoints/step_XXXXXX.safetensors`` (the
    ``.state.safetensors`` optimizer/RNG files beside them are not needed, so a
    weights-only copy of a run - such as the shipped ``assets/series/`` - opens too;
    training writes the state file first, so every weight file of a run in progress
    is a finished checkpoint). Resuming training still needs both files
    (:func:`circuitfade.training.complete_checkpoints`).

    Each model is rebuilt from ``config.json`` (``RunConfig.model_config()``) and its
    weights loaded with ``SoftPriorTransformer.load_weights`` (checked keys/shapes).
    Metadata: ``run`` (directory name), ``run_dir`` (absolute path), ``path`` (gate
    path name), ``seed``, ``task`` (task name); ``series.task`` is the run's task and
    ``series.gate_path`` its gate path. Raises :class:`CheckpointError` if
    ``run_dir`` is not a run or holds no complete checkpoint.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a directory; expected a circuitfade run directory")
    cfg = _read_run_config(run_dir)
    if cfg is None:
        raise CheckpointError(
            f"{run_dir}: not a circuitfade run directory (expected config.json with keys {sorted(_RUN_KEYS)} "
            f"and a {CKPT_DIR}/ folder)"
        )
    files = _run_weight_files(run_dir / CKPT_DIR)
    if not files:
        raise CheckpointError(
            f"{run_dir}: circuitfade run without complete checkpoints (no step_XXXXXX.safetensors weight files "
            f"in {CKPT_DIR}/)"
        )
    model_cfg = dataclasses.replace(cfg.model_config(), device=device or "cpu")

    def loader(file: Path) -> Callable[[], nn.Module]:
        def load() -> nn.Module:
            model = SoftPriorTransformer(model_cfg)
            model.load_weights(file)
            return model.to(device or "cpu", print_details=False)
        return load

    snaps = [Snapshot(s, loader(f), str(f)) for s, f in files.items()]
    path = cfg.gate_path()
    start = int((cfg.parent or {}).get("step", 0))
    meta = {
        "run": run_dir.resolve().name,
        "run_dir": str(run_dir.resolve()),
        "path": path.name,
        "seed": cfg.seed,
        "task": cfg.task["name"],
    }
    return CheckpointSeries(snaps, meta, task=cfg.make_task(), gate_path=path,
                            gate_span=(start, cfg.train.steps), source=str(run_dir))


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


def _build_config(config, source: str) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` (or ``SoftPriorConfig``) from an object, dict or JSON file."""
    if isinstance(config, HookedTransformerConfig):
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
        names = {f.name for f in dataclasses.fields(HookedTransformerConfig) if f.init}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(f"{source}: unknown HookedTransformerConfig fields {unknown}")
        try:
            if "dtype" in d:
                d["dtype"] = _as_torch_dtype(d["dtype"])
            return HookedTransformerConfig(**d)
        except (TypeError, ValueError, AssertionError) as e:
            raise CheckpointError(f"{source}: invalid HookedTransformerConfig: {e}") from None
    raise ValueError(
        "config= must be a HookedTransformerConfig (or SoftPriorConfig), a dict of its fields, "
        f"or a path to a JSON file with them; got {type(config).__name__}"
    )


def _new_model(cfg: HookedTransformerConfig, device: str = "cpu", *, shapes_only: bool = False) -> HookedTransformer:
    """An untrained model for ``cfg`` on ``device``; its weights are to be overwritten.

    Plain ``HookedTransformer``s skip the random init (``init_weights=False``), and with
    ``shapes_only`` are built on the meta device (no memory), for header checks.
    """
    if isinstance(cfg, SoftPriorConfig):
        return SoftPriorTransformer(dataclasses.replace(cfg, device=device))
    cfg = dataclasses.replace(cfg, init_weights=False, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        if shapes_only:
            with torch.device("meta"):
                return HookedTransformer(cfg, move_to_device=False)
        return HookedTransformer(cfg, move_to_device=False)


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
    expected = _new_model(cfg, shapes_only=True).state_dict()
    shapes = {k: _Shape(v.shape) for k, v in expected.items()}
    for f in files:  # eager, header-only validation
        check_state_dict({k: _Shape(s) for k, s in _peek_shapes(f).items()}, shapes, str(f))

    def loader(file: Path) -> Callable[[], nn.Module]:
        def load() -> nn.Module:
            sd = load_tensors(file)
            model = _new_model(cfg, device or "cpu")
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
# local Hugging Face models
# --------------------------------------------------------------------------------------
def _hf_config(model_dir: Path) -> dict | None:
    """The parsed ``config.json`` if ``model_dir`` looks like a transformers model directory."""
    f = model_dir / "config.json"
    if not f.is_file():
        return None
    try:
        d = read_json(f)
    except CheckpointError:
        return None
    if isinstance(d, dict) and ("model_type" in d or "architectures" in d) and not _RUN_KEYS <= set(d):
        return d
    return None


def _check_hf_dir(model_dir: Path, d: Mapping) -> str:
    arch = (d.get("architectures") or [None])[0]
    if arch not in SUPPORTED_HF_ARCHITECTURES:
        raise CheckpointError(
            f"{model_dir}: unsupported Hugging Face architecture {arch!r} (model_type "
            f"{d.get('model_type')!r}); supported: {list(SUPPORTED_HF_ARCHITECTURES)}"
        )
    if not any((model_dir / w).is_file() for w in _HF_WEIGHT_FILES):
        raise CheckpointError(f"{model_dir}: no weights (expected one of {list(_HF_WEIGHT_FILES)})")
    return arch


def load_hf_local(
    model_dir: str | Path,
    device: str = "cpu",
    *,
    process: bool = False,
    dtype: torch.dtype = torch.float32,
    tokenizer=None,
) -> HookedTransformer:
    """A ``HookedTransformer`` from a local ``transformers`` model directory, offline.

    ``model_dir`` holds ``config.json`` and weights written by ``save_pretrained``
    (e.g. one Pythia revision). Steps: ``AutoModelForCausalLM.from_pretrained(model_dir,
    local_files_only=True)``; TransformerLens's own config conversion
    (``loading_from_pretrained.get_pretrained_model_config``) run on a copy of
    ``config.json`` in a neutral temporary folder (TL picks some architectures by
    substrings of the *name*, such as "llama", so the real path is never shown to it)
    and its weight converter (``get_pretrained_state_dict(..., hf_model=...)``,
    e.g. ``convert_neox_weights``); then ``load_and_process_state_dict``.

    ``process=False`` (default) keeps the weights as trained (the
    ``from_pretrained_no_processing`` convention: logits equal the HF model's);
    ``process=True`` applies TL's default ``fold_ln``, ``center_writing_weights``,
    ``center_unembed``, ``fold_value_biases`` (same log-probs, different weights).
    A tokenizer is loaded from ``model_dir`` when tokenizer files are there (or pass
    ``tokenizer=``); otherwise the model takes token ids only. Architectures:
    :data:`SUPPORTED_HF_ARCHITECTURES`; anything else raises :class:`CheckpointError`.
    Requires the ``transformers`` package.
    """
    model_dir = Path(model_dir)
    d = _hf_config(model_dir)
    if d is None:
        raise CheckpointError(
            f"{model_dir}: not a local Hugging Face model directory (expected config.json with "
            "'model_type'/'architectures' and weights from save_pretrained)"
        )
    arch = _check_hf_dir(model_dir, d)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformer_lens import loading_from_pretrained as tl_loading
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"loading {model_dir} needs the 'transformers' package: {e}") from None

    try:
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=dtype)
    except Exception as e:
        raise CheckpointError(f"{model_dir}: transformers could not load the model: {e}") from None
    hf.eval()
    tmp = Path(tempfile.mkdtemp(prefix="circuitfade_hf_"))
    try:
        neutral = tmp / "model"
        neutral.mkdir()
        neutral_cfg = dict(d)
        if arch == "GPT2LMHeadModel" and "n_ctx" not in neutral_cfg:
            # transformers >= 5 no longer writes GPT-2's n_ctx; TL reads it (== n_positions)
            neutral_cfg["n_ctx"] = neutral_cfg.get("n_positions", 1024)
        (neutral / "config.json").write_text(json.dumps(neutral_cfg))
        cfg = tl_loading.get_pretrained_model_config(
            str(neutral), hf_cfg=hf.config.to_dict(), fold_ln=process, device=device, dtype=dtype,
            local_files_only=True,
        )
        if cfg.original_architecture != arch:
            raise CheckpointError(
                f"{model_dir}: TransformerLens read architecture {cfg.original_architecture!r}, config says {arch!r}"
            )
        cfg.model_name = model_dir.name
        cfg.tokenizer_name = None
        with torch.no_grad():
            sd = tl_loading.get_pretrained_state_dict(str(neutral), cfg, hf, dtype=dtype)
            sd = {k: v.detach().clone() for k, v in sd.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    del hf
    if tokenizer is None and any((model_dir / t).is_file() for t in _HF_TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as e:
            raise CheckpointError(f"{model_dir}: tokenizer files present but unreadable: {e}") from None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer, move_to_device=True)
    model.load_and_process_state_dict(
        sd, fold_ln=process, center_writing_weights=process, center_unembed=process, fold_value_biases=process,
    )
    return model.eval()


def _hf_series(dirs: list[Path], steps: list[int], device, metadata, source: str) -> CheckpointSeries:
    archs = set()
    for m in dirs:
        archs.add(_check_hf_dir(m, _hf_config(m)))  # eager: config and weights present

    def loader(m: Path) -> Callable[[], nn.Module]:
        return lambda: load_hf_local(m, device=device or "cpu")

    snaps = [Snapshot(s, loader(m), str(m)) for m, s in zip(dirs, steps)]
    if len(archs) == 1:
        metadata = {"architecture": archs.pop(), **metadata}
    return CheckpointSeries(snaps, metadata, source=source)


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


# --------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------
def _metric_items(metrics) -> list[tuple[str, Callable[..., MetricOutput]]]:
    if isinstance(metrics, Mapping):
        items = [(str(k), f) for k, f in metrics.items()]
    elif callable(metrics):
        items = [(_fn_name(metrics), metrics)]
    elif isinstance(metrics, Iterable):
        items = [(_fn_name(f), f) for f in metrics]
    else:
        raise ValueError(f"metrics must be a dict {{name: fn}} or a list of functions, got {type(metrics).__name__}")
    if not items:
        raise ValueError("no metrics given")
    for name, f in items:
        if not callable(f):
            raise ValueError(f"metric {name!r} is not callable: {f!r}")
    names = [n for n, _ in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate metric names {dup}; pass a dict {{name: fn}}")
    return items


def _fn_name(f) -> str:
    while hasattr(f, "func"):  # functools.partial
        f = f.func
    return getattr(f, "__name__", type(f).__name__)


def _n_args(fn) -> int:
    """How many of (model, batch, task) to pass positionally (see :func:`trace`)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 3
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(pos) >= 3 and (pos[2].default is inspect.Parameter.empty or pos[2].name == "task"):
        return 3
    return max(1, min(len(pos), 2))


def _rows(name: str, out, model, step: int) -> pd.DataFrame:
    """Tidy rows (layer, head, metric, value, extra...) for one metric output."""
    if isinstance(out, pd.DataFrame):
        if "value" not in out.columns:
            raise ValueError(f"metric {name!r} returned a DataFrame without a 'value' column: {list(out.columns)}")
        df = out.copy()
        if "metric" not in df.columns:
            df["metric"] = name
        for c in ("layer", "head"):
            df[c] = df[c].astype("Int64") if c in df.columns else pd.array([pd.NA] * len(df), dtype="Int64")
        df = df.drop(columns=[c for c in ("step",) if c in df.columns])
        return df
    if isinstance(out, Mapping):
        return pd.concat([_rows(f"{name}.{k}", v, model, step) for k, v in out.items()], ignore_index=True)
    if isinstance(out, np.ndarray):
        out = torch.from_numpy(out)
    if isinstance(out, Tensor):
        out = out.detach().float().cpu()
        if out.ndim == 0:
            out = float(out)
        elif out.ndim == 2:
            cfg = getattr(model, "cfg", None)
            want = (getattr(cfg, "n_layers", out.shape[0]), getattr(cfg, "n_heads", out.shape[1]))
            if tuple(out.shape) != tuple(want):
                raise ValueError(
                    f"metric {name!r} at step {step} returned a tensor of shape {tuple(out.shape)}; "
                    f"expected [n_layers, n_heads] = {list(want)}"
                )
            L, H = out.shape
            return pd.DataFrame({
                "layer": pd.array(np.repeat(np.arange(L), H), dtype="Int64"),
                "head": pd.array(np.tile(np.arange(H), L), dtype="Int64"),
                "metric": name,
                "value": out.reshape(-1).numpy().astype(float),
            })
        else:
            raise ValueError(
                f"metric {name!r} at step {step} returned a tensor of shape {tuple(out.shape)}; expected a "
                "scalar or [n_layers, n_heads]"
            )
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        return pd.DataFrame({"layer": pd.array([pd.NA], dtype="Int64"), "head": pd.array([pd.NA], dtype="Int64"),
                             "metric": [name], "value": [float(out)]})
    raise ValueError(
        f"metric {name!r} at step {step} returned {type(out).__name__}; expected a float, a tensor "
        "[n_layers, n_heads], a mapping of those, or a DataFrame with a 'value' column"
    )


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


def trace(
    series: CheckpointSeries,
    metrics: Mapping[str, Callable[..., MetricOutput]] | Sequence[Callable[..., MetricOutput]],
    task: Task | None = None,
    *,
    batch: Batch | Int[Tensor, "batch pos"] | None = None,
    n: int = 512,
    seed: int = EVAL_SEED,
    progress: bool = True,
    skip_errors: tuple[type[BaseException], ...] = (NoGates,),
    grad: bool = False,
    **kwargs,
) -> pd.DataFrame:
    """Evaluate ``metrics`` on every snapshot of ``series`` into one tidy DataFrame.

    The data: ``batch`` if given, else ``eval_set(task, n, seed)`` built once, where
    ``task`` defaults to ``series.task`` (the default ``seed`` is the trainer's eval
    seed, so a circuitfade run is traced on its own eval set); with neither, metrics
    get ``batch=None`` (weight-only metrics). A :class:`Batch` is moved to each
    model's device.

    Metric protocol: ``metrics`` is a dict ``{name: fn}`` or a list of functions (named
    by ``__name__``). Each is called as ``fn(model, batch, task, **kwargs)``; ``task``
    is passed only if ``fn`` has a third positional parameter that is named ``task``
    or has no default (or takes ``*args``), and ``batch`` only if it has a second, so
    analysis functions ``f(model, batch, *, ...)`` can be used directly. Calls run
    under ``torch.no_grad()`` unless ``grad=True``. ``fn`` returns

    * a number or 0-d tensor -> one row, ``layer`` and ``head`` NA;
    * a tensor ``Float[Tensor, "layer head"]`` of shape ``[n_layers, n_heads]`` ->
      one row per head;
    * a mapping ``{key: one of these}`` -> rows with metric ``"{name}.{key}"``;
    * a DataFrame with a ``value`` column (optional ``metric`` (default ``name``),
      ``layer``, ``head``, and any extra columns, which are kept).

    If ``fn`` raises one of ``skip_errors`` (default :class:`NoGates`), one row with
    ``value = NaN`` and ``note`` = ``"no gates"`` (or ``"<ErrorType>: <message>"``)
    is recorded instead.

    Returns:
        DataFrame with columns ``step`` (int64), ``layer``, ``head`` (nullable
        ``Int64``, ``<NA>`` for model-level metrics), ``metric`` (str), ``value``
        (float), ``note`` (``None`` unless skipped), any extra columns from
        DataFrame metrics, then one column per ``series.metadata`` key (constant).
    """
    if not isinstance(series, CheckpointSeries):
        raise ValueError(f"trace expects a CheckpointSeries (see attach()), got {type(series).__name__}")
    items = [(name, fn, _n_args(fn)) for name, fn in _metric_items(metrics)]
    task = task if task is not None else series.task
    if batch is None and task is not None:
        batch = eval_set(task, n=n, seed=seed)
    frames: list[pd.DataFrame] = []
    bar = tqdm(series, total=len(series), disable=not progress, desc=str(series.metadata.get("run", "trace")),
               leave=False)
    for step, model in bar:
        dev = _model_device(model)
        b = batch.to(dev) if isinstance(batch, (Batch, Tensor)) and dev is not None else batch
        args = (model, b, task)
        for name, fn, k in items:
            try:
                with torch.set_grad_enabled(grad):
                    out = fn(*args[:k], **kwargs)
                df = _rows(name, out, model, step)
                if "note" not in df.columns:
                    df["note"] = None
            except skip_errors as e:
                note = "no gates" if isinstance(e, NoGates) else f"{type(e).__name__}: {e}"
                df = pd.DataFrame({"layer": pd.array([pd.NA], dtype="Int64"),
                                   "head": pd.array([pd.NA], dtype="Int64"),
                                   "metric": [name], "value": [math.nan], "note": [note]})
            df.insert(0, "step", step)
            frames.append(df)
        del model
    bar.close()
    if frames:
        out = pd.concat(frames, ignore_index=True)
    else:
        out = pd.DataFrame({"step": pd.Series(dtype="int64"), "layer": pd.Series(dtype="Int64"),
                            "head": pd.Series(dtype="Int64"), "metric": pd.Series(dtype=object),
                            "value": pd.Series(dtype=float), "note": pd.Series(dtype=object)})
    out["step"] = out["step"].astype("int64")
    out["value"] = out["value"].astype(float)
    for c in ("layer", "head"):
        out[c] = out[c].astype("Int64")
    extra = [c for c in out.columns if c not in TRACE_COLUMNS]
    out = out[list(TRACE_COLUMNS) + extra]
    for k, v in series.metadata.items():
        if k not in out.columns:
            out[k] = [v] * len(out)
    return out
