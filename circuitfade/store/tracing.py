"""trace(): metric functions over a series into one tidy DataFrame; the metric protocol."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor

from circuitfade.gating.evaluation import NoGatesError
from circuitfade.model.devices import keep_freed_memory, resolve_device, to_device
from circuitfade.tasks import EVAL_SEED, EVAL_SIZE, Batch, Task, as_task, eval_set

from .series import CheckpointSeries

TRACE_COLUMNS: tuple[str, ...] = ("step", "layer", "head", "metric", "value", "se", "lo", "hi", "note")
"""Leading columns of every :func:`trace` DataFrame (metadata columns follow).

``se, lo, hi``: the standard error and the interval of ``value`` when the metric
provides them (NaN otherwise); see each metric for its method. The column ``head`` is
the head index (read it as ``df["head"]``: ``df.head`` is the DataFrame method)."""

INTERVAL_COLUMNS = ("se", "lo", "hi")

INPUTS = ("model", "batch", "task")
"""What a metric may ask for, in the order it is passed."""

PerHead = Float[Tensor, "layer head"]
"""A per-head metric value: shape ``[n_layers, n_heads]``."""

MetricOutput = float | PerHead | Mapping | pd.DataFrame
"""What a :func:`trace` metric returns (see :func:`trace`)."""

# Raised by a metric that needs gates when given a model without any: trace() records
# such a metric as one row with value NaN and note "no gates" (see skip_errors).
NoGates = NoGatesError


def head_label(layer: int, head: int) -> str:
    """``"L{layer}H{head}"``, the paper's name for a head (e.g. ``L1H3``); the one head label."""
    return f"L{int(layer)}H{int(head)}"


def per_head_frame(
    values: Float[Tensor, "layer head"],
    metric: str,
    *,
    se=None,
    lo=None,
    hi=None,
    boot=None,
) -> pd.DataFrame:
    """A ``[layer, head]`` tensor as tidy rows ``layer, head, metric, value`` (the one helper).

    Rows are layer-major (``L0H0, L0H1, ...``); ``value`` is float. Optional
    ``se``, ``lo``, ``hi`` (each ``[layer, head]``) become columns of the same names;
    ``boot`` (``[resamples, layer, head]``) becomes a column ``boot`` holding each head's
    resampled values as a float array (what the consolidation timeline resamples).
    """
    t = values.detach() if isinstance(values, Tensor) else torch.tensor(np.array(values, dtype=float))
    if t.dim() != 2:
        raise ValueError(f"values: expected a [layer, head] tensor, got shape {tuple(t.shape)}")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"metric: expected a non-empty str, got {metric!r}")
    L, H = t.shape
    out = pd.DataFrame({
        "layer": np.repeat(np.arange(L), H),
        "head": np.tile(np.arange(H), L),
        "metric": metric,
        "value": t.reshape(-1).double().cpu().numpy(),
    })
    for name, v in (("se", se), ("lo", lo), ("hi", hi)):
        if v is not None:
            a = np.asarray(torch.as_tensor(v).detach().double().cpu() if isinstance(v, Tensor) else v, dtype=float)
            if a.shape != (L, H):
                raise ValueError(f"{name}: expected shape {(L, H)}, got {a.shape}")
            out[name] = a.reshape(-1)
    if boot is not None:
        b = np.asarray(boot, dtype=np.float32)
        if b.ndim != 3 or b.shape[1:] != (L, H):
            raise ValueError(f"boot: expected shape [resamples, {L}, {H}], got {b.shape}")
        flat = b.reshape(b.shape[0], -1)
        out["boot"] = [flat[:, i].copy() for i in range(L * H)]
    return out


