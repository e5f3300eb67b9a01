"""Per-head mechanistic diagnostics (main paper, Section 9, Table 3 and Figure 11).

Two measurements per layer and head, for any TransformerLens ``HookedTransformer``
with the standard hook names (``blocks.{layer}.attn.hook_pattern`` and
``blocks.{layer}.attn.hook_z``), including :class:`~circuitfade.model.SoftPriorTransformer`:

* :func:`successor_value_mass` - how much attention a head puts, at each answer
  position, on the key positions that hold the correct answer token;
* :func:`mean_ablation_importance` - how much accuracy drops when the head's output
  is replaced by its batch mean (at zero gate by default, as in the paper).

:func:`head_diagnostics` returns both as one tidy long DataFrame (``layer, head,
metric, value``) ready to be traced over a checkpoint series. Nothing here trains or
changes the model: hooks and gate overrides exist only during the forward passes,
and the model's train/eval mode is restored.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from circuitfade.analysis.gates import NoGatesError
from circuitfade.gating.evaluation import gate_condition, has_gates
from circuitfade.tasks import Batch, Task

__all__ = [
    "ABLATION_IMPORTANCE",
    "ABLATION_LOSS_INCREASE",
    "SUCCESSOR_MASS",
    "head_diagnostics",
    "head_label",
    "mean_ablation_importance",
    "per_head_frame",
    "successor_value_mass",
]

SUCCESSOR_MASS = "successor_mass"
"""Metric name of :func:`successor_value_mass` in tidy frames."""
ABLATION_IMPORTANCE = "ablation_importance"
"""Metric name of the accuracy drop of :func:`mean_ablation_importance` in tidy frames."""
ABLATION_LOSS_INCREASE = "ablation_loss_increase"
"""Metric name of the loss increase of :func:`mean_ablation_importance` in tidy frames."""


def head_label(layer: int, head: int) -> str:
    """``"L{layer}H{head}"``, the paper's name for a head (e.g. ``L1H3``)."""
    return f"L{int(layer)}H{int(head)}"


# ---------------------------------------------------------------------------- checks
def _check_model(model, hook: str) -> tuple[int, int]:
    cfg = getattr(model, "cfg", None)
    hook_dict = getattr(model, "hook_dict", None)
    if cfg is None or hook_dict is None:
        raise ValueError(
            f"model: expected a TransformerLens HookedTransformer (with .cfg and hooks), got {type(model).__name__}"
        )
    missing = [f"blocks.{l}.attn.{hook}" for l in range(cfg.n_layers) if f"blocks.{l}.attn.{hook}" not in hook_dict]
    if missing:
        raise ValueError(f"model {type(model).__name__}: expected standard TransformerLens hooks, missing {missing}")
    return cfg.n_layers, cfg.n_heads


def _check_batch(model, batch: Batch) -> Batch:
    if not isinstance(batch, Batch):
        raise ValueError(f"batch: expected a circuitfade.tasks.Batch, got {type(batch).__name__}")
    if batch.n_answers == 0:
        raise ValueError("batch: expected at least one answer position (batch.answer_mask is all False)")
    if batch.n_pos > model.cfg.n_ctx:
        raise ValueError(f"batch: sequence length {batch.n_pos} exceeds the model's n_ctx={model.cfg.n_ctx}")
    device = next(model.parameters()).device
    return batch.to(device) if batch.device != device else batch


def _gates_context(model, gates: str | Mapping | None):
    """``gate_condition(model, gates)``; :class:`NoGatesError` pointing plain models at ``gates=None``."""
    if gates not in (None, "normal") and not has_gates(model):
        raise NoGatesError(
            f"model {type(model).__name__} has no gates, so gates={gates!r} does not apply; "
            "pass gates=None to analyse it as it is"
        )
    return gate_condition(model, gates)


@contextlib.contextmanager
def _inference(model, gates) -> Iterator[None]:
    """Eval mode, no grad and the gate condition; restores train/eval mode on exit."""
    was_training = model.training
    ctx = _gates_context(model, gates)
    model.eval()
    try:
        with torch.no_grad(), ctx:
            yield
    finally:
        model.train(was_training)


