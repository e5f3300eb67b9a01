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

Heads are named ``"L{layer}H{head}"``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from circuitfade.analysis.heads import ABLATION_IMPORTANCE, SUCCESSOR_MASS

__all__ = ["DEFAULT_THRESHOLDS", "consolidation_timeline", "timeline_long", "top_heads"]

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
    top.insert(len(by) + 4, "head_label", [f"L{l}H{h}" for l, h in zip(top["layer"], top["head"])])
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


def timeline_long(
    traced: pd.DataFrame,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    *,
    by: Sequence[str] | str | None = None,
    gate_zero_step: int | Mapping | None = None,
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
    (``first_step >= gate_zero_step``; NA if either is NA). See the module docstring.
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
            rows.append(row)
    out = pd.DataFrame(rows)
    for col in ("first_step", "final_step", "peak_step", "gate_zero_step"):
        out[col] = out[col].astype("Int64")
    for col in ("first_head", "top_head", "peak_head"):
        out[col] = out[col].astype("string")
    out["after_gate_zero"] = out["after_gate_zero"].astype("boolean")
    return out


def consolidation_timeline(
    traced: pd.DataFrame,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    *,
    by: Sequence[str] | str | None = None,
    gate_zero_step: int | Mapping | None = None,
) -> pd.DataFrame:
    """The paper's Table 3: one row per series, one column set per thresholded metric.

    For each metric ``m`` in ``thresholds`` (default ``successor_mass`` >= .25 and
    ``ablation_importance`` >= .03) the columns ``m_top_head`` (top head at the final
    step), ``m_first_step`` (first step any head reaches the threshold), ``m_first_head``
    (that head) and ``m_after_gate_zero``; then ``gate_zero_step`` and
    ``after_gate_zero`` (True iff every metric's first crossing is at or after the gate
    reached zero; False if any is before; NA otherwise). Arguments and definitions as in
    :func:`timeline_long`; groups without a crossing get NA.
    """
    long = timeline_long(traced, thresholds, by=by, gate_zero_step=gate_zero_step)
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
        row["gate_zero_step"] = part["gate_zero_step"].iloc[0]
        row["after_gate_zero"] = part["after_gate_zero"].all(skipna=False)
        rows.append(row)
    out = pd.DataFrame(rows)
    for m in thresholds:
        out[f"{m}_first_step"] = out[f"{m}_first_step"].astype("Int64")
        out[f"{m}_top_head"] = out[f"{m}_top_head"].astype("string")
        out[f"{m}_first_head"] = out[f"{m}_first_head"].astype("string")
        out[f"{m}_after_gate_zero"] = out[f"{m}_after_gate_zero"].astype("boolean")
    out["gate_zero_step"] = out["gate_zero_step"].astype("Int64")
    out["after_gate_zero"] = out["after_gate_zero"].astype("boolean")
    return out
