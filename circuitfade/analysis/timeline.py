"""When do circuits consolidate? Threshold crossings in traced head metrics (paper Table 3).

Input is a tidy trace: one row per ``(group..., step, layer, head, metric)`` with a
``value`` column, where the group columns (``run``, ``path``, ``seed``, ...) identify
one checkpoint series - what :func:`circuitfade.store.trace` produces from
:func:`circuitfade.analysis.heads.head_diagnostics`. Definitions:

* *top head at a step*: the head with the largest value of the metric at that step
  (ties broken by the lowest layer, then the lowest head; NaN values are ignored);
* *first crossing*: the first step at which the top head's value is ``>= threshold``,
  i.e. the first step at which any head reaches the threshold, and which head that is;
* *top head* of a series: the top head at the series' final step (the last step at
  which the metric was measured) - "which head carries the circuit once consolidated";
  :func:`timeline_long` also reports the *peak* head (largest value over all steps);
* *after gate zero*: ``first_step >= gate_zero_step`` (the step at which the prior's
  gate reached zero, e.g. 1050 for ``fade600->0``).

Uncertainty (:func:`timeline_long` columns, see there):

* *spread of the first crossing*: the same definitions applied to each bootstrap
  resample of the evaluation examples (the ``boot`` column that
  :func:`~circuitfade.analysis.heads.head_diagnostics` writes; resample ``r`` is one
  alternative evaluation set, shared by every head and step), giving
  ``first_step_lo/hi`` (percentile interval of the crossing step), ``cross_rate``
  (fraction of resamples that cross at all) and ``after_gate_zero_rate``;
* *agreement*: how often the resamples name the same first-crossing head and the same
  top head as the point estimate;
* *margin*: the top head's value minus the runner-up's (at the first crossing and at
  the final step); a margin inside the heads' intervals means the ranking is a coin flip;
* *noise floor*: the largest value of the metric over heads at step 0 (the untrained
  model, on the same evaluation) and its upper interval bound. A crossing whose value
  is not above ``noise_floor_hi`` (or a threshold the untrained model already reaches)
  is reported as ``crossing = "within noise floor"``.

Heads are named ``"L{layer}H{head}"`` (:func:`circuitfade.store.tracing.head_label`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from circuitfade.analysis.heads import ABLATION_IMPORTANCE, SUCCESSOR_MASS
from circuitfade.stats import DEFAULT_LEVEL
from circuitfade.store.tracing import head_label

__all__ = ["DEFAULT_THRESHOLDS", "UNCERTAINTY_COLUMNS", "consolidation_timeline", "timeline_long", "top_heads"]

DEFAULT_THRESHOLDS = {SUCCESSOR_MASS: 0.25, ABLATION_IMPORTANCE: 0.03}
"""The paper's thresholds (Table 3): successor mass >= .25, ablation accuracy drop >= .03."""

DEFAULT_BY = ("run", "path", "seed")
REQUIRED = ("step", "layer", "head", "metric", "value")


def _resolve_by(traced: pd.DataFrame, by: Sequence[str] | str | None) -> list[str]:
    if not isinstance(traced, pd.DataFrame):
        raise ValueError(f"traced: expected a pandas DataFrame, got {type(traced).__name__}")
    missing = [c for c in REQUIRED if c not in traced.columns]
    if missing:
        raise ValueError(f"traced: expected columns {list(REQUIRED)} plus group columns, missing {missing}")
    if "boot" in traced.columns and traced["boot"].map(lambda b: isinstance(b, str)).any():
        raise ValueError(
            "traced: the 'boot' column holds text, not arrays of resampled values (a trace written with "
            "DataFrame.to_csv and read with pandas.read_csv?), so no interval could be computed; write and read "
            "traces with circuitfade.store.save_trace / load_trace"
        )
    if by is None:
        return [c for c in DEFAULT_BY if c in traced.columns]
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by if c not in traced.columns]
    if missing:
        raise ValueError(f"by: columns {missing} are not in the trace (columns: {list(traced.columns)})")
    clash = [c for c in by if c in REQUIRED or c == "gate_zero_step"]
    if clash:
        raise ValueError(f"by: {clash} cannot be group columns")
    return by


