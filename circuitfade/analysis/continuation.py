"""The continuation signal of removability (main paper, Section 3.3), as a measured quantity.

The paper's argument: the fade works when the zero-gate loss gradient at the
prior-shaped parameters has a large component along the circuit,

    useful recovery signal  ∝  || P_C ∇_θ L(θ_prior, g = 0) ||

Here ``P_C`` is the orthogonal projection onto the coordinates of the circuit's
heads: for every head ``(l, h)`` in the circuit, its slices of the attention
parameters ``W_Q, W_K, W_V`` (``[h, :, :]``), ``W_O`` (``[h, :, :]``) and ``b_Q,
b_K, b_V`` (``[h, :]``). ``b_O`` is shared by the heads of a layer and belongs to
no head. ``θ`` is the *backbone*: every trainable parameter except the priors' bias
tables and gate logits (:meth:`SoftPriorTransformer.prior_parameters`), which the
zero-gate model does not use. For a plain ``HookedTransformer`` every parameter is
backbone.

Reported per model (:func:`continuation_signal`):

* ``circuit_norm`` = ``||P_C g||`` with ``g = ∇_θ L(θ, gates)`` (zero gates by default);
* ``total_norm`` = ``||g||``; ``circuit_share`` = ``circuit_norm / total_norm``;
* the same share for random head sets of the same size (``random_mean``,
  ``random_sd``), ``share_ratio = circuit_share / random_mean`` and
  ``p_random`` = fraction of random sets whose share is at least the circuit's.

Because the head slices are disjoint, ``||P_S g||² = Σ_{h ∈ S} ||g_h||²`` for any
head set ``S``, so one backward pass gives the circuit and every random baseline.

The circuit is either a user-given head set or the ``k`` heads with the largest
mean-ablation accuracy drop (:func:`circuitfade.analysis.mean_ablation_importance`)
under ``importance_gates`` (default ``"normal"``: the heads the model uses *with*
its prior at that checkpoint, which is the information available before a fade).
:func:`continuation_trace` does this at every checkpoint of a series.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuitfade.analysis.gates import batch_first
from circuitfade.analysis.heads import check_batch, gates_context, head_label, mean_ablation_importance
from circuitfade.tasks import EVAL_SEED, Batch, Task, eval_set

__all__ = [
    "HEAD_PARAMS",
    "backbone_parameters",
    "circuit_heads",
    "continuation_signal",
    "continuation_trace",
    "head_gradient_norms",
    "head_slices",
]

HEAD_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
"""Per-head attention parameters (leading dimension = head)."""
_HEAD_PARAM = re.compile(r"blocks\.(\d+)\.attn\.(W_Q|W_K|W_V|W_O|b_Q|b_K|b_V)")


def backbone_parameters(model) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters except the priors' (bias tables, gate logits), by name."""
    prior = set()
    if hasattr(model, "prior_parameters"):
        prior = {n for n, _ in model.prior_parameters()}
    return {n: p for n, p in model.named_parameters() if p.requires_grad and n not in prior}


