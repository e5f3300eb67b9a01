"""The layer x head heatmap panels that the figures (:mod:`circuitfade.viz.plots`) and their
static export (:mod:`circuitfade.viz.export`) both draw: one heatmap trace, integer axes, a
colour bar with a wrapped title, and the small-multiples grid of several panels.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["COLORSCALE", "wrap", "colorbar", "heat_trace", "int_axis", "panel_grid"]

COLORSCALE = "Viridis"
"""The colour scale of every per-head heatmap."""


def wrap(text: str, width: int = 18) -> str:
    """``text`` broken into lines of at most ``width`` characters (plotly ``<br>``), at spaces."""
    lines, cur = [], ""
    for word in str(text).split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return "<br>".join([*lines, cur] if cur else lines)


def colorbar(label: str) -> dict:
    """A colour bar whose title is wrapped (two or three short lines beside it), so no part of it is
    clipped at the figure's edge; heatmaps are tall enough for the rotated lines."""
    return dict(title=dict(text=wrap(label, 26), side="right"), thickness=18)


def heat_trace(z, text, n_layers: int, n_heads: int) -> go.Heatmap:
    """One ``[layer, head]`` heatmap trace: ``z`` with hover ``text``, on the figure's shared colour axis."""
    return go.Heatmap(
        z=z, x=list(range(n_heads)), y=list(range(n_layers)), text=text,
        hovertemplate="%{text}<extra></extra>", coloraxis="coloraxis", xgap=1, ygap=1,
    )


def int_axis(n: int) -> dict:
    """An axis with a tick at each integer ``0 .. n - 1`` (layers, heads)."""
    return dict(tickmode="array", tickvals=list(range(n)), ticktext=[str(i) for i in range(n)])


def panel_grid(panels: list[tuple[str, np.ndarray, list]], n_layers: int, n_heads: int, label: str,
               crange: tuple[float, float], max_cols: int = 6) -> go.Figure:
    """Small multiples: one ``[layer, head]`` heatmap per ``(title, z, hover text)`` panel, one colour scale."""
    cols = min(max_cols, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=[t for t, _, _ in panels],
        horizontal_spacing=min(0.04, 0.5 / cols), vertical_spacing=min(0.12, 0.6 / max(rows - 1, 1)),
    )
    for i, (t, z, text) in enumerate(panels):
        fig.add_trace(heat_trace(z, text, n_layers, n_heads).update(name=t), row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(**int_axis(n_heads))
    fig.update_yaxes(autorange="reversed", **int_axis(n_layers))
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text="layer", row=r, col=1)
    for i in range(len(panels)):
        if i + cols >= len(panels):  # the lowest panel of its column
            fig.update_xaxes(title_text="head", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(
        title=dict(text=f"{label} per head at every checkpoint"),
        coloraxis=dict(colorscale=COLORSCALE, cmin=crange[0], cmax=crange[1], colorbar=colorbar(label)),
        height=max(300, rows * (40 * n_layers + 140) + 100),
    )
    return fig
