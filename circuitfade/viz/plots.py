"""Plotly figures of finished results: every builder takes DataFrames and returns a ``go.Figure``.

Inputs are the tidy frames the rest of the package produces, never models:

* a **trace** (:func:`circuitfade.store.trace`): columns ``step, layer, head, metric,
  value`` (extra columns are ignored) - :func:`head_heatmap`,
  :func:`head_small_multiples`, :func:`head_timeline`. A figure shows one series: the
  trace must hold one row per ``(step, layer, head)`` for the metric (filter a
  multi-run trace to one run first);
* a **gate intervention table** (:func:`circuitfade.analysis.gate_intervention_table`):
  ``condition, gates, accuracy, loss`` - :func:`gate_intervention_bar`;
* a run's **metrics table** (``metrics.csv``, :func:`circuitfade.train.checkpoints.read_metrics`):
  ``step, gate_*, acc_*`` (or ``mse_*``) - :func:`training_curves`.

Heads are named ``"L{layer}H{head}"`` everywhere, hover text included. Figures carry
axis titles with units and a fixed height. ``plots.save`` writes any of them: HTML always
(plotly.js embedded, works offline), PNG / SVG / PDF through an image exporter -
``pip install 'circuitfade[figures]'`` (kaleido 0.2.1, which bundles its own headless
Chromium and needs no network); kaleido >= 1 also works where Chrome is installed. It is
:func:`circuitfade.viz.export.save` (as ``plots.static_figure`` is
:func:`circuitfade.viz.export.static_figure`), where the export machinery lives.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from circuitfade.store.tracing import head_label
from circuitfade.viz import moved_names
from circuitfade.viz.export import save, static_figure  # noqa: F401 - plots.save, plots.static_figure: documented
from circuitfade.viz.panels import COLORSCALE, colorbar, heat_trace, int_axis, panel_grid

__all__ = [
    "METRIC_LABELS",
    "metric_label",
    "head_heatmap",
    "head_small_multiples",
    "head_timeline",
    "gate_intervention_bar",
    "training_curves",
    "class_count_figure",
]

METRIC_LABELS: dict[str, str] = {
    "successor_mass": "successor-value mass (attention probability)",
    "ablation_importance": "mean-ablation importance (accuracy drop, fraction)",
    "ablation_loss_increase": "mean-ablation loss increase (nats)",
}
"""Axis/colorbar titles (with units) of the package's per-head metrics; others show their name."""

STEP_TITLE = "training step"
GATE_TITLE = "gate value (0 = prior off, 1 = full)"
GATE_TICKS = dict(tickmode="array", tickvals=[0, 0.25, 0.5, 0.75, 1], ticktext=["0", "0.25", "0.5", "0.75", "1"])
"""Gate-axis ticks at nice values (a secondary axis would otherwise sync its ticks to the primary's)."""
LEGEND_RIGHT = dict(x=1.1, xanchor="left", y=1, yanchor="top", tracegroupgap=0)
"""The legend, placed clear of the secondary (gate) axis title."""
ACC_TITLE = "accuracy (fraction correct)"

__getattr__ = moved_names(__name__, {"circuitfade.viz.export": (
    "save_figure", "image_exporter", "ExportError", "use_exportable_renderer", "EXPORTABLE_RENDERER",
    "IMAGE_FORMATS", "EXPORTER_HINT")})

_CONDITION_LABELS = {
    "normal": "normal (gates as set)",
    "zero": "zero gate",
    "param": "gate = sigmoid(logit)",
    "half": "gate = 0.5",
}


def metric_label(metric: str) -> str:
    """The axis title of ``metric``: :data:`METRIC_LABELS` entry, else the name itself."""
    return METRIC_LABELS.get(metric, metric)


