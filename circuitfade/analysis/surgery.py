"""Weight surgery on attention heads: re-initialise the query-key or value-output slices of named heads.

:func:`reinit_slices` works on any TransformerLens ``HookedTransformer`` (and on
:class:`~circuitfade.model.transformer.SoftPriorTransformer`, whose attention keeps TransformerLens's weight
names; its fused path stacks ``W_Q, W_K, W_V`` at every forward, so editing the per-head tensors is enough).
For head ``h`` of layer ``l`` (``blocks.{l}.attn``):

* ``which="qk"``: ``W_Q[h], W_K[h]`` (``[d_model, d_head]``) and ``b_Q[h], b_K[h]`` (``[d_head]``);
* ``which="ov"``: ``W_V[h]`` (``[d_model, d_head]``), ``W_O[h]`` (``[d_head, d_model]``) and ``b_V[h]``.

``b_O`` (shared by all heads of a layer) and the soft-prior parameters (bias tables, gate logits, the content
prior's ``W_cq, W_ck``) are never touched. New values come from the model's own initialisation
(``cfg.init_mode`` with ``cfg.initializer_range``, the fan-in / fan-out of the *whole* parameter tensor as
TransformerLens's ``init_weights`` computes it; biases are zero, as TransformerLens initialises them), drawn
from the caller's ``torch.Generator`` so a surgery is reproducible.

Optimizer state is the caller's: the issue-17 protocol ("keep everything else and the optimizer state")
means do nothing to it. :func:`reset_slice_moments` zeroes, for exactly the changed slices, every per-element
state tensor of the optimizer (AdamW's ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``) and leaves
everything else, including Adam's shared per-tensor ``step`` count, as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import Tensor

__all__ = ["SLICES", "SliceChange", "init_values", "reinit_slices", "reset_slice_moments"]

SLICES: dict[str, tuple[str, ...]] = {
    "qk": ("W_Q", "W_K", "b_Q", "b_K"),
    "ov": ("W_V", "W_O", "b_V"),
}
"""The per-head attention parameters each kind of surgery re-initialises."""


@dataclass(frozen=True)
class SliceChange:
    """One re-initialised slice: ``param[head]`` of parameter ``name`` (``blocks.{layer}.attn.{weight}``),
    with its values ``before`` and ``after`` (detached CPU copies)."""

    name: str
    layer: int
    head: int
    weight: str
    before: Tensor
    after: Tensor


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:  # TransformerLens's calc_fan_in_and_fan_out
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3:  # [n_heads, d_in, d_out]
        return shape[1], shape[0] * shape[2]
    raise ValueError(f"no fan-in / fan-out for a tensor of shape {shape}")


def init_values(cfg, weight: str, full_shape: tuple[int, ...], shape: tuple[int, ...],
                generator: torch.Generator, dtype: torch.dtype = torch.float32) -> Tensor:
    """Fresh values of ``shape`` for (a slice of) parameter ``weight`` whose whole tensor has ``full_shape``,
    drawn on the CPU from ``generator`` with the distribution of TransformerLens's ``init_weights`` for
    ``cfg.init_mode``: ``gpt2`` N(0, initializer_range²); ``xavier_*`` / ``kaiming_*`` (relu gain, fan-in)
    with gain ``initializer_range``; ``muP`` N(0, 1 / fan_in). Biases (``b_*``) are zero."""
    if weight.startswith("b_"):
        return torch.zeros(shape, dtype=dtype)
    mode, gain = getattr(cfg, "init_mode", "gpt2"), float(getattr(cfg, "initializer_range", 0.02))
    fan_in, fan_out = _fans(tuple(full_shape))
    if mode == "gpt2":
        kind, scale = "normal", gain
    elif mode == "xavier_uniform":
        kind, scale = "uniform", gain * math.sqrt(6.0 / (fan_in + fan_out))
    elif mode == "xavier_normal":
        kind, scale = "normal", gain * math.sqrt(2.0 / (fan_in + fan_out))
    elif mode == "kaiming_uniform":
        kind, scale = "uniform", gain * math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
    elif mode == "kaiming_normal":
        kind, scale = "normal", gain * math.sqrt(2.0) / math.sqrt(fan_in)
    elif mode == "muP":
        kind, scale = "normal", 1.0 / math.sqrt(fan_in)
    else:
        raise ValueError(f"reinit_slices: unknown cfg.init_mode {mode!r}")
    if kind == "normal":
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype)
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return ((2.0 * u - 1.0) * scale).to(dtype)


def _check_heads(model, heads) -> list[tuple[int, int]]:
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(v, int) for v in heads):
        heads = [heads]
    out = []
    for lh in heads:
        try:
            layer, head = lh
        except (TypeError, ValueError):
            raise ValueError(f"reinit_slices: heads must be (layer, head) pairs, got {lh!r}") from None
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (layer, head))
        if not ok or not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"reinit_slices: head {lh!r} out of range (n_layers={n_layers}, n_heads={n_heads})")
        if (layer, head) not in out:
            out.append((layer, head))
    if not out:
        raise ValueError("reinit_slices: no heads given")
    return out


def reinit_slices(model, heads: Iterable[tuple[int, int]], which: str = "qk", *,
                  generator: torch.Generator | None = None) -> list[SliceChange]:
    """Re-initialise, in place, the ``which`` slices (:data:`SLICES`) of ``heads`` (``(layer, head)`` pairs)
    and return one :class:`SliceChange` per slice, in the order drawn (heads in the given order, then the
    weights in :data:`SLICES` order). Every other parameter and buffer stays bit for bit as it was. With the
    same ``generator`` state the new values are the same (``generator=None``: a fresh one seeded 0).
    Grouped-query attention (K/V shared across heads) is refused: its K/V slices are not per head."""
    if which not in SLICES:
        raise ValueError(f"reinit_slices: which must be one of {sorted(SLICES)}, got {which!r}")
    if not hasattr(model, "cfg") or not hasattr(model, "blocks"):
        raise TypeError(f"reinit_slices needs a TransformerLens HookedTransformer, got {type(model).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    if getattr(model.cfg, "n_key_value_heads", None) is not None:
        raise ValueError("reinit_slices: grouped-query attention shares K/V across heads; per-head slices undefined")
    changes: list[SliceChange] = []
    with torch.no_grad():
        for layer, head in _check_heads(model, heads):
            attn = model.blocks[layer].attn
            for weight in SLICES[which]:
                p = getattr(attn, weight, None)
                if not isinstance(p, torch.Tensor) or p.dim() < 2 or p.shape[0] != model.cfg.n_heads:
                    raise ValueError(f"reinit_slices: blocks.{layer}.attn has no per-head parameter {weight}")
                before = p[head].detach().cpu().clone()
                new = init_values(model.cfg, weight, tuple(p.shape), tuple(p.shape[1:]), generator, p.dtype)
                p[head].copy_(new.to(p.device))
                changes.append(SliceChange(f"blocks.{layer}.attn.{weight}", layer, head, weight, before,
                                           p[head].detach().cpu().clone()))
    return changes


def reset_slice_moments(optimizer: torch.optim.Optimizer, model, changes: Iterable[SliceChange]) -> int:
    """Zero, for exactly the slices in ``changes``, every optimizer state tensor shaped like its parameter
    (AdamW: ``exp_avg``, ``exp_avg_sq``; SGD: ``momentum_buffer``). Scalars such as Adam's ``step`` are shared
    by the whole tensor and are left alone. Returns the number of state slices zeroed (0 before the first
    step, when there is no state yet)."""
    params = dict(model.named_parameters())
    n = 0
    with torch.no_grad():
        for c in changes:
            if c.name not in params:
                raise ValueError(f"reset_slice_moments: model has no parameter {c.name}")
            p = params[c.name]
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    value[c.head].zero_()
                    n += 1
    return n
