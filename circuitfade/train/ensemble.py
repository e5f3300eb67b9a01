"""Train E runs that share a model shape as one stacked model: an ensemble dimension in every weight.

Runs of one model shape, task and step budget (the same :func:`ensemble_key`) are trained
together: every parameter ``p`` of shape ``S`` becomes one tensor ``[E, *S]``, a training
step is one batched forward and backward over ``[E, batch, pos]`` tokens, and one AdamW
update over every member's slices. Each member keeps everything its single run has:

* its seed and initial weights (each member is made by :func:`~circuitfade.train.state.new_run`,
  then stacked), its data generator (its batches, in the same order, from
  ``task.sample(batch_size, generator, **config.mix_at(step))``) and its prior-dropout generator;
* its gate path (learned, fixed or scheduled gates, per member), data mix, lr, weight decay
  and clipping norm;
* its own AdamW state (torch's AdamW applied to the member's slices, so the maths is
  torch's, per member, including its per-parameter step counts);
* its evaluation rows on the one evaluation set (:meth:`Ensemble.evaluate`: the single
  trainer's conditions, chunks and metrics, one stacked forward for all members);
* its run directory, written by :mod:`~circuitfade.train.checkpoints` (weights, optimizer and
  RNG state, ``metrics.csv``, ``done.json`` / ``failed.json``), so ``attach``, ``trace``,
  resume, branch and sweep reuse see an ordinary run.

Equivalence: on the CPU the batched step computes each member's loss, gradients and
update bit for bit as its single run does (tested on the gate paths, priors on and off,
prior dropout and the dual loss), because every batched kernel does per member what
the single run's kernel does (``bmm`` against ``mm``, row-wise softmax, elementwise ops),
and the few operations whose rounding depends on the batch (layer norm with its affine
weights, the task loss, gradient norms, the AdamW kernel) are called per member. On a
GPU the kernels may differ; the tolerance tests hold there too.

A member whose loss or gradient norm becomes non-finite stops at that step (its weights
not updated), is recorded failed (``failed.json``, as the single trainer writes) and is
removed from the stack; the others go on. An interrupted ensemble resumes each member from
its last complete checkpoint (members at different steps are trained in groups by step);
a member resumed alone by :func:`~circuitfade.train.loop.train` continues as a single run.

What cannot be a member (:func:`ensemble_refusal`): branches (``config.parent``; they
start from another run's checkpoint), rotary positions, ``attn_scores_soft_cap`` and
``post_embedding_ln`` (the model has no fused path for them). They train as single runs. Compiled runs
(``TrainConfig.compile``) train together with runs compiled alike: the stacked training forward
and backward run under ``torch.compile`` (evaluation stays eager), and each member's
``run.compile_seconds`` holds the first step's seconds, as :func:`~circuitfade.train.loop.fit` keeps it.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor

from circuitfade.gating.evaluation import EVAL_CHUNK, condition_groups, conditions_row, gate_condition
from circuitfade.model import SoftPriorTransformer
from circuitfade.model.core import logits_at_all_positions
from circuitfade.model.fused import fused_path_refusal
from circuitfade.model.devices import keep_freed_memory, resolve_device
from circuitfade.tasks import EVAL_SEED, Batch, Task, eval_set
from circuitfade.train.callbacks import NON_FINITE_WEIGHTS, Callback, Callbacks, divergence, is_eval_step, step_loop
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
from circuitfade.train.lock import RunLocked, run_lock
from circuitfade.train.loop import row_at_step, training_forward
from circuitfade.train.rundir import RunDir
from circuitfade.train.stacked import BatchedAdamW, StackedModel
from circuitfade.train.state import Run, new_run, one_thread

__all__ = ["DEFAULT_MEMBERS", "default_ensemble_size", "ensemble_key", "ensemble_refusal", "fit_ensemble",
           "train_ensemble", "MemberStatus", "MemberOutcome", "Ensemble"]

DEFAULT_MEMBERS = {"cpu": 4}
"""Most members per ensemble by device type, from ``benchmarks/ensemble.py`` (the smallest E within 5%
of the most runs per hour, one thread; ``results/benchmarks/ensemble.json`` holds the measurement and
names its machine); devices not measured use the CPU figure. A sweep on the CPU does not use it: it
takes the size measured on the machine it runs on (:func:`circuitfade.train.calibrate.ensemble_size_here`). A sweep splits ensembles further so that every worker
has one (:func:`~circuitfade.train.sweep.plan_jobs`)."""

# training settings every member of an ensemble shares (the others are the member's own)
_SHARED_TRAIN = ("steps", "batch_size", "eval_every", "eval_size", "eval_conditions", "dual_loss", "device", "compile")


# ----------------------------------------------------------------------------------------------
# who can train together
# ----------------------------------------------------------------------------------------------
def ensemble_refusal(cfg: RunConfig) -> str | None:
    """Why ``cfg`` cannot be an ensemble member (one line), or ``None`` if it can."""
    if cfg.parent:
        return "a branch starts from its parent's checkpoint: trained as a single run"
    mc = cfg.model_config()
    why = fused_path_refusal(mc)
    if why is not None:
        return f"{why}: trained as a single run"
    if getattr(mc, "post_embedding_ln", False):
        return "post_embedding_ln has no fused path: trained as a single run"
    return None


def default_ensemble_size(device: str = "cpu") -> int:
    """:data:`DEFAULT_MEMBERS` for ``device`` (``"cpu"``, ``"cuda:1"``, ``"auto"``...; its type decides)."""
    kind = resolve_device(device).type
    return DEFAULT_MEMBERS.get(kind, DEFAULT_MEMBERS["cpu"])


def ensemble_key(cfg: RunConfig) -> str:
    """What the members of one ensemble share, as a JSON string: the model config without its
    gate modes and initial gate (each member has its own), the task, and the training settings
    :data:`_SHARED_TRAIN` (step budget, batch size, evaluation). Raises ``ValueError`` with
    :func:`ensemble_refusal`'s reason for a config that cannot be a member."""
    why = ensemble_refusal(cfg)
    if why is not None:
        raise ValueError(f"run {cfg.path!r} seed {cfg.seed} cannot join an ensemble: {why}")
    model = {k: v for k, v in cfg.model_config().to_json_dict().items() if k not in ("gate_modes", "gate_init")}
    tc = cfg.train
    train = {k: getattr(tc, k) for k in _SHARED_TRAIN}
    train["eval_conditions"] = list(train["eval_conditions"])
    return json.dumps({"model": model, "task": cfg.task, "train": train}, sort_keys=True, default=str)


