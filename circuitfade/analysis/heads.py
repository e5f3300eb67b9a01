"""Per-head mechanistic diagnostics (main paper, Section 9, Table 3 and Figure 11).

Two measurements per layer and head, for any TransformerLens ``HookedTransformer``
with the standard hook names (``blocks.{layer}.attn.hook_pattern`` and
``blocks.{layer}.attn.hook_z``), including :class:`~circuitfade.model.SoftPriorTransformer`:

* :func:`successor_mass` - how much attention a head puts, at each answer
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
import functools
import warnings
from typing import Iterator, Mapping

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from circuitfade.analysis.gates import batch_first
from circuitfade.compat import deprecated_names, resumes_at_layer
from circuitfade.gating.evaluation import NoGatesError, gate_condition, has_gates
from circuitfade.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES, bootstrap_ratio, bootstrap_weights, percentile_interval
from circuitfade.store.tracing import head_label, per_head_frame
from circuitfade.tasks import Batch, Task

__all__ = [
    "ABLATION_IMPORTANCE",
    "ABLATION_LOSS_INCREASE",
    "BOOTSTRAP_SEED",
    "SUCCESSOR_MASS",
    "NO_SOURCES_NOTE",
    "check_vocab",
    "has_answer_sources",
    "head_diagnostics",
    "mean_ablation_importance",
    "successor_mass",
]

SUCCESSOR_MASS = "successor_mass"
"""Metric name of :func:`successor_mass` in tidy frames (also the function's name)."""
ABLATION_IMPORTANCE = "ablation_importance"
"""Metric name of the accuracy drop of :func:`mean_ablation_importance` in tidy frames."""
ABLATION_LOSS_INCREASE = "ablation_loss_increase"
"""Metric name of the loss increase of :func:`mean_ablation_importance` in tidy frames."""

BOOTSTRAP_SEED = 0
"""Seed of the bootstrap resamples over evaluation examples. Fixed, so every head, every
checkpoint and every metric measured on the same evaluation set shares the same
resamples (resample ``r`` is one coherent alternative evaluation set)."""


# ---------------------------------------------------------------------------- checks
def check_model(model, hook: str) -> tuple[int, int]:
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


def check_batch(model, batch: Batch) -> Batch:
    if not isinstance(batch, Batch):
        raise ValueError(f"batch: expected a circuitfade.tasks.Batch, got {type(batch).__name__}")
    if batch.n_answers == 0:
        raise ValueError("batch: expected at least one answer position (batch.answer_mask is all False)")
    if batch.n_pos > model.cfg.n_ctx:
        raise ValueError(f"batch: sequence length {batch.n_pos} exceeds the model's n_ctx={model.cfg.n_ctx}")
    check_vocab(model, batch)
    device = next(model.parameters()).device
    return batch.to(device) if batch.device != device else batch


def check_vocab(model, batch: Batch) -> None:
    """``ValueError`` unless every token id of ``batch`` is below the model's ``d_vocab`` and every
    target below its ``d_vocab_out`` (a task whose vocabulary is larger than the model's would
    otherwise fail with an ``IndexError`` inside the embedding)."""
    cfg = model.cfg
    d_vocab = int(cfg.d_vocab)
    d_out = int(getattr(cfg, "d_vocab_out", -1) or -1)
    d_out = d_vocab if d_out < 1 else d_out
    top = int(batch.tokens.max()) if batch.tokens.numel() else -1
    if top >= d_vocab or (batch.tokens.numel() and int(batch.tokens.min()) < 0):
        raise ValueError(
            f"batch: token ids up to {top} but the model's vocabulary has d_vocab={d_vocab} tokens; evaluate on a "
            "task whose vocabulary fits the model (e.g. a smaller vocabulary through --task-arg / the task config)"
        )
    targets = batch.targets[batch.answer_mask]
    if targets.numel() and int(targets.max()) >= d_out:
        raise ValueError(f"batch: answer targets up to {int(targets.max())} but the model predicts d_vocab_out={d_out} "
                         "tokens; evaluate on a task whose vocabulary fits the model")


def gates_context(model, gates: str | Mapping | None):
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
    ctx = gates_context(model, gates)
    model.eval()
    try:
        with torch.no_grad(), ctx:
            yield
    finally:
        model.train(was_training)


def _auto_gates(model, gates):
    """``"auto"`` -> ``"zero"`` for a gated model, ``None`` (as it is) for a plain one."""
    if isinstance(gates, str) and gates == "auto":
        return "zero" if has_gates(model) else None
    return gates


def _interval(boot: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN heads (a non-finite model) -> NaN
        se = np.nanstd(boot, axis=0, ddof=1) if boot.shape[0] > 1 else np.full(boot.shape[1:], np.nan)
    lo, hi = percentile_interval(boot, level)
    return se, lo, hi


# -------------------------------------------------------------------- successor mass
def _successor_sums(model, batch: Batch, gates) -> tuple[Tensor, Tensor]:
    """Per-example successor mass summed over answer positions ``[batch, layer, head]``
    (NaN where a head's pattern at an answer position was not a distribution: a
    non-finite model, whose NaN pattern TransformerLens zeroes before the hook), and the
    per-example answer counts ``[batch]``."""
    n_layers, n_heads = check_model(model, "hook_pattern")
    batch = check_batch(model, batch)
    sums = torch.full((len(batch), n_layers, n_heads), float("nan"), dtype=torch.float64)
    fired = [False] * n_layers
    # only the answer rows (query positions) of a pattern are read: gather them once per layer
    rows = batch.answer_mask.any(0).nonzero().flatten()
    sources = batch.answer_sources[:, rows].to(torch.float64)  # [batch, answer rows, key_pos]
    mask = batch.answer_mask[:, rows]  # [batch, answer rows]
    mask64 = mask.to(torch.float64)

    def make_hook(layer: int):
        def hook(pattern: Float[Tensor, "batch head query_pos key_pos"], hook) -> None:
            p = pattern[:, :, rows].to(torch.float64)  # [batch, head, answer rows, key_pos]
            mass = torch.einsum("bhqk,bqk->bhq", p, sources)  # [batch, head, answer rows]
            total = torch.einsum("bhq,bq->bh", mass, mask64)
            broken = ((p.sum(-1) < 0.5) & mask[:, None, :]).any(-1)  # zeroed (NaN) rows
            broken |= ~torch.isfinite(pattern).flatten(2).all(-1)  # anywhere in the pattern
            sums[:, layer] = torch.where(broken, torch.nan, total).cpu()
            fired[layer] = True

        return hook

    hooks = [(f"blocks.{l}.attn.hook_pattern", make_hook(l)) for l in range(n_layers)]
    with _inference(model, gates):
        model.run_with_hooks(batch.tokens, fwd_hooks=hooks, return_type=None)
    if not all(fired):
        raise ValueError("model: a hook_pattern hook did not fire during the forward pass")
    if not has_answer_sources(batch):
        sums.fill_(float("nan"))  # no answer token is marked anywhere: the mass is undefined, not 0
    return sums, batch.answer_mask.sum(1).to(torch.float64).cpu()


NO_SOURCES_NOTE = "no answer sources: the batch marks no position holding an answer token, so successor mass is undefined"
"""The ``note`` of successor-mass rows measured on a batch without answer sources (their values are NaN)."""


def has_answer_sources(batch: Batch) -> bool:
    """Whether any answer position of ``batch`` has a marked source (``answer_sources``)."""
    return bool((batch.answer_sources & batch.answer_mask[:, :, None]).any())


def successor_mass(
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
    position with no marked source contributes 0 (e.g. a Markov position whose answer was
    drawn at random); a batch with no marked source at any answer position gives NaN for
    every head (the mass is undefined, not 0; :data:`NO_SOURCES_NOTE`).

    What it cannot tell: *why* a head attends there. A head that learned a positional
    shortcut ("attend to t-14") scores as high as an induction head whenever the answer
    sits at that offset (a fixed-span model scores 0.99 this way). To tell induction
    from position, use the selectivity screens
    (:func:`circuitfade.analysis.screens.capability_selectivity`,
    ``circuitfade screen``), which compare each head on repeated vs matched control
    sequences.

    ``gates``: an optional gate condition applied during the forward (see
    :func:`circuitfade.gating.evaluation.gate_condition`; ``None`` = as the model is). Works for
    any ``HookedTransformer`` with the standard ``hook_pattern`` hooks (gates other than
    ``None``/``"normal"`` need a gated model). A non-finite model gives NaN, not 0.

    Returns a float32 CPU tensor ``[n_layers, n_heads]`` (intervals: see
    :func:`head_diagnostics`). Raises ``ValueError`` if the batch has no answer
    positions or the model lacks the hooks.
    """
    sums, counts = _successor_sums(model, batch, gates)
    return (sums.sum(0) / counts.sum()).float()


successor_mass.metric_inputs = ("model", "batch")
successor_mass.metric_name = SUCCESSOR_MASS


# ------------------------------------------------------------------- mean ablation
_MAX_ELEMENTS = 2**21
"""Default ``max_elements`` of :func:`mean_ablation_importance` and :func:`head_diagnostics`
(elements of the widest activation of one ablation forward; the rule is in the former's docstring)."""


def _activation_width(model, n_pos: int) -> int:
    """Elements per sequence of the widest activation of a forward over ``n_pos`` positions:
    ``n_pos`` times the largest of ``d_model``, ``d_mlp`` (unless attention-only),
    ``d_vocab_out``, ``n_heads * d_head`` and ``n_heads * n_pos`` (the attention scores)."""
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    widths = [int(cfg.d_model), n_heads * int(getattr(cfg, "d_head", 1) or 1), n_heads * int(n_pos)]
    d_out = int(getattr(cfg, "d_vocab_out", -1) or -1)
    widths.append(d_out if d_out > 0 else int(cfg.d_vocab))
    if not getattr(cfg, "attn_only", False) and getattr(cfg, "d_mlp", None):
        widths.append(int(cfg.d_mlp))
    return int(n_pos) * max(widths)


def _heads_per_forward(model, n_seq: int, n_pos: int, *, max_batch: int | None = None,
                      max_elements: int | None = _MAX_ELEMENTS) -> int:
    """How many heads of a layer :func:`mean_ablation_importance` ablates in one forward of the
    batch (``n_seq`` sequences of ``n_pos`` tokens) repeated once per head: every head of the
    layer, as long as ``max_elements`` (elements of the widest activation,
    ``_activation_width``, over the repeated batch) and ``max_batch`` (sequences) allow;
    at least one. ``None`` lifts either cap."""
    per = int(model.cfg.n_heads)
    if max_batch is not None:
        per = min(per, max_batch // n_seq)
    if max_elements is not None:
        per = min(per, max_elements // (n_seq * _activation_width(model, n_pos)))
    return max(1, per)


def _check_cap(value, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name}: expected a positive int or None, got {value!r}")


@batch_first
def mean_ablation_importance(
    model,
    batch: Batch,
    task: Task,
    *,
    gates: str | Mapping | None = "zero",
    max_batch: int | None = None,
    max_elements: int | None = _MAX_ELEMENTS,
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

    Computation: one clean forward, then per layer forwards on the batch repeated once
    per head of a group of that layer's heads (copy ``k`` has the group's head ``k``
    mean-ablated); for a layer after the first, the forward resumes from the clean
    residual stream before that layer where the model can (``start_at_layer``: circuitfade's
    models and ``HookedTransformer``; the blocks before it are not run again). How many heads share a forward: as many as fit both caps, at least
    one, at most the layer's heads:

    * ``max_elements`` (default ``2**21``, 8 MiB of float32): elements of the widest
      activation of the repeated batch, i.e. ``heads * len(batch) * n_pos *
      max(d_model, d_mlp, d_vocab_out, n_heads * d_head, n_heads * n_pos)`` (the last:
      the attention scores; ``d_mlp`` only with MLPs);
    * ``max_batch``: sequences per forward (``heads * len(batch)``), to bound memory.

    ``None`` lifts a cap (``max_elements=None, max_batch=None``: every head of a layer
    in one forward). Why an element cap: repeating the batch pays while forwards are
    small (each forward's fixed cost, hooks and Python, is shared by the heads in it) and
    stops paying once activations outgrow the processor's caches, where one forward of
    ``k`` copies costs more than ``k`` forwards of one. A few MiB per activation is where
    that happens on common CPUs; the default is a rule of thumb, not an optimum measured
    for any one machine: raise it on a GPU and measure with
    ``benchmarks/trace_speed.py``. So a small model on a small batch ablates every head
    of a layer in one forward, a large one splits. The grouping changes how the work is
    cut, not what is computed (tested: one head per forward and all heads in one give
    the same values).

    Returns one row per head, sorted by layer then head, with columns ``layer, head,
    acc_drop, loss_increase, acc_clean, acc_ablated, loss_clean, loss_ablated``.
    """
    rows, _ = _ablation(model, task, batch, gates, max_batch, max_elements)
    return pd.DataFrame(rows)


_TASK_SCORING = ("_check_logits", "_correct", "accuracy", "loss", "per_example_accuracy")


def _answer_view(task: Task, batch: Batch) -> tuple[Tensor | None, Batch]:
    """``(cols, view)``: the positions that hold an answer in some sequence of ``batch``, and
    ``batch`` cut to those positions, when ``task`` scores with :class:`Task`'s own methods.
    Those read logits only at answer positions, so :func:`_scores` of ``logits[:, cols]`` on the
    view equals :func:`_scores` of ``logits`` on the batch while touching a fraction of the logits
    (associative recall: one position of each sequence). ``(None, batch)`` for a task or batch
    type that scores its own way, or when every position holds an answer."""
    if type(batch) is not Batch or any(getattr(type(task), m, None) is not getattr(Task, m) for m in _TASK_SCORING):
        return None, batch
    cols = batch.answer_mask.any(0).nonzero().flatten()
    if len(cols) == batch.n_pos:
        return None, batch
    n = len(cols)
    return cols, Batch(batch.tokens[:, cols], batch.targets[:, cols], batch.answer_mask[:, cols],
                       torch.zeros(len(batch), n, n, dtype=torch.bool, device=batch.device))


def _scores(task: Task, logits: Tensor, batch: Batch, cols: Tensor | None = None,
            n_pos: int | None = None) -> tuple[float, float, np.ndarray, np.ndarray]:
    """``(accuracy, loss, correct_b, ce_b)``: the task's pooled accuracy and loss (NaN if any
    answer logit is non-finite) and per-example correct counts and cross-entropy sums
    (NaN for an example with a non-finite answer logit). With ``cols`` (``logits`` and
    ``batch`` cut to those of ``n_pos`` positions, :func:`_answer_view`), the cross-entropy
    sums add the same terms at the same places as on the whole batch, so they agree bit for bit."""
    mask = batch.answer_mask
    finite_b = (torch.isfinite(logits).all(-1) | ~mask).all(-1)  # [batch]
    acc = float(task.accuracy(logits, batch))
    loss = float(task.loss(logits, batch))
    if not bool(finite_b.all()):
        acc = loss = float("nan")
    counts = mask.sum(1).to(torch.float64)
    correct = task.per_example_accuracy(logits, batch).to(torch.float64) * counts
    ce = torch.zeros(mask.shape, dtype=torch.float64, device=logits.device)
    ce[mask] = F.cross_entropy(logits[mask].double(), batch.targets[mask], reduction="none")
    if cols is not None:
        full = torch.zeros((mask.shape[0], n_pos), dtype=torch.float64, device=logits.device)
        full[:, cols] = ce
        ce = full
    ce_b = ce.sum(1)
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=logits.device)
    correct = torch.where(finite_b, correct, nan)
    ce_b = torch.where(finite_b, ce_b, nan)
    return acc, loss, correct.cpu().numpy(), ce_b.cpu().numpy()


def _resumes_at_layer(model) -> bool:
    """Whether ``model`` runs a forward from a block's residual stream (``start_at_layer`` with
    ``tokens``) exactly as a whole forward reaches that block: circuitfade's soft-prior models,
    and the ``HookedTransformer`` s :func:`circuitfade.compat.resumes_at_layer` accepts. Other
    models (a ``TransformerBridge``) run every forward whole."""
    from circuitfade.model.core import SoftPriorCore

    return isinstance(model, SoftPriorCore) or resumes_at_layer(model)


def _ablation(model, task: Task, batch: Batch, gates, max_batch,
              max_elements: int | None = _MAX_ELEMENTS) -> tuple[list[dict], dict]:
    """Rows of :func:`mean_ablation_importance` and the per-example arrays its intervals need."""
    n_layers, n_heads = check_model(model, "hook_z")
    batch = check_batch(model, batch)
    if not isinstance(task, Task):
        raise ValueError(f"task: expected a circuitfade.tasks.Task (mean ablation scores answers with it), got "
                         f"{type(task).__name__}; with trace(), pass task= (a name such as 'assoc', a Task) or your "
                         "own circuitfade.tasks.Batch (as task= or batch=: it carries its targets)")
    _check_cap(max_batch, "max_batch")
    _check_cap(max_elements, "max_elements")
    B = len(batch)
    if B < 2:
        raise ValueError(
            f"batch: mean ablation needs at least 2 examples, got {B} (the batch mean of one example is that "
            "example, so every head would score exactly 0)"
        )
    per_forward = _heads_per_forward(model, B, batch.n_pos, max_batch=max_batch, max_elements=max_elements)
    names = [f"blocks.{l}.attn.hook_z" for l in range(n_layers)]
    means: dict[int, Tensor] = {}
    resumes = _resumes_at_layer(model)
    resid: dict[int, Tensor] = {}  # the clean residual stream before each block from 1 on (where resumable)

    def save_mean(layer: int):
        def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> None:
            means[layer] = z.mean(dim=0)  # [pos, head, d_head]

        return hook

    def save_resid(layer: int):
        def hook(x: Float[Tensor, "batch pos d_model"], hook) -> None:
            resid[layer] = x.detach().clone()

        return hook

    def ablate(layer: int, heads: list[int]):
        def hook(z: Float[Tensor, "copies_batch pos head d_head"], hook) -> Tensor:
            _, P, H, D = z.shape
            z = z.reshape(len(heads), B, P, H, D).clone()  # z's own layout: a plain copy, no transpose
            for copy, h in enumerate(heads):
                z[copy, :, :, h, :] = means[layer][:, h, :]  # broadcast over the batch
            return z.view(len(heads) * B, P, H, D)

        return hook

    rows = []
    correct_abl = np.full((n_layers, n_heads, B), np.nan)
    ce_abl = np.full((n_layers, n_heads, B), np.nan)
    with _inference(model, gates):
        saves = [(n, save_mean(l)) for l, n in enumerate(names)]
        if resumes:
            saves += [(f"blocks.{l}.hook_resid_pre", save_resid(l)) for l in range(1, n_layers)]
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=saves)
        if len(means) != n_layers:
            raise ValueError("model: a hook_z hook did not fire during the forward pass")
        cols, view = _answer_view(task, batch)
        if cols is not None:
            logits = logits[:, cols]
        acc_clean, loss_clean, correct_clean, ce_clean = _scores(task, logits, view, cols, batch.n_pos)
        for layer in range(n_layers):
            for start in range(0, n_heads, per_forward):
                heads = list(range(start, min(start + per_forward, n_heads)))
                tokens = batch.tokens.repeat(len(heads), 1)  # copy k = rows [k*B, (k+1)*B)
                hooks = [(names[layer], ablate(layer, heads))]
                if layer in resid:  # the blocks before this layer are the clean forward's: resume after them
                    logits = model.run_with_hooks(resid[layer].repeat(len(heads), 1, 1), start_at_layer=layer,
                                                  tokens=tokens, fwd_hooks=hooks)
                else:
                    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
                logits = logits.view(len(heads), B, *logits.shape[1:])
                if cols is not None:
                    logits = logits[:, :, cols]
                for copy, h in enumerate(heads):
                    acc, loss, correct_abl[layer, h], ce_abl[layer, h] = _scores(task, logits[copy], view, cols,
                                                                                 batch.n_pos)
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
    per_example = {
        "counts": batch.answer_mask.sum(1).double().cpu().numpy(),
        "acc_drop": (correct_clean[None, None, :] - correct_abl).transpose(2, 0, 1),  # [B, L, H]
        "loss_increase": (ce_abl - ce_clean[None, None, :]).transpose(2, 0, 1),
    }
    return rows, per_example


# --------------------------------------------------------------------- diagnostics
@functools.lru_cache(maxsize=4)
def _bootstrap_weights(n: int, resamples: int) -> np.ndarray:
    """:func:`bootstrap_weights` with :data:`BOOTSTRAP_SEED`, drawn once per ``(n, resamples)`` and
    shared (read-only) by every checkpoint of a trace."""
    w = bootstrap_weights(n, resamples, BOOTSTRAP_SEED)
    w.flags.writeable = False
    return w


def _frame(metrics: list[str], values: np.ndarray, intervals=None) -> pd.DataFrame:
    """The rows of :func:`per_head_frame` for several metrics at once (metric-major, then layer, then
    head), built as one frame: ``values`` ``[metric, layer, head]``; ``intervals``: ``(se, lo, hi)``
    each ``[metric, layer, head]`` and the resamples ``[R, metric, layer, head]``, or ``None``."""
    M, L, H = values.shape
    out = {
        "layer": np.tile(np.repeat(np.arange(L), H), M),
        "head": np.tile(np.arange(H), M * L),
        "metric": np.repeat(np.array(metrics, dtype=object), L * H),
        "value": np.asarray(values, dtype=np.float64).reshape(-1),
    }
    if intervals is not None:
        se, lo, hi, boot = intervals
        out.update(se=np.asarray(se, dtype=float).reshape(-1), lo=np.asarray(lo, dtype=float).reshape(-1),
                   hi=np.asarray(hi, dtype=float).reshape(-1))
        flat = np.asarray(boot, dtype=np.float32).reshape(boot.shape[0], -1)
        out["boot"] = [flat[:, i].copy() for i in range(M * L * H)]
    return pd.DataFrame(out)


def head_diagnostics(
    model,
    batch: Batch,
    task: Task,
    *,
    mass_gates: str | Mapping | None = None,
    ablation_gates: str | Mapping | None = "auto",
    max_batch: int | None = None,
    max_elements: int | None = _MAX_ELEMENTS,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Both Section 9 diagnostics as one tidy frame ``layer, head, metric, value, se, lo, hi, boot``.

    The argument order ``(model, batch, task)`` is the metric protocol of
    :func:`circuitfade.store.trace`, so ``trace(series, [head_diagnostics])`` gives a
    trace that :func:`circuitfade.analysis.timeline.consolidation_timeline` reads
    directly (the metric names below are kept).

    Metrics: :data:`SUCCESSOR_MASS` (:func:`successor_mass` under ``mass_gates``,
    default: the gates as they are), :data:`ABLATION_IMPORTANCE` (``acc_drop`` of
    :func:`mean_ablation_importance` under ``ablation_gates``) and
    :data:`ABLATION_LOSS_INCREASE` (its ``loss_increase``). ``ablation_gates="auto"``
    (default): ``"zero"`` (the paper's zero-gate importance) for a gated model, the
    model as it is for a plain ``HookedTransformer``, so every metric is computed on
    any model. ``max_batch`` and ``max_elements``: how many heads share an ablation
    forward (see :func:`mean_ablation_importance`; the values do not depend on them).

    Intervals: a nonparametric bootstrap over evaluation *examples* (``resamples``
    resamples of the batch with replacement, :data:`BOOTSTRAP_SEED`; each estimate is
    recomputed as the pooled ratio over the resampled examples' answer positions; the
    ablation means are held at their full-batch values). ``se`` is the standard
    deviation of the resampled estimates, ``lo``/``hi`` their ``level`` percentile
    interval, ``boot`` the resampled values themselves (a float array per row; the same
    resamples for every head and checkpoint). ``resamples=0`` skips them (NaN columns);
    ``resamples=1`` and batches of fewer than 2 examples are refused (``ValueError``): an
    interval from one resample or one example is no interval, and the batch mean of one
    example is the example. On a batch without answer sources the successor-mass rows
    are NaN and a ``note`` column says why (:data:`NO_SOURCES_NOTE`).
    """
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 0 or resamples == 1:
        raise ValueError(f"resamples: expected 0 (no intervals) or an int >= 2, got {resamples!r} "
                         "(one resample gives an interval of zero width around one value)")
    if isinstance(batch, Batch) and len(batch) < 2:
        raise ValueError(f"batch: head diagnostics need at least 2 examples, got {len(batch)} (mean ablation "
                         "and intervals over examples are undefined for one)")
    ablation_gates = _auto_gates(model, ablation_gates)
    sums, counts = _successor_sums(model, batch, mass_gates)
    mass = (sums.sum(0) / counts.sum()).float()
    rows, per_example = _ablation(model, task, batch, ablation_gates, max_batch, max_elements)
    abl = pd.DataFrame(rows)
    L, H = mass.shape
    values = {
        SUCCESSOR_MASS: (mass.double().numpy(), sums.numpy(), counts.numpy()),
        ABLATION_IMPORTANCE: (abl["acc_drop"].to_numpy().reshape(L, H), per_example["acc_drop"],
                              per_example["counts"]),
        ABLATION_LOSS_INCREASE: (abl["loss_increase"].to_numpy().reshape(L, H), per_example["loss_increase"],
                                 per_example["counts"]),
    }
    intervals = None
    if resamples:
        weights = _bootstrap_weights(len(counts), resamples)
        boots = [bootstrap_ratio(num, den, weights) for _, num, den in values.values()]  # each [R, L, H]
        per_metric = [_interval(b, level) for b in boots]  # one metric at a time: numpy's NaN path is per array
        intervals = (*(np.stack([iv[i] for iv in per_metric]) for i in range(3)), np.stack(boots, axis=1))
    out = _frame(list(values), np.stack([v[0] for v in values.values()]), intervals)
    if not has_answer_sources(batch):
        out["note"] = pd.Series([NO_SOURCES_NOTE if m == SUCCESSOR_MASS else None for m in out["metric"]],
                                dtype=object)
    return out


__getattr__ = deprecated_names(__name__, {"successor_value_mass": (__name__, "successor_mass")})
"""``successor_value_mass``, the former name of :func:`successor_mass`, warns and resolves to it."""
