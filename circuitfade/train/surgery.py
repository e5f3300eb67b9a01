"""Re-initialising parts of a live run: chosen heads' weight slices drawn afresh.

:func:`reinit_heads` is the intervention of the waiting-time experiment
(:mod:`circuitfade.experiments.alignment`): destroy ``m`` parts of a trained
circuit and keep training. Which slices are drawn again is a parameter
(``slices``), so an experiment can re-initialise only the query-key slices, or
only the value-output slices, of the same heads.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from circuitfade.train.loop import Run

__all__ = ["SLICES", "reinit_heads"]

SLICES: dict[str, tuple[str, ...]] = {
    "q": ("W_Q", "b_Q"),
    "k": ("W_K", "b_K"),
    "v": ("W_V", "b_V"),
    "o": ("W_O",),
}
"""Slice names -> attention parameters whose ``[head]`` slice they are (``b_O`` is shared by all
heads and never touched)."""


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
                    state = run.optimizer.state.get(p) if reset_optimizer else None
                    for key in ("exp_avg", "exp_avg_sq"):
                        if state and key in state:
                            state[key][head] = 0.0
    return touched
