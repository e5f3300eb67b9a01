"""The removability map's figure: a heatmap of the fade − forced_zero margin over
(model x task), one dot per seed, hover text with every number behind a cell.

Input frames are those of :mod:`studies.removability.map` (``cells``:
one row per cell; ``runs``: one row per run); this module only draws.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from circuitfade.viz.export import ExportError, save

__all__ = ["map_figure", "export_png"]

_SCALE = [[0.0, "#2166ac"], [0.5, "#f7f7f7"], [1.0, "#b2182b"]]  # blue (fade worse) - white - red (fade better)
_SHORT = {"path decides removability": "path decides", "prior only speeds learning": "only faster",
          "no difference": "no difference", "mixed": "mixed", "forced_zero better": "forced_zero better",
          "too few seeds": "too few seeds"}


def _f(x, spec="{:.3f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def map_figure(cells: pd.DataFrame, runs: pd.DataFrame, *, models: Sequence[str] | None = None,
               tasks: Sequence[str] | None = None, zmax: float = 0.8, title: str | None = None) -> go.Figure:
    """Heatmap: rows = models, columns = tasks, colour = mean margin (fade600->0 −
    forced_zero zero-gate accuracy, clipped to ±``zmax``); text = mean [95% interval],
    class and seed count; dots = per-seed margins (left to right in seed order, same
    colour scale, black outline); grey "not run" for grid cells without runs."""
    models = list(models) if models is not None else list(dict.fromkeys(cells.model))
    tasks = list(tasks) if tasks is not None else list(dict.fromkeys(cells.task))
    if not len(cells):
        raise ValueError("cells: nothing to draw (no finished cell)")
    recs = {(r["model"], r["task"]): r for r in cells.to_dict("records")}  # dicts: 'class' is a keyword
    z = [[recs[(m, t)]["margin_mean"] if (m, t) in recs else None for t in tasks] for m in models]
    text = [["" for _ in tasks] for _ in models]
    hover = [[f"{m} × {t}: not run" for t in tasks] for m in models]
    for i, m in enumerate(models):
        for j, t in enumerate(tasks):
            r = recs.get((m, t))
            if r is None:
                continue
            text[i][j] = (f"<b>{_f(r['margin_mean'], '{:+.2f}')}</b> [{_f(r['margin_lo'], '{:+.2f}')}, "
                          f"{_f(r['margin_hi'], '{:+.2f}')}]<br>forced_zero {_f(r['fz_mean'], '{:.2f}')} → fade "
                          f"{_f(r['fade_mean'], '{:.2f}')}<br>{_SHORT.get(r['class'], r['class'])} (n={r['n_paired']})")
            hover[i][j] = (f"<b>{m} × {t}</b> ({r['steps']} steps)<br>class: {r['class']}<br>"
                           f"margin {_f(r['margin_mean'], '{:+.3f}')} [95% t: {_f(r['margin_lo'], '{:+.3f}')}, "
                           f"{_f(r['margin_hi'], '{:+.3f}')}], per seed {r['margin_seeds']}<br>"
                           f"forced_zero {_f(r['fz_mean'])} ± {_f(r['fz_sd'])} ({r['fz_seeds']})<br>"
                           f"fade600->0 {_f(r['fade_mean'])} ± {_f(r['fade_sd'])} ({r['fade_seeds']})<br>"
                           f"unforced {_f(r['unforced_mean'])} (n={r['unforced_n']})<br>"
                           f"on plateau: forced_zero {_f(r['fz_plateau_frac'], '{:.2f}')}, "
                           f"fade {_f(r['fade_plateau_frac'], '{:.2f}')}<br>"
                           f"t50 forced_zero {r['fz_t50_seeds']} | fade {r['fade_t50_seeds']}")
    fig = go.Figure()
    missing_z = [[0 if v is None else None for v in row] for row in z]
    fig.add_trace(go.Heatmap(z=missing_z, x=list(range(len(tasks))), y=list(range(len(models))),
                             colorscale=[[0, "#d9d9d9"], [1, "#d9d9d9"]], showscale=False, hoverinfo="skip"))
    fig.add_trace(go.Heatmap(
        z=z, x=list(range(len(tasks))), y=list(range(len(models))), zmin=-zmax, zmax=zmax, colorscale=_SCALE,
        text=text, texttemplate="%{text}", textfont={"size": 13}, customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", xgap=3, ygap=3,
        colorbar={"title": {"text": "margin<br>fade − forced_zero"}}))
    for i, m in enumerate(models):
        for j, t in enumerate(tasks):
            if (m, t) not in recs:
                fig.add_annotation(x=j, y=i, text="not run", showarrow=False, font={"color": "#555"})
    # seeds as dots
    xs, ys, cs, hs = [], [], [], []
    for i, m in enumerate(models):
        for j, t in enumerate(tasks):
            sub = runs[(runs.model == m) & (runs.task == t)]
            fz = sub[sub.path == "forced_zero"].set_index("seed")
            fa = sub[sub.path == "fade600->0"].set_index("seed")
            seeds = sorted(set(fz.index) & set(fa.index))
            for q, s in enumerate(seeds):
                off = (q - (len(seeds) - 1) / 2) * min(0.12, 0.7 / max(len(seeds), 1))
                marg = float(fa.acc_zero[s] - fz.acc_zero[s])
                xs.append(j + off), ys.append(i - 0.3), cs.append(marg)
                hs.append(f"{m} × {t}, seed {s}<br>margin {marg:+.3f}<br>fade {fa.acc_zero[s]:.3f} "
                          f"(±{fa.se_zero[s]:.3f}) run {fa.run[s]}<br>forced_zero {fz.acc_zero[s]:.3f} "
                          f"(±{fz.se_zero[s]:.3f}) run {fz.run[s]}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="seeds", showlegend=False,
                             marker={"size": 13, "color": cs, "cmin": -zmax, "cmax": zmax, "colorscale": _SCALE,
                                     "line": {"color": "black", "width": 1.2}},
                             hovertext=hs, hovertemplate="%{hovertext}<extra></extra>"))
    n_seeds = sorted(set(cells.n_paired))
    fig.update_layout(
        title=title or ("Removability map: zero-gate accuracy margin fade600->0 − forced_zero "
                        f"(dots: seeds; n = {', '.join(map(str, n_seeds))} per cell)"),
        xaxis={"tickvals": list(range(len(tasks))), "ticktext": tasks, "title": "task", "range": [-0.5, len(tasks) - 0.5]},
        yaxis={"tickvals": list(range(len(models))), "ticktext": models, "title": "model (4 heads)",
               "range": [-0.5, len(models) - 0.5]},
        height=170 * len(models) + 160, width=900, plot_bgcolor="white", margin={"l": 90, "r": 40, "t": 70, "b": 60},
        title_font={"size": 14},
    )
    return fig


def export_png(fig: go.Figure, path: str | Path, *, width: int | None = None, timeout: float = 180.0) -> str | None:
    """Write ``fig`` as a PNG through :func:`circuitfade.viz.plots.save` (in a child process,
    ``timeout`` seconds at most). Returns ``None`` on success or the reason it could not;
    PNGs are optional, the HTML is always written."""

    try:
        save(fig, path, width=width, timeout=timeout)
    except ExportError as e:
        return str(e)
    return None
