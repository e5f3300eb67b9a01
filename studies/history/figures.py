"""Figures of the history-dependence study (:mod:`studies.history`), from its finished frames."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["history_figures"]


def history_figures(trace: pd.DataFrame, patching: pd.DataFrame, period: int) -> dict[str, go.Figure]:
    """Three plotly figures from the finished frames: ``margin`` (margin over the schedule
    and relaxation, both branches, seed mean and per seed, with ``p_ICL`` on a second axis),
    ``patching`` (seed-mean restored-fraction maps, layer × position, both directions side
    by side) and ``relaxation`` (gap below − above after the schedule, per seed and mean).

    ``trace``: ``seed, branch, phase, k, p_icl, margin`` (branches in order of appearance, the first two
    ``from_below`` and ``from_above``); ``patching``: ``direction, layer, pos, restored``; ``period``: updates
    of the schedule (``k = period`` is where relaxation starts)."""
    branches = list(dict.fromkeys(trace.branch))
    colors = dict(zip(branches, ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")))
    t = trace[trace.phase != "anchor"]
    fig1 = make_subplots(specs=[[{"secondary_y": True}]])
    for b in branches:
        tb = t[t.branch == b]
        for s, ts in tb.groupby("seed"):
            fig1.add_trace(go.Scatter(x=ts.k, y=ts.margin, mode="lines", line=dict(color=colors[b], width=0.7),
                                      opacity=0.35, name=f"{b} seed {s}", showlegend=False))
        mean = tb.groupby("k", as_index=False)[["margin", "p_icl"]].mean()
        fig1.add_trace(go.Scatter(x=mean.k, y=mean.margin, mode="lines", line=dict(color=colors[b], width=2.5),
                                  name=f"{b} (mean margin)"))
        fig1.add_trace(go.Scatter(x=mean.k, y=mean.p_icl, mode="lines", line=dict(color=colors[b], dash="dot"),
                                  name=f"{b} p_ICL"), secondary_y=True)
    fig1.add_vline(x=period, line_dash="dash", line_color="grey")
    fig1.update_xaxes(title_text="updates since the branch point (relaxation at p0 after the dashed line)")
    fig1.update_yaxes(title_text="logit margin context − fixed (conflict trials, nats)", secondary_y=False)
    fig1.update_yaxes(title_text="p_ICL of the training mix", secondary_y=True, range=[0, 1], showgrid=False)
    fig1.update_layout(title="Margin over the balanced schedules", height=450)

    dirs = list(dict.fromkeys(patching.direction))
    fig2 = make_subplots(rows=1, cols=len(dirs), subplot_titles=[f"patch {d}" for d in dirs])
    for i, d in enumerate(dirs):
        m = patching[patching.direction == d].groupby(["layer", "pos"], as_index=False)["restored"].mean()
        z = m.pivot(index="layer", columns="pos", values="restored")
        ylab = [f"resid_pre {l}" if l < z.index.max() else "final resid" for l in z.index]
        fig2.add_trace(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=ylab, coloraxis="coloraxis"), row=1, col=i + 1)
        fig2.update_xaxes(title_text="position", row=1, col=i + 1)
    fig2.update_layout(title="Fraction of the margin gap restored by single-site residual patching (seed mean)",
                       coloraxis=dict(colorscale="RdBu", cmid=0, colorbar=dict(title="restored")), height=380)

    r = t[t.phase == "relax"].pivot_table(index=["seed", "k"], columns="branch", values="margin").reset_index()
    r["gap"] = r["from_below"] - r["from_above"]
    r["j"] = r["k"] - period
    fig3 = go.Figure()
    for s, rs in r.groupby("seed"):
        fig3.add_trace(go.Scatter(x=rs.j, y=rs.gap, mode="lines+markers", opacity=0.5, name=f"seed {s}"))
    mean = r.groupby("j", as_index=False)["gap"].mean()
    fig3.add_trace(go.Scatter(x=mean.j, y=mean.gap, mode="lines", line=dict(color="black", width=3), name="mean"))
    fig3.add_hline(y=0, line_color="grey")
    fig3.update_layout(title="Relaxation: margin gap (from below − from above) at constant p0",
                       xaxis_title="further updates at p0", yaxis_title="margin gap (nats)", height=400)
    return {"margin": fig1, "patching": fig2, "relaxation": fig3}
