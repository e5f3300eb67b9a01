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

:func:`evaluate` is the package's one public evaluation; :func:`gate_intervention_table`
and :func:`condition_metrics` (its form as :func:`~circuitfade.store.trace` rows) call it, and
the trainer logs the same accuracy and loss with its fast internal form
(:func:`circuitfade.gating.evaluation.evaluate_conditions`).

Argument convention of every model-level analysis in :mod:`circuitfade.analysis`:
``f(model, batch, [task,] *, options)``, the order :func:`~circuitfade.store.trace` passes
them. The calls of the previous release, ``f(model, task, batch)`` and ``f(model, task,
batch=batch)``, still work for one release with a ``DeprecationWarning`` (:func:`batch_first`).
"""

from __future__ import annotations

import functools
import warnings
from numbers import Real
from typing import Mapping

import pandas as pd
import torch

import torch.nn.functional as F

from circuitfade.gating.evaluation import CONDITIONS, NoGatesError, gate_condition, has_gates
from circuitfade.stats import DEFAULT_LEVEL, proportion_interval, ratio_se
from circuitfade.tasks import EVAL_SEED, EVAL_SIZE, Batch, Task, as_task, eval_set

__all__ = [
    "PRIOR_LABELS",
    "TABLE_COLUMNS",
    "condition_metrics",
    "describe_gates",
    "evaluate",
    "gate_intervention_table",
    "intervention_conditions",
]

PRIOR_LABELS = {"pos": "position", "content": "content"}
"""Human-readable names of the built-in priors, used in condition labels."""

TABLE_COLUMNS = ["condition", "gates", "accuracy", "accuracy_se", "accuracy_lo", "accuracy_hi", "loss", "loss_se",
                 "n_answers"]
"""Columns of :func:`gate_intervention_table`."""

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


def batch_first(fn):
    """``fn(model, batch, task, ...)`` that also takes the previous release's orders for one release,
    with a ``DeprecationWarning``: ``fn(model, task, batch=batch)`` and ``fn(model, task, batch)`` (a
    :class:`~circuitfade.tasks.Task` before a :class:`~circuitfade.tasks.Batch`) are read as
    ``fn(model, batch, task)``."""

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        if args and "batch" in kwargs:
            given = kwargs.pop("batch")  # None: the task's evaluation set, which batch=task now means
            args = (given, args[0], *args[1:]) if given is not None else args
        elif len(args) >= 2 and isinstance(args[1], Batch) and not isinstance(args[0], Batch):
            args = (args[1], args[0], *args[2:])
        else:
            return fn(model, *args, **kwargs)
        warnings.warn(f"{fn.__name__}(model, task, batch): the argument order is now {fn.__name__}(model, batch, "
                      "task); the old order will be refused in the next release", DeprecationWarning, stacklevel=2)
        return fn(model, *args, **kwargs)

    return wrapper


def tokens_renamed(fn):
    """``fn(model, batch, ...)`` whose data argument was called ``tokens`` in the previous release:
    ``fn(model, tokens=...)`` still works for one release, with a ``DeprecationWarning``."""

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        if "tokens" in kwargs:
            if args or "batch" in kwargs:
                raise TypeError(f"{fn.__name__}: give the data once, as batch")
            kwargs["batch"] = kwargs.pop("tokens")
            warnings.warn(f"{fn.__name__}(model, tokens=...): the argument is now batch (a Batch or token ids); "
                          "tokens= will be refused in the next release", DeprecationWarning, stacklevel=2)
        return fn(model, *args, **kwargs)

    return wrapper


def _data(batch, task, n, seed) -> tuple[Task, Batch]:
    """``(task, batch)`` of an analysis's ``batch`` and ``task`` arguments (see :func:`evaluate`)."""
    if batch is None:
        raise ValueError("batch: expected a Batch, a Task, a task name or a dict {'name': ..., **config}, got None")
    if isinstance(batch, Batch) and task is not None:
        return as_task(task), batch
    if task is not None:
        raise ValueError(f"batch: a {type(batch).__name__} stands for a task's evaluation set, so task= must not be "
                         "given as well; pass the Batch to evaluate on as batch")
    task = as_task(batch)  # a task, a name, a dict, or a Batch scored as its own task (BatchTask)
    return task, eval_set(task, n, EVAL_SEED if seed is None else seed)


