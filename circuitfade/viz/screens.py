"""Figures and the HTML report of the developmental screens (``circuitfade screen``).

Every builder takes the tables :func:`circuitfade.commands.screen.run` returns (finished
screens, never models): :func:`fraction_figure` (class fractions over revisions),
:func:`heatmap_figure` (a per-head metric at each revision, with a slider), :func:`pr_figure`
(PR timelines with the threshold crossing marked), :func:`figures` (all of the report's) and
:func:`report_html` (the report page). The protocol and its command line are
:mod:`circuitfade.commands.screen`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis.development import PR_METRIC, per_head, pr_lead_test
from circuitfade.analysis.screens import CLASS_METRICS, DEFAULT_THRESHOLDS, SCORES
from circuitfade.analysis.spectra import elevated_pr
from circuitfade.store import head_label
from circuitfade.viz import moved_names, plots
from circuitfade.viz.html import Note, Section, page

__all__ = [
    "figures",
    "fraction_figure",
    "heatmap_figure",
    "pr_figure",
    "wide_fractions",
    "report_html",
]

__getattr__ = moved_names(__name__, {
    "circuitfade.commands.screen": ("run", "main", "build_parser", "check_screen_arguments", "TABLES"),
})


_COLORS = {"induction": "#d62728", "previous_token": "#1f77b4", "bos": "#7f7f7f"}
_DASHES = {"induction": "solid", "previous_token": "dash", "bos": "dot"}  # classes with equal fractions stay visible


def _step_axis(steps) -> dict:
    steps = [int(s) for s in steps]
    return dict(title="revision (training step)", tickmode="array", tickvals=list(range(len(steps))),
                ticktext=[str(s) for s in steps])


def fraction_figure(fractions: pd.DataFrame, shapes: pd.DataFrame | None = None) -> go.Figure:
    """Whole-model fraction of heads in each class per revision (revisions evenly spaced)."""
    steps = sorted(fractions["step"].unique())
    pos = {s: i for i, s in enumerate(steps)}
    fig = go.Figure()
    shape_of = {} if shapes is None else dict(zip(shapes["class"], shapes["shape"]))
    for c, g in fractions.groupby("class", sort=False):
        g = g.sort_values("step")
        label = f"{c} ({shape_of[c]})" if c in shape_of else c
        fig.add_trace(go.Scatter(x=[pos[s] for s in g["step"]], y=g["fraction"], mode="lines+markers", name=label,
                                 line=dict(color=_COLORS.get(c), dash=_DASHES.get(c, "solid"), width=2.5),
                                 marker=dict(symbol={"bos": "square", "previous_token": "diamond"}.get(c, "circle"),
                                             size=9 if c == "induction" else 7), customdata=g["step"],
                                 hovertemplate="step %{customdata}: %{y:.3f}<extra>" + c + "</extra>"))
    fig.update_layout(title="Fraction of heads in each class", xaxis=_step_axis(steps),
                      yaxis=dict(title="fraction of heads", range=[-0.02, 1.02]), height=420)
    return fig


def heatmap_figure(screen: pd.DataFrame, metric: str = "induction_selectivity",
                   threshold: float | None = None) -> go.Figure:
    """``metric`` per ``[layer, head]`` at each revision, one heatmap per revision with a slider.

    Heads at or above ``threshold`` (default: the class threshold of ``metric`` if it
    is a class metric) are marked with a dot.
    """
    wide = per_head(screen)
    if metric not in wide.columns:
        raise ValueError(f"screen table has no column {metric!r}")
    if threshold is None:
        threshold = {m: DEFAULT_THRESHOLDS[c] for c, m in CLASS_METRICS.items()}.get(metric)
    steps = sorted(wide["step"].unique())
    layers = sorted(wide["layer"].unique())
    heads = sorted(wide["head"].unique())
    vals = wide[metric].astype(float)
    zmin, zmax = float(np.nanmin(vals)), float(np.nanmax(vals))
    if metric.endswith("selectivity"):
        bound = max(abs(zmin), abs(zmax), 1e-9)
        zmin, zmax = -bound, bound
    fig = go.Figure()
    for i, step in enumerate(steps):
        g = wide[wide["step"] == step].pivot(index="layer", columns="head", values=metric).reindex(
            index=layers, columns=heads)
        fig.add_trace(go.Heatmap(z=g.to_numpy(dtype=float), x=[f"H{h}" for h in heads], y=[f"L{l}" for l in layers],
                                 zmin=zmin, zmax=zmax,
                                 colorscale="RdBu_r" if metric.endswith("selectivity") else "Viridis",
                                 visible=i == len(steps) - 1, colorbar=dict(title=metric),
                                 hovertemplate="%{y} %{x}: %{z:.3f}<extra>step " + str(step) + "</extra>"))
    n_heat = len(steps)
    if threshold is not None:
        for i, step in enumerate(steps):
            g = wide[(wide["step"] == step) & (wide[metric].astype(float) >= threshold)]
            fig.add_trace(go.Scatter(x=[f"H{h}" for h in g["head"]], y=[f"L{l}" for l in g["layer"]], mode="markers",
                                     marker=dict(color="black", size=9, symbol="circle-open-dot"),
                                     name=f">= {threshold}", showlegend=False, visible=i == len(steps) - 1,
                                     hoverinfo="skip"))
    per_step = 2 if threshold is not None else 1
    slider_steps = []
    for i, step in enumerate(steps):
        visible = [False] * (n_heat * per_step)
        visible[i] = True
        if threshold is not None:
            visible[n_heat + i] = True
        slider_steps.append(dict(method="update", label=str(step),
                                 args=[{"visible": visible}, {"title": f"{metric} at step {step}"}]))
    fig.update_layout(
        title=f"{metric} at step {steps[-1]}", height=200 + 60 * len(layers),
        sliders=[dict(active=len(steps) - 1, currentvalue=dict(prefix="step "), steps=slider_steps, pad=dict(t=40))],
        yaxis=dict(autorange="reversed"),
    )
    return fig


def pr_figure(screen: pd.DataFrame, lead: pd.DataFrame | None = None, *, cls: str = "induction",
              pr_metric: str = PR_METRIC, heads: list[tuple[int, int]] | None = None) -> go.Figure:
    """PR timelines of the final ``cls`` heads (or ``heads``), with the threshold crossing marked.

    Each line is the head's ``pr_metric`` per revision; a star marks the revision at
    which it first crosses its class threshold (from ``lead``, a :func:`pr_lead_test`
    table, or recomputed), open circles mark revisions where
    :func:`~circuitfade.analysis.spectra.elevated_pr` flags its PR.
    """
    wide = per_head(screen)
    steps = sorted(wide["step"].unique())
    pos = {s: i for i, s in enumerate(steps)}
    if lead is None:
        lead = pr_lead_test(screen, cls=cls, pr_metric=pr_metric)
    if heads is None:
        heads = list(zip(lead["layer"].astype(int), lead["head"].astype(int)))
    cross = {(int(l), int(h)): c for l, h, c in zip(lead["layer"], lead["head"], lead["cross_step"])}
    flagged = elevated_pr(wide[["step", "layer", "head"]].assign(value=wide[pr_metric].astype(float)))
    wide = wide.assign(elevated=flagged["elevated"].to_numpy())
    fig = go.Figure()
    for layer, head in heads:
        g = wide[(wide["layer"] == layer) & (wide["head"] == head)].sort_values("step")
        name = head_label(layer, head)
        x = [pos[s] for s in g["step"]]
        fig.add_trace(go.Scatter(x=x, y=g[pr_metric], mode="lines+markers", name=name, legendgroup=name,
                                 customdata=g["step"],
                                 hovertemplate="step %{customdata}: PR %{y:.2f}<extra>" + name + "</extra>"))
        e = g[g["elevated"]]
        fig.add_trace(go.Scatter(x=[pos[s] for s in e["step"]], y=e[pr_metric], mode="markers", legendgroup=name,
                                 showlegend=False, marker=dict(symbol="circle-open", size=14, color="black"),
                                 hoverinfo="skip"))
        c = cross.get((layer, head))
        if c is not None and not pd.isna(c):
            y = g.loc[g["step"] == c, pr_metric]
            fig.add_trace(go.Scatter(x=[pos[int(c)]], y=y, mode="markers", legendgroup=name, showlegend=False,
                                     marker=dict(symbol="star", size=16, color="gold",
                                                 line=dict(color="black", width=1)),
                                     hovertemplate=f"{name} crosses the {cls} threshold at step {int(c)}"
                                                   "<extra></extra>"))
    fig.update_layout(title=f"Head-output PR of the final {cls} heads (star: first revision above the {cls} "
                            "threshold; circle: PR elevated)", xaxis=_step_axis(steps),
                      yaxis=dict(title="participation ratio"), height=450)
    return fig


def figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """The report's figures from :func:`circuitfade.commands.screen.run`'s tables."""
    screen = tables["screen"]
    out = {"fractions": fraction_figure(tables["class_fractions"], tables.get("emergence_shape"))}
    out["induction_heatmap"] = heatmap_figure(screen, "induction_selectivity")
    out["pr_timelines"] = pr_figure(screen, tables.get("pr_lead"))
    out["bos_heatmap"] = heatmap_figure(screen, "bos_capability")
    out["previous_token_heatmap"] = heatmap_figure(screen, "previous_token_selectivity")
    return out


def wide_fractions(fractions: pd.DataFrame) -> pd.DataFrame:
    """The class fractions as one row per revision: ``step`` and one column per class."""
    w = fractions.pivot(index="step", columns="class", values="fraction").reset_index()
    w.columns.name = None
    return w[["step", *[c for c in SCORES if c in w.columns]]]


def _wide_counts(fractions: pd.DataFrame) -> pd.DataFrame:
    """Heads in each class per revision, as ``count`` columns plus ``of`` (heads screened)."""
    w = fractions.pivot(index="step", columns="class", values="count").reset_index()
    w.columns.name = None
    w = w[["step", *[c for c in SCORES if c in w.columns]]]
    return w.assign(of=fractions.groupby("step", sort=True)["n_heads"].first().to_numpy())


def report_html(tables: Mapping[str, pd.DataFrame], *, meta: Mapping | None = None,
                title: str = "circuitfade developmental screens") -> str:
    """One self-contained HTML page (:func:`circuitfade.viz.html.page`) from
    :func:`circuitfade.commands.screen.run`'s tables: the figures first, then the tables (class
    membership as head counts)."""
    meta = dict(meta or {})
    screen = tables["screen"]
    steps = sorted(screen["step"].unique())
    skipped = tables["integrity"][tables["integrity"]["status"] != "ok"]
    intro = (f"Source {meta.get('source', '?')}: {len(steps)} revisions screened (steps {steps[0]}-{steps[-1]}), "
             f"{len(skipped)} skipped; {meta.get('n', '?')} sequences per screen input, BOS token "
             f"{meta.get('bos')}; thresholds {meta.get('thresholds', DEFAULT_THRESHOLDS)}.")
    figs = figures(tables)
    figs["fractions"] = plots.class_count_figure(tables["class_fractions"], tables.get("emergence_shape"))
    for fig in figs.values():  # room for the colour-bar titles of the small heatmaps
        fig.update_layout(height=max(int(fig.layout.height or 450), 420))
    pr_lead = tables["pr_lead"]
    sections = [
        Section("Figures", list(figs.values())),
        Section("Heads in each class (count per revision)", [_wide_counts(tables["class_fractions"])]),
        Section("Emergence shape", [
            Note("sharp: the largest change between adjacent revisions is at least half of the net change from "
                 "the first to the last revision; flat: net change below 0.05."),
            tables["emergence_shape"]]),
        Section("Layers that never have a head of a class",
                [tables["zero_layers"][tables["zero_layers"]["zero_at_every_revision"]]]),
        Section("Convergence of the induction set to the final set",
                [tables["convergence_summary"], tables["set_convergence"]]),
        Section("PR lead test (final induction heads)", [
            Note("elevated_by_cross: head-output PR elevated (above its earlier revisions' mean by more than 2 sd) "
                 "at or before the first revision where induction selectivity crosses the threshold."),
            pr_lead if len(pr_lead) else "No induction heads at the final revision."]),
        Section("The same test for the final heads of every class", [tables["pr_lead_all"]], level=3),
        Section("Integrity", [tables["integrity"][["step", "source", "status"]]]),
    ]
    return page(title, sections, intro=intro)
