"""Evaluate a model on a task batch under named gate conditions.

Conditions (the main paper reports "normal" and "zero-gate"; our prototype
showed the paper's "normal" column is ambiguous, so we name every one):

* ``"normal"`` - gates as they are now (learned sigmoid, or the fixed/scheduled
  value the trainer set for this step);
* ``"zero"``   - every prior's gate at 0 (the prior removed);
* ``"param"``  - every gate at ``sigmoid(logit)``, whatever its mode (for masked
  modes this is the initial logit, i.e. ``gate_init``);
* ``"half"``   - every gate at 0.5;
* ``{"pos": 0.0}`` or any mapping - exactly those gates overridden.

Models without gates (a plain ``HookedTransformer``) support only ``"normal"``.
"""

from __future__ import annotations

import contextlib
from typing import Mapping

import torch

from circuitfade.tasks import Batch, Task

CONDITIONS = ("normal", "zero", "param", "half")
EVAL_CHUNK = 128  # examples per forward in evaluate_batch


class NoGatesError(ValueError):
    """The model has no gates, so a gate condition other than "normal" does not apply.

    :func:`circuitfade.store.trace` records metrics raising it as NaN rows with
    ``note = "no gates"`` instead of failing.
    """


def has_gates(model) -> bool:
    return hasattr(model, "gates") and hasattr(getattr(model, "cfg", None), "priors")


def gate_condition(model, condition: str | Mapping | None):
    """Context manager that puts ``model``'s gates into ``condition``."""
    if condition in (None, "normal"):
        return contextlib.nullcontext(model)
    if not has_gates(model):
        raise NoGatesError(f"model {type(model).__name__} has no gates; only condition 'normal' applies")
    if isinstance(condition, Mapping):
        return model.gates(**condition)
    if condition == "zero":
        return model.gates(**{p: 0.0 for p in model.cfg.priors})
    if condition == "half":
        return model.gates(**{p: 0.5 for p in model.cfg.priors})
    if condition == "param":
        return model.gates(**model.gate_values("parameter"))
    raise ValueError(f"unknown gate condition {condition!r}; expected one of {CONDITIONS} or a mapping")


def answer_logits(model, batch: Batch) -> torch.Tensor:
    """``model(batch.model_input)``, computing the last block only at the answer positions
    when the model offers it (a :class:`~circuitfade.model.SoftPriorTransformer` on its
    fused path, no hook attached): the same loss, accuracy and gradients, and NaN logits
    at positions no answer is scored at. Any other model (or a hooked one) runs in full.

    Tasks score only ``batch.answer_mask`` positions, so the training loss and every
    metric of :func:`evaluate_batch` are unchanged by it (tested to 1e-5).
    """
    x = batch.model_input
    if not getattr(model, "supports_positions", False):
        return model(x)
    cols = batch.answer_mask.any(0).nonzero().flatten()
    return model(x, positions=cols)


@torch.no_grad()
def evaluate_batch(model, task: Task, batch: Batch, condition: str | Mapping | None = "normal") -> dict:
    """``task.metrics`` of ``model`` on ``batch`` under ``condition``: ``{"accuracy", "loss"}``
    for token tasks, ``{"mse", "loss"}`` for regression tasks.

    The forward runs in chunks of :data:`EVAL_CHUNK` examples (less peak memory); the
    metrics are computed once on the joined logits, so they are those of the whole batch."""
    was_training = model.training
    model.eval()
    try:
        with gate_condition(model, condition):
            n = len(batch)
            if n <= EVAL_CHUNK:
                logits = answer_logits(model, batch)
            else:
                logits = torch.cat([answer_logits(model, batch[i:i + EVAL_CHUNK]) for i in range(0, n, EVAL_CHUNK)])
        return task.metrics(logits, batch)
    finally:
        model.train(was_training)


def _gate_key(model, condition) -> tuple:
    """The effective gate values under ``condition``, as a hashable key."""
    with gate_condition(model, condition):
        g = model.gate_values("effective")
    return tuple((name, tuple(g[name].flatten().tolist())) for name in sorted(g))


def condition_groups(model, conditions=CONDITIONS) -> list[list[int]]:
    """Indices into ``conditions`` grouped by the gate values they put ``model``'s gates at
    (first-seen order; the first index of each group is the one to evaluate). Conditions
    other than ``"normal"`` are left out for a model without gates or priors."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(conditions):
        if c != "normal" and (not has_gates(model) or not model.cfg.priors):
            continue  # no priors: every gate condition is the "normal" model
        key = _gate_key(model, c) if has_gates(model) and model.cfg.priors else ("normal",)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def conditions_row(conditions, metrics: list[dict | None]) -> dict[str, float]:
    """``{f"{metric}_{condition}": value}`` in the order of ``conditions``; ``metrics[i]``: the
    metrics under ``conditions[i]`` (``None``: not evaluated, left out)."""
    out = {}
    for c, m in zip(conditions, metrics):
        for k, v in (m or {}).items():
            out[f"{_SHORT.get(k, k)}_{c}"] = v
    return out


def evaluate_conditions(model, task: Task, batch: Batch, conditions=CONDITIONS) -> dict[str, float]:
    """Flat dict ``{f"{metric}_{condition}": value}`` over several conditions.

    Conditions that put the gates at the same values (for a scheduled path ``param``
    and ``half`` both mean 0.5; after a fade ``normal`` equals ``zero``) are the same
    model, so each distinct set of gate values is evaluated once and its metrics are
    logged under every name that has it (:func:`condition_groups`).
    """
    conditions = list(conditions)
    metrics: list[dict | None] = [None] * len(conditions)
    for group in condition_groups(model, conditions):
        m = evaluate_batch(model, task, batch, conditions[group[0]])
        for i in group:
            metrics[i] = m
    return conditions_row(conditions, metrics)


_SHORT = {"accuracy": "acc"}