def _identical_groups(frame: pd.DataFrame, cols: list[str]) -> list[list[str]]:
    """``cols`` grouped by identical values (NaN equal to NaN, to 1e-12), first-seen order."""
    groups: list[list[str]] = []
    for c in cols:
        v = frame[c].astype(float).to_numpy()
        for g in groups:
            if np.allclose(v, frame[g[0]].astype(float).to_numpy(), rtol=0, atol=1e-12, equal_nan=True):
                g.append(c)
                break
        else:
            groups.append([c])
    return groups


_head_name = head_label  # the one head label, "L{layer}H{head}"


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


# ------------------------------------------------------------------------- tidy input
def _head_frame(traced: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of ``metric`` as ``step, layer, head, value`` (ints, float), sorted; validated."""
    if not isinstance(traced, pd.DataFrame):
        raise ValueError(f"traced: expected a pandas DataFrame (see circuitfade.store.trace), got {type(traced).__name__}")
    if "head" not in traced.columns and "head_idx" in traced.columns:
        traced = traced.rename(columns={"head_idx": "head"})
    need = ["step", "layer", "head", "metric", "value"]
    missing = [c for c in need if c not in traced.columns]
    if missing:
        raise ValueError(f"traced: expected columns {need}, missing {missing}")
    if not isinstance(metric, str):
        raise ValueError(f"metric: expected a metric name (str), got {metric!r}")
    rows = traced[traced["metric"] == metric]
    if rows.empty:
        known = sorted(map(str, traced["metric"].dropna().unique()))
        raise ValueError(f"metric {metric!r} is not in the trace; metrics: {known}")
    rows = rows[rows["layer"].notna() & rows["head"].notna()]
    if rows.empty:
        raise ValueError(f"metric {metric!r} has no per-head rows (layer and head are missing); nothing to plot per head")
    df = pd.DataFrame({
        "step": rows["step"].astype("int64").to_numpy(),
        "layer": rows["layer"].astype("int64").to_numpy(),
        "head": rows["head"].astype("int64").to_numpy(),
        "value": rows["value"].astype(float).to_numpy(),
    })
    lo, hi = _interval(rows, "value")
    if lo is not None:
        df["lo"], df["hi"] = lo, hi
    dup = df.duplicated(["step", "layer", "head"])
    if dup.any():
        s, l, h = df.loc[dup, ["step", "layer", "head"]].iloc[0]
        raise ValueError(
            f"traced: several {metric!r} rows for step {s}, head {_head_name(l, h)}; the trace holds several "
            "series (runs, paths or seeds): filter it to one, e.g. traced[traced['run'] == name]"
        )
    if df["value"].isna().all():
        raise ValueError(f"metric {metric!r}: every value is NaN; nothing to plot")
    return df.sort_values(["step", "layer", "head"], kind="mergesort").reset_index(drop=True)


def _interval(rows: pd.DataFrame, col: str):
    """Optional interval columns of ``col``: ``lo``/``hi`` (or ``{col}_lo``/``{col}_hi``), else
    ``se`` (or ``{col}_se``) as ``value ± 1.96 se``; ``(None, None)`` when there are none."""
    for lo_c, hi_c in (("lo", "hi"), (f"{col}_lo", f"{col}_hi")):
        if lo_c in rows.columns and hi_c in rows.columns:
            lo, hi = rows[lo_c].astype(float).to_numpy(), rows[hi_c].astype(float).to_numpy()
            return (lo, hi) if not (np.isnan(lo).all() and np.isnan(hi).all()) else (None, None)
    for se_c in ("se", f"{col}_se"):
        if se_c in rows.columns:
            se = rows[se_c].astype(float).to_numpy()
            if np.isnan(se).all():
                return None, None
            v = rows[col].astype(float).to_numpy()
            return v - 1.96 * se, v + 1.96 * se
    return None, None


def _error_y(values, lo, hi) -> dict | None:
    """plotly ``error_y`` for an interval ``[lo, hi]`` around ``values`` (None without one)."""
    if lo is None:
        return None
    v = np.asarray(values, float)
    return dict(type="data", symmetric=False, array=np.maximum(np.asarray(hi, float) - v, 0),
                arrayminus=np.maximum(v - np.asarray(lo, float), 0), thickness=1, width=3)


def _grid(df: pd.DataFrame, step: int, n_layers: int, n_heads: int) -> tuple[np.ndarray, list[list[str]]]:
    """``z[layer, head]`` (NaN where absent) and hover text at ``step``."""
    z = np.full((n_layers, n_heads), np.nan)
    part = df[df["step"] == step]
    z[part["layer"].to_numpy(), part["head"].to_numpy()] = part["value"].to_numpy()
    text = [[f"{_head_name(l, h)} step {step}: {_fmt(z[l, h])}" for h in range(n_heads)] for l in range(n_layers)]
    return z, text


def _color_range(values: np.ndarray) -> tuple[float, float]:
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


# ---------------------------------------------------------------------------- heatmaps
def head_heatmap(traced: pd.DataFrame, metric: str, *, step: int | None = None) -> go.Figure:
    """``metric`` per head as a layer x head heatmap, one checkpoint at a time.

    ``step=None``: one heatmap trace per checkpoint step, a slider selecting which is
    visible (starting at the last step); ``step=S``: only step ``S`` (``ValueError``
    listing the steps if absent). One colour scale, fixed over all shown steps (min to
    max of the metric), so colours compare across steps; the colorbar is titled with
    the metric (:func:`metric_label`). Hover text: ``"L{layer}H{head} step {S}: {value}"``.
    Rows are layers (layer 0 on top), columns heads.
    """
    df = _head_frame(traced, metric)
    steps = sorted(df["step"].unique().tolist())
    if step is not None:
        if step not in steps:
            raise ValueError(f"step {step!r} is not in the trace of {metric!r}; steps: {steps}")
        steps = [step]
        df = df[df["step"] == step]
    n_layers, n_heads = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    label = metric_label(metric)
    cmin, cmax = _color_range(df["value"].to_numpy())
    fig = go.Figure()
    for s in steps:
        z, text = _grid(df, s, n_layers, n_heads)
        fig.add_trace(heat_trace(z, text, n_layers, n_heads).update(name=f"step {s}"))
    last = len(steps) - 1
    for i, tr in enumerate(fig.data):
        tr.visible = i == last
    title = f"{label} per head"
    fig.update_layout(
        meta={"kind": "head_heatmap", "label": label},  # static_figure() turns the slider into small multiples
        title=dict(text=f"{title}, step {steps[last]}"),
        coloraxis=dict(colorscale=COLORSCALE, cmin=cmin, cmax=cmax, colorbar=colorbar(label)),
        xaxis=dict(title=dict(text="head"), **int_axis(n_heads)),
        yaxis=dict(title=dict(text="layer"), autorange="reversed", **int_axis(n_layers)),
        height=max(440, 60 * n_layers + 260),
    )
    if len(steps) > 1:
        fig.update_layout(sliders=[dict(
            active=last,
            currentvalue=dict(prefix="checkpoint at training step "),
            pad=dict(t=40),
            steps=[
                dict(method="update", label=str(s),
                     args=[{"visible": [j == i for j in range(len(steps))]}, {"title.text": f"{title}, step {s}"}])
                for i, s in enumerate(steps)
            ],
        )])
    return fig


def head_small_multiples(traced: pd.DataFrame, metric: str, *, max_cols: int = 6) -> go.Figure:
    """One small layer x head heatmap of ``metric`` per checkpoint step, in a grid.

    Panels in step order, ``min(max_cols, n_steps)`` per row, each titled ``"step S"``;
    one shared colour scale (min to max over all steps) with the metric as colorbar
    title. Hover text as in :func:`head_heatmap`. The static form of :func:`head_heatmap`:
    ``plots.save`` writes this grid when a slider heatmap goes to PNG/SVG/PDF.
    """
    if isinstance(max_cols, bool) or not isinstance(max_cols, numbers.Integral) or max_cols < 1:
        raise ValueError(f"max_cols: expected a positive int, got {max_cols!r}")
    df = _head_frame(traced, metric)
    steps = sorted(df["step"].unique().tolist())
    n_layers, n_heads = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    panels = [(f"step {s}", *_grid(df, s, n_layers, n_heads)) for s in steps]
    cmin, cmax = _color_range(df["value"].to_numpy())
    return panel_grid(panels, n_layers, n_heads, metric_label(metric), (cmin, cmax), int(max_cols))


# ---------------------------------------------------------------------------- timeline
def _first_crossings(df: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per head: the first step with ``value >= threshold`` (``layer, head, step, value``)."""
    hit = df[df["value"] >= threshold]
    return hit.groupby(["layer", "head"], sort=True).head(1).reset_index(drop=True)


def _gate_traces(gate, steps: list[int]) -> list[go.Scatter]:
    """Gate lines for the secondary axis from a DataFrame or a callable ``step -> value``."""
    style = dict(mode="lines", line=dict(dash="dot", width=2), hovertemplate="%{text}<extra></extra>")
    if isinstance(gate, pd.DataFrame):
        cols = ["gate"] if "gate" in gate.columns else [c for c in gate.columns if str(c).startswith("gate_")]
        if "step" not in gate.columns or not cols:
            raise ValueError(
                f"gate: expected a DataFrame with a 'step' column and a 'gate' (or 'gate_<prior>') column, "
                f"got columns {list(gate.columns)}"
            )
        out = []
        g = gate.sort_values("step", kind="mergesort")
        for group in _identical_groups(g, cols):
            c = group[0]
            name = "gate" if c == "gate" else f"gate ({' = '.join(str(x)[5:] for x in group)})"
            ys = g[c].astype(float).to_numpy()
            xs = g["step"].to_numpy()
            text = [f"{name} at step {int(x)}: {_fmt(y)}" for x, y in zip(xs, ys)]
            out.append(go.Scatter(x=xs, y=ys, name=name, text=text, **style))
        return out
    if callable(gate):
        lo, hi = min(steps), max(steps)
        dense = np.unique(np.concatenate([np.round(np.linspace(lo, hi, 401)), np.asarray(steps, float)])).astype(int)
        xs, ys = [], []
        for s in dense.tolist():
            v = gate(s)
            if v is not None:
                xs.append(s)
                ys.append(float(v))
        if not xs:
            return []  # e.g. learned gates: no prescribed schedule
        text = [f"gate schedule at step {x}: {_fmt(y)}" for x, y in zip(xs, ys)]
        return [go.Scatter(x=xs, y=ys, name="gate (schedule)", text=text, **style)]
    raise ValueError(f"gate: expected None, a DataFrame (step, gate) or a callable step -> value, got {type(gate).__name__}")


def head_timeline(
    traced: pd.DataFrame,
    metric: str,
    *,
    gate: pd.DataFrame | Callable[[int], float | None] | None = None,
    threshold: float | None = None,
    top_k: int | None = None,
    gate_zero_step: int | None = None,
) -> go.Figure:
    """``metric`` of every head over training steps, with the gate schedule and threshold crossings.

    * One line per head (``"L{layer}H{head}"``), x = checkpoint step; the top head (largest
      value at the last step) drawn wider and above the others. Optional interval columns
      (``lo``/``hi`` or ``se``, see :func:`_interval`) become error bars. ``top_k``: only
      the ``k`` heads with the largest value at the last step (ties: lowest layer, then
      head), plus the head of the first crossing if it is not among them.
    * ``gate``: drawn on a secondary y axis (dotted): a DataFrame with ``step`` and
      ``gate`` columns (or ``gate_<prior>`` columns, as in ``metrics.csv``, one line each),
      or a callable ``step -> value`` (e.g. ``series.gate_value``) sampled at up to 400
      steps over the traced range (``None`` values are left out).
    * ``threshold``: a dashed horizontal line (named in the legend, trace ``"threshold T"``);
      a star marker (trace ``"first crossing"``) at each plotted head's first step with
      ``value >= threshold``; and an annotation at
      the series' first crossing - the first step at which any head reaches the threshold,
      and the top head (largest value) at that step, i.e. ``first_step`` / ``first_head`` of
      :func:`circuitfade.analysis.timeline_long`.
    * ``gate_zero_step``: a vertical dotted line where the gate reached zero.
    """
    df = _head_frame(traced, metric)
    steps = sorted(df["step"].unique().tolist())
    heads = sorted({(int(l), int(h)) for l, h in zip(df["layer"], df["head"])})
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)):
        raise ValueError(f"threshold: expected a number or None, got {threshold!r}")
    crossings = _first_crossings(df, float(threshold)) if threshold is not None else None
    first = None
    if crossings is not None and len(crossings):
        first = crossings.sort_values(["step", "value", "layer", "head"], ascending=[True, False, True, True],
                                      kind="mergesort").iloc[0]
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
            raise ValueError(f"top_k: expected a positive int or None, got {top_k!r}")
        final = df[df["step"] == steps[-1]].sort_values(["value", "layer", "head"], ascending=[False, True, True],
                                                        kind="mergesort", na_position="last")
        keep = [(int(l), int(h)) for l, h in zip(final["layer"], final["head"])][: int(top_k)]
        if first is not None and (int(first["layer"]), int(first["head"])) not in keep:
            keep.append((int(first["layer"]), int(first["head"])))
        heads = sorted(keep)

    gate_traces = _gate_traces(gate, steps) if gate is not None else []
    fig = make_subplots(specs=[[{"secondary_y": bool(gate_traces)}]])
    # the top head (largest value at the last step) is drawn above the others (zorder) and wider
    final = {(int(l), int(h)): v for l, h, v in
             df[df["step"] == steps[-1]][["layer", "head", "value"]].itertuples(index=False, name=None)}
    top = max(heads, key=lambda lh: (np.nan_to_num(final.get(lh, np.nan), nan=-np.inf), -lh[0], -lh[1]))
    for l, h in heads:
        part = df[(df["layer"] == l) & (df["head"] == h)]
        name = _head_name(l, h)
        text = [f"{name} step {s}: {_fmt(v)}" for s, v in zip(part["step"], part["value"])]
        err = _error_y(part["value"], part["lo"], part["hi"]) if "lo" in part.columns else None
        fig.add_trace(go.Scatter(x=part["step"], y=part["value"], name=name, zorder=1 if (l, h) == top else 0,
                                 legendgroup=name, mode="lines+markers", text=text,
                                 hovertemplate="%{text}<extra></extra>", marker=dict(size=5 if (l, h) != top else 7),
                                 line=dict(width=3.5 if (l, h) == top else 1.8), error_y=err))
    if crossings is not None:
        plotted = set(heads)
        mask = [(int(l), int(h)) in plotted for l, h in zip(crossings["layer"], crossings["head"])]
        shown = crossings[pd.Series(mask, index=crossings.index, dtype=bool)]
        text = [f"{_head_name(l, h)} first reaches {threshold:g} at step {s} (value {_fmt(v)})"
                for l, h, s, v in zip(shown["layer"], shown["head"], shown["step"], shown["value"])]
        fig.add_trace(go.Scatter(
            x=shown["step"], y=shown["value"], mode="markers", name=f"first crossing (≥ {threshold:g})",
            marker=dict(symbol="star", size=13, color="black", line=dict(width=1, color="white")),
            text=text, hovertemplate="%{text}<extra></extra>", zorder=2,
        ))
        fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=threshold, y1=threshold,
                      line=dict(dash="dash", color="gray", width=1.5))
        # the threshold is named in the legend (an entry that draws nothing), not by a text label in
        # the plot, so it never collides with the first crossing's label or with the data
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"threshold {threshold:g}",
                                 line=dict(dash="dash", color="gray", width=1.5), hoverinfo="skip"))
        if first is not None:
            name = _head_name(first["layer"], first["head"])
            span = max(steps[-1] - steps[0], 1)
            right_half = (int(first["step"]) - steps[0]) / span > 0.5
            fig.add_annotation(x=int(first["step"]), y=float(first["value"]), xref="x", yref="y",
                               text=f"{name} first reaches {threshold:g}<br>at step {int(first['step'])}",
                               showarrow=True, arrowhead=2, ax=-70 if right_half else 70, ay=-55,
                               bgcolor="rgba(255,255,255,0.85)")
    for tr in gate_traces:
        fig.add_trace(tr, secondary_y=True)
    if gate_traces:
        ys = np.concatenate([np.asarray(t.y, float) for t in gate_traces])
        unit = np.nanmin(ys) >= 0 and np.nanmax(ys) <= 1
        fig.update_yaxes(title_text=GATE_TITLE, secondary_y=True, showgrid=False,
                         **(dict(range=[0, 1.05], **GATE_TICKS) if unit else {}))
    if gate_zero_step is not None:
        fig.add_shape(type="line", xref="x", x0=gate_zero_step, x1=gate_zero_step, yref="paper", y0=0, y1=1,
                      line=dict(dash="dot", color="firebrick", width=1.5))
        fig.add_annotation(x=gate_zero_step, xref="x", yref="paper", y=1, text=f"gate reaches 0 (step {gate_zero_step})",
                           showarrow=False, xanchor="left", yanchor="bottom", font=dict(color="firebrick"))
    fig.update_xaxes(title_text=STEP_TITLE)
    fig.update_yaxes(title_text=metric_label(metric), secondary_y=False)
    fig.update_layout(title=dict(text=f"{metric_label(metric)} per head over training"), height=480,
                      legend=dict(title=dict(text="head"), **(LEGEND_RIGHT if gate_traces else dict(tracegroupgap=0))))
    return fig


