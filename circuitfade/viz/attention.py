"""Attention patterns across a checkpoint series: head x query x key, a slider over steps.

    from circuitfade.viz.attention import attention_patterns, attention_figure, attention_view
    pats = attention_patterns(series, batch.tokens[0])      # one sequence, every checkpoint
    attention_figure(pats, layer=1)                          # plotly: one panel per head, slider over steps
    attention_view(pats, layer=1)                            # CircuitsVis when installed, else the same figure

:func:`attention_patterns` runs each checkpoint once on one token sequence and keeps
``blocks.{l}.attn.hook_pattern`` (softmax attention probabilities, after the causal mask
and, for soft-prior models, after the gated prior - the gates as the model has them;
wrap the call in ``model.gates(...)`` per model if you want another condition). It works
on any TransformerLens model (``HookedTransformer`` or :class:`SoftPriorTransformer`).
Figures put the tokens on the axes, labelled ``"position:token"`` so repeated tokens
stay distinct.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

__all__ = ["AttentionPatterns", "attention_patterns", "attention_figure", "attention_view"]


@dataclass(frozen=True)
class AttentionPatterns:
    """Attention probabilities of one sequence at several checkpoints.

    ``patterns``: ``float [step, layer, head, query, key]`` (rows sum to 1 over keys
    ``<= query``); ``steps``: the checkpoint steps, in order; ``labels``: one axis label
    per position (``"position:token"``).
    """

    patterns: np.ndarray
    steps: tuple[int, ...]
    labels: tuple[str, ...]

    @property
    def n_layers(self) -> int:
        return self.patterns.shape[1]

    @property
    def n_heads(self) -> int:
        return self.patterns.shape[2]


def _models(source, steps):
    """``[(step, model)]`` from a CheckpointSeries, a ``{step: model}`` mapping or a list of models."""
    if isinstance(source, Mapping):
        items = sorted((int(s), m) for s, m in source.items())
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        items = list(enumerate(source))
    elif hasattr(source, "steps") and hasattr(source, "__getitem__"):  # CheckpointSeries: loads lazily
        items = [(int(s), None) for s in source.steps]
    else:
        raise ValueError(
            f"source: expected a CheckpointSeries, a {{step: model}} mapping or a list of models, got {type(source).__name__}"
        )
    if steps is not None:
        want = [int(s) for s in steps]
        have = {s for s, _ in items}
        missing = [s for s in want if s not in have]
        if missing:
            raise ValueError(f"steps {missing} are not in the series; steps: {sorted(have)}")
        items = [(s, m) for s, m in items if s in set(want)]
    if not items:
        raise ValueError("source: no checkpoints")
    for step, model in items:
        yield step, (source[step] if model is None else model)


def attention_patterns(source, tokens, *, steps: Sequence[int] | None = None,
                       token_labels: Sequence[str] | None = None) -> AttentionPatterns:
    """Attention patterns of one sequence at every checkpoint of ``source`` (or at ``steps``).

    Args:
        source: a :class:`~circuitfade.store.CheckpointSeries` (models loaded one at a
            time), a ``{step: model}`` mapping, or a list of models (steps 0, 1, ...).
        tokens: one sequence, ``int [pos]`` (or ``[1, pos]``), e.g. ``batch.tokens[0]``.
        steps: a subset of the series' steps.
        token_labels: one string per position (default: the token ids); axes show
            ``"position:label"``.
    """
    t = torch.as_tensor(tokens)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.numel() == 0 or t.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"tokens: expected one sequence of token ids, int [pos], got shape {tuple(t.shape)} {t.dtype}")
    t = t.long()
    if token_labels is None:
        token_labels = [str(int(x)) for x in t]
    if len(token_labels) != t.numel():
        raise ValueError(f"token_labels: expected {t.numel()} labels (one per position), got {len(token_labels)}")
    labels = tuple(f"{i}:{lab}" for i, lab in enumerate(token_labels))
    out, got_steps = [], []
    for step, model in _models(source, steps):
        n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
        if n_ctx is not None and t.numel() > n_ctx:
            raise ValueError(f"tokens: {t.numel()} positions, but the model at step {step} has n_ctx = {n_ctx}")
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                _, cache = model.run_with_cache(t[None], names_filter=lambda name: name.endswith("attn.hook_pattern"))
        finally:
            model.train(was_training)
        layers = sorted(int(k.split(".")[1]) for k in cache.keys())
        if not layers:
            raise ValueError(f"the model at step {step} has no attn.hook_pattern hooks (not a TransformerLens model?)")
        out.append(np.stack([cache[f"blocks.{l}.attn.hook_pattern"][0].float().numpy() for l in layers]))
        got_steps.append(int(step))
    shapes = {p.shape for p in out}
    if len(shapes) != 1:
        raise ValueError(f"checkpoints differ in shape (layers, heads, q, k): {sorted(shapes)}")
    return AttentionPatterns(np.stack(out), tuple(got_steps), labels)


def _check(p: AttentionPatterns, layer: int) -> None:
    if not isinstance(p, AttentionPatterns):
        raise ValueError(f"expected AttentionPatterns (see attention_patterns), got {type(p).__name__}")
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