# --------------------------------------------------------------------------------------
# the metric protocol
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A function to trace, with what it takes stated explicitly.

    ``fn`` is called as ``fn(*[inputs...], **kwargs)`` where ``inputs`` is an ordered
    subset of ``("model", "batch", "task")`` (default: all three), e.g.
    ``Metric(f, inputs=("model",))`` for a weight-only metric ``f(model)``.
    ``name``: the metric name in the trace (default ``fn.metric_name``, else
    ``fn.__name__``).

    A plain function passed to :func:`trace` is read the same way: its inputs are its
    ``metric_inputs`` attribute if it has one (the analysis functions declare theirs),
    else all three. Nothing is inferred from signatures.
    """

    fn: Callable[..., MetricOutput]
    name: str | None = None
    inputs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ValueError(f"metric: {self.fn!r} is not callable")
        inputs = self.inputs if self.inputs is not None else getattr(self.fn, "metric_inputs", INPUTS)
        inputs = (inputs,) if isinstance(inputs, str) else tuple(inputs)
        bad = [i for i in inputs if i not in INPUTS] or ([] if len(set(inputs)) == len(inputs) else list(inputs))
        if bad or not inputs or inputs[0] != "model":
            raise ValueError(f"metric inputs: expected 'model' then any of 'batch', 'task' (in that order), got {inputs}")
        if list(inputs) != sorted(inputs, key=INPUTS.index):
            raise ValueError(f"metric inputs: expected the order {INPUTS}, got {inputs}")
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "name", str(self.name) if self.name is not None else _fn_name(self.fn))

    @property
    def needs_data(self) -> bool:
        return "batch" in self.inputs or "task" in self.inputs

    def __call__(self, model, batch, task, **kwargs) -> MetricOutput:
        given = {"model": model, "batch": batch, "task": task}
        return self.fn(*[given[i] for i in self.inputs], **kwargs)


def metric(fn: Callable | None = None, *, name: str | None = None, inputs: Sequence[str] | str | None = None):
    """``Metric(fn, name, inputs)``; also a decorator (``@metric(inputs=("model", "batch"))``)."""
    if fn is None:
        return lambda f: Metric(f, name, inputs)
    return Metric(fn, name, inputs)


def _as_metric(f, name: str | None = None) -> Metric:
    if not callable(f):
        raise ValueError(f"metric {name or f!r} is not callable: {f!r}")
    if isinstance(f, Metric):
        return f if name is None or f.name == name else Metric(f.fn, name, f.inputs)
    return Metric(f, name)


def _metric_items(metrics) -> list[Metric]:
    if isinstance(metrics, Mapping):
        items = [_as_metric(f, str(k)) for k, f in metrics.items()]
    elif callable(metrics):
        items = [_as_metric(metrics)]
    elif isinstance(metrics, Iterable):
        items = [_as_metric(f) for f in metrics]
    else:
        raise ValueError(f"metrics must be a dict {{name: fn}} or a list of functions, got {type(metrics).__name__}")
    if not items:
        raise ValueError("no metrics given")
    names = [m.name for m in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate metric names {dup}; pass a dict {{name: fn}}")
    return items


def _fn_name(f) -> str:
    name = getattr(f, "metric_name", None)
    if isinstance(name, str) and name:
        return name
    while hasattr(f, "func"):  # functools.partial
        f = f.func
    return getattr(f, "metric_name", None) or getattr(f, "__name__", type(f).__name__)


def _na_heads(n: int) -> dict:
    return {"layer": pd.array([pd.NA] * n, dtype="Int64"), "head": pd.array([pd.NA] * n, dtype="Int64")}


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
            return per_head_frame(out, name)
        else:
            raise ValueError(
                f"metric {name!r} at step {step} returned a tensor of shape {tuple(out.shape)}; expected a "
                "scalar or [n_layers, n_heads]"
            )
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        return pd.DataFrame({**_na_heads(1), "metric": [name], "value": [float(out)]})
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
    task: Task | str | Mapping | Batch | None = None,
    *,
    batch: Batch | Int[Tensor, "batch pos"] | None = None,
    n: int = EVAL_SIZE,
    seed: int = EVAL_SEED,
    progress: bool = True,
    skip_errors: tuple[type[BaseException], ...] = (NoGates,),
    grad: bool = False,
    device: str | None = None,
    **kwargs,
) -> pd.DataFrame:
    """Evaluate ``metrics`` on every snapshot of ``series`` into one tidy DataFrame.

    The data: ``batch`` if given, else ``eval_set(task, n, seed)`` built once (the
    package's one evaluation convention by default: :data:`~circuitfade.tasks.EVAL_SIZE`
    examples, :data:`~circuitfade.tasks.EVAL_SEED`, the set the trainer logs
    ``metrics.csv`` on). ``task`` defaults to ``series.task`` and may be a
    :class:`Task`, a task name (``"assoc"``), a dict ``{"name": ..., **config}`` or a
    user's own :class:`Batch` (then exactly that batch is the data; see
    :meth:`Batch.from_answers`). A :class:`Batch` given as ``batch=`` without a task is
    its own task too (:class:`~circuitfade.tasks.BatchTask`: accuracy and loss on its
    targets), so ``trace(series, [head_diagnostics], batch=my_batch)`` works. A
    :class:`Batch` is moved to each model's device. If a metric needs data and there is
    neither task nor batch, ``ValueError``: "this series has no task; pass task=".
    Progress: :func:`progress_bar`. ``device``
    (``"cpu"``, ``"cuda"``, ``"mps"``, ``"auto"``) moves each snapshot's model there
    first (default: where the series put it). Like the trainers, ``trace`` lets the C
    allocator reuse freed tensor memory (:func:`~circuitfade.model.devices.keep_freed_memory`,
    once per process; ``CIRCUITFADE_KEEP_HEAP=0`` turns it off): each checkpoint's forwards
    allocate and free the same few-MiB activations, which otherwise fault in fresh pages.

    Metric protocol (explicit, see :class:`Metric`): ``metrics`` is a dict ``{name: fn}``
    or a list of functions / :class:`Metric` objects. Each is called with the inputs it
    declares (``Metric.inputs`` or the function's ``metric_inputs`` attribute; default
    ``(model, batch, task)``) plus ``**kwargs``, under ``torch.no_grad()`` unless
    ``grad=True``. Its name is ``Metric.name``, the dict key, ``fn.metric_name`` or
    ``fn.__name__``. ``fn`` returns

    * a number or 0-d tensor -> one row, ``layer`` and ``head`` NA;
    * a tensor ``Float[Tensor, "layer head"]`` of shape ``[n_layers, n_heads]`` ->
      one row per head;
    * a mapping ``{key: one of these}`` -> rows with metric ``"{name}.{key}"``;
    * a DataFrame with a ``value`` column (optional ``metric`` (default ``name``),
      ``layer``, ``head``, ``se``, ``lo``, ``hi`` and any extra columns, which are kept).

    If ``fn`` raises one of ``skip_errors`` (default :class:`NoGates`), one row with
    ``value = NaN`` and ``note`` = ``"no gates"`` (or ``"<ErrorType>: <message>"``)
    is recorded instead.

    Returns:
        DataFrame with columns ``step`` (int64), ``layer``, ``head`` (nullable
        ``Int64``, ``<NA>`` for model-level metrics; the head index, read as
        ``df["head"]``), ``metric`` (str), ``value``, ``se``, ``lo``, ``hi`` (float; the
        interval columns are NaN for metrics that give none), ``note`` (``None`` unless
        skipped), any extra columns from DataFrame metrics (e.g. ``boot``: resampled
        values), then one column per ``series.metadata`` key (constant).
    """
    if not isinstance(series, CheckpointSeries):
        raise ValueError(f"trace expects a CheckpointSeries (see attach()), got {type(series).__name__}")
    items = _metric_items(metrics)
    task = as_task(task if task is not None else series.task)
    if task is None and isinstance(batch, Batch):
        task = as_task(batch)  # a Batch carries its targets: scored as its own task (BatchTask)
    if batch is None and task is not None:
        batch = eval_set(task, n=n, seed=seed)
    if batch is None and any(m.needs_data for m in items):
        need = [m.name for m in items if m.needs_data]
        raise ValueError(
            f"{series.source}: this series has no task; pass task= (a task name such as 'assoc', a dict, a Task, "
            f"or your own Batch) or batch= to trace {need}"
        )
    frames: list[pd.DataFrame] = []
    keep_freed_memory()
    bar = progress_bar(series, total=len(series), disable=not progress,
                       desc=str(series.metadata.get("run", "trace")), leave=False)
    if device is not None:
        resolve_device(device)  # fails before any work if the device is not here
    for step, model in bar:
        model = to_device(model, device)
        dev = _model_device(model)
        b = batch
        if isinstance(batch, (Batch, Tensor)) and dev is not None and batch.device != dev:
            b = batch.to(dev)  # once per device change, not a copy per snapshot
        for m in items:
            try:
                with torch.set_grad_enabled(grad):
                    out = m(model, b, task, **kwargs)
                df = _rows(m.name, out, model, step)
                if "note" not in df.columns:
                    df["note"] = None
            except skip_errors as e:
                note = "no gates" if isinstance(e, NoGates) else f"{type(e).__name__}: {e}"
                df = pd.DataFrame({**_na_heads(1), "metric": [m.name], "value": [math.nan], "note": [note]})
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
    for c in ("value",) + INTERVAL_COLUMNS:
        out[c] = out[c].astype(float) if c in out.columns else math.nan
    for c in ("layer", "head"):
        out[c] = out[c].astype("Int64")
    extra = [c for c in out.columns if c not in TRACE_COLUMNS]
    out = out[list(TRACE_COLUMNS) + extra]
    for k, v in series.metadata.items():
        if k not in out.columns:
            out[k] = [v] * len(out)
    return out


# --------------------------------------------------------------------------------------
# progress bars
# --------------------------------------------------------------------------------------
def progress_bar(iterable=None, **kwargs):
    """A ``tqdm`` progress bar: the notebook widget inside Jupyter when ``ipywidgets`` is
    installed (``pip install ipywidgets``), else the text bar. Unlike ``tqdm.auto`` it never
    warns "IProgress not found" in a notebook without ``ipywidgets``."""
    import sys

    bar = None
    if "ipykernel.zmqshell" in sys.modules:
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as bar
        except ImportError:
            bar = None
    if bar is None:
        from tqdm.std import tqdm as bar
    return bar(iterable, **kwargs)


# --------------------------------------------------------------------------------------
# traces on disk
# --------------------------------------------------------------------------------------
TRACE_FORMAT = "circuitfade-trace"
"""The ``format`` field of the JSON file :func:`save_trace` writes beside a CSV trace."""

_ARRAY = "array:"


def _schema_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _is_na(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _column_kind(name: str, col: pd.Series) -> str:
    """How a column is written: ``array:<dtype>`` for a column of numpy arrays (``boot``);
    ``text:<dtype>`` for text with missing values (written as is, missing as an empty
    cell); ``json:<dtype>`` for other object columns (and text holding empty strings),
    one JSON value per cell; else its pandas dtype name."""
    if col.dtype != object and not pd.api.types.is_string_dtype(col.dtype):
        return str(col.dtype)
    vals = [v for v in col if not _is_na(v)]
    if vals and all(isinstance(v, np.ndarray) for v in vals):
        dts = {v.dtype.str for v in vals}
        if len(dts) != 1 or any(v.ndim != 1 for v in vals):
            raise ValueError(f"save_trace: column {name!r} holds arrays of several dtypes or shapes")
        return _ARRAY + vals[0].dtype.name
    if all(isinstance(v, str) and v != "" for v in vals):
        return f"text:{col.dtype}"
    return f"json:{col.dtype}"


def _jsonable(name: str, v):
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if v is pd.NA:
        return None
    raise ValueError(f"save_trace: column {name!r} holds a {type(v).__name__} ({v!r}); expected str, numbers or None")


def save_trace(traced: pd.DataFrame, path: str | Path) -> Path:
    """Write a trace so that :func:`load_trace` gives back every column with its values and dtypes.

    * ``.parquet``: one Parquet file (needs ``pyarrow``);
    * anything else (``.csv``): a CSV file plus ``<name>.json`` beside it recording each
      column's dtype. Floats are written in shortest round-trip form (bit-exact), the
      resampled-value arrays of ``boot`` as JSON lists (exact for float32), text and
      ``None`` cells (``note``) as JSON strings, so nothing turns into text or NaN.

    Both files are written atomically. Returns ``path``. A plain ``df.to_csv`` /
    ``pd.read_csv`` round trip turns ``boot`` into strings, and the consolidation
    timeline then refuses it.
    """
    from circuitfade.io import atomic_write, write_json

    if not isinstance(traced, pd.DataFrame):
        raise ValueError(f"save_trace: expected a trace DataFrame, got {type(traced).__name__}")
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ValueError(f"{path}: writing Parquet needs pyarrow (pip install pyarrow), or save as .csv") from None
        import io as _io

        buf = _io.BytesIO()
        traced.to_parquet(buf, index=False)
        return atomic_write(path, buf.getvalue())
    kinds = {c: _column_kind(str(c), traced[c]) for c in traced.columns}
    out = pd.DataFrame(index=traced.index)
    for c, kind in kinds.items():
        col = traced[c]
        if kind.startswith(_ARRAY):
            out[c] = [None if not isinstance(v, np.ndarray) else json.dumps([float(x) for x in v]) for v in col]
        elif kind.startswith("json:"):
            out[c] = [json.dumps(None if _is_na(v) else _jsonable(str(c), v)) for v in col]
        elif kind.startswith("text:"):
            out[c] = ["" if _is_na(v) else v for v in col]
        elif kind.startswith(("float", "Float")):
            out[c] = [("" if pd.isna(v) else repr(float(v))) for v in col]
        else:
            out[c] = col.astype(object).where(col.notna(), "")
    atomic_write(path, out.to_csv(index=False).encode())
    write_json(_schema_path(path), {"format": TRACE_FORMAT, "version": 1, "rows": len(traced),
                                    "columns": [[str(c), k] for c, k in kinds.items()]})
    return path


def load_trace(path: str | Path) -> pd.DataFrame:
    """A trace written by :func:`save_trace`, column for column (dtypes, ``None`` notes and
    ``boot`` arrays included). ``ValueError`` naming the file when it, or the JSON file beside a
    CSV, is missing, not a saved trace, or does not match."""
    from circuitfade.io import check_file, read_json

    path = check_file(path)
    if path.suffix.lower() == ".parquet":
        try:
            return pd.read_parquet(path)
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    schema_file = _schema_path(path)
    if not schema_file.is_file():
        raise ValueError(f"{path}: no {schema_file.name} beside it; a trace saved with save_trace has one "
                         "(a CSV written by DataFrame.to_csv cannot be read back exactly)")
    schema = read_json(schema_file)
    if not isinstance(schema, dict) or schema.get("format") != TRACE_FORMAT:
        raise ValueError(f"{schema_file}: not a circuitfade trace schema (format {TRACE_FORMAT!r})")
    cols = [(str(c), str(k)) for c, k in schema["columns"]]
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable CSV trace ({e})") from None
    if list(raw.columns) != [c for c, _ in cols] or len(raw) != schema.get("rows"):
        raise ValueError(f"{path}: columns or row count differ from {schema_file.name} (columns "
                         f"{list(raw.columns)[:8]}, {len(raw)} rows; expected {[c for c, _ in cols][:8]}, "
                         f"{schema.get('rows')} rows)")
    out = {}
    try:
        for c, kind in cols:
            text = raw[c]
            if kind.startswith(_ARRAY):
                dt = np.dtype(kind[len(_ARRAY):])
                out[c] = pd.Series([None if t == "" else np.asarray(json.loads(t), dtype=dt) for t in text],
                                   dtype=object)
            elif kind.startswith(("json:", "text:")):
                vals = [json.loads(t) for t in text] if kind.startswith("json:") else [t or None for t in text]
                out[c] = pd.Series(vals, dtype=object).astype(kind.split(":", 1)[1])
            elif kind.startswith(("float", "Float")):
                out[c] = pd.Series([math.nan if t == "" else float(t) for t in text]).astype(kind)
            elif kind in ("bool", "boolean"):
                out[c] = pd.Series([None if t == "" else t == "True" for t in text], dtype=object).astype(kind)
            else:
                out[c] = pd.Series([None if t == "" else t for t in text], dtype=object).astype(kind)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: column {c!r} does not read back as {kind} ({e})") from None
    return pd.DataFrame(out)
