"""Run configuration: :class:`TrainConfig` (optimisation, bookkeeping) and :class:`RunConfig`
(model, task, gate path, data mix, seed, parent), validated at construction.

A run is a pure function of its :class:`RunConfig`; :meth:`RunConfig.identity` is what
caches and resume checks compare.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

import torch

from circuitfade import __version__
from circuitfade.gating.evaluation import CONDITIONS
from circuitfade.gating.paths import GatePath, parse_path
from circuitfade.gating.schedules import Schedule, parse_schedule
from circuitfade.model import SoftPriorConfig
from circuitfade.model.devices import check_device_name
from circuitfade.tasks import EVAL_SIZE, Task, make_task

__all__ = ["TrainConfig", "RunConfig", "TrainingDiverged", "checkpoint_steps", "is_checkpoint_step", "MAX_SEED",
           "TRAIN_DTYPES", "check_trainable", "check_task_fits"]

MAX_SEED = 2**62  # seeds (and seed + small offsets) must fit torch's 64-bit generator seed


class TrainingDiverged(RuntimeError):
    """The loss, gradient norm or weights became non-finite at ``step``; the run did not finish."""

    def __init__(self, step: int, error: str):
        super().__init__(f"training diverged at step {step}: {error}")
        self.step, self.error = int(step), error


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
    # torch.compile the training forward: False (eager), True (inductor) or a torch.compile backend name.
    # Not part of the run's identity: compiled and eager runs differ by rounding only (see docs/benchmarks.md)
    compile: bool | str = False

    def __post_init__(self):
        check_device_name(self.device)
        if not isinstance(self.compile, (bool, str)) or self.compile == "":
            raise ValueError(f"TrainConfig.compile must be true, false or a torch.compile backend name, "
                             f"got {self.compile!r}")
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
            unknown = sorted(set(self.train) - {f.name for f in fields(TrainConfig)})
            if unknown:
                raise ValueError(f"RunConfig.train: unknown TrainConfig fields {unknown}; known: "
                                 f"{[f.name for f in fields(TrainConfig)]}")
            object.__setattr__(self, "train", TrainConfig(**self.train))
        elif not isinstance(self.train, TrainConfig):
            raise ValueError(f"RunConfig.train must be a TrainConfig or a mapping of its fields, got {self.train!r}")
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
        device = self.model.get("device")
        if device not in (None, "cpu"):
            raise ValueError(f"RunConfig.model.device: where a run trains is TrainConfig.device (--device), "
                             f"not a model field; got {device!r}")
        task = self.make_task()
        mc = self.model_config(task)  # model config errors surface now, naming the field
        check_trainable(mc)
        check_task_fits(task, mc)

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
        if d["train"]["compile"] is False:
            del d["train"]["compile"]  # likewise
        return {"circuitfade_version": __version__, **d}

    def identity(self) -> dict:
        """:meth:`to_dict` without the device and the compile switch: a run is the same experiment
        wherever and however it trains (cache keys and resume checks use this; devices and compiled
        kernels differ only by rounding)."""
        d = self.to_dict()
        d["train"].pop("device", None)
        d["train"].pop("compile", None)
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


TRAIN_DTYPES = (torch.float32, torch.float64)
"""The dtypes the trainer trains in (half precision is not supported by the soft-prior attention)."""


def check_trainable(mc: SoftPriorConfig) -> None:
    """Raise ``ValueError`` naming the field unless the trainer can train a model of config ``mc``:
    dtype in :data:`TRAIN_DTYPES`, and a positive ``d_mlp`` when the model has MLPs."""
    if mc.dtype not in TRAIN_DTYPES:
        raise ValueError(f"RunConfig.model.dtype: the trainer trains in float32 or float64, got "
                         f"{str(mc.dtype).removeprefix('torch.')}")
    if not mc.attn_only and (isinstance(mc.d_mlp, bool) or not isinstance(mc.d_mlp, int) or mc.d_mlp < 1):
        raise ValueError(f"RunConfig.model.d_mlp must be a positive integer when attn_only is false, got {mc.d_mlp!r}")


def check_task_fits(task: Task, mc: SoftPriorConfig) -> None:
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


def is_checkpoint_step(cfg: TrainConfig, step: int, start: int = 0) -> bool:
    """Whether a checkpoint is written at ``step`` for a run (or branch) that starts at ``start``:
    ``start``, every ``checkpoint_every`` steps from ``start``, the extras, and the end
    (computed, never enumerated, so a huge ``steps`` costs nothing)."""
    if not start <= step <= cfg.steps:
        return False
    return step in (start, cfg.steps) or (step - start) % cfg.checkpoint_every == 0 \
        or step in cfg.extra_checkpoints


def checkpoint_steps(cfg: TrainConfig, start: int = 0, *, limit: int = 100_000) -> list[int]:
    """Steps at which checkpoints are written: ``start``, every ``checkpoint_every``, extras, the end.

    Raises ``ValueError`` when there would be more than ``limit`` of them (the trainer itself
    uses :func:`is_checkpoint_step` and never builds this list)."""
    n = (cfg.steps - start) // cfg.checkpoint_every + 2 + len(cfg.extra_checkpoints)
    if n > limit:
        raise ValueError(f"checkpoint_steps: about {n} checkpoints (steps={cfg.steps}, checkpoint_every="
                         f"{cfg.checkpoint_every}); more than limit={limit}")
    steps = set(range(start, cfg.steps + 1, cfg.checkpoint_every)) | {start, cfg.steps}
    steps |= {s for s in cfg.extra_checkpoints if start <= s <= cfg.steps}
    return sorted(steps)