def _head_rows(traced: pd.DataFrame, by: list[str], metrics: Sequence[str]) -> pd.DataFrame:
    """Rows of ``metrics`` with a value, checked for duplicates."""
    rows = traced[traced["metric"].isin(list(metrics))]
    rows = rows[rows["value"].notna()]
    if rows[["layer", "head", "step"]].isna().any().any():
        raise ValueError("traced: head metrics need non-missing step, layer and head")
    key = by + ["metric", "step", "layer", "head"]
    dup = rows.duplicated(key)
    if dup.any():
        example = rows.loc[dup, key].iloc[0].to_dict()
        raise ValueError(
            f"traced: several rows for the same {key}, e.g. {example}; "
            "add the column that tells them apart to `by`"
        )
    return rows


def top_heads(
    traced: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    *,
    by: Sequence[str] | str | None = None,
) -> pd.DataFrame:
    """The top head of each metric at each step of each series.

    ``metrics``: which metrics (default: every metric whose rows all have a layer and
    a head, so per-run scalars such as accuracy are skipped). ``by``: group columns
    (default: those of ``run``, ``path``, ``seed`` present in the trace).

    Returns columns ``*by, metric, step, layer, head, head_label, value``, one row per
    (group, metric, step), where ``layer, head`` is the head with the largest ``value``
    (ties: lowest layer, then lowest head; NaN values ignored).
    """
    by = _resolve_by(traced, by)
    if metrics is None:
        has_head = traced[["layer", "head"]].notna().all(axis=1).groupby(traced["metric"]).all()
        metrics = list(has_head[has_head].index)
    rows = _head_rows(traced, by, metrics)
    order = rows.sort_values(
        by + ["metric", "step", "value", "layer", "head"],
        ascending=[True] * len(by) + [True, True, False, True, True],
        kind="mergesort",
    )
    top = order.groupby(by + ["metric", "step"], sort=True, dropna=False).head(1)
    top = top[by + ["metric", "step", "layer", "head", "value"]].reset_index(drop=True)
    top["layer"] = top["layer"].astype(int)
    top["head"] = top["head"].astype(int)
    top.insert(len(by) + 4, "head_label", [head_label(l, h) for l, h in zip(top["layer"], top["head"])])
    return top


def _group_keys(traced: pd.DataFrame, by: list[str]) -> list[tuple]:
    if not by:
        return [()]
    return list(traced[by].drop_duplicates().itertuples(index=False, name=None))


def _gate_zero_steps(traced, by, keys, gate_zero_step) -> dict[tuple, object]:
    """``{group key: gate-zero step or pd.NA}`` from the trace column or the argument."""
    if "gate_zero_step" in traced.columns:
        if gate_zero_step is not None:
            raise ValueError(
                "gate_zero_step: the trace already has a gate_zero_step column; pass gate_zero_step=None"
            )
        out = {}
        groups = traced.groupby(by, dropna=False) if by else [((), traced)]
        for key, frame in groups:
            key = key if isinstance(key, tuple) else (key,)
            values = frame["gate_zero_step"].dropna().unique()
            if len(values) > 1:
                raise ValueError(
                    f"traced: group {dict(zip(by, key))} has several gate_zero_step values {sorted(values)}"
                )
            out[key] = int(values[0]) if len(values) else pd.NA
        return out
    if gate_zero_step is None:
        return {k: pd.NA for k in keys}
    if isinstance(gate_zero_step, Mapping):
        out = {}
        for k in keys:
            if k in gate_zero_step:
                v = gate_zero_step[k]
            elif len(k) == 1 and k[0] in gate_zero_step:
                v = gate_zero_step[k[0]]
            else:
                v = None
            out[k] = pd.NA if v is None or pd.isna(v) else int(v)
        return out
    if isinstance(gate_zero_step, bool) or not isinstance(gate_zero_step, int):
        raise ValueError(
            f"gate_zero_step: expected None, an int or a mapping group -> int, got {gate_zero_step!r}"
        )
    return {k: gate_zero_step for k in keys}


UNCERTAINTY_COLUMNS = (
    "first_step_lo", "first_step_hi", "cross_rate", "first_head_agreement", "first_margin",
    "top_agreement", "top_margin", "noise_floor", "noise_floor_hi", "crossing", "after_gate_zero_rate",
)
"""Columns :func:`timeline_long` adds for the uncertainty of each row (module docstring)."""