# ------------------------------------------------------------------ gates and training
def gate_intervention_bar(table: pd.DataFrame, *, chance: float | None = None) -> go.Figure:
    """Accuracy under each gate condition of a gate intervention table, as bars.

    ``table``: columns ``condition`` and ``accuracy`` (optional ``gates`` and ``loss``
    appear in the hover text), one row per condition, in the order drawn. Optional
    interval columns (``accuracy_lo``/``accuracy_hi``, ``lo``/``hi`` or ``accuracy_se``/``se``,
    the last as ± 1.96 se) are drawn as whiskers.
    ``chance``: a dashed horizontal line at chance accuracy (e.g. ``task.chance``), labelled
    in the right margin, clear of the bars.
    """
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"table: expected a DataFrame (see gate_intervention_table), got {type(table).__name__}")
    missing = [c for c in ("condition", "accuracy") if c not in table.columns]
    if missing:
        raise ValueError(f"table: expected columns ['condition', 'accuracy'] (and optionally gates, loss), missing {missing}")
    if table.empty:
        raise ValueError("table: no rows to plot")
    if table["condition"].duplicated().any():
        raise ValueError("table: one row per condition expected (several models' tables? plot one at a time)")
    cond = table["condition"].astype(str).tolist()
    acc = table["accuracy"].astype(float).tolist()
    gates = table["gates"].astype(str).tolist() if "gates" in table.columns else [None] * len(cond)
    loss = table["loss"].astype(float).tolist() if "loss" in table.columns else [None] * len(cond)
    hover = []
    for c, a, g, l in zip(cond, acc, gates, loss):
        s = f"{c}" + (f" ({g})" if g else "") + f": accuracy {_fmt(a)}"
        hover.append(s + (f", loss {_fmt(l)} nats" if l is not None else ""))
    lo, hi = _interval(table, "accuracy")
    if lo is not None:
        hover = [f"{t} [{_fmt(a)}, {_fmt(b)}]" for t, a, b in zip(hover, lo, hi)]
    fig = go.Figure(go.Bar(x=cond, y=acc, text=[f"{a:.3f}" for a in acc], textposition="outside",
                           hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", name="accuracy",
                           error_y=_error_y(acc, lo, hi)))
    if chance is not None:
        if isinstance(chance, bool) or not isinstance(chance, numbers.Real):
            raise ValueError(f"chance: expected a number or None, got {chance!r}")
        fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=chance, y1=chance,
                      line=dict(dash="dash", color="gray"))
        fig.add_annotation(xref="paper", x=1.01, yref="y", y=chance, text=f"chance<br>{chance:.3g}", showarrow=False,
                           xanchor="left", yanchor="middle", align="left", font=dict(color="gray"))
    fig.update_layout(
        margin=dict(r=90),
        title=dict(text="Gate interventions at evaluation (final checkpoint)"),
        xaxis=dict(title=dict(text="gate condition at evaluation")),
        yaxis=dict(title=dict(text=ACC_TITLE), range=[0, 1.08]),
        height=420, showlegend=False,
    )
    return fig