# ----------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------
def _answer_rows(batches: Sequence[Batch], n: int, last_needs_scores: bool) -> Tensor | None:
    """The query rows the last block computes: every position any member scores (sorted), or
    ``None`` where that would not help (as the single model's answer-position path decides)."""
    mask = torch.stack([b.answer_mask.any(0) for b in batches]).any(0)
    rows = mask.nonzero().flatten()
    if rows.numel() >= n or last_needs_scores:
        return None
    return rows


def _check_inputs(model: SoftPriorTransformer, x: Tensor) -> None:
    """The single model's input checks, once for the stacked inputs ``[E, batch, pos(, d_vocab)]``."""
    cfg = model.cfg
    if x.shape[2] > cfg.n_ctx:
        raise ValueError(f"sequence length {x.shape[2]} exceeds the context n_ctx={cfg.n_ctx}")
    if cfg.input_mode == "real":
        if not x.is_floating_point() or x.shape[-1] != cfg.d_vocab:
            raise ValueError(f"input_mode='real' takes float inputs [batch, pos, {cfg.d_vocab}]; got "
                             f"{tuple(x.shape[1:])} {x.dtype}")
    elif x.numel() and (int(x.min()) < 0 or int(x.max()) >= cfg.d_vocab):
        raise ValueError(f"token ids must be in [0, {cfg.d_vocab}); got min {int(x.min())}, max {int(x.max())}")