def _with_intervals(task: Task, logits, batch: Batch, level: float) -> dict:
    """``task.metrics`` plus, for token tasks, ``accuracy_se/lo/hi``, ``loss_se``, ``n_answers``."""
    out = dict(task.metrics(logits, batch))
    if "accuracy" not in out:
        return out
    mask = batch.answer_mask
    counts = mask.sum(1).double()
    correct = task.per_example_accuracy(logits, batch).double() * counts
    acc = proportion_interval(correct.cpu().numpy(), counts.cpu().numpy(), level)
    ce = torch.zeros(mask.shape, dtype=torch.float64, device=logits.device)
    ce[mask] = F.cross_entropy(logits[mask].double(), batch.targets[mask], reduction="none")
    out.update(accuracy_se=acc["se"], accuracy_lo=acc["lo"], accuracy_hi=acc["hi"],
               loss_se=ratio_se(ce.sum(1).cpu().numpy(), counts.cpu().numpy()), n_answers=int(counts.sum()))
    return out


@batch_first
def evaluate(
    model,
    batch: Batch | Task | str | Mapping,
    task: Task | str | Mapping | None = None,
    *,
    gates: str | Mapping | None = "normal",
    n: int = EVAL_SIZE,
    seed: int | None = None,
    level: float = DEFAULT_LEVEL,
) -> dict:
    """Accuracy and loss of ``model`` on ``batch`` under one gate condition, with intervals.

    The package's one public evaluation::

        evaluate(model, "assoc")                    # the task's evaluation set (EVAL_SIZE, EVAL_SEED)
        evaluate(model, batch, task, gates="zero")  # this batch, scored by this task, at zero gate
        evaluate(model, my_batch)                   # your own Batch, scored on its own targets

    ``gates``: ``"normal"`` (gates as they are, also ``None``), ``"zero"`` (every gate
    0), ``"param"`` (every gate ``sigmoid(logit)``), ``"half"`` (every gate 0.5) or a
    mapping such as ``{"pos": 0.0}`` overriding exactly those gates (values: a number,
    ``[n_heads]`` or ``[n_layers, n_heads]``); see :mod:`circuitfade.gating.evaluation`.

    ``batch``: the evaluation data. A :class:`Batch`, scored by ``task`` (a :class:`Task`, a
    task name or a dict ``{"name": ..., **config}``); without ``task``, a :class:`Batch` is
    scored as its own task (:class:`~circuitfade.tasks.BatchTask`: its first ``n`` examples).
    Or a task itself (a :class:`Task`, a name or a dict; ``task`` not given): then its
    evaluation set ``eval_set(task, n, seed)`` (the package's one convention, ``EVAL_SIZE``
    examples and ``EVAL_SEED`` when ``seed`` is ``None``: the set ``metrics.csv`` is logged on).

    Returns ``{"accuracy", "loss", "condition", "accuracy_se", "accuracy_lo",
    "accuracy_hi", "loss_se", "n_answers"}``: accuracy is the fraction of answer
    positions whose argmax is the target, loss the mean cross-entropy over answer
    positions (:meth:`Task.accuracy`, :meth:`Task.loss`), ``condition`` is
    :func:`describe_gates` of ``gates``. Intervals (:func:`circuitfade.stats.proportion_interval`):
    binomial standard error and Wilson ``level`` interval when every example has one
    answer position, by-example (cluster) standard error otherwise; ``loss_se`` by
    example. Regression tasks return their own metrics (``mse``, ``loss``, ...) and
    ``condition``.

    Raises ``ValueError`` for an unknown condition, and :class:`NoGatesError` (a
    ``ValueError``) for any condition other than ``"normal"`` on a model without gates.
    """
    task, batch = _data(batch, task, n, seed)
    condition = describe_gates(gates)  # validates the type early
    if gates not in (None, "normal") and not has_gates(model):
        raise NoGatesError(
            f"model {type(model).__name__} has no gates, so gates={gates!r} does not apply; "
            "use gates='normal' (or check circuitfade.gating.evaluation.has_gates(model))"
        )
    device = next(model.parameters()).device
    batch = batch.to(device) if batch.device != device else batch
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), gate_condition(model, gates):
            logits = model(batch.model_input)
        r = _with_intervals(task, logits, batch, level)
    finally:
        model.train(was_training)
    if "accuracy" not in r:
        return {**r, "condition": condition}
    return {"accuracy": r.pop("accuracy"), "loss": r.pop("loss"), "condition": condition, **r}


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