def _top_two(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the last axis (heads, in layer-major order): argmax (lowest index on ties,
    NaN ignored), max, and the runner-up value."""
    x = np.where(np.isnan(v), -np.inf, v)
    arg = np.argmax(x, axis=-1)
    best = np.take_along_axis(x, arg[..., None], axis=-1)[..., 0]
    rest = x.copy()
    np.put_along_axis(rest, arg[..., None], -np.inf, axis=-1)
    second = rest.max(axis=-1) if x.shape[-1] > 1 else np.full(best.shape, -np.inf)
    fix = lambda a: np.where(np.isfinite(a), a, np.nan)  # noqa: E731
    return arg, fix(best), fix(second)


def _first_cross(best: np.ndarray, threshold: float) -> np.ndarray:
    """Index of the first step (axis 0) with ``best >= threshold``; -1 where never."""
    hit = np.nan_to_num(best, nan=-np.inf) >= threshold
    return np.where(hit.any(axis=0), hit.argmax(axis=0), -1)


def _uncertainty(rows: pd.DataFrame, threshold: float, gz, level: float) -> dict:
    """The :data:`UNCERTAINTY_COLUMNS` of one (series, metric)."""
    out: dict = dict(first_step_lo=pd.NA, first_step_hi=pd.NA, cross_rate=np.nan, first_head_agreement=np.nan,
                     first_margin=np.nan, top_agreement=np.nan, top_margin=np.nan, noise_floor=np.nan,
                     noise_floor_hi=np.nan, crossing="never", after_gate_zero_rate=np.nan)
    if rows is None or not len(rows):
        return out
    steps = np.sort(rows["step"].unique())
    heads = sorted({(int(l), int(h)) for l, h in zip(rows["layer"], rows["head"])})
    col = {hk: i for i, hk in enumerate(heads)}
    srow = {int(st): i for i, st in enumerate(steps)}
    si = rows["step"].map(lambda x: srow[int(x)]).to_numpy()
    hi_ = np.array([col[(int(l), int(h))] for l, h in zip(rows["layer"], rows["head"])])
    V = np.full((len(steps), len(heads)), np.nan)
    V[si, hi_] = rows["value"].to_numpy(dtype=float)
    arg, best, second = _top_two(V)
    first = _first_cross(best[:, None], threshold)[0]
    final = len(steps) - 1
    out["top_margin"] = float(best[final] - second[final])
    if first >= 0:
        out["first_margin"] = float(best[first] - second[first])
    boot = None
    if "boot" in rows.columns and rows["boot"].map(lambda b: isinstance(b, np.ndarray)).all():
        sizes = {len(b) for b in rows["boot"]}
        if len(sizes) == 1:
            R = sizes.pop()
            boot = np.full((len(steps), len(heads), R), np.nan)
            boot[si, hi_] = np.stack(rows["boot"].to_list())
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    if steps[0] == 0:
        out["noise_floor"] = float(best[0])
        hi_col = rows.loc[rows["step"] == 0, "hi"] if "hi" in rows.columns else pd.Series(dtype=float)
        if boot is not None:
            out["noise_floor_hi"] = float(np.nanpercentile(_top_two(np.moveaxis(boot[0], -1, 0))[1], q[1]))
        elif hi_col.notna().any():
            out["noise_floor_hi"] = float(hi_col.max())
        else:
            out["noise_floor_hi"] = float(best[0])
    if boot is not None:
        b = np.moveaxis(boot, -1, 1)  # [step, R, head]
        barg, bbest, _ = _top_two(b)  # [step, R]
        bfirst = _first_cross(bbest, threshold)  # [R]
        crossed = bfirst >= 0
        out["cross_rate"] = float(crossed.mean())
        fs = np.where(crossed, steps[np.maximum(bfirst, 0)].astype(float), np.inf)
        lo, hi = np.percentile(fs, q, method="inverted_cdf")  # steps are discrete: no interpolation
        out["first_step_lo"] = int(round(lo)) if np.isfinite(lo) else pd.NA
        out["first_step_hi"] = int(round(hi)) if np.isfinite(hi) else pd.NA
        out["top_agreement"] = float((barg[final] == arg[final]).mean())
        if first >= 0:
            fh = barg[np.maximum(bfirst, 0), np.arange(len(bfirst))]
            out["first_head_agreement"] = float(((fh == arg[first]) & crossed).mean())
        if gz is not None and not pd.isna(gz):
            out["after_gate_zero_rate"] = float((crossed & (fs >= int(gz))).mean() / max(crossed.mean(), 1e-300)) \
                if crossed.any() else np.nan
    if first >= 0:
        floor_hi = out["noise_floor_hi"]
        inside = steps[0] == 0 and (first == 0 or (np.isfinite(floor_hi) and best[first] <= floor_hi)
                                    or threshold <= out["noise_floor"])
        out["crossing"] = "within noise floor" if inside else ("crossed" if steps[0] == 0 else "crossed (no step 0)")
    return out


def timeline_long(
    traced: pd.DataFrame,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    *,
    by: Sequence[str] | str | None = None,
    gate_zero_step: int | Mapping | None = None,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Consolidation summary, one row per (group, thresholded metric).

    ``thresholds``: ``{metric: threshold}`` (default :data:`DEFAULT_THRESHOLDS`); every
    metric must occur in the trace. ``by``: group columns (default: those of ``run``,
    ``path``, ``seed`` present; ``()`` treats the whole trace as one series).
    ``gate_zero_step``: taken from a ``gate_zero_step`` column of the trace if there is
    one (one value per group), else from this argument: an int for every group, or a
    mapping from group key (a tuple of the ``by`` values, or the bare value if there is
    one group column) to int; groups it does not name get NA.

    Columns: ``*by, metric, threshold, first_step, first_head, first_value`` (first
    crossing, NA if the threshold is never reached), ``top_head, top_value, final_step``
    (top head at the final step), ``peak_head, peak_step, peak_value`` (largest value
    over all steps, earliest step on ties), ``gate_zero_step, after_gate_zero``
    (``first_step >= gate_zero_step``; NA if either is NA), then the uncertainty
    (:data:`UNCERTAINTY_COLUMNS`):

    * ``first_step_lo, first_step_hi``: ``level`` percentile interval of the first
      crossing step over the bootstrap resamples (NA when more than ``(1 - level)/2``
      of them never cross); ``cross_rate``: fraction of resamples that cross;
      ``after_gate_zero_rate``: among those, the fraction crossing at or after
      ``gate_zero_step``;
    * ``first_head_agreement`` / ``top_agreement``: fraction of resamples whose first
      crossing head / final-step top head is the point estimate's;
    * ``first_margin`` / ``top_margin``: top head minus runner-up at the first crossing /
      final step;
    * ``noise_floor``: the metric's maximum over heads at step 0 (untrained model, same
      evaluation; NaN without a step-0 checkpoint), ``noise_floor_hi`` its upper
      ``level`` bound (over resamples, else the heads' ``hi``, else the value);
    * ``crossing``: ``"crossed"``, ``"within noise floor"`` (the crossing value is not
      above ``noise_floor_hi``, or the untrained model already reaches the threshold),
      ``"crossed (no step 0)"`` or ``"never"``.

    The resample columns need the ``boot`` column of
    :func:`~circuitfade.analysis.heads.head_diagnostics` (NaN/NA without it). See the
    module docstring.
    """
    by = _resolve_by(traced, by)
    if not isinstance(thresholds, Mapping) or not thresholds:
        raise ValueError(f"thresholds: expected a non-empty mapping metric -> threshold, got {thresholds!r}")
    absent = [m for m in thresholds if m not in set(traced["metric"])]
    if absent:
        known = sorted(traced["metric"].unique())
        raise ValueError(f"thresholds: metrics {absent} are not in the trace (metrics: {known})")
    keys = _group_keys(traced, by)
    gz = _gate_zero_steps(traced, by, keys, gate_zero_step)
    top = top_heads(traced, list(thresholds), by=by)
    head_rows = _head_rows(traced, by, list(thresholds))
    grouped_rows = dict(list(head_rows.groupby(by + ["metric"], sort=False, dropna=False))) if by else \
        dict(list(head_rows.groupby("metric", sort=False)))
    grouped = top.groupby(by + ["metric"], sort=False, dropna=False) if by else top.groupby("metric", sort=False)
    top_groups = dict(list(grouped))

    rows = []
    for key in keys:
        for metric, threshold in thresholds.items():
            tkey = key + (metric,) if by else metric
            series = top_groups.get(tkey)
            row = dict(zip(by, key))
            row.update(metric=metric, threshold=float(threshold))
            na = dict(
                first_step=pd.NA, first_head=pd.NA, first_value=float("nan"),
                top_head=pd.NA, top_value=float("nan"), final_step=pd.NA,
                peak_head=pd.NA, peak_step=pd.NA, peak_value=float("nan"),
            )  # fmt: skip
            row.update(na)
            if series is not None and len(series):
                series = series.sort_values("step", kind="mergesort")
                final = series.iloc[-1]
                peak = series.loc[series["value"].idxmax()]
                row.update(
                    top_head=final["head_label"], top_value=float(final["value"]), final_step=int(final["step"]),
                    peak_head=peak["head_label"], peak_step=int(peak["step"]), peak_value=float(peak["value"]),
                )  # fmt: skip
                crossed = series[series["value"] >= threshold]
                if len(crossed):
                    first = crossed.iloc[0]
                    row.update(
                        first_step=int(first["step"]), first_head=first["head_label"],
                        first_value=float(first["value"]),
                    )  # fmt: skip
            row["gate_zero_step"] = gz[key]
            if pd.isna(row["first_step"]) or pd.isna(row["gate_zero_step"]):
                row["after_gate_zero"] = pd.NA
            else:
                row["after_gate_zero"] = bool(row["first_step"] >= row["gate_zero_step"])
            row.update(_uncertainty(grouped_rows.get(tkey), float(threshold), gz[key], level))
            rows.append(row)
    out = pd.DataFrame(rows)
    for col in ("first_step", "final_step", "peak_step", "gate_zero_step", "first_step_lo", "first_step_hi"):
        out[col] = out[col].astype("Int64")
    out["crossing"] = out["crossing"].astype("string")
    for col in ("first_head", "top_head", "peak_head"):
        out[col] = out[col].astype("string")
    out["after_gate_zero"] = out["after_gate_zero"].astype("boolean")
    return out


WIDE_UNCERTAINTY = ("first_step_lo", "first_step_hi", "first_head_agreement", "top_agreement", "top_margin",
                    "noise_floor", "crossing")


def consolidation_timeline(
    traced: pd.DataFrame,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    *,
    by: Sequence[str] | str | None = None,
    gate_zero_step: int | Mapping | None = None,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """The paper's Table 3: one row per series, one column set per thresholded metric.

    For each metric ``m`` in ``thresholds`` (default ``successor_mass`` >= .25 and
    ``ablation_importance`` >= .03) the columns ``m_top_head`` (top head at the final
    step), ``m_first_step`` (first step any head reaches the threshold), ``m_first_head``
    (that head), ``m_after_gate_zero``, and the uncertainty of :func:`timeline_long`:
    ``m_first_step_lo``, ``m_first_step_hi``, ``m_first_head_agreement``,
    ``m_top_agreement``, ``m_top_margin``, ``m_noise_floor``, ``m_crossing``; then
    ``gate_zero_step`` and
    ``after_gate_zero`` (True iff every metric's first crossing is at or after the gate
    reached zero; False if any is before; NA otherwise). Arguments and definitions as in
    :func:`timeline_long`; groups without a crossing get NA.
    """
    long = timeline_long(traced, thresholds, by=by, gate_zero_step=gate_zero_step, level=level)
    by = _resolve_by(traced, by)
    keys = _group_keys(traced, by)
    rows = []
    for i, key in enumerate(keys):
        part = long.iloc[i * len(thresholds) : (i + 1) * len(thresholds)]
        row = dict(zip(by, key))
        for _, r in part.iterrows():
            m = r["metric"]
            row[f"{m}_top_head"] = r["top_head"]
            row[f"{m}_first_step"] = r["first_step"]
            row[f"{m}_first_head"] = r["first_head"]
            row[f"{m}_after_gate_zero"] = r["after_gate_zero"]
            for c in WIDE_UNCERTAINTY:
                row[f"{m}_{c}"] = r[c]
        row["gate_zero_step"] = part["gate_zero_step"].iloc[0]
        row["after_gate_zero"] = part["after_gate_zero"].all(skipna=False)
        rows.append(row)
    out = pd.DataFrame(rows)
    for m in thresholds:
        out[f"{m}_first_step"] = out[f"{m}_first_step"].astype("Int64")
        out[f"{m}_top_head"] = out[f"{m}_top_head"].astype("string")
        out[f"{m}_first_head"] = out[f"{m}_first_head"].astype("string")
        out[f"{m}_after_gate_zero"] = out[f"{m}_after_gate_zero"].astype("boolean")
        for c in ("first_step_lo", "first_step_hi"):
            out[f"{m}_{c}"] = out[f"{m}_{c}"].astype("Int64")
        out[f"{m}_crossing"] = out[f"{m}_crossing"].astype("string")
    out["gate_zero_step"] = out["gate_zero_step"].astype("Int64")
    out["after_gate_zero"] = out["after_gate_zero"].astype("boolean")
    return out
