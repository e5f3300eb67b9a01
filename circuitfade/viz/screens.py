"""Developmental screens of a revision series: ``circuitfade screen SERIES``.

"When do attention circuits form across model revisions" screens every attention head of
Pythia / OLMo at log-spaced revisions. This module runs that protocol on any series
(with no download, on the local developing series of :mod:`circuitfade.train.recipes`):

* :func:`run` attaches a series (a run directory, a folder of Hugging Face model
  folders, a folder of state dicts, or a :class:`~circuitfade.store.CheckpointSeries`),
  checks its integrity, screens every revision
  (:func:`~circuitfade.analysis.development.screen_series`), computes the series-level
  tables and writes an HTML report (class fractions over steps, per-revision heatmaps
  of induction selectivity with a slider, PR timelines with the selectivity crossing
  marked) plus one CSV per table;
* :func:`main` is the command line ``circuitfade screen SERIES [--out report.html]
  [--bos ID] [--n N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis.development import (
    PR_METRIC,
    class_fractions,
    convergence_summary,
    emergence_shape,
    layer_counts,
    per_head,
    pr_lead_test,
    screen_series,
    set_convergence,
    zero_layers,
)
from circuitfade.analysis.screens import CLASS_METRICS, DEFAULT_THRESHOLDS, SCORES
from circuitfade.analysis.spectra import elevated_pr
from circuitfade.io import check_outputs, default_output_dir, write_csv, write_text
from circuitfade.store import CheckpointSeries, attach, head_label
from circuitfade.store.revisions import sound_revisions
from circuitfade.viz import plots
from circuitfade.viz.command import (Parser, add_source_arguments, flag_names, guarded, removing_new_folders,
                                     source_from_args)
from circuitfade.viz.html import Note, Section, page

__all__ = [
    "run",
    "figures",
    "fraction_figure",
    "heatmap_figure",
    "pr_figure",
    "report_html",
    "build_parser",
    "main",
]

# --------------------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------------------
def _series(source) -> CheckpointSeries:
    return source if isinstance(source, CheckpointSeries) else attach(source)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    full = [f for f in frames if len(f)]
    return pd.concat(full, ignore_index=True) if full else frames[0]


def check_screen_arguments(*, n, seq_len=None, bos=None, seed=0) -> None:
    """``ValueError`` naming the first bad one of :func:`run`'s ``n`` (an integer >= 1),
    ``seq_len`` (``None`` or an integer >= 1), ``bos`` (``None`` or a token id >= 0) and ``seed``
    (an integer >= 0); :func:`run` calls it before attaching or screening anything."""
    for name, v, minimum, optional in (("n", n, 1, False), ("seq_len", seq_len, 1, True), ("bos", bos, 0, True),
                                       ("seed", seed, 0, False)):
        if v is None and optional:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")


TABLES = ("integrity", "screen", "class_fractions", "emergence_shape", "layer_counts", "zero_layers",
          "set_convergence", "convergence_summary", "pr_lead", "pr_lead_all")
"""The tables :func:`run` returns and writes as ``<name>.csv``."""


def run(
    series_or_run_dir,
    out: str | Path | None = None,
    *,
    n: int = 32,
    seq_len: int | None = None,
    bos: int | None = None,
    seed: int = 0,
    thresholds: Mapping[str, float] | None = None,
    jaccard_threshold: float = 0.8,
    html_name: str = "report.html",
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """Screen every revision of a series and compute the series-level tables.

    Steps: attach (unless given a series), :func:`~circuitfade.store.revisions.sound_revisions`
    (duplicate and unreadable revisions left out with a warning),
    :func:`~circuitfade.analysis.development.screen_series`, then the tables. Returns ``{"integrity",
    "screen", "class_fractions", "emergence_shape", "layer_counts", "zero_layers", "set_convergence",
    "convergence_summary", "pr_lead", "pr_lead_all"}`` (``pr_lead``: the final induction
    heads; ``pr_lead_all``: the same test for the final heads of every class). With
    ``out`` (a folder), writes
    ``out/<html_name>`` and ``out/<table>.csv`` for each table.
    """
    check_screen_arguments(n=n, seq_len=seq_len, bos=bos, seed=seed)  # before any work or progress bar
    series, integrity = sound_revisions(_series(series_or_run_dir))
    screen = screen_series(series, n=n, seq_len=seq_len, bos=bos, seed=seed, thresholds=thresholds,
                           progress=progress).table
    fractions = class_fractions(screen)
    counts = layer_counts(screen)
    conv = set_convergence(screen, jaccard_threshold=jaccard_threshold)
    tables = {
        "integrity": integrity,
        "screen": screen,
        "class_fractions": fractions,
        "emergence_shape": emergence_shape(fractions),
        "layer_counts": counts,
        "zero_layers": zero_layers(counts),
        "set_convergence": conv,
        "convergence_summary": convergence_summary(conv),
        "pr_lead": pr_lead_test(screen),
        "pr_lead_all": _concat([pr_lead_test(screen, cls=c) for c in SCORES]),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            write_csv(out / f"{name}.csv", df)
        meta = {"source": str(series.source), "n": n, "bos": bos if bos is not None else
                getattr(series.task, "bos_token", None), "thresholds": {**DEFAULT_THRESHOLDS, **(thresholds or {})}}
        write_text(out / html_name, report_html(tables, meta=meta))
    return tables


# --------------------------------------------------------------------------------------
# figures (plotly, from finished tables)
# --------------------------------------------------------------------------------------
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
    """The report's figures from :func:`run`'s tables."""
    screen = tables["screen"]
    out = {"fractions": fraction_figure(tables["class_fractions"], tables.get("emergence_shape"))}
    out["induction_heatmap"] = heatmap_figure(screen, "induction_selectivity")
    out["pr_timelines"] = pr_figure(screen, tables.get("pr_lead"))
    out["bos_heatmap"] = heatmap_figure(screen, "bos_capability")
    out["previous_token_heatmap"] = heatmap_figure(screen, "previous_token_selectivity")
    return out


def _wide_fractions(fractions: pd.DataFrame) -> pd.DataFrame:
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
    """One self-contained HTML page (:func:`circuitfade.viz.html.page`) from :func:`run`'s tables:
    the figures first, then the tables (class membership as head counts)."""
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


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------
def build_parser(prog: str = "circuitfade screen") -> argparse.ArgumentParser:
    """The ``circuitfade screen`` parser: the screen's options and the checkpoint-finding group it
    shares with ``circuitfade analyze`` (:func:`~circuitfade.viz.command.add_source_arguments`)."""
    ap = Parser(
        prog=prog,
        description="Screen every attention head of every revision of a checkpoint series (induction, "
                    "previous-token, BOS-attractor classes; head-output PR), print the series-level tables and "
                    "write an HTML report.",
    )
    ap.add_argument("series", metavar="SERIES",
                    help="a circuitfade run directory, a folder of Hugging Face model folders (step1000/, ...), "
                         "or a folder of state-dict files with config.json")
    ap.add_argument("--out", metavar="FILE",
                    help="HTML report (default reports/<SERIES name>-screen/screen.html); tables go next to it as CSV")
    ap.add_argument("--force", action="store_true", help="replace output files that already exist")
    ap.add_argument("--bos", type=int, metavar="ID", help="BOS token id (default: the run task's, else none)")
    ap.add_argument("--n", type=int, default=32, help="sequences per screen input (default 32)")
    ap.add_argument("--seq-len", type=int, metavar="L", help="half-length of the repeated input (default: auto)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the screen inputs (default 0)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_source_arguments(ap, "SERIES")
    return ap


def _print(title: str, df: pd.DataFrame) -> None:
    print(f"\n## {title}")
    print(df.to_string(index=False, na_rep="NA", float_format=lambda v: f"{v:.3g}") if len(df) else "(none)")


def main(argv: list[str] | None = None) -> int:
    """``circuitfade screen SERIES [--out report.html] [--bos ID] [--n N] ...``: exit 0, 2 on bad input
    (one line in the command's flags, :func:`~circuitfade.viz.command.guarded`; folders the command
    created are removed again), 130 on Ctrl-C."""
    ap = build_parser()
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    return guarded(ap.prog, _screen_command, ns, resume=None, flags=flag_names(ap), also=(KeyError,))


def _screen_command(ns: argparse.Namespace) -> int:
    source = Path(ns.series)
    out = Path(ns.out) if ns.out else default_output_dir(source, "screen") / "screen.html"
    t0 = time.time()
    check_screen_arguments(n=ns.n, seq_len=ns.seq_len, bos=ns.bos, seed=ns.seed)  # before any progress bar
    with removing_new_folders(out.parent):
        check_outputs([out, *(out.parent / f"{name}.csv" for name in TABLES)], force=ns.force)
        series = source_from_args(ns, source)
        tables = run(series, out.parent, n=ns.n, seq_len=ns.seq_len, bos=ns.bos, seed=ns.seed, html_name=out.name,
                     progress=not ns.quiet)
    _print("Integrity", tables["integrity"][["step", "source", "status"]])
    _print("Class fractions", _wide_fractions(tables["class_fractions"]))
    _print("Emergence shape", tables["emergence_shape"])
    zero = tables["zero_layers"]
    _print("Layers with no head of a class at any revision", zero[zero["zero_at_every_revision"]])
    _print("Induction-set convergence", tables["convergence_summary"])
    _print("PR lead test (final induction heads)", tables["pr_lead"])
    print(f"\nreport: {out}  (tables: {out.parent}/*.csv; {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