@batch_first
def gate_intervention_table(
    model,
    batch: Batch | Task | str | Mapping,
    task: Task | str | Mapping | None = None,
    *,
    n: int = EVAL_SIZE,
    seed: int | None = None,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Accuracy and loss with each prior's gate zeroed at evaluation (paper Section 6, Figure 4).

    One row per condition of :func:`intervention_conditions`; for the default model
    (priors ``pos``, ``content``) the rows are ``normal`` (gates as trained),
    ``position gate zeroed``, ``content gate zeroed``, ``both gates zeroed``. Every row
    is evaluated on the same batch (``batch`` and ``task`` as in :func:`evaluate`: a
    :class:`Batch` with its task, or a task whose evaluation set ``eval_set(task, n, seed)``
    is used).

    Columns (:data:`TABLE_COLUMNS`): ``condition`` (label), ``gates`` (the override:
    ``"as trained"`` or e.g. ``"pos=0, content=0"``), ``accuracy`` with ``accuracy_se``,
    ``accuracy_lo``, ``accuracy_hi``, ``loss`` with ``loss_se``, ``n_answers`` (as in
    :func:`evaluate`).

    Raises :class:`NoGatesError` (a ``ValueError``) for a model without gates; skip such
    models with ``circuitfade.gating.evaluation.has_gates(model)``.
    """
    conditions = intervention_conditions(model)
    task, batch = _data(batch, task, n, seed)
    rows = []
    for label, gates in conditions:
        r = evaluate(model, batch, task, gates=gates, level=level)
        rows.append({"condition": label, "gates": "as trained" if gates == "normal" else describe_gates(gates),
                     **{k: r.get(k) for k in TABLE_COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def condition_metrics(
    model,
    batch: Batch,
    task: Task,
    *,
    conditions: tuple[str, ...] | str = "auto",
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Accuracy and loss under evaluation conditions, with intervals, as tidy trace rows.

    :func:`evaluate` as :func:`circuitfade.store.trace` rows (not exported from
    :mod:`circuitfade.analysis`: trace it as ``trace(series, [condition_metrics])``):
    one row per (condition, metric) with columns ``metric`` (``"accuracy"``, ``"loss"``;
    regression tasks: their primary metric and ``loss``), ``condition``, ``value``,
    ``se``, ``lo``, ``hi`` (accuracy: binomial/Wilson or by-example, see
    :func:`evaluate`; loss: ``value ± z·se``). ``conditions="auto"``: ``("normal",
    "zero")`` for a gated model, ``("normal",)`` for a plain one.
    """
    from circuitfade.stats import normal_interval

    if isinstance(conditions, str) and conditions == "auto":
        conditions = ("normal", "zero") if has_gates(model) else ("normal",)
    rows = []
    for c in conditions:
        r = evaluate(model, batch, task, gates=c, level=level)
        if "accuracy" in r:
            rows.append({"metric": "accuracy", "condition": describe_gates(c), "value": r["accuracy"],
                         "se": r["accuracy_se"], "lo": r["accuracy_lo"], "hi": r["accuracy_hi"]})
            lo, hi = normal_interval(r["loss"], r["loss_se"], level)
            rows.append({"metric": "loss", "condition": describe_gates(c), "value": r["loss"], "se": r["loss_se"],
                         "lo": lo, "hi": hi})
        else:
            for k, v in r.items():
                if k != "condition":
                    rows.append({"metric": k, "condition": describe_gates(c), "value": float(v)})
    return pd.DataFrame(rows)