def training_curves(metrics_df: pd.DataFrame) -> go.Figure:
    """Evaluation curves of a run (``metrics.csv``) with its gates on a secondary axis.

    One line per evaluation condition: the ``acc_<condition>`` columns (accuracy), or
    for tasks without accuracy the ``mse_<condition>`` columns, else ``loss_<condition>``;
    conditions ``normal`` (gates as set at that step), ``zero``, ``param``, ``half``
    (see :mod:`circuitfade.gating.evaluation`). Every ``gate_<prior>`` column (mean effective
    gate over heads and layers) is a dotted line on the secondary y axis (ticks at 0, .25,
    ..., 1). Conditions (or gates) whose curves are identical at every step are drawn once,
    named ``"a = b (identical)"`` (gates: ``"gate (pos = content)"``).
    """
    if not isinstance(metrics_df, pd.DataFrame):
        raise ValueError(f"metrics_df: expected a DataFrame (metrics.csv), got {type(metrics_df).__name__}")
    if "step" not in metrics_df.columns:
        raise ValueError(f"metrics_df: expected a 'step' column, got {list(metrics_df.columns)}")
    for prefix, title in (("acc_", ACC_TITLE), ("mse_", "mean squared error"), ("loss_", "cross-entropy loss (nats)")):
        cols = [c for c in metrics_df.columns if str(c).startswith(prefix)]
        if cols:
            break
    else:
        raise ValueError(
            "metrics_df: expected acc_<condition>, mse_<condition> or loss_<condition> columns, "
            f"got {list(metrics_df.columns)}"
        )
    gate_cols = [c for c in metrics_df.columns if str(c).startswith("gate_")]
    m = metrics_df.sort_values("step", kind="mergesort")
    fig = make_subplots(specs=[[{"secondary_y": bool(gate_cols)}]])
    for group in _identical_groups(m, cols):  # conditions with identical curves: one line, named for all
        names = [_CONDITION_LABELS.get(str(c)[len(prefix):], str(c)[len(prefix):]) for c in group]
        name = names[0] if len(names) == 1 else " = ".join(names) + " (identical)"
        ys = m[group[0]].astype(float)
        text = [f"{name}, step {int(s)}: {_fmt(v)}" for s, v in zip(m["step"], ys)]
        fig.add_trace(go.Scatter(x=m["step"], y=ys, name=name, mode="lines", text=text, connectgaps=True,
                                 hovertemplate="%{text}<extra></extra>"))
    for tr in _gate_traces(m[["step", *gate_cols]], m["step"].tolist()) if gate_cols else []:
        fig.add_trace(tr, secondary_y=True)
    if gate_cols:
        ys = m[gate_cols].astype(float).to_numpy()
        unit = np.nanmin(ys) >= 0 and np.nanmax(ys) <= 1
        fig.update_yaxes(title_text=GATE_TITLE, secondary_y=True, showgrid=False,
                         **(dict(range=[0, 1.05], **GATE_TICKS) if unit else {}))
    fig.update_xaxes(title_text=STEP_TITLE)
    fig.update_yaxes(title_text=title, secondary_y=False, **({"range": [0, 1.05]} if prefix == "acc_" else {}))
    fig.update_layout(title=dict(text="Evaluation during training"), height=460,
                      legend=dict(title=dict(text="evaluated with"), orientation="h", x=0, xanchor="left",
                                  y=-0.2, yanchor="top"),
                      margin=dict(b=130))
    return fig


