"""Attention patterns of one sequence across a checkpoint series (head x query x key per step).

    from circuitfade.analysis.attention import attention_series
    from circuitfade.viz.attention import attention_figure, attention_view
    pats = attention_series(series, batch.tokens[0])        # one sequence, every checkpoint
    attention_figure(pats, layer=1)                          # plotly: one panel per head, slider over steps

:func:`attention_series` runs each checkpoint once on one token sequence through
:func:`circuitfade.analysis.screens.attention_patterns` (the one reader of
``blocks.{l}.attn.hook_pattern``: softmax attention probabilities, after the causal mask
and, for soft-prior models, after the gated prior - the gates as the model has them; wrap
the call in ``model.gates(...)`` per model if you want another condition), with the model in
eval mode. It works on any TransformerLens model (``HookedTransformer`` or
:class:`SoftPriorTransformer`). Positions are labelled ``"position:token"`` so repeated tokens
stay distinct; :mod:`circuitfade.viz.attention` draws the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from circuitfade.analysis.screens import attention_patterns

__all__ = ["AttentionPatterns", "attention_series"]


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


def attention_series(source, tokens, *, steps: Sequence[int] | None = None,
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
            pattern = attention_patterns(model, t[None])  # [layer, 1, head, query, key]
        except ValueError as e:
            raise ValueError(f"the model at step {step}: {e}") from None
        finally:
            model.train(was_training)
        out.append(pattern[:, 0].float().numpy())
        got_steps.append(int(step))
    shapes = {p.shape for p in out}
    if len(shapes) != 1:
        raise ValueError(f"checkpoints differ in shape (layers, heads, q, k): {sorted(shapes)}")
    return AttentionPatterns(np.stack(out), tuple(got_steps), labels)
