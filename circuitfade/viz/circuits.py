"""Figures of circuits: edge scores as a graph, an edge x step heatmap and the faithfulness curve.

Every builder takes the frames :mod:`circuitfade.analysis.edges` produces (never a model) and
returns a plotly ``go.Figure``; :func:`circuitfade.viz.plots.save` writes any of them.

* :func:`circuit_graph` - the top-``k`` edges of one checkpoint (a slider over checkpoints for
  a trace): nodes laid out by layer (rows, input at the bottom, logits on top) and component
  (columns: heads, then the MLP), an edge's width proportional to ``|score|``, blue for a
  positive score, red for a negative one. An edge into a head's query, key, value or prior
  ends at the head's node, offset to the left (q), centre (k), right (v) or below (prior);
* :func:`edge_heatmap` - the score of the ``top`` edges (largest ``|score|`` at any step) at
  every checkpoint, zero white;
* :func:`faithfulness_figure` - the fraction of the objective the top-``k`` circuit recovers
  against ``k``, with the stated fraction and the smallest circuit that reaches it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis.edges import EDGE_ATTRIBUTION, smallest_circuit, top_edges
from circuitfade.viz.plots import STEP_TITLE

__all__ = ["circuit_graph", "edge_heatmap", "faithfulness_figure"]

_ROLE_OFFSET = {"q": (-0.22, -0.18), "k": (0.0, -0.22), "v": (0.22, -0.18)}
_POSITIVE, _NEGATIVE = "#2166ac", "#b2182b"


def _num(v) -> str:
    """A score for hover text: 4 significant digits, ``n/a`` when missing."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(v) else f"{v:.4g}"


def _edge_frame(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    need = {"edge", "value", "sender", "receiver", "sender_layer", "sender_head", "receiver_layer",
            "receiver_head", "role"}
    if not isinstance(frame, pd.DataFrame) or not need <= set(frame.columns):
        raise ValueError(f"frame: expected edge scores (edge_scores, edge_effects or a trace with edge_attribution), "
                         f"missing columns {sorted(need - set(getattr(frame, 'columns', [])))}")
    df = frame[frame["metric"] == metric] if "metric" in frame.columns else frame
    if df.empty:
        raise ValueError(f"frame: no rows of metric {metric!r}")
    if "step" not in df.columns:
        df = df.assign(step=0)
    return df


def _layout(df: pd.DataFrame) -> tuple[int, int]:
    n_layers = int(max(df["sender_layer"].max(), df["receiver_layer"].max() - 1)) + 1
    n_heads = int(max(df["sender_head"].max(), df["receiver_head"].max())) + 1
    return n_layers, max(n_heads, 1)


def _node_xy(kind_layer_head: tuple[str, int, int], n_layers: int, n_heads: int) -> tuple[float, float]:
    name, layer, head = kind_layer_head
    if name == "input":
        return (n_heads - 1) / 2, -1.0
    if name == "logits":
        return (n_heads - 1) / 2, float(n_layers)
    if name.startswith("MLP"):
        return float(n_heads) + 0.2, layer + 0.5
    return float(head), float(layer)


def _sender_key(row) -> tuple[str, int, int]:
    return row["sender"], int(row["sender_layer"]), int(row["sender_head"])


def _receiver_key(row) -> tuple[str, int, int]:
    name = row["receiver"].split(".")[0]
    return name, int(row["receiver_layer"]), int(row["receiver_head"])


def _graph_traces(df: pd.DataFrame, k: int, by: str, n_layers: int, n_heads: int, scale: float) -> list:
    chosen = df.set_index("edge").loc[top_edges(df, k, by=by)].reset_index()
    traces = []
    for _, row in chosen.iterrows():
        x0, y0 = _node_xy(_sender_key(row), n_layers, n_heads)
        x1, y1 = _node_xy(_receiver_key(row), n_layers, n_heads)
        dx, dy = _ROLE_OFFSET.get(row["role"], (0.0, -0.3) if row["role"] not in ("mlp", "logits") else (0.0, 0.0))
        x1, y1 = x1 + dx, y1 + dy
        v = float(row["value"])
        width = 1.0 + 9.0 * abs(v) / scale if scale > 0 and math.isfinite(v) else 1.0
        interval = f" [{_num(row['lo'])}, {_num(row['hi'])}]" if "lo" in row and "hi" in row else ""
        text = f"{row['edge']}: {_num(v)}{interval}"
        traces.append(go.Scatter(x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2, y1], mode="lines+markers",
                                 line=dict(width=width, color=_POSITIVE if v >= 0 else _NEGATIVE),
                                 marker=dict(size=[0, 6, 0], color=_POSITIVE if v >= 0 else _NEGATIVE),
                                 opacity=0.75, hoverinfo="text", text=text, showlegend=False, name=row["edge"]))
    nodes = [("input", -1, -1), ("logits", n_layers, -1)]
    nodes += [(f"L{l}H{h}", l, h) for l in range(n_layers) for h in range(n_heads)]
    if (df["receiver"].str.startswith("MLP")).any():
        nodes += [(f"MLP{l}", l, -1) for l in range(n_layers)]
    xy = [_node_xy(n, n_layers, n_heads) for n in nodes]
    traces.append(go.Scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text",
                             text=[n[0] for n in nodes], textposition="middle right", hoverinfo="text",
                             marker=dict(size=14, color="#dddddd", line=dict(width=1, color="#555555")),
                             showlegend=False, name="nodes"))
    return traces


