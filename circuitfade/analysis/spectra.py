"""Participation-ratio (PR) spectra of attention heads, and PR elevation across revisions.

The participation ratio of a spectrum ``lambda_1..lambda_k >= 0`` is

    PR = (sum_i lambda_i)^2 / sum_i lambda_i^2,

the effective number of dimensions: 1 for a rank-1 spectrum, ``k`` for a flat
one. For data ``x`` (``n`` samples of dimension ``d``) the spectrum is the
eigenvalues of the sample covariance ``C = xc^T xc / (n - 1)``, ``xc = x -
mean(x)``. Since ``sum lambda = tr C`` and ``sum lambda^2 = ||C||_F^2`` for a
symmetric ``C``, PR is computed from traces of the Gram matrix (in float64, on
whichever of ``xc^T xc`` / ``xc xc^T`` is smaller; both have the same nonzero
eigenvalues), with no eigendecomposition. The developmental-trajectory paper
tracks per-head PR across checkpoints and asks whether it is
elevated when the head becomes an induction head; ``elevated_pr`` is that test.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitfade.analysis.screens import head_frame, layer_activations
from circuitfade.tasks import Batch

_RELATIVE_ZERO = 1e-24
"""Total variance at most this times the raw energy ``sum x^2`` counts as zero (PR = nan)."""


def participation_ratio_of_spectrum(eigenvalues: Float[Tensor, "*batch k"]) -> Float[Tensor, "*batch"]:
    """``(sum lambda)^2 / sum lambda^2`` over the last axis, in float64.

    Eigenvalues must be >= 0 (up to roundoff; tiny negatives from eigensolvers are
    clipped to 0). An all-zero spectrum has no effective dimension: returns nan.
    """
    lam = torch.as_tensor(eigenvalues).double()
    if lam.ndim < 1 or lam.shape[-1] == 0:
        raise ValueError(f"eigenvalues must have a non-empty last axis, got shape {tuple(lam.shape)}")
    if (lam < -1e-9 * lam.abs().amax(dim=-1, keepdim=True).clamp_min(1e-300)).any():
        raise ValueError("eigenvalues must be non-negative (a covariance or Gram spectrum)")
    lam = lam.clamp_min(0.0)
    total = lam.sum(-1)
    squares = (lam**2).sum(-1)
    return torch.where(squares > 0, total**2 / squares.clamp_min(1e-300), torch.full_like(total, float("nan")))


def _pr_from_gram(gram: Float[Tensor, "*batch m m"], energy: Float[Tensor, "*batch"]) -> Float[Tensor, "*batch"]:
    """PR of the spectrum of a symmetric PSD matrix: ``tr(G)^2 / ||G||_F^2`` (nan if ~0)."""
    trace = torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)
    frob2 = (gram**2).sum(dim=(-2, -1))
    zero = (trace <= _RELATIVE_ZERO * energy) | (frob2 <= 0)
    return torch.where(zero, torch.full_like(trace, float("nan")), trace**2 / frob2.clamp_min(1e-300))


def participation_ratio(x: Float[Tensor, "*batch n d"]) -> Float[Tensor, "*batch"]:
    """PR of the sample covariance of ``x`` (samples on axis -2, features on axis -1).

    ``PR = (sum lambda)^2 / sum lambda^2`` with ``lambda`` the eigenvalues of the
    covariance of ``x`` centred over its ``n`` samples. Rank-1 data gives 1, isotropic
    data in ``d`` dimensions gives about ``d`` (``d / (1 + d/n)`` in expectation for
    Gaussian samples). Leading axes are batched. Data with zero variance give nan.
    Computed in float64 from ``tr(C)^2 / ||C||_F^2`` on the smaller Gram matrix.
    """
    if not isinstance(x, Tensor) or x.ndim < 2:
        raise ValueError(f"x must be a tensor [..., n, d], got {getattr(x, 'shape', x)!r}")
    n, d = x.shape[-2:]
    if n < 2 or d < 1:
        raise ValueError(f"need n >= 2 samples of dimension d >= 1, got n={n}, d={d}")
    x64 = x.detach().double()
    xc = x64 - x64.mean(dim=-2, keepdim=True)
    gram = xc.transpose(-2, -1) @ xc if d <= n else xc @ xc.transpose(-2, -1)
    return _pr_from_gram(gram, (x64**2).sum(dim=(-2, -1)))


def _select_positions(z: Tensor, positions) -> Tensor:
    n_pos = z.shape[1]
    if isinstance(positions, str):
        if positions != "all":
            raise ValueError(f"positions must be 'all', an int, a slice or a sequence of ints, got {positions!r}")
        return z
    if isinstance(positions, int):
        positions = [positions]
    if isinstance(positions, slice):
        index = torch.arange(n_pos)[positions]
    else:
        index = torch.as_tensor(list(positions), dtype=torch.long)
    if index.numel() == 0 or index.min() < -n_pos or index.max() >= n_pos:
        raise ValueError(f"positions {positions!r} select nothing or lie outside [0, {n_pos})")
    return z[:, index]


def head_output_pr(
    model,
    batch: Int[Tensor, "batch pos"] | Batch,
    *,
    positions: str | int | slice | Sequence[int] = "all",
    space: str = "result",
) -> Float[Tensor, "layer head"]:
    """PR of each head's output over samples = batch x selected positions.

    ``space="result"`` (default): the head's write to the residual stream,
    ``z[b, p, h] @ W_O[layer, h]`` in ``d_model`` space (without the layer's shared
    ``b_O``), where ``z`` is ``blocks.{l}.attn.hook_z`` ``[batch, pos, head, d_head]``.
    Its covariance is ``W_O^T G W_O`` with ``G`` the ``d_head x d_head`` covariance
    of ``z``, so PR is computed exactly as ``tr(G M)^2 / tr(G M G M)`` with
    ``M = W_O W_O^T`` (``d_head`` sized; cheap for large ``d_model``).
    ``space="z"``: the PR of ``z`` itself (``d_head`` space).

    ``batch``: token ids ``[batch, pos]`` (or a :class:`~circuitfade.tasks.Batch`: its ``tokens``).
    ``positions``: ``"all"``, an int, a slice or a sequence of position indices.
    One ``run_with_cache`` keeping only ``hook_z``; the model is not modified.
    """
    if space not in ("result", "z"):
        raise ValueError(f"space must be 'result' or 'z', got {space!r}")
    activations = layer_activations(model, batch, "hook_z")
    rows = []
    with torch.no_grad():
        for layer, act in enumerate(activations):
            z = _select_positions(act.double(), positions)  # [batch pos head d_head]
            z = z.reshape(-1, *z.shape[2:]).transpose(0, 1)  # [head sample d_head]
            if z.shape[1] < 2:
                raise ValueError(f"need at least 2 samples (batch x positions), got {z.shape[1]}")
            if space == "z":
                rows.append(participation_ratio(z))
                continue
            zc = z - z.mean(dim=1, keepdim=True)
            gram = zc.transpose(-2, -1) @ zc  # [head d_head d_head]
            w_o = model.blocks[layer].attn.W_O.detach().double().cpu()  # [head d_head d_model]
            m = w_o @ w_o.transpose(-2, -1)  # [head d_head d_head]
            gm = gram @ m
            trace = torch.diagonal(gm, dim1=-2, dim2=-1).sum(-1)
            trace_sq = torch.diagonal(gm @ gm, dim1=-2, dim2=-1).sum(-1)
            energy = torch.diagonal((z.transpose(-2, -1) @ z) @ m, dim1=-2, dim2=-1).sum(-1)  # sum ||z W_O||^2
            zero = (trace <= _RELATIVE_ZERO * energy) | (trace_sq <= 0)
            rows.append(torch.where(zero, torch.full_like(trace, float("nan")), trace**2 / trace_sq.clamp_min(1e-300)))
    return torch.stack(rows)


def weight_pr(model) -> pd.DataFrame:
    """PR of each head's OV and QK weight spectra, as tidy rows.

    Columns ``layer, head, metric, value`` with ``metric`` ``"ov_pr"`` (the spectrum is
    the squared singular values ``S^2`` of ``W_V[l,h] @ W_O[l,h]``, i.e. the
    eigenvalues of ``OV^T OV``) or ``"qk_pr"`` (same for ``W_Q[l,h] @ W_K[l,h]^T``), from
    ``model.OV.S`` / ``model.QK.S`` (TransformerLens ``FactoredMatrix``). Biases and
    rotary embeddings are ignored. A zero matrix gives nan.
    """
    with torch.no_grad():
        ov = participation_ratio_of_spectrum(model.OV.S.detach().double().cpu() ** 2)
        qk = participation_ratio_of_spectrum(model.QK.S.detach().double().cpu() ** 2)
    return pd.concat([head_frame(ov, "ov_pr"), head_frame(qk, "qk_pr")], ignore_index=True)


def elevated_pr(
    pr_by_step: pd.DataFrame,
    *,
    z: float = 2.0,
    rel_tol: float = 0.05,
    ratio: float | None = None,
    window: int | None = None,
    min_history: int = 1,
    by: Sequence[str] = ("layer", "head"),
) -> pd.DataFrame:
    """Flag, for each head and revision, whether PR is elevated relative to its own past.

    ``pr_by_step`` has columns ``step``, ``value`` and the grouping columns ``by``
    (default ``layer, head``; add e.g. ``"metric"`` or a run column when the frame
    holds several series per head). Within each group, rows are ordered by ``step``;
    the history of a row is the ``window`` revisions before it (all earlier ones if
    ``window`` is None), never the row itself or later ones.

    * z rule (default, ``ratio=None``): elevated iff
      ``value - mean(history) > max(z * std(history), rel_tol * |mean(history)|)``
      (population std; the ``rel_tol`` floor stops a nearly flat history from
      flagging roundoff-sized rises).
    * ratio rule (``ratio`` given): elevated iff ``value > ratio * median(history)``.

    Rows with fewer than ``min_history`` (>= 1) earlier revisions, in particular the
    first revision, are never elevated; nan values are never elevated and are
    left out of later histories. Returns a copy of the frame (same row order) with
    columns ``baseline`` (the history's mean, or median under the ratio rule; nan
    without history) and ``elevated`` (bool).
    """
    by = list(by)
    needed = set(by) | {"step", "value"}
    if not isinstance(pr_by_step, pd.DataFrame) or not needed <= set(pr_by_step.columns):
        cols = list(pr_by_step.columns) if isinstance(pr_by_step, pd.DataFrame) else type(pr_by_step).__name__
        raise ValueError(f"pr_by_step must be a DataFrame with columns {sorted(needed)}, got {cols}")
    if pr_by_step.duplicated(by + ["step"]).any():
        raise ValueError(f"several rows per ({', '.join(by + ['step'])}); pass `by` naming every identifying column")
    if min_history < 1:
        raise ValueError(f"min_history must be >= 1 (the first revision is never elevated), got {min_history}")
    if window is not None and window < 1:
        raise ValueError(f"window must be None or >= 1, got {window}")
    if ratio is not None and ratio <= 0:
        raise ValueError(f"ratio must be positive, got {ratio}")
    if z < 0 or rel_tol < 0:
        raise ValueError(f"z and rel_tol must be >= 0, got z={z}, rel_tol={rel_tol}")

    out = pr_by_step.copy()
    baseline = pd.Series(np.nan, index=out.index, dtype=float)
    elevated = pd.Series(False, index=out.index, dtype=bool)
    for _, group in out.groupby(by, sort=False):
        group = group.sort_values("step")
        history: list[float] = []
        for idx, value in zip(group.index, group["value"].astype(float)):
            past = np.asarray(history if window is None else history[-window:], dtype=float)
            if len(past) >= min_history:
                if ratio is not None:
                    base = float(np.median(past))
                    flag = value > ratio * base
                else:
                    base = float(past.mean())
                    flag = value - base > max(z * float(past.std()), rel_tol * abs(base))
                baseline[idx] = base
                elevated[idx] = bool(flag) and not np.isnan(value)
            if not np.isnan(value):
                history.append(value)
    out["baseline"] = baseline
    out["elevated"] = elevated
    return out
