"""The main paper's figure: zero-gate accuracy of every training path of Tables 1-2 on the base
model, ours (one dot per seed, the mean with its 95% interval) beside the paper's value.

Built from the runs' final metrics (``results_runs.csv`` or the run folders), so
``python -m studies.paper reproduce --tables-only`` redraws it without training.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pandas as pd
import plotly.graph_objects as go

from circuitfade.train import RunConfig
from circuitfade.viz.export import ExportError, save
from studies.paper import protocol as P

__all__ = ["PATHS", "paths_points", "paths_figure", "write_paths_figure"]

PATHS = ("fade600->0", "linear0.5->0", "forced_const0.5", "unforced", "forced_zero", "switch@1050", "switch@600",
         "posthoc")
"""The base model's paths of Tables 1-2, in the order drawn."""


def _paper_value(cell) -> float:
    """The paper's mean from a table cell such as ``".734 ± .028"`` (NaN for "—")."""
    try:
        return float(str(cell).split("±")[0].strip())
    except ValueError:
        return math.nan


def paths_points(acc_zero: Callable[[RunConfig], float], root, tables: dict, seeds) -> pd.DataFrame:
    """One row per (path, seed): ``path, seed, acc_zero`` (``acc_zero(config)``: the run's final
    zero-gate accuracy, NaN where the run is missing), plus the paper's zero-gate value per path from
    the ``paths``/``controls`` tables (``paper``)."""
    paper = {}
    for name in ("paths", "controls"):
        t = tables.get(name)
        if t is not None and "paper zero-gate" in t:
            base = t[t["model"].astype(str).str.startswith("base")]
            paper.update({c: _paper_value(v) for c, v in zip(base["condition"], base["paper zero-gate"])})
    rows = []
    for path in PATHS:
        for s in seeds:
            cfg = P.posthoc_config(root, s, P.FULL) if path == "posthoc" else P.run(path, s, P.FULL)
            rows.append({"path": path, "seed": s, "acc_zero": acc_zero(cfg),
                         "paper": paper.get(path, math.nan)})
    return pd.DataFrame(rows)


def paths_figure(points: pd.DataFrame) -> go.Figure:
    """Dots per seed, the mean with its 95% interval (:class:`studies.paper.protocol.Measure`) and
    the paper's value (open diamond) for every path; the 0.2 and 0.6 lines are the thresholds the
    claims use."""
    fig = go.Figure()
    xs, means, lo, hi = [], [], [], []
    for path in PATHS:
        vals = points.loc[points.path == path, "acc_zero"].dropna().tolist()
        m = P.Measure.of(vals)
        xs.append(path)
        means.append(m.mean)
        lo.append(m.mean - m.lo if m.n > 1 else 0.0)
        hi.append(m.hi - m.mean if m.n > 1 else 0.0)
        fig.add_trace(go.Scatter(x=[path] * len(vals), y=vals, mode="markers", showlegend=False,
                                 marker={"color": "#888", "size": 7}, hoverinfo="y"))
    fig.add_trace(go.Scatter(x=xs, y=means, mode="markers", name="ours: mean, 95% t interval over seeds",
                             marker={"color": "#b2182b", "size": 12, "symbol": "line-ew-open",
                                     "line": {"width": 3, "color": "#b2182b"}},
                             error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo,
                                      "color": "#b2182b", "thickness": 2}))
    paper = points.groupby("path", sort=False)["paper"].first().reindex(list(PATHS))
    fig.add_trace(go.Scatter(x=list(PATHS), y=paper.tolist(), mode="markers", name="paper",
                             marker={"color": "#2166ac", "size": 11, "symbol": "diamond-open",
                                     "line": {"width": 2}}))
    for y, text, where in ((0.2, "≤ .20: fails at zero gate", "top right"),
                           (0.6, "≥ .60: keeps the circuit", "bottom right")):
        fig.add_hline(y=y, line={"dash": "dot", "color": "#999", "width": 1}, annotation_text=text,
                      annotation_position=where, annotation_font_size=11)
    fig.update_layout(title="Zero-gate accuracy by training path (base model L=2 d=64, 3,600 steps; grey: seeds)",
                      yaxis={"title": "zero-gate accuracy", "range": [0, 1.05]}, xaxis={"title": "training path"},
                      template="plotly_white", width=900, height=480,
                      legend={"orientation": "h", "y": -0.25, "x": 0})
    return fig


def write_paths_figure(acc_zero: Callable[[RunConfig], float], root, tables: dict, seeds,
                       out: str | Path) -> str | None:
    """Write ``OUT/fig_paths.png`` (see :func:`paths_points`); returns ``None`` or the reason the PNG
    was not written."""
    points = paths_points(acc_zero, root, tables, seeds)
    if points.acc_zero.notna().sum() == 0:
        return "no base-model runs of Tables 1-2"
    try:
        save(paths_figure(points), Path(out) / "fig_paths.png", timeout=180.0)
    except ExportError as e:
        return str(e)
    return None
