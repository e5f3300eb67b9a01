"""Re-initialising parts of a live run: chosen heads' weight slices drawn afresh.

:func:`reinit_heads` is the intervention of the waiting-time experiment
(:mod:`studies.alignment`): destroy ``m`` parts of a trained
circuit and keep training. Which slices are drawn again is a parameter
(``slices``), so an experiment can re-initialise only the query-key slices, or
only the value-output slices, of the same heads.

:func:`reinit_slices` is the same surgery on a bare model (any TransformerLens ``HookedTransformer``,
``SoftPriorTransformer`` included: its fused path stacks ``W_Q, W_K, W_V`` at every forward, so editing
the per-head tensors is enough), with new values drawn from a caller's ``torch.Generator`` with the
model's own initialisation distribution (:func:`init_values`: ``cfg.init_mode``, ``cfg.initializer_range``
and the fans of the *whole* tensor, as TransformerLens's ``init_weights`` computes them; biases zero, as
TransformerLens initialises them) rather than by building a fresh model, so it also works on models that
cannot be rebuilt from their config. ``which="qk"``: ``W_Q[h], b_Q[h], W_K[h], b_K[h]``; ``which="ov"``:
``W_V[h], b_V[h], W_O[h]`` (:data:`WHICH`). It leaves the optimizer alone (the issue-17 protocol keeps
the optimizer state); :func:`reset_slice_moments` zeroes, for exactly the changed slices, every
per-element optimizer state tensor (AdamW ``exp_avg``, ``exp_avg_sq``; SGD ``momentum_buffer``) and keeps
per-tensor scalars such as Adam's ``step``. :func:`reinit_heads` uses the same zeroing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

from circuitfade.train.state import Run

__all__ = ["SLICES", "WHICH", "SliceChange", "init_values", "reinit_heads", "reinit_slices", "reset_slice_moments"]

SLICES: dict[str, tuple[str, ...]] = {
    "q": ("W_Q", "b_Q"),
    "k": ("W_K", "b_K"),
    "v": ("W_V", "b_V"),
    "o": ("W_O",),
}
"""Slice names -> attention parameters whose ``[head]`` slice they are (``b_O`` is shared by all
heads and never touched)."""

WHICH: dict[str, tuple[str, ...]] = {
    "qk": SLICES["q"] + SLICES["k"],
    "ov": SLICES["v"] + SLICES["o"],
}
"""The parameters :func:`reinit_slices` re-initialises for ``which="qk"`` and ``which="ov"``."""


def reinit_heads(run: Run, heads: Iterable[tuple[int, int]], *, seed: int,
                 slices: Sequence[str] = ("q", "k", "v", "o"), reset_optimizer: bool = True) -> list[str]:
    """Re-draw the given heads' weight slices of ``run.model`` from the model's own initialisation.

    ``heads``: ``(layer, head)`` pairs. A fresh model of the same config is built under
    ``torch.manual_seed(seed)`` (inside ``torch.random.fork_rng``, so the caller's global
    RNG is untouched) and each named slice ``P[head]`` (see :data:`SLICES`) is copied from
    it: the new values come from exactly the distribution the run started from, and are
    a pure function of ``seed``. With ``reset_optimizer`` the AdamW moments
    (``exp_avg``, ``exp_avg_sq``) of those slices are zeroed (they belonged to the old
    weights; the step count is per tensor and stays, so bias correction treats the
    fresh moments as old ones: the first updates of the new slices are larger than
    ``lr`` for a few hundred steps, the same in every cell of an experiment).

    Mutates ``run`` in place (it is a training operation, not an analysis) and returns
    the names of the parameters touched, e.g. ``["blocks.0.attn.W_Q[2]", ...]``.
    """
    heads = [(int(layer), int(head)) for layer, head in heads]
    cfg = run.model.cfg
    bad = [h for h in heads if not (0 <= h[0] < cfg.n_layers and 0 <= h[1] < cfg.n_heads)]
    if bad:
        raise ValueError(f"heads {bad} out of range for a model with {cfg.n_layers} layers x {cfg.n_heads} heads")
    unknown = [s for s in slices if s not in SLICES]
    if unknown or not slices:
        raise ValueError(f"slices: expected a non-empty subset of {list(SLICES)}, got {list(slices)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        fresh = type(run.model)(cfg)
    touched = []
    with torch.no_grad():
        for layer, head in heads:
            attn, new = run.model.blocks[layer].attn, fresh.blocks[layer].attn
            for s in slices:
                for name in SLICES[s]:
                    p = getattr(attn, name)
                    p[head] = getattr(new, name)[head].to(p.device, p.dtype)
                    touched.append(f"blocks.{layer}.attn.{name}[{head}]")
                    if reset_optimizer:
                        _zero_state_slice(run.optimizer, p, head)
    return touched


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
    """Re-initialise, in place, the ``which`` slices (:data:`WHICH`) of ``heads`` (``(layer, head)`` pairs)
    and return one :class:`SliceChange` per slice, in the order drawn (heads in the given order, then the
    weights in :data:`SLICES` order). Every other parameter and buffer stays bit for bit as it was. With the
    same ``generator`` state the new values are the same (``generator=None``: a fresh one seeded 0).
    Grouped-query attention (K/V shared across heads) is refused: its K/V slices are not per head."""
    if which not in WHICH:
        raise ValueError(f"reinit_slices: which must be one of {sorted(WHICH)}, got {which!r}")
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
            for weight in WHICH[which]:
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
            n += _zero_state_slice(optimizer, params[c.name], c.head)
    return n


def _zero_state_slice(optimizer: torch.optim.Optimizer, p: Tensor, head: int) -> int:
    """Zero ``[head]`` of every state tensor of ``p`` shaped like ``p``; the number zeroed."""
    n = 0
    with torch.no_grad():
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                value[head].zero_()
                n += 1
    return n