def head_slices(model) -> dict[tuple[int, int], list[tuple[str, int]]]:
    """``{(layer, head): [(parameter name, index along dim 0), ...]}`` for every head.

    Raises ``ValueError`` if a per-head parameter's leading dimension is not ``n_heads``
    (e.g. grouped-query attention, whose K/V heads are shared).
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    params = backbone_parameters(model)
    out: dict[tuple[int, int], list[tuple[str, int]]] = {(l, h): [] for l in range(n_layers) for h in range(n_heads)}
    for name, p in params.items():
        m = _HEAD_PARAM.fullmatch(name)
        if not m:
            continue
        if p.shape[0] != n_heads:
            raise ValueError(f"{name}: leading dimension {p.shape[0]} is not n_heads={n_heads}; per-head slices "
                             "are defined only for plain multi-head attention")
        for h in range(n_heads):
            out[(int(m.group(1)), h)].append((name, h))
    if any(not v for v in out.values()):
        raise ValueError("model: expected per-head attention parameters blocks.{l}.attn.W_Q/W_K/W_V/W_O")
    return out


def _norm_heads(model, heads) -> list[tuple[int, int]]:
    L, H = model.cfg.n_layers, model.cfg.n_heads
    out = []
    for x in heads:
        try:
            l, h = (int(x[0]), int(x[1]))
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"heads: expected (layer, head) pairs, got {x!r}") from None
        if not (0 <= l < L and 0 <= h < H):
            raise ValueError(f"heads: {head_label(l, h)} is outside the model ({L} layers x {H} heads)")
        out.append((l, h))
    if not out:
        raise ValueError("heads: expected at least one (layer, head)")
    if len(set(out)) != len(out):
        raise ValueError(f"heads: duplicate heads in {heads!r}")
    return out


@batch_first
def head_gradient_norms(
    model, batch: Batch, task: Task, *, gates: str | Mapping | None = "zero"
) -> tuple[Tensor, float]:
    """``(sq[layer, head], total_sq)``: squared norm of the loss gradient restricted to
    each head's parameter slices, and the squared norm of the whole backbone gradient.

    ``L = task.loss(model(batch), batch)`` under ``gates`` (eval mode; the model's
    ``.grad`` fields and mode are left as they were).
    """
    if not isinstance(task, Task):
        raise ValueError(f"task: expected a circuitfade.tasks.Task, got {type(task).__name__}")
    batch = check_batch(model, batch)
    params = backbone_parameters(model)
    slices = head_slices(model)
    names = list(params)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), gates_context(model, gates):
            loss = task.loss(model(batch.model_input), batch)
            if not torch.isfinite(loss):
                raise ValueError(f"loss is not finite ({float(loss)}); cannot take its gradient")
            grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    finally:
        model.train(was_training)
    g = {n: (torch.zeros_like(params[n]) if gr is None else gr).detach().double() for n, gr in zip(names, grads)}
    total = float(sum((v**2).sum() for v in g.values()))
    sq = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.float64)
    for (l, h), parts in slices.items():
        sq[l, h] = float(sum((g[n][i] ** 2).sum() for n, i in parts))
    return sq, total


@batch_first
def circuit_heads(
    model, batch: Batch, task: Task, k: int = 2, *, gates: str | Mapping | None = "normal"
) -> list[tuple[int, int]]:
    """The ``k`` heads with the largest mean-ablation accuracy drop under ``gates``
    (ties broken by the larger loss increase, then layer-major order)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    n = model.cfg.n_layers * model.cfg.n_heads
    if k > n:
        raise ValueError(f"k={k} exceeds the model's {n} heads")
    imp = mean_ablation_importance(model, batch, task, gates=gates)
    imp = imp.sort_values(["acc_drop", "loss_increase", "layer", "head"], ascending=[False, False, True, True],
                          kind="mergesort")
    return [(int(r.layer), int(r.head)) for r in imp.head(k).itertuples()]


