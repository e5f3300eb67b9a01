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
import copy
import csv
import io
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import safe_open
from tqdm import tqdm

from circuitfade import __version__
from circuitfade.gating.evaluation import CONDITIONS, answer_logits, evaluate_conditions
from circuitfade.io import CheckpointError, atomic_write, read_json, save_tensors, write_json
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.model.devices import check_device_name, resolve_device
from circuitfade.train.optim import clip_grad_norm
from circuitfade.gating.paths import GatePath, parse_path
from circuitfade.gating.schedules import Schedule, parse_schedule
from circuitfade.tasks import EVAL_SEED, EVAL_SIZE, Batch, Task, eval_set, make_task

__all__ = ["TrainConfig", "RunConfig", "train", "branch", "branch_config", "clone_run", "fit", "Run", "load_checkpoint",
           "checkpoint_steps", "TrainingDiverged", "RunLocked"]

CKPT_DIR = "checkpoints"
# EVAL_SEED / EVAL_SIZE: the package's one evaluation convention (circuitfade.tasks.base); one eval
# set for every run of a task config, whatever the seed
MAX_SEED = 2**62  # seeds (and seed + small offsets) must fit torch's 64-bit generator seed


class TrainingDiverged(RuntimeError):
    """The loss, gradient norm or weights became non-finite at ``step``; the run did not finish."""

    def __init__(self, step: int, error: str):
        super().__init__(f"training diverged at step {step}: {error}")
        self.step, self.error = int(step), error


class RunLocked(RuntimeError):
    """Another live process is training this run directory."""