# -------------------------------------------------------------------- successor mass
def successor_value_mass(
    model,
    batch: Batch,
    *,
    gates: str | Mapping | None = None,
) -> Float[Tensor, "layer head"]:
    """Successor-value mass of every head (paper Section 9, metric (i)).

    For layer ``l`` and head ``h`` with attention pattern ``A[b, h, i, j]`` (the softmax
    at ``blocks.{l}.attn.hook_pattern``, query ``i``, key ``j``)::

        mass[l, h] = (1 / N) * Σ_{(b, i): answer_mask[b, i]}  Σ_j A[b, h, i, j] * answer_sources[b, i, j]

    where ``N`` is the number of answer positions in the batch. ``answer_sources[b, i]``
    marks the key positions holding the correct answer token for answer position ``i``
    (associative recall: the value paired with the queried key; Markov induction: the
    successor of the earlier occurrence of the current token). So ``mass`` is the
    attention probability a head puts on the correct answer token, averaged over all
    answer positions of the batch: 1 for a head that always attends only there, and
    ``1/(i+1)`` per position for a uniformly attending head with one source. An answer
    position with no marked source contributes 0 (the built-in tasks always mark one).

    ``gates``: an optional gate condition applied during the forward (see
    :func:`circuitfade.gating.evaluation.gate_condition`; ``None`` = as the model is). Works for
    any ``HookedTransformer`` with the standard ``hook_pattern`` hooks (gates other than
    ``None``/``"normal"`` need a gated model).

    Returns a float32 CPU tensor ``[n_layers, n_heads]``. Raises ``ValueError`` if the
    batch has no answer positions or the model lacks the hooks.
    """
    n_layers, n_heads = _check_model(model, "hook_pattern")
    batch = _check_batch(model, batch)
    n_answers = float(batch.n_answers)
    out = torch.full((n_layers, n_heads), float("nan"))

    def make_hook(layer: int):
        def hook(pattern: Float[Tensor, "batch head query_pos key_pos"], hook) -> None:
            dtype = torch.promote_types(pattern.dtype, torch.float32)
            sources = batch.answer_sources.to(dtype)  # [batch, query_pos, key_pos]
            mask = batch.answer_mask.to(dtype)  # [batch, query_pos]
            mass = torch.einsum("bhqk,bqk->bhq", pattern.to(dtype), sources)  # [batch, head, query_pos]
            out[layer] = (torch.einsum("bhq,bq->h", mass, mask) / n_answers).float().cpu()

        return hook

    hooks = [(f"blocks.{l}.attn.hook_pattern", make_hook(l)) for l in range(n_layers)]
    with _inference(model, gates):
        model.run_with_hooks(batch.tokens, fwd_hooks=hooks, return_type=None)
    if torch.isnan(out).any():
        raise ValueError("model: a hook_pattern hook did not fire during the forward pass")
    return out


# ------------------------------------------------------------------- mean ablation
def mean_ablation_importance(
    model,
    task: Task,
    batch: Batch,
    *,
    gates: str | Mapping | None = "zero",
    max_batch: int | None = None,
) -> pd.DataFrame:
    """Accuracy drop and loss increase when one head is replaced by its batch mean (paper Section 9, (ii)).

    For every layer ``l`` and head ``h``, the head's output ``z`` at
    ``blocks.{l}.attn.hook_z`` (``[batch, pos, head, d_head]``, the attention-weighted
    values before ``W_O``) is replaced, for every sequence, by its *position-wise batch
    mean* ``z̄[p, h] = mean_b z[b, p, h]`` taken from the clean forward on the same batch
    under the same gate condition; everything downstream (later layers included) is
    recomputed. Then::

        acc_drop      = acc_clean - acc_ablated
        loss_increase = loss_ablated - loss_clean

    with accuracy and loss as :meth:`Task.accuracy` / :meth:`Task.loss` (pooled over the
    batch's answer positions).

    ``gates``: the gate condition of both the clean and the ablated forwards;
    ``"zero"`` by default (the paper's zero-gate ablation importance). For a model
    without gates pass ``gates=None`` (anything else raises :class:`NoGatesError`,
    a ``ValueError``).

    Computation: one clean forward, then per layer one forward on the batch repeated
    once per head (copy ``k`` has head ``k`` of that layer mean-ablated), i.e.
    ``n_layers`` forwards of ``n_heads * batch`` sequences. ``max_batch`` caps the
    sequences per forward (at least one head copy per forward) to bound memory.

    Returns one row per head, sorted by layer then head, with columns ``layer, head,
    acc_drop, loss_increase, acc_clean, acc_ablated, loss_clean, loss_ablated``.
    """
    n_layers, n_heads = _check_model(model, "hook_z")
    batch = _check_batch(model, batch)
    if not isinstance(task, Task):
        raise ValueError(f"task: expected a circuitfade.tasks.Task, got {type(task).__name__}")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ValueError(f"max_batch: expected a positive int or None, got {max_batch!r}")
    B = len(batch)
    per_forward = n_heads if max_batch is None else max(1, min(n_heads, max_batch // B))
    names = [f"blocks.{l}.attn.hook_z" for l in range(n_layers)]
    means: dict[int, Tensor] = {}

    def save_mean(layer: int):
        def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> None:
            means[layer] = z.mean(dim=0)  # [pos, head, d_head]

        return hook

    def ablate(layer: int, heads: list[int]):
        def hook(z: Float[Tensor, "copies_batch pos head d_head"], hook) -> Tensor:
            _, P, H, D = z.shape
            z = z.reshape(len(heads), B, P, H, D).clone(memory_format=torch.contiguous_format)
            for copy, h in enumerate(heads):
                z[copy, :, :, h, :] = means[layer][:, h, :]  # broadcast over the batch
            return z.view(len(heads) * B, P, H, D)

        return hook

    rows = []
    with _inference(model, gates):
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(n, save_mean(l)) for l, n in enumerate(names)])
        if len(means) != n_layers:
            raise ValueError("model: a hook_z hook did not fire during the forward pass")
        acc_clean = float(task.accuracy(logits, batch))
        loss_clean = float(task.loss(logits, batch))
        for layer in range(n_layers):
            for start in range(0, n_heads, per_forward):
                heads = list(range(start, min(start + per_forward, n_heads)))
                tokens = batch.tokens.repeat(len(heads), 1)  # copy k = rows [k*B, (k+1)*B)
                logits = model.run_with_hooks(tokens, fwd_hooks=[(names[layer], ablate(layer, heads))])
                logits = logits.view(len(heads), B, *logits.shape[1:])
                for copy, h in enumerate(heads):
                    acc = float(task.accuracy(logits[copy], batch))
                    loss = float(task.loss(logits[copy], batch))
                    rows.append(
                        {
                            "layer": layer,
                            "head": h,
                            "acc_drop": acc_clean - acc,
                            "loss_increase": loss - loss_clean,
                            "acc_clean": acc_clean,
                            "acc_ablated": acc,
                            "loss_clean": loss_clean,
                            "loss_ablated": loss,
                        }
                    )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------- tidy frames
