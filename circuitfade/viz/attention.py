"""Figures of attention patterns across a checkpoint series: head x query x key, a slider over steps.

    from circuitfade.analysis.attention import attention_series
    from circuitfade.viz.attention import attention_figure, attention_view
    pats = attention_series(series, batch.tokens[0])        # one sequence, every checkpoint
    attention_figure(pats, layer=1)                          # plotly: one panel per head, slider over steps
    attention_view(pats, layer=1)                            # CircuitsVis when installed, else the same figure

Both take the :class:`~circuitfade.analysis.attention.AttentionPatterns` that
:func:`circuitfade.analysis.attention.attention_series` computes (nothing here runs a model).
Figures put the tokens on the axes, labelled ``"position:token"`` so repeated tokens
stay distinct.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from circuitfade.analysis.attention import AttentionPatterns
from circuitfade.viz import moved_names

__all__ = ["attention_figure", "attention_view"]

__getattr__ = moved_names(__name__, {"circuitfade.analysis.attention": (("attention_patterns", "attention_series"),)})


def _check(p: AttentionPatterns, layer: int) -> None:
    if not isinstance(p, AttentionPatterns):
        raise ValueError(f"expected AttentionPatterns (see attention_series), got {type(p).__name__}")
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not 0 <= layer < p.n_layers:
        raise ValueError(f"layer: expected an int in [0, {p.n_layers}), got {layer!r}")


def attention_figure(p: AttentionPatterns, layer: int = 0, *, heads: Sequence[int] | None = None) -> go.Figure:
    """Layer ``layer``'s attention patterns: one query x key heatmap per head, a slider over steps.

    Rows are query positions (top to bottom), columns key positions; both axes carry the
    token labels. One colour scale, 0 to 1 (attention probability). The slider starts at
    the last step. Hover: ``"L{layer}H{head} step S: query q -> key k: p"``.
    """
    _check(p, layer)
    heads = list(range(p.n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < p.n_heads]
    if bad or not heads:
        raise ValueError(f"heads: expected head indices in [0, {p.n_heads}), got {heads}")
    n_pos = p.patterns.shape[-1]
    fig = make_subplots(rows=1, cols=len(heads), subplot_titles=[f"L{layer}H{h}" for h in heads],
                        horizontal_spacing=min(0.06, 0.3 / len(heads)))
    for i, step in enumerate(p.steps):
        for j, h in enumerate(heads):
            z = p.patterns[i, layer, h]
            text = [[f"L{layer}H{h} step {step}: query {p.labels[q]} -> key {p.labels[k]}: {z[q, k]:.3f}"
                     for k in range(n_pos)] for q in range(n_pos)]
            fig.add_trace(go.Heatmap(z=z, x=list(range(n_pos)), y=list(range(n_pos)), text=text,
                                     hovertemplate="%{text}<extra></extra>", coloraxis="coloraxis",
                                     visible=i == len(p.steps) - 1, name=f"step {step} L{layer}H{h}"),
                          row=1, col=j + 1)
    axis = dict(tickmode="array", tickvals=list(range(n_pos)), ticktext=list(p.labels), tickfont=dict(size=9))
    fig.update_xaxes(title_text="key", **axis)
    fig.update_yaxes(autorange="reversed", **axis)
    fig.update_yaxes(title_text="query", row=1, col=1)
    k = len(heads)
    last = len(p.steps) - 1
    fig.update_layout(
        title=dict(text=f"Attention patterns, layer {layer}, step {p.steps[last]}"),
        coloraxis=dict(colorscale="Blues", cmin=0, cmax=1,
                       colorbar=dict(title=dict(text="attention<br>probability", side="right"), thickness=16)),
        height=max(420, 18 * n_pos + 220), width=None,
    )
    if len(p.steps) > 1:
        fig.update_layout(sliders=[dict(
            active=last, currentvalue=dict(prefix="checkpoint at training step "), pad=dict(t=60),
            steps=[dict(method="update", label=str(s),
                        args=[{"visible": [t // k == i for t in range(k * len(p.steps))]},
                              {"title.text": f"Attention patterns, layer {layer}, step {s}"}])
                   for i, s in enumerate(p.steps)],
        )])
    return fig


class CircuitsVisSeries:
    """CircuitsVis attention views, one per step, behind an HTML range slider (``_repr_html_``)."""

    def __init__(self, steps: Sequence[int], renders: Sequence[str], layer: int):
        self.steps, self.renders, self.layer = list(steps), list(renders), layer

    @property
    def html(self) -> str:
        uid = f"cfattn{id(self)}"
        last = len(self.steps) - 1
        blocks = "".join(
            f'<div class="{uid}-step" data-i="{i}" style="display:{"block" if i == last else "none"}">{r}</div>'
            for i, r in enumerate(self.renders))
        steps_js = json.dumps(self.steps)
        return (f'<div id="{uid}"><p>Layer {self.layer}, training step <span id="{uid}-label">{self.steps[last]}'
                f'</span></p><input type="range" min="0" max="{last}" value="{last}" style="width: 60%" '
                f'oninput="(function(v){{var s={steps_js};document.querySelectorAll(\'.{uid}-step\').forEach('
                f'function(e){{e.style.display = (e.dataset.i == v) ? \'block\' : \'none\';}});'
                f'document.getElementById(\'{uid}-label\').textContent = s[v];}})(this.value)">{blocks}</div>')

    def _repr_html_(self) -> str:
        return self.html


def attention_view(p: AttentionPatterns, layer: int = 0, *, backend: str = "auto"):
    """The attention view people look at first: CircuitsVis when it is installed, else plotly.

    ``backend``: ``"auto"`` (CircuitsVis if importable, else :func:`attention_figure`),
    ``"circuitsvis"`` (``ImportError`` with the install command if absent) or ``"plotly"``.
    The CircuitsVis view renders ``circuitsvis.attention.attention_patterns`` per step
    behind a slider (a :class:`CircuitsVisSeries`; displays in notebooks, ``.html`` for a file).
    """
    _check(p, layer)
    if backend not in ("auto", "circuitsvis", "plotly"):
        raise ValueError(f"backend: expected 'auto', 'circuitsvis' or 'plotly', got {backend!r}")
    if backend != "plotly":
        try:
            import circuitsvis.attention as cv_attention
        except ImportError:
            if backend == "circuitsvis":
                raise ImportError("backend='circuitsvis' needs CircuitsVis: pip install circuitsvis") from None
        else:
            renders = [str(cv_attention.attention_patterns(tokens=list(p.labels),
                                                           attention=torch.from_numpy(p.patterns[i, layer])))
                       for i in range(len(p.steps))]
            return CircuitsVisSeries(p.steps, renders, layer)
    return attention_figure(p, layer)