def circuit_graph(frame: pd.DataFrame, *, k: int = 20, step: int | None = None, by: str = "abs",
                  metric: str = EDGE_ATTRIBUTION) -> go.Figure:
    """The top-``k`` edges (by ``|value|``, or signed ``value`` with ``by="value"``) as a graph.

    ``frame``: :func:`~circuitfade.analysis.edges.edge_scores` / ``edge_effects`` output (one
    graph) or a trace with :func:`~circuitfade.analysis.edges.edge_attribution` rows: one graph
    per checkpoint with a slider (``step=S``: that checkpoint only). Edge widths share one scale
    over every shown checkpoint; hover text gives the edge, its score and interval.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    df = _edge_frame(frame, metric)
    steps = sorted(int(s) for s in df["step"].unique())
    if step is not None:
        if int(step) not in steps:
            raise ValueError(f"step {step!r} is not in the frame; steps: {steps}")
        steps = [int(step)]
    n_layers, n_heads = _layout(df)
    shown = df[df["step"].isin(steps)]
    scale = float(np.nanmax(np.abs(shown["value"].to_numpy()))) if len(shown) else 0.0
    fig = go.Figure()
    groups = []
    for s in steps:
        traces = _graph_traces(df[df["step"] == s], k, by, n_layers, n_heads, scale)
        groups.append(len(traces))
        for tr in traces:
            fig.add_trace(tr)
    last = len(steps) - 1
    owner = [i for i, n in enumerate(groups) for _ in range(n)]
    for tr, i in zip(fig.data, owner):
        tr.visible = i == last
    title = f"top {k} edges by |score|" if by == "abs" else f"top {k} edges by score"
    label = (lambda s: f"{title}, step {s}") if len(set(df["step"])) > 1 else (lambda s: title)
    fig.update_layout(
        meta={"kind": "circuit_graph"},
        title=dict(text=label(steps[last])),
        xaxis=dict(title=dict(text="head (MLP on the right)"), tickmode="array", tickvals=list(range(n_heads)),
                   range=[-0.8, n_heads + 1.2], zeroline=False),
        yaxis=dict(title=dict(text="layer (input below, logits on top)"), tickmode="array",
                   tickvals=[-1, *range(n_layers), n_layers], ticktext=["input", *map(str, range(n_layers)), "logits"],
                   range=[-1.6, n_layers + 0.6], zeroline=False),
        height=max(460, 110 * (n_layers + 2) + 120), plot_bgcolor="white",
    )
    if len(steps) > 1:
        fig.update_layout(sliders=[dict(
            active=last, currentvalue=dict(prefix="checkpoint at training step "), pad=dict(t=40),
            steps=[dict(method="update", label=str(s), args=[{"visible": [o == i for o in owner]},
                                                               {"title.text": label(s)}])
                   for i, s in enumerate(steps)],
        )])
    return fig


def edge_heatmap(traced: pd.DataFrame, *, top: int = 30, metric: str = EDGE_ATTRIBUTION) -> go.Figure:
    """Edge x step heatmap of the ``top`` edges (largest ``|value|`` at any step), rows ordered by
    their largest ``|value|``; a diverging scale centred on zero; hover with the interval."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top: expected a positive int, got {top!r}")
    df = _edge_frame(traced, metric)
    peak = df.assign(a=df["value"].abs()).groupby("edge", sort=False)["a"].max().sort_values(ascending=False, kind="stable")
    edges = list(peak.index[:top])
    steps = sorted(int(s) for s in df["step"].unique())
    sub = df[df["edge"].isin(edges)].set_index(["edge", "step"])
    z = np.full((len(edges), len(steps)), np.nan)
    text = [["" for _ in steps] for _ in edges]
    for i, e in enumerate(edges):
        for j, s in enumerate(steps):
            if (e, s) in sub.index:
                row = sub.loc[(e, s)]
                row = row.iloc[0] if isinstance(row, pd.DataFrame) else row
                z[i, j] = float(row["value"])
                iv = f" [{_num(row['lo'])}, {_num(row['hi'])}]" if "lo" in row.index else ""
                text[i][j] = f"{e} step {s}: {_num(row['value'])}{iv}"
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    colorbar = dict(title=dict(text="edge score<br>(objective drop<br>when patched)", side="right"), thickness=18)
    fig = go.Figure(go.Heatmap(z=z, x=[str(s) for s in steps], y=edges, text=text,
                               hovertemplate="%{text}<extra></extra>", colorscale="RdBu", zmid=0, zmin=-lim,
                               zmax=lim, colorbar=colorbar, xgap=1, ygap=1))
    fig.update_layout(meta={"kind": "edge_heatmap"}, title=dict(text=f"top {len(edges)} edges across checkpoints"),
                      xaxis=dict(title=dict(text=STEP_TITLE), type="category"),
                      yaxis=dict(title=dict(text="edge"), autorange="reversed"),
                      height=max(420, 18 * len(edges) + 220))
    return fig


