"""trace(): metric functions over a series into one tidy DataFrame; the metric protocol."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor
from tqdm import tqdm

from circuitfade.gating.evaluation import NoGatesError
from circuitfade.model.devices import resolve_device, to_device
from circuitfade.tasks import Batch, Task, eval_set
from circuitfade.train.loop import EVAL_SEED

from .series import CheckpointSeries

TRACE_COLUMNS: tuple[str, ...] = ("step", "layer", "head", "metric", "value", "note")
"""Leading columns of every :func:`trace` DataFrame (metadata columns follow)."""

PerHead = Float[Tensor, "layer head"]
"""A per-head metric value: shape ``[n_layers, n_heads]``."""

MetricOutput = float | PerHead | Mapping | pd.DataFrame
"""What a :func:`trace` metric returns (see :func:`trace`)."""

# Raised by a metric that needs gates when given a model without any: trace() records
# such a metric as one row with value NaN and note "no gates" (see skip_errors).
NoGates = NoGatesError


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
    device: str | None = None,
    **kwargs,
) -> pd.DataFrame:
    """Evaluate ``metrics`` on every snapshot of ``series`` into one tidy DataFrame.

    The data: ``batch`` if given, else ``eval_set(task, n, seed)`` built once, where
    ``task`` defaults to ``series.task`` (the default ``seed`` is the trainer's eval
    seed, so a circuitfade run is traced on its own eval set); with neither, metrics
    get ``batch=None`` (weight-only metrics). A :class:`Batch` is moved to each
    model's device. ``device`` (``"cpu"``, ``"cuda"``, ``"mps"``, ``"auto"``) moves each
    snapshot's model there first (default: where the series put it).

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
    if device is not None:
        resolve_device(device)  # fails before any work if the device is not here
    for step, model in bar:
        model = to_device(model, device)
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
