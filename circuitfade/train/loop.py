"""A small, readable trainer that follows gate schedules and writes a checkpoint series.

A run is a pure function of its :class:`RunConfig`. :func:`train` writes a run
directory a user can read without circuitfade::

    RUN/
      config.json                        everything needed to rebuild the run
      metrics.csv                        step, gates, train loss, eval under each gate condition
      checkpoints/step_000300.safetensors            model weights
      checkpoints/step_000300.state.safetensors      optimizer + RNG state (to resume)
      done.json                          written last, when the run has finished

Every file is written atomically. A run killed at any point resumes from its
last complete checkpoint and ends bit-identical to an uninterrupted run, because
all randomness (initialisation, batches, prior dropout) comes from generators
whose state is checkpointed, and :func:`train` computes with one torch thread
whatever the caller's setting (so the bytes do not depend on the thread count;
the caller's setting is restored afterwards). A run whose loss, gradient norm
or weights become non-finite stops at that step, writes ``failed.json``
(``{"step", "error"}``) instead of ``done.json`` and raises
:class:`TrainingDiverged`; its checkpoints are the finite ones before it. :func:`branch` starts a new run from another run's
checkpoint (weights *and* optimizer state), which post hoc continuation and
hard switches use.

The loop (see :func:`fit`): set the gates for step ``t`` from the path, sample a
batch, one AdamW step with clipping; evaluate on a fixed eval set every
``eval_every`` steps; checkpoint at the precomputed steps.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from circuitfade.gating.evaluation import answer_logits, evaluate_conditions
from circuitfade.gating.paths import GatePath
from circuitfade.io import CheckpointError
from circuitfade.model import SoftPriorTransformer
from circuitfade.model.devices import keep_freed_memory, resolve_device
from circuitfade.tasks import EVAL_SEED, Batch, Task, eval_set
from circuitfade.train.callbacks import (
    NON_FINITE_WEIGHTS,
    Callback,
    Callbacks,
    clip_list,
    divergence,
    is_eval_step,
    step_loop,
)
from circuitfade.train.checkpoints import (
    clean_scratch,
    complete_checkpoints,
    dir_state,
    finish_run,
    load_checkpoint,
    raise_recorded_failure,
    resume_steps,
    save_checkpoint,
    write_metrics,
)
from circuitfade.train.config import RunConfig, TrainingDiverged, is_checkpoint_step
from circuitfade.train.lock import run_lock
from circuitfade.train.rundir import RunDir
from circuitfade.train.optim import OptimizerCalls, clip_grad_norm
from circuitfade.train.state import Run, new_run, one_thread

__all__ = ["train", "fit", "branch", "branch_config", "row_at_step", "training_forward", "Sampler", "Logger"]


def _set_gates_for_step(model: SoftPriorTransformer, path: GatePath, step: int, last: float | None = None) -> float | None:
    """Set fixed/scheduled gates to the path's value at ``step``; returns that value. ``last``: the
    value set at the previous step (the buffers are not rewritten when it has not changed)."""
    if path.mode == "learned":
        return None
    v = path.value_at(step)
    if v != last:
        model.set_gate_values(**{p: v for p in model.cfg.priors})
    return v


def _gate_summary(model: SoftPriorTransformer) -> dict:
    return {f"gate_{p}": float(g.mean()) for p, g in model.gate_values("effective").items()}


def row_at_step(run: Run, loss_value: float) -> dict:
    """Set ``run``'s fixed / scheduled gates to its gate path's value at ``run.step`` (as the
    trainer evaluates) and return the start of its ``metrics.csv`` row at that step: ``step``,
    the mean effective gate per prior, the data mix and ``train_loss``. The evaluation's
    metrics (:func:`~circuitfade.gating.evaluation.evaluate_conditions`) complete the row."""
    model, cfg = run.model, run.config
    _set_gates_for_step(model, cfg.gate_path(), run.step)
    return {"step": run.step, **_gate_summary(model), **cfg.mix_at(run.step), "train_loss": loss_value}


Sampler = Callable[[int, torch.Generator], Batch]
Logger = Callable[[int, dict], None]
"""``logger(step, metrics)``: called with each evaluation row; see :mod:`circuitfade.train.loggers`."""


def training_forward(model: SoftPriorTransformer | Callable, compile: bool | str = False):
    """What the training step calls: ``model`` itself, or with ``compile`` (``True``: inductor, or a
    backend name) ``torch.compile(model)``, which shares the model's parameters and buffers (the
    optimizer, checkpoints and evaluation see the same tensors). Gate schedules write buffers, so
    they need no recompilation; a gate override (prior dropout, dual loss) compiles a second graph.
    ``model`` may be any callable (the ensemble compiles its stacked model's ``logits``)."""
    if not compile:
        return model
    import torch._dynamo  # noqa: F401  (imported here: eager runs never load the compiler)

    return torch.compile(model, backend="inductor" if compile is True else compile, dynamic=False)


def _finite_weights(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def fit(run: Run, until: int | None = None, *, run_dir: Path | None = None, task: Task | None = None,
        eval_batch: Batch | None = None, progress: bool = True, sampler: Sampler | None = None,
        logger: Logger | None = None, callbacks: Sequence[Callback] | None = None) -> Run:
    """The training loop: advance ``run`` from ``run.step`` to global step ``until``.

    ``until`` defaults to ``run.config.train.steps`` (the end of the run) and may be
    any step in between, so ``fit`` works as a step function (``fit(run, until=k)``)
    without touching ``run.config``: the gate path and data mixes are read at the
    global step, and stopping at ``k`` then continuing gives the same weights as
    one uninterrupted call. Evaluation rows are added every ``eval_every`` steps and
    at ``until``; checkpoints (only with ``run_dir``) at the run's checkpoint steps.
    ``task`` and ``eval_batch`` default to the run's task and its fixed eval set
    (pass them when calling ``fit`` many times). ``sampler(step, generator) ->
    Batch`` replaces the default ``task.sample(batch_size, generator,
    **config.mix_at(step))`` (e.g. to replay a fixed multiset of examples in a
    chosen order). ``logger(step, metrics)`` is called with each evaluation row (the
    ``metrics.csv`` row, a dict) as it is recorded (see :mod:`circuitfade.train.loggers`).
    ``callbacks``: :class:`~circuitfade.train.callbacks.Callback` s called at every step (a
    penalty on the loss, a recorder of the applied gradient, a restore after the update, a stop
    rule; see :mod:`circuitfade.train.callbacks`); a callback returning ``True`` from ``on_record``
    or ``on_step`` ends the call at that step. Gradients are clipped over the optimizer's
    parameters (``run.optimizer`` may be any optimizer with ``param_groups``, ``zero_grad`` and
    ``step``, e.g. :class:`~circuitfade.train.langevin.LangevinNoise`).
    Computes with one torch thread. With ``config.train.compile`` the training forward is
    compiled with ``torch.compile`` (:func:`training_forward`; evaluation stays eager): the first step then
    includes the compilation, whose seconds are kept in ``run.compile_seconds``.

    Raises :class:`TrainingDiverged` (before updating the weights) when the loss or
    the gradient norm is non-finite, or when an update leaves non-finite weights
    (checked before each checkpoint is written).
    """
    cfg, tc, model = run.config, run.config.train, run.model
    until = tc.steps if until is None else until
    if isinstance(until, bool) or not isinstance(until, int) or not run.step <= until <= tc.steps:
        raise ValueError(f"fit(until={until!r}): expected an integer step in [{run.step} (the run's step), "
                         f"{tc.steps} (config.train.steps)]")
    if task is None:
        task = cfg.make_task()
    if eval_batch is None:
        eval_batch = eval_set(task, n=tc.eval_size, seed=EVAL_SEED)
    keep_freed_memory()  # evaluation passes otherwise fault in fresh pages every time (same results)
    path = cfg.gate_path()
    ckpt_start = int((cfg.parent or {}).get("step", 0))
    priors = model.cfg.priors
    device = model.W_E.device  # batches are drawn on the CPU generator, then moved here
    eval_batch = eval_batch.to(device) if device.type != "cpu" else eval_batch

    hooks = Callbacks(callbacks)
    forward = training_forward(model, tc.compile)

    def record(loss_value: float) -> bool:
        row = row_at_step(run, loss_value)
        row.update(evaluate_conditions(model, task, eval_batch, tc.eval_conditions))
        run.metrics.append(row)
        if run_dir is not None:
            write_metrics(run_dir, run.metrics)
        if logger is not None:
            logger(run.step, dict(row))
        return hooks.on_record(run, dict(row)) if hooks else False

    def checkpoint() -> None:
        if run_dir is not None and is_checkpoint_step(tc, run.step, ckpt_start):
            if not _finite_weights(model):
                raise TrainingDiverged(run.step, NON_FINITE_WEIGHTS)
            save_checkpoint(run, run_dir)
            if hooks:
                hooks.on_checkpoint(run, run.step)

    def first() -> None:
        if not run.metrics or run.metrics[-1]["step"] < run.step:
            if is_eval_step(run.step, tc.eval_every, until):
                record(float("nan"))
        checkpoint()
        model.train()

    def advance() -> int:
        nonlocal gate_now, loss_value, first_compiled
        gate_now = _set_gates_for_step(model, path, run.step, gate_now)
        if sampler is not None:
            batch = sampler(run.step, run.data_gen)
        else:
            batch = task.sample(tc.batch_size, run.data_gen, **cfg.mix_at(run.step))
        if device.type != "cpu":
            batch = batch.to(device)
        drop = tc.prior_dropout > 0 and torch.rand((), generator=run.dropout_gen).item() < tc.prior_dropout
        t0 = time.perf_counter() if first_compiled else None
        with model.gates(**{p: 0.0 for p in priors}) if drop else contextlib.nullcontext():
            loss = task.loss(answer_logits(forward, batch), batch)  # last block at answer positions only
        if tc.dual_loss:
            with model.gates(**{p: 0.0 for p in priors}):
                loss = loss + task.loss(answer_logits(forward, batch), batch)
        task_loss = loss
        if hooks:
            loss = hooks.on_loss(run, batch, loss)
        optimizer.zero_grad()
        loss.backward()
        if t0 is not None:
            first_compiled = False
            run.compile_seconds = time.perf_counter() - t0
        norm = clip_grad_norm(params, tc.grad_clip)
        loss_value = float(task_loss.detach())
        diverged = divergence(run.step, loss_value, float(norm))
        if diverged is not None:
            raise diverged
        if hooks:
            hooks.before_update(run, norm)
        optimizer.step()
        run.step += 1
        if hooks:
            hooks.after_update(run)
        return run.step

    def after(step: int, due: bool) -> bool:
        stop = record(loss_value) if due else False
        checkpoint()
        return bool(hooks.on_step(run) if hooks else False) or stop

    def postfix() -> dict:
        last = run.metrics[-1]
        kind = task.primary_metric.column
        return {"loss": f"{last['train_loss']:.3f}", kind: f"{last.get(kind + '_normal', math.nan):.3f}",
                kind + "0": f"{last.get(kind + '_zero', math.nan):.3f}"}

    params = clip_list(run.optimizer)
    optimizer = OptimizerCalls(run.optimizer, params)  # its zero_grad and step, bit for bit
    gate_now = None  # the gate buffers' value as last set here (None: set them at the first step)
    first_compiled = forward is not model  # time the first compiled step (it compiles the graphs)
    loss_value = math.nan
    with one_thread():
        step_loop(now=lambda: run.step, until=until, eval_every=tc.eval_every, first=first, advance=advance,
                  after=after, progress=progress, desc=f"{cfg.path} s{cfg.seed}", postfix=postfix)
    return run


def train(cfg: RunConfig, run_dir: str | Path | None, *, progress: bool = True, sampler: Sampler | None = None,
          run: Run | None = None, logger: Logger | None = None, callbacks: Sequence[Callback] | None = None) -> Run:
    """Train ``cfg`` into ``run_dir`` (resuming or returning a finished run as needed).

    With ``run_dir=None`` nothing is written (handy in notebooks and tests); an
    in-memory ``run`` (e.g. a clone made with :func:`clone_run`) is then continued
    under ``cfg`` (its ``train.steps`` is where it stops; :func:`fit` with
    ``until=`` does the same without a new config). ``sampler`` replaces the
    default batch source (see :func:`fit`); ``logger(step, metrics)`` receives every
    evaluation row (see :mod:`circuitfade.train.loggers`); ``callbacks`` are passed to :func:`fit`
    (see :mod:`circuitfade.train.callbacks`).

    Guarantees: one torch thread while computing (the caller's setting is
    restored); a finished run is returned without writing anything (so it can be
    re-requested from a read-only copy); otherwise the directory is locked (an OS
    lock on ``.lock``, released by the kernel when the holder exits or dies), temp
    files of killed writers (``.NAME.XXXXXXXX.cftmp``, nothing else) are removed, and
    a run that diverges raises :class:`TrainingDiverged` and is recorded in
    ``failed.json`` (asking for it again raises the same error rather than
    retraining). A run resumes from its last complete checkpoint only if that
    checkpoint is verifiably this run's at that step (:func:`load_checkpoint`);
    otherwise :class:`~circuitfade.io.CheckpointError` names the file, and nothing
    is trained or written (a corrupt input is never recorded as a divergence).
    """
    resolve_device(cfg.train.device)  # an unavailable device fails before anything is written
    with one_thread():
        task = cfg.make_task()
        ev = eval_set(task, n=cfg.train.eval_size, seed=EVAL_SEED)
        if run_dir is None:
            if cfg.parent:
                raise ValueError("a branch needs a run directory to read its parent from")
            if run is not None:
                run.config = cfg
            run = run or new_run(cfg)
            if run.step > cfg.train.steps:
                return run
            return fit(run, cfg.train.steps, task=task, eval_batch=ev, progress=progress,
                       sampler=sampler, logger=logger, callbacks=callbacks)
        run_dir = Path(run_dir)
        state = dir_state(cfg, run_dir)
        if state == "done":  # read-only: no lock, no writes
            done = complete_checkpoints(run_dir)
            if done:
                run = load_checkpoint(new_run(cfg), run_dir, done[-1])
                if run.step == cfg.train.steps:
                    return run
        if state == "failed":
            raise_recorded_failure(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        with run_lock(run_dir):
            clean_scratch(run_dir)
            state = dir_state(cfg, run_dir)  # again, now that we hold the lock
            if state == "failed":
                raise_recorded_failure(run_dir)
            if state == "new":
                RunDir(run_dir).write_config(cfg)
            run = new_run(cfg)
            done = resume_steps(cfg, run_dir)
            if done:
                load_checkpoint(run, run_dir, done[-1])
                if state == "done" and run.step == cfg.train.steps:
                    return run
            elif cfg.parent:
                _start_from_parent(run, cfg.parent)
            try:
                fit(run, run_dir=run_dir, task=task, eval_batch=ev, progress=progress, sampler=sampler,
                    logger=logger, callbacks=callbacks)
            except TrainingDiverged as e:
                RunDir(run_dir).record_failure(e)
                raise
            finish_run(run, run_dir)
    return run


def _start_from_parent(run: Run, parent: Mapping) -> None:
    pdir, pstep = Path(parent["run"]), int(parent["step"])
    if pstep not in complete_checkpoints(pdir):
        raise CheckpointError(f"{pdir}: no complete checkpoint at step {pstep} to branch from")
    load_checkpoint(run, pdir, pstep)  # applies run.config's lr / weight decay to the restored optimizer
    run.metrics = [m for m in run.metrics if m["step"] <= pstep]
    for m in run.metrics:
        m["parent"] = str(pdir)


def branch_config(parent: RunConfig, parent_dir: str | Path, step: int, *, path: str, steps: int | None = None,
                  **train_overrides) -> RunConfig:
    """The config of a branch from ``parent`` (trained in ``parent_dir``) at ``step``.

    Model, task, data mix and seed are the parent's (gate modes follow the new
    ``path``); training settings too, except ``steps`` (default: the parent's) and
    any ``train_overrides`` (e.g. ``lr=``). The one way to build a branch config:
    :func:`branch` and :func:`circuitfade.train.sweep.child_of` use it.
    """
    model = {k: v for k, v in parent.model.items() if k not in ("gate_modes", "gate_init")}
    tc = replace(parent.train, steps=steps if steps is not None else parent.train.steps, **train_overrides)
    if tc.steps < step:
        raise ValueError(f"branch ends at step {tc.steps}, before its start step {step}")
    return RunConfig(path=path, task=parent.task, model=model, train=tc, seed=parent.seed, mix=parent.mix,
                     parent={"run": str(Path(parent_dir).resolve()), "step": int(step)})


def branch(parent_dir: str | Path, step: int, run_dir: str | Path, *, path: str, steps: int | None = None,
           progress: bool = True, **train_overrides) -> Run:
    """Start a new run at ``run_dir`` from ``parent_dir``'s checkpoint at ``step``.

    Model weights, optimizer state and the data generator are copied; the new run
    follows gate ``path`` (evaluated at the global step) up to global step
    ``steps`` (default: the parent's ``steps``). Model and task settings are the
    parent's; gate modes follow the new path; ``train_overrides`` (e.g. ``lr=``,
    ``weight_decay=``) replace the parent's and apply to the copied optimizer.
    """
    parent_dir = Path(parent_dir)
    pcfg = RunDir(parent_dir).read_config()
    cfg = branch_config(pcfg, parent_dir, step, path=path, steps=steps, **train_overrides)
    return train(cfg, run_dir, progress=progress)