def faithfulness_figure(curve: pd.DataFrame, *, fraction: float | None = 0.8) -> go.Figure:
    """Recovered fraction against the number of top edges kept (:func:`~circuitfade.analysis.edges.faithfulness_curve`);
    its bootstrap interval over examples as a band (where the curve has ``lo`` / ``hi``), a
    dashed line at ``fraction`` and a marker at the smallest circuit that reaches it. The legend
    sits below the axis, clear of the curve, its band and the lines' labels."""
    if not isinstance(curve, pd.DataFrame) or not {"k", "recovered"} <= set(curve.columns):
        raise ValueError("curve: expected a faithfulness_curve frame with columns 'k' and 'recovered'")
    c = curve.sort_values("k")
    fig = go.Figure()
    if {"lo", "hi"} <= set(c.columns):
        fig.add_trace(go.Scatter(x=list(c["k"]) + list(c["k"])[::-1], y=list(c["hi"]) + list(c["lo"])[::-1],
                                 fill="toself", fillcolor="rgba(31,119,180,0.2)", line=dict(width=0),
                                 mode="lines", name="bootstrap interval over examples", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=c["k"], y=c["recovered"], mode="lines+markers", name="top-k circuit",
                             line=dict(color="#1f77b4"), hovertemplate="%{x} edges: %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#999999", width=1), annotation_text="clean run")
    fig.add_hline(y=0.0, line=dict(color="#999999", width=1), annotation_text="corrupted run",
                  annotation_position="bottom right")
    if fraction is not None:
        best = smallest_circuit(c, fraction)
        fig.add_hline(y=fraction, line=dict(dash="dash", color="#555555", width=1),
                      annotation_text=f"{fraction:g} of the objective", annotation_position="bottom right")
        if best["k"] is not None:
            fig.add_trace(go.Scatter(x=[best["k"]], y=[best["recovered"]], mode="markers",
                                     marker=dict(size=13, symbol="star", color="#d62728"),
                                     name=f"smallest circuit recovering {fraction:g}: {best['k']} edges"))
    fig.update_layout(meta={"kind": "faithfulness"}, title=dict(text="faithfulness of the top-k edge circuit"),
                      xaxis=dict(title=dict(text="edges kept (top k by score)")),
                      yaxis=dict(title=dict(text="objective recovered (0 = corrupted, 1 = clean)")),
                      height=480, legend=dict(orientation="h", x=0.0, xanchor="left", y=-0.18, yanchor="top"))
    return fig