class Ensemble:
    """Live state of an ensemble: the member :class:`Run` s (all at one step, one :func:`ensemble_key`),
    their :class:`~circuitfade.train.stacked.StackedModel` and :class:`~circuitfade.train.stacked.BatchedAdamW`. :meth:`train_step` advances every active
    member by one step (with the caller's torch threads: :func:`fit_ensemble` uses one);
    :meth:`sync` writes a member's state back into its ``Run``."""

    def __init__(self, runs: Sequence[Run]):
        self.runs = list(runs)
        self.cfgs = [r.config for r in self.runs]
        keys = {ensemble_key(c) for c in self.cfgs}
        if len(keys) != 1:
            raise ValueError("fit_ensemble: the runs differ in model shape, task or shared training settings "
                             "(see ensemble_key)")
        steps = {r.step for r in self.runs}
        if len(steps) != 1:
            raise ValueError(f"fit_ensemble: the runs are at different steps {sorted(steps)}; group them by step")
        self.paths = [c.gate_path() for c in self.cfgs]
        learned = [{p: r.model.cfg.gate_mode(p) == "learned" for p in r.model.cfg.priors} for r in self.runs]
        self.model = StackedModel([r.model for r in self.runs], learned)
        self.opt = BatchedAdamW(self.model, [r.optimizer for r in self.runs], [r.model for r in self.runs])
        self.active = list(range(len(self.runs)))  # member index (into runs) of each stack slot
        self.tc = self.cfgs[0].train
        # the training forward (and so its backward), compiled with TrainConfig.compile; evaluation stays eager
        self._train_logits = training_forward(self.model.logits, self.tc.compile)
        self._compiling = bool(self.tc.compile)  # the first step compiles: timed

    @property
    def step_now(self) -> int:
        return self.runs[self.active[0]].step

    def set_gates(self, step: int) -> None:
        """Gate buffers of fixed / scheduled members at their path's value at ``step`` (the trainer's rule)."""
        vals, has = [], []
        for slot, i in enumerate(self.active):
            path = self.paths[i]
            has.append(path.mode != "learned")
            vals.append(float(path.value_at(step)) if path.mode != "learned" else 0.0)
        if not any(has):
            return
        dev = self.model.device
        v = torch.tensor(vals, dtype=torch.float32).to(device=dev)
        m = torch.tensor(has, dtype=torch.bool, device=dev)
        for name, buf in self.model.buffers.items():
            buf.copy_(torch.where(m[:, None], v.to(buf.dtype)[:, None], buf))

    def sync(self, slot: int, optimizer: bool = True) -> Run:
        """Member ``slot``'s Run, brought up to date with the stack (weights, gate buffers, optimizer)."""
        run = self.runs[self.active[slot]]
        self.model.copy_to(slot, run.model)
        if optimizer:
            self.opt.copy_to(slot, run.optimizer, run.model)
        return run

    def drop(self, slots: Sequence[int]) -> None:
        keep = [s for s in range(len(self.active)) if s not in set(slots)]
        self.model.keep(keep)
        self.opt.keep(keep)
        self.active = [self.active[s] for s in keep]

    def train_step(self, task: Task) -> tuple[list[float], list[float]]:
        """One step of every active member: sample, forward, loss, backward, clip, AdamW.
        Returns each slot's loss and gradient norm (before clipping); a member whose loss or
        norm is not finite is not updated."""
        model, tc = self.model, self.tc
        step = self.step_now
        t0 = time.perf_counter() if self._compiling else None
        self.set_gates(step)
        batches, drops = [], []
        for i in self.active:
            run, cfg = self.runs[i], self.cfgs[i]
            batches.append(task.sample(tc.batch_size, run.data_gen, **cfg.mix_at(step)))
            p = cfg.train.prior_dropout
            drops.append(p > 0 and torch.rand((), generator=run.dropout_gen).item() < p)
        dev = model.device
        if dev.type != "cpu":
            batches = [b.to(dev) for b in batches]
        x = torch.stack([b.model_input for b in batches])
        _check_inputs(model.template, x)
        n = x.shape[2]
        rows = _answer_rows(batches, n, any(p.needs_scores for p in model.template.blocks[-1].attn.priors.values()))
        drop = torch.tensor(drops, dtype=torch.bool, device=dev)
        losses = self._losses(x, rows, batches, task, drop if any(drops) else None)
        if tc.dual_loss:
            zero = torch.ones(len(batches), dtype=torch.bool, device=dev)
            losses = [a + b for a, b in zip(losses, self._losses(x, rows, batches, task, zero))]
        for p in model.params.values():
            p.grad = None
        torch.stack(losses).sum().backward()
        # which parameters each member has a gradient for (the single run's p.grad is not None)
        has_grad: dict[str, list[bool]] = {}
        for name, p in model.params.items():
            if p.grad is None:
                continue
            if ".attn.gate_" in name and name.endswith("_logit"):
                j = model.cfg.priors.index(name.rsplit(".gate_", 1)[1][: -len("_logit")])
                learned = model.learned[:, j].tolist()
                # a learned gate is in the graph unless this step's gates were all overridden (prior dropout)
                has_grad[name] = [learned[s] and not drops[s] for s in range(model.E)]
            else:
                has_grad[name] = [True] * model.E
        grads = {n: model.params[n].grad.unbind(0) for n in has_grad}
        norms = self._clip(grads, has_grad)
        lvs = [float(v) for v in torch.stack([l.detach() for l in losses]).tolist()]
        nvs = [float(v) for v in norms.tolist()]
        update = [math.isfinite(a) and math.isfinite(b) for a, b in zip(lvs, nvs)]
        self.opt.step(grads, has_grad, update)
        for slot, i in enumerate(self.active):
            if update[slot]:
                self.runs[i].step += 1
        if t0 is not None:
            self._compiling = False
            seconds = time.perf_counter() - t0
            for i in self.active:
                self.runs[i].compile_seconds = seconds
        return lvs, nvs

    def _losses(self, x: Tensor, rows: Tensor | None, batches: Sequence[Batch], task: Task,
                zero: Tensor | None) -> list[Tensor]:
        """Each member's task loss on its batch, from logits laid out as the single model returns them."""
        logits = self._train_logits(x, rows, zero)
        return [task.loss(logits_at_all_positions(logits[s], rows, x.shape[2]), b) for s, b in enumerate(batches)]

    @torch.no_grad()
    def evaluate(self, slots: Sequence[int], task: Task, batch: Batch, conditions: Sequence) -> list[dict[str, float]]:
        """:func:`~circuitfade.gating.evaluation.evaluate_conditions` of the members in ``slots`` on ``batch``,
        with one stacked forward per distinct condition and chunk of
        :data:`~circuitfade.gating.evaluation.EVAL_CHUNK` examples (as the single model chunks).

        Each member's gate values under a condition are read from its single model (copied from
        the stack first), so the conditions mean exactly what they mean there; a condition is
        evaluated when some member in ``slots`` has a new set of gate values under it
        (:func:`~circuitfade.gating.evaluation.condition_groups`). The stack's gate buffers must hold
        the values to evaluate at (the trainer sets them for the step)."""
        models = []
        for s, i in enumerate(self.active):
            self.model.copy_to(s, self.runs[i].model)
            models.append(self.runs[i].model)
        conditions = list(conditions)
        groups = {s: condition_groups(models[s], conditions) for s in slots}
        metrics: dict[int, list[dict | None]] = {s: [None] * len(conditions) for s in slots}
        for ci, c in enumerate(conditions):
            due = [(s, g) for s in slots for g in groups[s] if g[0] == ci]
            if not due:
                continue
            values = self._metrics(models, c, task, batch)
            for s, g in due:
                for i in g:
                    metrics[s][i] = values[s]
        return [conditions_row(conditions, metrics[s]) for s in slots]

    def _metrics(self, models: Sequence[SoftPriorTransformer], condition, task: Task, batch: Batch) -> list[dict]:
        """``task.metrics`` of every member on ``batch`` with its gates under ``condition``."""
        layers, priors = range(self.model.cfg.n_layers), self.model.cfg.priors
        per_member = []
        for m in models:
            with gate_condition(m, condition):
                per_member.append([{name: m.blocks[i].attn.gate(name).detach() for name in priors} for i in layers])
        override = [{name: torch.stack([g[i][name] for g in per_member]) for name in priors} for i in layers]
        E = len(models)
        needs = any(p.needs_scores for p in self.model.template.blocks[-1].attn.priors.values())
        chunks: list[list[Tensor]] = [[] for _ in models]
        for start in range(0, len(batch), EVAL_CHUNK):
            part = batch if len(batch) <= EVAL_CHUNK else batch[start:start + EVAL_CHUNK]
            x = part.model_input
            n = x.shape[1]
            rows = _answer_rows([part], n, needs)
            logits = self.model.logits(x.unsqueeze(0).expand(E, *x.shape), rows, gates=override)
            for s in range(E):
                chunks[s].append(logits_at_all_positions(logits[s], rows, n))
        return [task.metrics(c[0] if len(c) == 1 else torch.cat(c), batch) for c in chunks]

    def _clip(self, grads: dict[str, tuple[Tensor, ...]], has_grad: dict[str, list[bool]]) -> Tensor:
        """Clip each member's gradients to its ``grad_clip`` (:func:`~circuitfade.train.optim.clip_grad_norm`'s
        maths per member); returns ``[E]`` total norms before clipping."""
        E = self.model.E
        lists = [[grads[n][s] for n in grads if has_grad[n][s]] for s in range(E)]
        flat = [g for lst in lists for g in lst]
        norms = torch._foreach_norm(flat, 2.0) if flat else []
        totals, k = [], 0
        for lst in lists:
            if lst:
                totals.append(torch.linalg.vector_norm(torch.stack(norms[k:k + len(lst)]), 2.0))
            else:
                totals.append(torch.tensor(0.0, device=self.model.device))
            k += len(lst)
        total = torch.stack(totals)
        max_norm = torch.tensor([self.cfgs[i].train.grad_clip for i in self.active], dtype=total.dtype,
                                device=total.device)
        coef = torch.clamp((total + 1e-6).reciprocal() * max_norm, max=1.0)
        with torch.no_grad():
            for n, p in self.model.params.items():
                if n in grads:
                    p.grad.mul_(coef.view(E, *([1] * (p.dim() - 1))).to(p.grad.dtype))
        return total