def _number(owner: str, name: str, v, *, minimum: float, strict: bool, allow_inf: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
    ok = ok and (math.isfinite(v) or allow_inf) and (v > minimum if strict else v >= minimum)
    if not ok:
        rel = ">" if strict else ">="
        raise ValueError(f"{owner}.{name} must be a {'' if allow_inf else 'finite '}number {rel} {minimum}, got {v!r}")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping (main paper, Section 4: AdamW 1e-3, wd 0.01, clip 1.0, batch 64)."""

    steps: int = 3600  # global step at which the run ends (branches continue their parent's count)
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_size: int = EVAL_SIZE
    checkpoint_every: int = 300  # every 300 steps, as the paper's mechanism traces
    extra_checkpoints: tuple = ()
    prior_dropout: float = 0.0  # probability a training batch runs with every gate at 0
    dual_loss: bool = False  # loss at active gates + loss at zero gates, each step
    eval_conditions: tuple = ("normal", "zero", "param", "half")
    # where to train: cpu | cuda[:N] | mps | auto. Not part of the run's identity (see RunConfig.identity)
    device: str = "cpu"

    def __post_init__(self):
        check_device_name(self.device)
        for name in ("steps", "batch_size", "eval_every", "eval_size", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {v!r}")
        _number("TrainConfig", "lr", self.lr, minimum=0.0, strict=True)
        _number("TrainConfig", "weight_decay", self.weight_decay, minimum=0.0, strict=False)
        _number("TrainConfig", "grad_clip", self.grad_clip, minimum=0.0, strict=True, allow_inf=True)
        if isinstance(self.prior_dropout, bool) or not isinstance(self.prior_dropout, (int, float)) \
                or not 0.0 <= self.prior_dropout < 1.0:
            raise ValueError(f"TrainConfig.prior_dropout must be in [0, 1), got {self.prior_dropout!r}")
        extra = tuple(self.extra_checkpoints)
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in extra):
            raise ValueError(f"TrainConfig.extra_checkpoints must be non-negative integer steps, got {extra!r}")
        object.__setattr__(self, "extra_checkpoints", extra)
        conds = tuple(self.eval_conditions)
        bad = [c for c in conds if c not in CONDITIONS]
        if bad:
            raise ValueError(f"TrainConfig.eval_conditions: unknown condition(s) {bad}; known: {list(CONDITIONS)}")
        object.__setattr__(self, "eval_conditions", conds)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run: model, task, gate path, optimisation, seed, parent."""

    path: str = "fade600->0"
    task: Mapping = field(default_factory=lambda: {"name": "assoc"})
    model: Mapping = field(default_factory=dict)  # SoftPriorConfig overrides (JSON form)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    parent: Mapping | None = None  # {"run": dir, "step": int} for branches
    mix: Mapping = field(default_factory=dict)  # data-mix schedules: {task sample kwarg: schedule spec}

    def __post_init__(self):
        for name in ("task", "model", "mix"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"RunConfig.{name} must be a mapping (a JSON object), got {getattr(self, name)!r}")
        object.__setattr__(self, "task", dict(self.task))
        object.__setattr__(self, "mix", {k: str(v) for k, v in dict(self.mix).items()})
        object.__setattr__(self, "model", dict(self.model))
        if isinstance(self.train, Mapping):
            object.__setattr__(self, "train", TrainConfig(**self.train))
        if "name" not in self.task:
            raise ValueError("RunConfig.task needs a 'name' (e.g. {'name': 'assoc'})")
        # the specs are parsed once, here (the spec strings stay the config's JSON form)
        steps = self.train.steps
        object.__setattr__(self, "_mix", {k: parse_schedule(v, total_steps=steps) for k, v in self.mix.items()})
        object.__setattr__(self, "_gate_path", parse_path(self.path, total_steps=steps))
        path = self.gate_path()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, 2**62), got {self.seed!r}")
        if self.parent is not None:
            p = self.parent
            if not isinstance(p, Mapping) or set(p) != {"run", "step"} or not isinstance(p["step"], int) \
                    or isinstance(p["step"], bool) or p["step"] < 0:
                raise ValueError(f"RunConfig.parent must be {{'run': dir, 'step': int >= 0}}, got {p!r}")
            object.__setattr__(self, "parent", {"run": str(p["run"]), "step": int(p["step"])})
        elif path.is_continuation:
            raise ValueError(
                f"path {self.path!r} continues a {path.continue_from!r} run and needs a parent checkpoint: "
                "use branch(parent_dir, step, out, path=...) or circuitfade.train.sweep.child_of(...)"
            )
        task = self.make_task()
        _check_task_fits(task, self.model_config(task))  # model config errors surface now, naming the field

    def gate_path(self) -> GatePath:
        """The parsed gate path (parsed once, at construction)."""
        return self._gate_path

    @property
    def mix_schedules(self) -> dict[str, Schedule]:
        """The parsed data-mix schedules (parsed once, at construction)."""
        return dict(self._mix)

    def mix_at(self, step: int) -> dict:
        """Data-mix parameters for training step ``step`` (passed to ``task.sample``)."""
        return {k: sched(step) for k, sched in self._mix.items()}

    def make_task(self) -> Task:
        kw = {k: v for k, v in self.task.items() if k != "name"}
        return make_task(self.task["name"], **kw)

    def model_config(self, task: Task | None = None) -> SoftPriorConfig:
        """Model config with gate modes taken from the path (unless given explicitly)."""
        # a task may need model settings (e.g. linreg: real-valued inputs, scalar read-out)
        task = task if task is not None else self.make_task()
        d = {**getattr(task, "model_overrides", {}), **self.model}
        path = self.gate_path()
        priors = tuple(d.get("priors", SoftPriorConfig().priors))
        if "gate_modes" not in d:
            d["gate_modes"] = {p: path.mode for p in priors}
        if path.mode == "fixed" and "gate_init" not in d:
            d["gate_init"] = 0.5  # logits start at logit(0.5); fixed buffers are set from the path
        return SoftPriorConfig.from_json_dict(d, source="RunConfig.model")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["train"] = asdict(self.train)
        if d["train"]["device"] == "cpu":
            del d["train"]["device"]  # the default is left out: config files stay as before
        return {"circuitfade_version": __version__, **d}

    def identity(self) -> dict:
        """:meth:`to_dict` without the device: a run is the same experiment wherever it
        trains (cache keys and resume checks use this; devices differ only by rounding)."""
        d = self.to_dict()
        d["train"].pop("device", None)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunConfig":
        d = {k: v for k, v in d.items() if k != "circuitfade_version"}
        known = {"path", "task", "model", "train", "seed", "parent", "mix"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown run config fields {unknown}")
        return cls(**d)

    def same_run(self, other: "RunConfig") -> bool:
        return json.dumps(self.identity(), sort_keys=True) == json.dumps(other.identity(), sort_keys=True)


def _check_task_fits(task: Task, mc: SoftPriorConfig) -> None:
    """Raise ``ValueError`` naming both sides if ``task``'s inputs do not fit the model ``mc``."""
    name = getattr(task, "name", type(task).__name__)
    if mc.input_mode == "real":
        if task.d_vocab != mc.d_vocab:
            raise ValueError(f"task {name!r} has inputs of width d_vocab={task.d_vocab} but the model takes "
                             f"d_vocab={mc.d_vocab}")
    else:
        if task.d_vocab > mc.d_vocab:
            raise ValueError(f"task {name!r} uses token ids in [0, d_vocab={task.d_vocab}) but the model has "
                             f"d_vocab={mc.d_vocab}; set both to the same size (--model '{{\"d_vocab\": {task.d_vocab}}}')")
        if mc.d_vocab_out < task.d_vocab:
            raise ValueError(f"task {name!r} scores d_vocab={task.d_vocab} classes but the model has "
                             f"d_vocab_out={mc.d_vocab_out}")
    if task.n_ctx > mc.n_ctx:
        raise ValueError(f"task {name!r} makes sequences of n_ctx={task.n_ctx} positions but the model has "
                         f"n_ctx={mc.n_ctx}")


def checkpoint_steps(cfg: TrainConfig, start: int = 0) -> list[int]:
    """Steps at which checkpoints are written: ``start``, every ``checkpoint_every``, extras, the end."""
    steps = set(range(start, cfg.steps + 1, cfg.checkpoint_every)) | {start, cfg.steps}
    steps |= {s for s in cfg.extra_checkpoints if start <= s <= cfg.steps}
    return sorted(steps)


# --------------------------------------------------------------------------------------
# checkpoint state (optimizer + RNG) as safetensors: no pickle anywhere
# --------------------------------------------------------------------------------------
def _optimizer_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, val in state.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(val)
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": json.dumps(groups)}


def _optimizer_from_tensors(opt: torch.optim.Optimizer, tensors: Mapping, meta: Mapping) -> None:
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        if not name.startswith("optim."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = t
    groups = json.loads(meta["param_groups"])
    opt.load_state_dict({"state": state, "param_groups": groups})


@dataclass
class Run:
    """Live training state: model, optimizer, generators, the step reached, metrics."""

    config: RunConfig
    model: SoftPriorTransformer
    optimizer: torch.optim.Optimizer
    data_gen: torch.Generator
    dropout_gen: torch.Generator
    step: int = 0
    metrics: list[dict] = field(default_factory=list)


def _make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    # every parameter is registered (masked gate logits simply never get a gradient),
    # so optimizer state lines up across gate modes and branches can copy it
    # fused=True: one kernel per parameter instead of a Python loop of ops (4.3 -> 0.9 ms per step on the
    # base model, one CPU thread); deterministic on a given device. A resumed run keeps the implementation
    # recorded in its checkpoint's param_groups, so old checkpoints resume exactly as they started.
    return torch.optim.AdamW(list(model.parameters()), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)


def _apply_hparams(opt: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """The config's lr and weight decay win over restored ``param_groups`` (branches may change them)."""
    for g in opt.param_groups:
        g["lr"], g["weight_decay"] = cfg.lr, cfg.weight_decay


@contextlib.contextmanager
def _one_thread():
    """Compute with one torch thread (results must not depend on the caller's setting); restore it after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def new_run(cfg: RunConfig) -> Run:
    """Fresh model/optimizer/generators for ``cfg`` (seeded, deterministic)."""
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.seed)
    model = SoftPriorTransformer(cfg.model_config())  # initialised on the CPU: the same weights everywhere
    if device.type != "cpu":
        model = model.to(device, print_details=False)
    opt = _make_optimizer(model, cfg.train)
    data_gen = torch.Generator().manual_seed(cfg.seed)
    dropout_gen = torch.Generator().manual_seed(cfg.seed + 7919)
    return Run(cfg, model, opt, data_gen, dropout_gen)


def save_checkpoint(run: Run, run_dir: Path) -> Path:
    """Write ``step_XXXXXX.state.safetensors`` then ``step_XXXXXX.safetensors`` (each atomic)."""
    ck = Path(run_dir) / CKPT_DIR
    stem = f"step_{run.step:06d}"
    tensors, meta = _optimizer_to_tensors(run.optimizer)
    tensors["rng.data"] = run.data_gen.get_state()
    tensors["rng.dropout"] = run.dropout_gen.get_state()
    meta.update(step=str(run.step), metrics=json.dumps(run.metrics), format="circuitfade-state")
    save_tensors(ck / f"{stem}.state.safetensors", tensors, metadata=meta)
    save_tensors(ck / f"{stem}.safetensors", run.model.state_dict(), metadata={"step": str(run.step)})
    return ck / f"{stem}.safetensors"


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps whose weights and state files both exist."""
    ck = Path(run_dir) / CKPT_DIR
    if not ck.is_dir():
        return []
    steps = []
    for f in ck.glob("step_*.safetensors"):
        if f.name.endswith(".state.safetensors"):
            continue
        stem = f.name[: -len(".safetensors")]
        try:
            s = int(stem.split("_", 1)[1])
        except ValueError:
            continue
        if (ck / f"{stem}.state.safetensors").is_file():
            steps.append(s)
    return sorted(steps)


def load_checkpoint(run: Run, run_dir: Path, step: int) -> Run:
    """Restore model, optimizer, generators and metrics of ``run`` from ``step``."""
    ck = Path(run_dir) / CKPT_DIR
    run.model.load_weights(ck / f"step_{step:06d}.safetensors")
    state_file = ck / f"step_{step:06d}.state.safetensors"
    if not state_file.is_file():
        raise CheckpointError(f"{state_file}: missing optimizer/RNG state")
    try:
        with safe_open(str(state_file), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise CheckpointError(f"{state_file}: unreadable state file: {e}") from None
    if meta.get("format") != "circuitfade-state":
        raise CheckpointError(f"{state_file}: not a circuitfade state file")
    _optimizer_from_tensors(run.optimizer, tensors, meta)
    _apply_hparams(run.optimizer, run.config.train)
    run.data_gen.set_state(tensors["rng.data"])
    run.dropout_gen.set_state(tensors["rng.dropout"])
    run.step = int(meta["step"])
    run.metrics = json.loads(meta["metrics"])
    return run


def _write_metrics(run_dir: Path, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(Path(run_dir) / "metrics.csv", buf.getvalue().encode())


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


Sampler = Callable[[int, torch.Generator], Batch]
Logger = Callable[[int, dict], None]
"""``logger(step, metrics)``: called with each evaluation row; see :mod:`circuitfade.train.loggers`."""


def _finite_weights(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def fit(run: Run, until: int | None = None, *, run_dir: Path | None = None, task: Task | None = None,
        eval_batch: Batch | None = None, progress: bool = True, sampler: Sampler | None = None,
        logger: Logger | None = None) -> Run:
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
    Computes with one torch thread.

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
    path = cfg.gate_path()
    ckpts = set(checkpoint_steps(tc, start=int((cfg.parent or {}).get("step", 0))))
    priors = model.cfg.priors
    device = model.W_E.device  # batches are drawn on the CPU generator, then moved here
    eval_batch = eval_batch.to(device) if device.type != "cpu" else eval_batch

    def record(loss_value: float) -> None:
        _set_gates_for_step(model, path, run.step)
        row = {"step": run.step, **_gate_summary(model), **cfg.mix_at(run.step), "train_loss": loss_value}
        row.update(evaluate_conditions(model, task, eval_batch, tc.eval_conditions))
        run.metrics.append(row)
        if run_dir is not None:
            _write_metrics(run_dir, run.metrics)
        if logger is not None:
            logger(run.step, dict(row))

    def checkpoint() -> None:
        if run_dir is not None and run.step in ckpts:
            if not _finite_weights(model):
                raise TrainingDiverged(run.step, "non-finite weights after the update (checkpoint not written)")
            save_checkpoint(run, run_dir)

    with _one_thread():
        if not run.metrics or run.metrics[-1]["step"] < run.step:
            if run.step % tc.eval_every == 0 or run.step == until:
                record(float("nan"))
        checkpoint()
        bar = tqdm(total=until, initial=run.step, disable=not progress, desc=f"{cfg.path} s{cfg.seed}", leave=False)
        model.train()
        params = list(model.parameters())
        gate_now = None  # the gate buffers' value as last set here (None: set them at the first step)
        try:
            while run.step < until:
                gate_now = _set_gates_for_step(model, path, run.step, gate_now)
                if sampler is not None:
                    batch = sampler(run.step, run.data_gen)
                else:
                    batch = task.sample(tc.batch_size, run.data_gen, **cfg.mix_at(run.step))
                if device.type != "cpu":
                    batch = batch.to(device)
                drop = tc.prior_dropout > 0 and torch.rand((), generator=run.dropout_gen).item() < tc.prior_dropout
                with model.gates(**{p: 0.0 for p in priors}) if drop else contextlib.nullcontext():
                    loss = task.loss(answer_logits(model, batch), batch)  # last block at answer positions only
                if tc.dual_loss:
                    with model.gates(**{p: 0.0 for p in priors}):
                        loss = loss + task.loss(answer_logits(model, batch), batch)
                run.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = clip_grad_norm(params, tc.grad_clip)
                lv, nv = float(loss.detach()), float(norm)
                if not (math.isfinite(lv) and math.isfinite(nv)):
                    raise TrainingDiverged(run.step, f"non-finite loss {lv} / gradient norm {nv} (weights not updated)")
                run.optimizer.step()
                run.step += 1
                bar.update(1)
                if run.step % tc.eval_every == 0 or run.step == until:
                    record(lv)
                    last = run.metrics[-1]
                    kind = task.primary_metric.column
                    bar.set_postfix(loss=f"{last['train_loss']:.3f}",
                                    **{kind: f"{last.get(kind + '_normal', math.nan):.3f}",
                                       kind + "0": f"{last.get(kind + '_zero', math.nan):.3f}"})
                checkpoint()
        finally:
            bar.close()
    return run


_TMP_SUFFIX = ".tmp"


def _is_scratch(name: str) -> bool:
    """Files that do not make a directory "not empty": the lock and atomic_write's temp files."""
    return name == ".lock" or name.startswith(".lock.") or (name.startswith(".") and name.endswith(_TMP_SUFFIX))


def _clean_scratch(run_dir: Path) -> None:
    """Remove temp files left by a killed writer (call with the run lock held)."""
    for folder in (run_dir, run_dir / CKPT_DIR):
        if folder.is_dir():
            for f in folder.iterdir():
                if f.is_file() and f.name.startswith(".") and f.name.endswith(_TMP_SUFFIX) \
                        and not f.name.startswith(".lock."):
                    f.unlink(missing_ok=True)
    for f in run_dir.glob(".lock.*.pid"):  # a pid file of a process that died while locking
        pid = f.name.split(".")[2]
        if not (pid.isdigit() and _pid_alive(int(pid))):
            f.unlink(missing_ok=True)


def _dir_state(cfg: RunConfig, run_dir: Path) -> str:
    """'new', 'resume', 'done' or 'failed', reading only; refuses a directory holding something else."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir}: exists and is not a directory (a run directory is a folder)")
    cfg_file = run_dir / "config.json"
    if cfg_file.is_file():
        try:
            existing = RunConfig.from_dict(read_json(cfg_file))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{cfg_file}: not a circuitfade run config ({e})") from None
        if not existing.same_run(cfg):
            raise ValueError(f"{run_dir} already holds a different run; choose another --out or delete it")
        if (run_dir / "done.json").is_file():
            return "done"
        return "failed" if (run_dir / "failed.json").is_file() else "resume"
    if run_dir.is_dir() and any(not _is_scratch(f.name) for f in run_dir.iterdir()):
        raise ValueError(f"{run_dir} exists, is not empty and has no config.json; refusing to write into it")
    return "new"


def _raise_recorded_failure(run_dir: Path) -> None:
    rec = read_json(run_dir / "failed.json")
    err = TrainingDiverged(int(rec.get("step", -1)), str(rec.get("error", "?")))
    err.args = (f"{err} (recorded in {run_dir / 'failed.json'}; delete that file to try again)",)
    raise err


def _finish(run: Run, run_dir: Path) -> None:
    final = run.metrics[-1] if run.metrics else {}
    write_json(Path(run_dir) / "done.json", {"step": run.step, "final": final})


def train(cfg: RunConfig, run_dir: str | Path | None, *, progress: bool = True, sampler: Sampler | None = None,
          run: Run | None = None, logger: Logger | None = None) -> Run:
    """Train ``cfg`` into ``run_dir`` (resuming or returning a finished run as needed).

    With ``run_dir=None`` nothing is written (handy in notebooks and tests); an
    in-memory ``run`` (e.g. a clone made with :func:`clone_run`) is then continued
    under ``cfg`` (its ``train.steps`` is where it stops; :func:`fit` with
    ``until=`` does the same without a new config). ``sampler`` replaces the
    default batch source (see :func:`fit`); ``logger(step, metrics)`` receives every
    evaluation row (see :mod:`circuitfade.train.loggers`).

    Guarantees: one torch thread while computing (the caller's setting is
    restored); a finished run is returned without writing anything (so it can be
    re-requested from a read-only copy); otherwise the directory is locked
    (``.lock`` with the owner's pid, created atomically; a dead owner's lock is
    taken over), temp files of killed writers are removed, and a run that
    diverges raises :class:`TrainingDiverged` and is recorded in ``failed.json``
    (asking for it again raises the same error rather than retraining).
    """
    resolve_device(cfg.train.device)  # an unavailable device fails before anything is written
    with _one_thread():
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
                       sampler=sampler, logger=logger)
        run_dir = Path(run_dir)
        state = _dir_state(cfg, run_dir)
        if state == "done":  # read-only: no lock, no writes
            done = complete_checkpoints(run_dir)
            if done:
                run = load_checkpoint(new_run(cfg), run_dir, done[-1])
                if run.step == cfg.train.steps:
                    return run
        if state == "failed":
            _raise_recorded_failure(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        with _run_lock(run_dir):
            _clean_scratch(run_dir)
            state = _dir_state(cfg, run_dir)  # again, now that we hold the lock
            if state == "failed":
                _raise_recorded_failure(run_dir)
            if state == "new":
                write_json(run_dir / "config.json", cfg.to_dict())
            run = new_run(cfg)
            done = complete_checkpoints(run_dir)
            if done:
                load_checkpoint(run, run_dir, done[-1])
                if state == "done" and run.step == cfg.train.steps:
                    return run
            elif cfg.parent:
                _start_from_parent(run, cfg.parent)
            try:
                fit(run, run_dir=run_dir, task=task, eval_batch=ev, progress=progress, sampler=sampler,
                    logger=logger)
            except TrainingDiverged as e:
                write_json(run_dir / "failed.json", {"step": e.step, "error": e.error})
                raise
            _finish(run, run_dir)
    return run


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_owner(lock: Path) -> int | None:
    """The pid in ``lock`` (0 if the file is empty or garbage), or ``None`` if there is no lock."""
    try:
        text = lock.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else 0


def _live_other(pid: int | None) -> bool:
    return bool(pid) and pid != os.getpid() and _pid_alive(pid)


@contextlib.contextmanager
def _dir_mutex(folder: Path):
    """An exclusive ``flock`` on ``folder`` (released by the kernel if we die): serialises lock takeovers."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def _run_lock(run_dir: Path):
    """One trainer per run directory: ``.lock`` holds the owner's pid from the moment it exists.

    The pid is written to a private temp file first, which is then hard-linked to
    ``.lock`` (fails if a lock exists) - so no process ever sees an empty lock. A
    lock whose pid is dead (or empty/garbage, from an older version) is stale: it
    is replaced by an atomic rename, under an ``flock`` on the directory so that two
    processes taking over the same stale lock cannot both win.
    """
    run_dir = Path(run_dir)
    lock = run_dir / ".lock"
    me = os.getpid()
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".lock.{me}.", suffix=".pid")
    try:
        os.write(fd, str(me).encode())
        os.fsync(fd)
        os.close(fd)
        for _ in range(100):
            try:
                os.link(tmp, lock)
                break
            except FileExistsError:
                pass
            owner = _lock_owner(lock)
            if owner is None:
                continue  # released in the meantime: try to create it again
            if _live_other(owner):
                raise RunLocked(f"{run_dir} is being trained by process {owner} (remove {lock} if that is wrong)")
            with _dir_mutex(run_dir):
                owner = _lock_owner(lock)
                if owner is None:
                    continue
                if _live_other(owner):
                    raise RunLocked(f"{run_dir} is being trained by process {owner} (remove {lock} if that is wrong)")
                os.replace(tmp, lock)  # the stale lock is replaced by ours in one step
                break
        else:  # pragma: no cover - would need 100 lost races in a row
            raise RunLocked(f"could not lock {run_dir}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:
        yield
    finally:
        if _lock_owner(lock) == me:
            lock.unlink(missing_ok=True)


def clone_run(run: Run, cfg: RunConfig | None = None) -> Run:
    """An in-memory copy of ``run`` (model, optimizer state, generators, step, metrics),
    optionally under a new config (e.g. another gate path, data mix, lr or weight decay:
    the new config's lr and weight decay apply to the copied optimizer)."""
    cfg = cfg or run.config
    new = new_run(cfg)
    new.model.load_state_dict(run.model.state_dict())
    new.optimizer.load_state_dict(copy.deepcopy(run.optimizer.state_dict()))
    _apply_hparams(new.optimizer, cfg.train)
    new.data_gen.set_state(run.data_gen.get_state())
    new.dropout_gen.set_state(run.dropout_gen.get_state())
    new.step, new.metrics = run.step, copy.deepcopy(run.metrics)
    return new


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
    pcfg = RunConfig.from_dict(read_json(parent_dir / "config.json"))
    cfg = branch_config(pcfg, parent_dir, step, path=path, steps=steps, **train_overrides)
    return train(cfg, run_dir, progress=progress)


def read_metrics(run_dir: str | Path):
    """``metrics.csv`` as a pandas DataFrame."""
    import pandas as pd

    return pd.read_csv(Path(run_dir) / "metrics.csv")


def run_steps(run_dir: str | Path) -> list[int]:
    """Checkpoint steps present (complete) in a run directory."""
    return complete_checkpoints(Path(run_dir))