@batch_first
def continuation_signal(
    model,
    batch: Batch,
    task: Task,
    *,
    heads: Sequence | None = None,
    k: int = 2,
    gates: str | Mapping | None = "zero",
    importance_gates: str | Mapping | None = "normal",
    n_random: int = 200,
    seed: int = 0,
) -> dict:
    """The continuation signal of one model (see the module docstring for definitions).

    ``heads``: the circuit as ``(layer, head)`` pairs; ``None`` = :func:`circuit_heads`
    with ``k`` and ``importance_gates``. ``gates``: the condition of the loss whose
    gradient is taken (``"zero"``: the prior removed). ``n_random`` random head sets of
    the circuit's size are drawn uniformly (without replacement within a set) with a
    ``torch.Generator`` seeded by ``seed``; ``n_random=0`` skips the baseline.

    Returns a dict with ``heads`` (labels joined by ``+``), ``k``, ``circuit_norm``,
    ``total_norm``, ``circuit_share``, ``param_share`` (the circuit's fraction of
    backbone coordinates: the share an isotropic gradient would give in expectation of
    squares), ``random_mean``, ``random_sd``, ``share_ratio``, ``p_random``.
    """
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 0:
        raise ValueError(f"n_random: expected a non-negative int, got {n_random!r}")
    circuit = circuit_heads(model, batch, task, k, gates=importance_gates) if heads is None else _norm_heads(model, heads)
    sq, total = head_gradient_norms(model, batch, task, gates=gates)
    L, H = sq.shape
    flat = sq.reshape(-1)
    idx = torch.tensor([l * H + h for l, h in circuit])
    c_norm = math.sqrt(float(flat[idx].sum()))
    t_norm = math.sqrt(total)
    share = c_norm / t_norm if t_norm > 0 else math.nan
    params = backbone_parameters(model)
    n_coord = sum(p.numel() for p in params.values())
    slices = head_slices(model)
    c_coord = sum(params[n][i].numel() for l, h in circuit for n, i in slices[(l, h)])
    out = {
        "heads": "+".join(head_label(l, h) for l, h in circuit),
        "k": len(circuit),
        "circuit_norm": c_norm,
        "total_norm": t_norm,
        "circuit_share": share,
        "param_share": c_coord / n_coord,
        "random_mean": math.nan,
        "random_sd": math.nan,
        "share_ratio": math.nan,
        "p_random": math.nan,
    }
    if n_random and t_norm > 0:
        gen = torch.Generator().manual_seed(int(seed))
        shares = np.array([
            math.sqrt(float(flat[torch.randperm(L * H, generator=gen)[: len(circuit)]].sum())) / t_norm
            for _ in range(n_random)
        ])
        out["random_mean"] = float(shares.mean())
        out["random_sd"] = float(shares.std(ddof=1)) if n_random > 1 else math.nan
        out["share_ratio"] = share / out["random_mean"] if out["random_mean"] > 0 else math.nan
        out["p_random"] = float((shares >= share - 1e-12).mean())
    return out


def continuation_trace(
    series,
    task: Task | None = None,
    *,
    steps: Iterable[int] | None = None,
    batch: Batch | None = None,
    n: int = 512,
    heads: Sequence | str | None = None,
    k: int = 2,
    gates: str | Mapping | None = "zero",
    importance_gates: str | Mapping | None = "normal",
    n_random: int = 200,
    seed: int = 0,
    progress: bool = False,
) -> pd.DataFrame:
    """:func:`continuation_signal` at every checkpoint of ``series`` (or at ``steps``).

    ``heads``: a fixed ``(layer, head)`` list, ``None`` (the ``k`` most important heads
    at each checkpoint, under ``importance_gates``) or ``"final"`` (the ``k`` most
    important heads of the last checkpoint, under ``gates``: the circuit the run ends
    with, held fixed over the series). The batch defaults to the run's eval set
    (``eval_set(task, n)`` with the trainer's eval seed). One row per checkpoint with
    ``step`` and the signal's columns.
    """
    task = task if task is not None else getattr(series, "task", None)
    if task is None:
        raise ValueError("task: the series has no task; pass one")
    batch = batch if batch is not None else eval_set(task, n, EVAL_SEED)
    sub = series.select(list(steps)) if steps is not None else series
    fixed = heads
    if isinstance(heads, str):
        if heads != "final":
            raise ValueError(f"heads: expected a list of (layer, head), None or 'final', got {heads!r}")
        last = series[series.steps[-1]]
        fixed = circuit_heads(last, batch, task, k, gates=gates)
    rows = []
    it = sub
    if progress:
        from circuitfade.store.tracing import progress_bar

        it = progress_bar(sub, total=len(sub), desc="continuation signal", unit="ckpt")
    for step, model in it:
        sig = continuation_signal(model, batch, task, heads=fixed, k=k, gates=gates,
                                  importance_gates=importance_gates, n_random=n_random, seed=seed)
        rows.append({"step": int(step), **sig})
    return pd.DataFrame(rows)
