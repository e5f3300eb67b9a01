"""Gate interventions at evaluation time (main paper, Section 6 and Figure 4).

A soft-prior model is trained with its priors active; the question is whether
its computation *uses* them. We evaluate the trained model with each prior's gate
set to zero in turn, and with all of them at zero, on a fixed evaluation batch
(:func:`circuitfade.tasks.eval_set`). Nothing is trained and the model is not
changed: the gates are overridden only for the duration of one forward pass.

Models without gates (a plain ``HookedTransformer``) can be evaluated with
:func:`evaluate` under ``gates="normal"`` only; :func:`gate_intervention_table`
raises :class:`NoGatesError` (a ``ValueError``) for them. A caller mapping the
table over many models skips those with
``if circuitfade.gating.evaluation.has_gates(model)`` or ``except NoGatesError``.
"""

from __future__ import annotations

from numbers import Real
from typing import Mapping

import pandas as pd
import torch

from circuitfade.gating.evaluation import CONDITIONS, NoGatesError, evaluate_batch, has_gates
from circuitfade.tasks import Batch, Task, eval_set

__all__ = [
    "NoGatesError",
    "PRIOR_LABELS",
    "describe_gates",
    "evaluate",
    "gate_intervention_table",
    "intervention_conditions",
]

PRIOR_LABELS = {"pos": "position", "content": "content"}
"""Human-readable names of the built-in priors, used in condition labels."""




def describe_gates(gates: str | Mapping | None) -> str:
    """A short string for a gate condition.

    ``None`` and ``"normal"`` -> ``"normal"``; the named conditions ``"zero"``,
    ``"param"``, ``"half"`` -> themselves; a mapping -> ``"pos=0, content=0.5"``
    (numbers with ``%g``; a tensor or array value as ``pos=<shape (2, 4)>``).
    """
    if gates is None:
        return "normal"
    if isinstance(gates, str):
        return gates
    if isinstance(gates, Mapping):
        parts = []
        for name, v in gates.items():
            if isinstance(v, Real):
                parts.append(f"{name}={float(v):g}")
            else:
                t = torch.as_tensor(v)
                parts.append(f"{name}={float(t):g}" if t.dim() == 0 else f"{name}=<shape {tuple(t.shape)}>")
        return ", ".join(parts)
    raise ValueError(f"gates: expected None, one of {CONDITIONS} or a mapping prior -> value, got {gates!r}")


def evaluate(
    model,
    task: Task,
    *,
    gates: str | Mapping | None = "normal",
    batch: Batch | None = None,
    n: int = 512,
    seed: int | None = None,
) -> dict:
    """Accuracy and loss of ``model`` on ``task`` under one gate condition.

    ``gates``: ``"normal"`` (gates as they are, also ``None``), ``"zero"`` (every gate
    0), ``"param"`` (every gate ``sigmoid(logit)``), ``"half"`` (every gate 0.5) or a
    mapping such as ``{"pos": 0.0}`` overriding exactly those gates (values: a number,
    ``[n_heads]`` or ``[n_layers, n_heads]``); see :mod:`circuitfade.gating.evaluation`.

    ``batch``: the evaluation batch; if ``None``, ``eval_set(task, n, seed)`` (the
    package's fixed evaluation seed when ``seed`` is ``None``).

    Returns ``{"accuracy": float, "loss": float, "condition": str}``: accuracy is the
    fraction of answer positions whose argmax is the target, loss the mean
    cross-entropy over answer positions (:meth:`Task.accuracy`, :meth:`Task.loss`),
    ``condition`` is :func:`describe_gates` of ``gates``.

    Raises ``ValueError`` for an unknown condition, and :class:`NoGatesError` (a
    ``ValueError``) for any condition other than ``"normal"`` on a model without gates.
    """
    if batch is None:
        batch = eval_set(task, n) if seed is None else eval_set(task, n, seed)
    if not isinstance(batch, Batch):
        raise ValueError(f"batch: expected a circuitfade.tasks.Batch or None, got {type(batch).__name__}")
    condition = describe_gates(gates)  # validates the type early
    if gates not in (None, "normal") and not has_gates(model):
        raise NoGatesError(
            f"model {type(model).__name__} has no gates, so gates={gates!r} does not apply; "
            "use gates='normal' (or check circuitfade.gating.evaluation.has_gates(model))"
        )
    device = next(model.parameters()).device
    r = evaluate_batch(model, task, batch.to(device) if batch.device != device else batch, gates)
    return {"accuracy": r["accuracy"], "loss": r["loss"], "condition": condition}


def intervention_conditions(model) -> list[tuple[str, dict | str]]:
    """The gate conditions of the intervention table, as ``(label, gates)`` pairs.

    ``("normal", "normal")`` (gates as trained), then one ``("<prior> gate zeroed",
    {prior: 0.0})`` per prior in ``model.cfg.priors`` order, then, if there are two or
    more priors, ``("both gates zeroed" | "all gates zeroed", {every prior: 0.0})``.
    Labels use :data:`PRIOR_LABELS` (``pos`` -> ``position``), else the prior's name.

    Raises :class:`NoGatesError` if the model has no gates.
    """
    if not has_gates(model):
        raise NoGatesError(
            f"model {type(model).__name__} has no gates, so there is no gate intervention to tabulate; "
            "check circuitfade.gating.evaluation.has_gates(model) first (or catch NoGatesError) to skip it"
        )
    priors = list(model.cfg.priors)
    out: list[tuple[str, dict | str]] = [("normal", "normal")]
    for p in priors:
        out.append((f"{PRIOR_LABELS.get(p, p)} gate zeroed", {p: 0.0}))
    if len(priors) >= 2:
        label = "both gates zeroed" if len(priors) == 2 else "all gates zeroed"
        out.append((label, {p: 0.0 for p in priors}))
    return out


def gate_intervention_table(
    model,
    task: Task,
    *,
    batch: Batch | None = None,
    n: int = 512,
    seed: int | None = None,
) -> pd.DataFrame:
    """Accuracy and loss with each prior's gate zeroed at evaluation (paper Section 6, Figure 4).

    One row per condition of :func:`intervention_conditions`; for the default model
    (priors ``pos``, ``content``) the rows are ``normal`` (gates as trained),
    ``position gate zeroed``, ``content gate zeroed``, ``both gates zeroed``. Every row
    is evaluated on the same batch (``batch``, or ``eval_set(task, n, seed)``).

    Columns: ``condition`` (label), ``gates`` (the override: ``"as trained"`` or e.g.
    ``"pos=0, content=0"``), ``accuracy``, ``loss`` (as in :func:`evaluate`).

    Raises :class:`NoGatesError` (a ``ValueError``) for a model without gates; skip such
    models with ``circuitfade.gating.evaluation.has_gates(model)``.
    """
    conditions = intervention_conditions(model)
    if batch is None:
        batch = eval_set(task, n) if seed is None else eval_set(task, n, seed)
    rows = []
    for label, gates in conditions:
        r = evaluate(model, task, gates=gates, batch=batch)
        rows.append(
            {
                "condition": label,
                "gates": "as trained" if gates == "normal" else describe_gates(gates),
                "accuracy": r["accuracy"],
                "loss": r["loss"],
            }
        )
    return pd.DataFrame(rows, columns=["condition", "gates", "accuracy", "loss"])