# ------------------------------------------------------------------ developmental screens
def class_count_figure(fractions: pd.DataFrame, shapes: pd.DataFrame | None = None) -> go.Figure:
    """Heads in each class per revision (a screen's class table), as counts out of the heads screened.

    ``fractions``: :func:`circuitfade.analysis.development.class_fractions` (``step, class,
    count, n_heads``). Revisions are evenly spaced (they are usually log-spaced) and
    labelled with their step. ``shapes`` (:func:`~circuitfade.analysis.development.emergence_shape`)
    adds each class's emergence shape to its legend entry. Classes whose counts agree at
    every revision are drawn once, named together ("induction = bos (identical counts)"),
    so no line hides under another. Counts read better than fractions of a few heads
    ("4 of 8" rather than "0.5").
    """
    if not isinstance(fractions, pd.DataFrame):
        raise ValueError(f"fractions: expected a DataFrame (class_fractions), got {type(fractions).__name__}")
    missing = [c for c in ("step", "class", "count", "n_heads") if c not in fractions.columns]
    if missing:
        raise ValueError(f"fractions: expected columns step, class, count, n_heads (class_fractions); missing {missing}")
    if fractions.empty:
        raise ValueError("fractions: no rows to plot")
    steps = sorted(int(s) for s in fractions["step"].unique())
    pos = {s: i for i, s in enumerate(steps)}
    n_heads = int(fractions["n_heads"].max())
    shape_of = {} if shapes is None else dict(zip(shapes["class"], shapes["shape"]))
    wide = fractions.pivot(index="step", columns="class", values="count").sort_index()
    classes = [c for c in dict.fromkeys(fractions["class"]) if c in wide.columns]
    fig = go.Figure()
    for group in _identical_groups(wide, classes):  # classes with the same counts at every revision: one line
        label = " = ".join(f"{c} ({shape_of[c]})" if c in shape_of else str(c) for c in group)
        label += " (identical counts)" if len(group) > 1 else ""
        g = wide[group[0]]
        name = " = ".join(map(str, group))
        text = [f"{name}, step {int(s)}: {_fmt(k) if pd.isna(k) else int(k)} of {n_heads} heads" for s, k in g.items()]
        fig.add_trace(go.Scatter(x=[pos[int(s)] for s in g.index], y=g.to_numpy(dtype=float), mode="lines+markers",
                                 name=label, text=text, hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(
        title=dict(text=f"Heads in each class (of {n_heads} heads screened)"),
        xaxis=dict(title=dict(text="revision (training step)"), tickmode="array", tickvals=list(range(len(steps))),
                   ticktext=[str(s) for s in steps]),
        yaxis=dict(title=dict(text="heads in the class"), range=[-0.3, n_heads + 0.3], dtick=max(1, n_heads // 8)),
        height=420, legend=dict(title=dict(text="class (emergence)")),
    )
    return fig