def per_head_frame(tensor: Float[Tensor, "layer head"], metric: str) -> pd.DataFrame:
    """A ``[layer, head]`` tensor as tidy rows with columns ``layer, head, metric, value``.

    Rows are ordered layer-major (``L0H0, L0H1, ...``); ``value`` is float.
    """
    t = torch.as_tensor(tensor).detach()
    if t.dim() != 2:
        raise ValueError(f"tensor: expected shape [layer, head], got {tuple(t.shape)}")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"metric: expected a non-empty str, got {metric!r}")
    L, H = t.shape
    layer, head = torch.meshgrid(torch.arange(L), torch.arange(H), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.reshape(-1).numpy(),
            "head": head.reshape(-1).numpy(),
            "metric": metric,
            "value": t.reshape(-1).double().cpu().numpy(),
        }
    )


def head_diagnostics(
    model,
    batch: Batch,
    task: Task,
    *,
    mass_gates: str | Mapping | None = None,
    ablation_gates: str | Mapping | None = "zero",
    max_batch: int | None = None,
) -> pd.DataFrame:
    """Both Section 9 diagnostics as one tidy frame ``layer, head, metric, value``.

    The argument order ``(model, batch, task)`` is the metric protocol of
    :func:`circuitfade.store.trace`, so ``trace(series, [head_diagnostics])`` gives a
    trace that :func:`circuitfade.analysis.timeline.consolidation_timeline` reads
    directly (the metric names below are kept).

    Metrics: :data:`SUCCESSOR_MASS` (:func:`successor_value_mass` under ``mass_gates``,
    default: the gates as they are), :data:`ABLATION_IMPORTANCE` (``acc_drop`` of
    :func:`mean_ablation_importance` under ``ablation_gates``, default ``"zero"``) and
    :data:`ABLATION_LOSS_INCREASE` (its ``loss_increase``). For a model without gates
    pass ``ablation_gates=None`` (otherwise :class:`NoGatesError`).
    """
    mass = per_head_frame(successor_value_mass(model, batch, gates=mass_gates), SUCCESSOR_MASS)
    abl = mean_ablation_importance(model, task, batch, gates=ablation_gates, max_batch=max_batch)
    frames = [mass]
    for column, metric in (("acc_drop", ABLATION_IMPORTANCE), ("loss_increase", ABLATION_LOSS_INCREASE)):
        frames.append(abl[["layer", "head"]].assign(metric=metric, value=abl[column].astype(float)))
    return pd.concat(frames, ignore_index=True)