def fit_ensemble(runs: Sequence[Run], until: int | None = None, *, run_dirs: Sequence[Path | str | None] | None = None,
                 task: Task | None = None, eval_batch: Batch | None = None, progress: bool = False,
                 logger: Callable[[int, int, dict], None] | None = None,
                 callbacks: Sequence[Callback] | None = None) -> list[TrainingDiverged | OSError | None]:
    """:func:`~circuitfade.train.loop.fit` for E runs at one step, trained as one stacked model.

    Advances every run from their common ``run.step`` to ``until`` (default: the runs'
    ``train.steps``), adding each member's evaluation rows every ``eval_every`` steps and
    at ``until``, and (with ``run_dirs``) writing each member's ``metrics.csv`` and its
    checkpoints at its checkpoint steps. The runs are updated in place and end as ordinary
    single runs (weights, optimizer state, generators, step, metrics), so :func:`fit` can
    continue any of them alone. ``logger(member, step, row)`` receives every evaluation row.

    ``callbacks``: :class:`~circuitfade.train.callbacks.Callback` s whose ``on_record``,
    ``on_checkpoint`` and ``on_step`` are called per member with that member's run, as
    :func:`fit` calls them, the run holding that member's weights at that step (its optimizer
    state is copied back when the member stops or ends; ``on_step`` copies the weights every
    step, so define it only where needed); ``True`` from ``on_record`` or ``on_step`` stops that member
    at that step (its entry stays ``None``: ``fit`` returns the same way) and the others go on.
    Callbacks that define ``on_loss``, ``before_update`` or ``after_update`` are refused
    (``ValueError``): those act on one model's loss and gradient; use :func:`fit`.

    Returns one entry per run: ``None``, or the :class:`TrainingDiverged` that stopped it
    (raised by the single trainer at the same step, with the same message: the member's
    weights are those before the failing update, and the others went on), or the
    :class:`OSError` that stopped it when its run directory could not be written (a full or
    read-only disk: the single trainer raises the same error; the others go on).
    """
    runs = list(runs)
    if not runs:
        return []
    run_dirs = [None] * len(runs) if run_dirs is None else [None if d is None else Path(d) for d in run_dirs]
    if len(run_dirs) != len(runs):
        raise ValueError(f"fit_ensemble: {len(runs)} runs but {len(run_dirs)} run_dirs")
    tc = runs[0].config.train
    until = tc.steps if until is None else until
    step0 = runs[0].step
    if isinstance(until, bool) or not isinstance(until, int) or not step0 <= until <= tc.steps:
        raise ValueError(f"fit_ensemble(until={until!r}): expected an integer step in [{step0} (the runs' step), "
                         f"{tc.steps} (config.train.steps)]")
    hooks = Callbacks(callbacks)
    inside = [name for name in ("on_loss", "before_update", "after_update") if hooks.defines(name)]
    if inside:
        raise ValueError(f"fit_ensemble: a callback defines {', '.join(inside)}, which act on one model's loss or "
                         "gradient; the ensemble calls on_record, on_checkpoint and on_step (use fit for the others)")
    keep_freed_memory()
    ens = Ensemble(runs)
    task = task if task is not None else runs[0].config.make_task()
    eval_batch = eval_batch if eval_batch is not None else eval_set(task, n=tc.eval_size, seed=EVAL_SEED)
    if ens.model.device.type != "cpu":  # drawn on the CPU, evaluated where the stack is (as fit does)
        eval_batch = eval_batch.to(ens.model.device)
    errors: list[TrainingDiverged | OSError | None] = [None] * len(runs)
    starts = [int((r.config.parent or {}).get("step", 0)) for r in runs]

    stopping: set[int] = set()  # slots a callback stopped at this step

    def record(slots: Sequence[int], loss_values: Sequence[float]) -> list[int]:
        """Each member's evaluation row at its step (the single trainer's row; evaluated together);
        returns the slots whose ``metrics.csv`` could not be written (a callback's ``True`` from
        ``on_record`` adds the slot to ``stopping``)."""
        rows = []
        for slot, lv in zip(slots, loss_values):
            run = ens.sync(slot, optimizer=False)
            rows.append(row_at_step(run, lv))  # sets the gates for this step, as the single loop does
            ens.model.copy_buffers_from(slot, run.model)
        evaluations = ens.evaluate(slots, task, eval_batch, tc.eval_conditions)
        unwritten = []
        for slot, row, ev in zip(slots, rows, evaluations):
            i = ens.active[slot]
            run = ens.runs[i]
            row.update(ev)
            run.metrics.append(row)
            if run_dirs[i] is not None:
                try:
                    write_metrics(run_dirs[i], run.metrics)
                except OSError as e:  # this member's disk: it stops here, the others go on
                    errors[i] = e
                    unwritten.append(slot)
                    continue
            if logger is not None:
                logger(i, run.step, dict(row))
            if hooks and hooks.on_record(run, dict(row)):  # its weights were synced above
                stopping.add(slot)
        return unwritten

    def checkpoint(slots: Sequence[int]) -> list[int]:
        """Checkpoint the members due at this step; returns the slots whose weights are not finite
        or whose checkpoint could not be written."""
        due = [s for s in slots if run_dirs[ens.active[s]] is not None
               and is_checkpoint_step(ens.runs[ens.active[s]].config.train, ens.runs[ens.active[s]].step,
                                      starts[ens.active[s]])]
        if not due:
            return []
        finite = ens.model.finite().tolist()
        bad = []
        for s in due:
            i = ens.active[s]
            if not finite[s]:
                errors[i] = TrainingDiverged(ens.runs[i].step, NON_FINITE_WEIGHTS)
                bad.append(s)
                continue
            try:
                save_checkpoint(ens.sync(s), run_dirs[i])
            except OSError as e:  # this member's disk: it stops here, the others go on
                errors[i] = e
                bad.append(s)
                continue
            if hooks:
                hooks.on_checkpoint(ens.runs[i], ens.runs[i].step)
        return bad

    last: dict = {}  # the step being finished: its losses, the slots that failed and those that advanced

    def first() -> None:
        due = [s for s, run in enumerate(runs) if (not run.metrics or run.metrics[-1]["step"] < run.step)
               and is_eval_step(run.step, tc.eval_every, until)]
        unwritten = record(due, [float("nan")] * len(due)) if due else []
        stopping.clear()  # fit too goes on past the starting row whatever on_record says
        bad = unwritten + checkpoint([s for s in range(len(runs)) if s not in unwritten])
        if bad:
            ens.drop(bad)

    def advance() -> int | None:
        lvs, nvs = ens.train_step(task)
        failed = []
        for s, (lv, nv) in enumerate(zip(lvs, nvs)):
            i = ens.active[s]
            diverged = divergence(ens.runs[i].step, lv, nv)
            if diverged is not None:
                errors[i] = diverged
                failed.append(s)
        for s in failed:
            ens.sync(s)
        ok = [s for s in range(len(ens.active)) if s not in failed]
        last.update(lvs=lvs, failed=failed, ok=ok)
        if not ok:
            ens.drop(failed)
            return None
        return ens.runs[ens.active[ok[0]]].step

    def after(step: int, due: bool) -> bool:
        ok, failed, lvs = last["ok"], last["failed"], last["lvs"]
        unwritten = record(ok, [lvs[s] for s in ok]) if due else []
        bad = unwritten + checkpoint([s for s in ok if s not in unwritten])
        if hooks.defines("on_step"):
            stopping.update(s for s in ok if s not in bad and hooks.on_step(ens.sync(s, optimizer=False)))
        stopped = sorted(s for s in stopping if s not in bad)
        for s in stopped:  # ends as fit returns: weights, optimizer and generators in its run
            ens.sync(s)
        stopping.clear()
        if failed or bad or stopped:
            ens.drop(failed + bad + stopped)
        return False

    with one_thread():
        step_loop(now=lambda: ens.step_now, until=until, eval_every=tc.eval_every, first=first, advance=advance,
                  after=after, progress=progress, desc=f"ensemble of {len(runs)}", active=lambda: bool(ens.active))
        for s in range(len(ens.active)):
            ens.sync(s)
    return errors


