"""The one stepping loop the trainers share, and the callbacks :func:`~circuitfade.train.loop.fit` calls.

:func:`step_loop` is the skeleton of :func:`~circuitfade.train.loop.fit` and
:func:`~circuitfade.train.ensemble.fit_ensemble`: the first evaluation and checkpoint, then one
training step at a time up to ``until``, an evaluation row every ``eval_every`` steps and at
``until``, a checkpoint after every step (the trainer decides whether one is due), the progress
bar, and stopping early when asked. :func:`divergence` is the one rule for a step that must not
update the weights (non-finite loss or gradient norm).

A :class:`Callback` sees every step of :func:`~circuitfade.train.loop.fit` (and
:func:`~circuitfade.train.loop.train`, which passes ``callbacks=`` on), in this order::

    loss = callback.on_loss(run, batch, loss)   # the loss to differentiate (e.g. plus a penalty)
    ... backward, gradient clipping, divergence check ...
    callback.before_update(run, grad_norm)      # the clipped gradient the update applies
    ... optimizer step; run.step += 1 ...
    callback.after_update(run)                  # e.g. write pinned slices back
    callback.on_record(run, row)                # when an evaluation row is recorded
    callback.on_checkpoint(run, step)           # when a checkpoint was written
    callback.on_step(run)                       # last, every step

``on_record`` and ``on_step`` stop the run by returning ``True``: the step ends as usual (its row
and checkpoint, if due, are written) and ``fit`` returns with ``run.step`` at that step. The
``train_loss`` column stays the task loss (before ``on_loss``). Hooks a callback does not define
do nothing (subclass :class:`Callback`, or write any object with some of these methods).

:func:`~circuitfade.train.ensemble.fit_ensemble` takes the same callbacks for the hooks that see
one member's finished step: ``on_record``, ``on_checkpoint`` and ``on_step``, each called with
that member's run (its weights as the single run's at that step); ``True`` stops that member
alone. The hooks inside a step (``on_loss``, ``before_update``, ``after_update``) act on one
model's loss and gradient, which the stacked members do not have: ``fit_ensemble`` refuses
callbacks that define them.

:class:`L2Penalty` is the general callback shipped here: ``(wd / 2) |theta|^2`` added to the loss,
so that it is inside the gradient that clipping and the optimizer see (unlike AdamW's decoupled
weight decay).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from tqdm import tqdm

from circuitfade.train.config import TrainingDiverged

if TYPE_CHECKING:  # pragma: no cover
    from circuitfade.tasks import Batch
    from circuitfade.train.state import Run

__all__ = ["Callback", "L2Penalty", "Callbacks", "step_loop", "divergence", "is_eval_step", "clip_list",
           "NON_FINITE_WEIGHTS"]


class Callback:
    """Hooks :func:`~circuitfade.train.loop.fit` calls at each step (all do nothing here; override some).

    ``on_record`` and ``on_step`` return ``True`` to stop the run after the current step."""

    def on_loss(self, run: "Run", batch: "Batch", loss: torch.Tensor) -> torch.Tensor:
        """The loss to differentiate, given the task loss of ``batch`` (return it unchanged by default)."""
        return loss

    def before_update(self, run: "Run", grad_norm: torch.Tensor) -> None:
        """After backward and clipping (``grad_norm``: the total norm before clipping), before the update."""

    def after_update(self, run: "Run") -> None:
        """After the optimizer step; ``run.step`` is already the new step."""

    def on_record(self, run: "Run", row: dict) -> bool | None:
        """An evaluation row (the ``metrics.csv`` row) was recorded at ``run.step``; ``True`` stops the run."""

    def on_checkpoint(self, run: "Run", step: int) -> None:
        """A checkpoint of ``step`` was written."""

    def on_step(self, run: "Run") -> bool | None:
        """The step is done (row and checkpoint written if due); ``True`` stops the run."""


class L2Penalty(Callback):
    """Add ``(weight_decay / 2) * sum |p|^2`` over the model's parameters to the loss.

    The penalty is part of the loss, so its gradient ``weight_decay * p`` is clipped with the data
    gradient and seen by every recorder in ``before_update``; with plain SGD this is coupled weight
    decay, and the stationary density of Langevin SGD is ``exp(-(L + wd/2 |theta|^2) / T)``.
    ``weight_decay`` must be a finite number >= 0 (0 adds nothing: the loss is returned unchanged).

    >>> L2Penalty(0.03).weight_decay
    0.03
    """

    def __init__(self, weight_decay: float):
        if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) \
                or not math.isfinite(weight_decay) or weight_decay < 0:
            raise ValueError(f"L2Penalty: weight_decay must be a finite number >= 0, got {weight_decay!r}")
        self.weight_decay = float(weight_decay)

    def on_loss(self, run: "Run", batch: "Batch", loss: torch.Tensor) -> torch.Tensor:
        if not self.weight_decay:
            return loss
        return loss + 0.5 * self.weight_decay * sum((p * p).sum() for p in run.model.parameters())

    def __repr__(self) -> str:
        return f"L2Penalty({self.weight_decay!r})"


class Callbacks:
    """A sequence of callbacks called as one (in order); hooks a callback lacks are skipped."""

    def __init__(self, callbacks: Iterable[Any] | None = None):
        self.items = list(callbacks or ())

    def __bool__(self) -> bool:
        return bool(self.items)

    def _each(self, name: str) -> list[Callable]:
        return [getattr(c, name) for c in self.items if callable(getattr(c, name, None))]

    def defines(self, name: str) -> bool:
        """Whether a callback defines hook ``name`` (beyond :class:`Callback`'s do-nothing one)."""
        return any(getattr(type(c), name, None) is not getattr(Callback, name) for c in self.items
                   if callable(getattr(c, name, None)))

    def on_loss(self, run, batch, loss):
        for hook in self._each("on_loss"):
            loss = hook(run, batch, loss)
        return loss

    def before_update(self, run, grad_norm) -> None:
        for hook in self._each("before_update"):
            hook(run, grad_norm)

    def after_update(self, run) -> None:
        for hook in self._each("after_update"):
            hook(run)

    def on_record(self, run, row) -> bool:
        return any([bool(hook(run, row)) for hook in self._each("on_record")])  # every hook sees the row

    def on_checkpoint(self, run, step) -> None:
        for hook in self._each("on_checkpoint"):
            hook(run, step)

    def on_step(self, run) -> bool:
        return any([bool(hook(run)) for hook in self._each("on_step")])


def divergence(step: int, loss: float, grad_norm: float) -> TrainingDiverged | None:
    """The :class:`TrainingDiverged` of a step whose loss or gradient norm is not finite (its weights
    must not be updated), or ``None``: the one rule (and message) of both trainers."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    return TrainingDiverged(step, f"non-finite loss {loss} / gradient norm {grad_norm} (weights not updated)")


NON_FINITE_WEIGHTS = "non-finite weights after the update (checkpoint not written)"


def is_eval_step(step: int, eval_every: int, until: int) -> bool:
    """Whether an evaluation row is recorded at ``step``: every ``eval_every`` steps and at ``until``."""
    return step % eval_every == 0 or step == until


def step_loop(*, now: Callable[[], int], until: int, first: Callable[[], None], advance: Callable[[], int | None],
              after: Callable[[int, bool], bool | None], progress: bool, desc: str,
              active: Callable[[], bool] = lambda: True, postfix: Callable[[], dict] | None = None,
              eval_every: int) -> None:
    """Drive a trainer from step ``now()`` to ``until``.

    ``first()`` records the starting row and checkpoint (as due); then, while ``active()`` and
    ``now() < until``: ``advance()`` takes one training step and returns the new step (``None``:
    nothing advanced, e.g. every ensemble member failed); ``after(step, due)`` records a row when
    ``due`` (:func:`is_eval_step`), writes the checkpoint if one is due, and returns ``True`` to stop.
    The progress bar (``desc``; ``postfix()`` after each row) advances one step per step."""
    first()
    bar = tqdm(total=until, initial=now(), disable=not progress, desc=desc, leave=False)
    try:
        while active() and now() < until:
            step = advance()
            bar.update(1)
            if step is None:
                continue
            due = is_eval_step(step, eval_every, until)
            stop = after(step, due)
            if due and postfix is not None:
                bar.set_postfix(**postfix())
            if stop:
                break
    finally:
        bar.close()


def clip_list(optimizer: Any) -> list[torch.Tensor]:
    """The parameters an optimizer updates, in its param groups' order (the list gradient clipping
    norms over: for the trainer's one-group AdamW, ``model.parameters()``)."""
    return [p for g in optimizer.param_groups for p in g["params"]]