# ----------------------------------------------------------------------------------------------
# run directories
# ----------------------------------------------------------------------------------------------
class MemberStatus(str, Enum):
    """How a member of :func:`train_ensemble` ended."""

    DONE = "done"  # trained to the end here
    CACHED = "cached"  # already finished before (done.json): nothing written
    FAILED = "failed"  # diverged (failed.json), recorded failed before, locked, or unreadable


@dataclass(frozen=True)
class MemberOutcome:
    """One member's result: ``status``, the run (``None`` when it could not be loaded), the error line."""

    status: MemberStatus
    run: Run | None
    error: str | None = None

    @property
    def final(self) -> dict:
        """The last evaluation row (``{}`` for a failed member)."""
        if self.status is MemberStatus.FAILED or self.run is None or not self.run.metrics:
            return {}
        return dict(self.run.metrics[-1])


def _failed(e: BaseException) -> MemberOutcome:
    return MemberOutcome(MemberStatus.FAILED, None, f"{type(e).__name__}: {e}")


def _recorded_failure(run_dir: Path) -> MemberOutcome:
    try:
        raise_recorded_failure(run_dir)
    except TrainingDiverged as e:
        return _failed(e)
    raise AssertionError("unreachable")  # pragma: no cover


def train_ensemble(configs: Sequence[RunConfig], run_dirs: Sequence[str | Path], *, progress: bool = False,
                   logger: Callable[[int, int, dict], None] | None = None) -> list[MemberOutcome]:
    """Train ``configs[i]`` into ``run_dirs[i]`` for every i, as one ensemble (resuming, or
    returning finished runs, as :func:`~circuitfade.train.loop.train` does for each).

    The configs must share :func:`ensemble_key`. Per member, the run directory rules are the
    single trainer's: a finished run is returned without writing anything; otherwise the
    directory is locked for the whole ensemble, temp files of killed writers are removed,
    ``config.json`` is written for a new run and a started one resumes from its last complete
    checkpoint. Members at different steps train in groups by step. A member that diverges
    gets ``failed.json`` and status ``FAILED``; one recorded failed before, locked by another
    process, whose checkpoint cannot be read or is past its end, or whose run directory cannot
    be written (a full disk) is ``FAILED`` with the single trainer's error naming the file, no
    ``failed.json`` (it did not diverge), and the others go on. Each member's lock is released
    as soon as that member ends. Never raises for one member's problem; raises ``ValueError``
    when the configs cannot form an ensemble.
    """
    configs, run_dirs = list(configs), [Path(d) for d in run_dirs]
    if len(configs) != len(run_dirs):
        raise ValueError(f"train_ensemble: {len(configs)} configs but {len(run_dirs)} run_dirs")
    if len({str(d.resolve()) for d in run_dirs}) != len(run_dirs):
        raise ValueError("train_ensemble: two members share a run directory")
    if not configs:
        return []
    if len({ensemble_key(c) for c in configs}) != 1:
        raise ValueError("train_ensemble: the configs differ in model shape, task or shared training settings")
    resolve_device(configs[0].train.device)
    outcomes: list[MemberOutcome | None] = [None] * len(configs)
    locks = [contextlib.ExitStack() for _ in configs]  # each member's lock, released when it ends
    with one_thread(), contextlib.ExitStack() as held:
        for lock in locks:
            held.enter_context(lock)
        task = configs[0].make_task()
        ev = eval_set(task, n=configs[0].train.eval_size, seed=EVAL_SEED)
        todo: list[tuple[int, Run]] = []
        for i, (cfg, d) in enumerate(zip(configs, run_dirs)):
            try:
                state = dir_state(cfg, d)
                if state == "done":
                    done = complete_checkpoints(d)
                    if done:
                        run = load_checkpoint(new_run(cfg), d, done[-1])
                        if run.step == cfg.train.steps:
                            outcomes[i] = MemberOutcome(MemberStatus.CACHED, run)
                            continue
                if state == "failed":
                    outcomes[i] = _recorded_failure(d)
                    continue
                d.mkdir(parents=True, exist_ok=True)
                locks[i].enter_context(run_lock(d))
                clean_scratch(d)
                state = dir_state(cfg, d)
                if state == "failed":
                    outcomes[i] = _recorded_failure(d)
                    continue
                if state == "new":
                    RunDir(d).write_config(cfg)
                run = new_run(cfg)
                done = resume_steps(cfg, d)
                if done:
                    load_checkpoint(run, d, done[-1])
                    if state == "done" and run.step == cfg.train.steps:
                        outcomes[i] = MemberOutcome(MemberStatus.CACHED, run)
                        locks[i].close()
                        continue
                todo.append((i, run))
            except (ValueError, OSError, RunLocked) as e:  # this member's problem: reported, the others go on
                outcomes[i] = _failed(e)
                locks[i].close()
        by_step: dict[int, list[tuple[int, Run]]] = {}
        for i, run in todo:
            by_step.setdefault(run.step, []).append((i, run))
        for step in sorted(by_step):
            group = by_step[step]
            errors = fit_ensemble([r for _, r in group], run_dirs=[run_dirs[i] for i, _ in group], task=task,
                                  eval_batch=ev, progress=progress,
                                  logger=None if logger is None else (lambda k, s, row, g=group: logger(g[k][0], s, row)))
            for (i, run), err in zip(group, errors):
                try:
                    if isinstance(err, TrainingDiverged):
                        RunDir(run_dirs[i]).record_failure(err)
                        outcomes[i] = MemberOutcome(MemberStatus.FAILED, run, f"TrainingDiverged: {err}")
                    elif err is not None:  # its run directory could not be written: no divergence recorded
                        outcomes[i] = MemberOutcome(MemberStatus.FAILED, run, f"{type(err).__name__}: {err}")
                    else:
                        finish_run(run, run_dirs[i])
                        outcomes[i] = MemberOutcome(MemberStatus.DONE, run)
                except OSError as e:  # failed.json or done.json could not be written: this member only
                    outcomes[i] = MemberOutcome(MemberStatus.FAILED, run, f"{type(e).__name__}: {e}")
                locks[i].close()
    return [o for o in outcomes if o is not None]
