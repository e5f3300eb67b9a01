"""Live training state: :class:`Run` (model, optimizer, generators, step, metrics), how a
fresh one is made (:func:`new_run`) and copied (:func:`clone_run`). The optimizer's state as
flat tensors (so checkpoints need no pickle) is :mod:`circuitfade.train.rundir`'s.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch

from circuitfade.model import SoftPriorTransformer
from circuitfade.model.devices import resolve_device
from circuitfade.train.config import RunConfig, TrainConfig

__all__ = ["Run", "new_run", "clone_run", "make_optimizer", "apply_hparams", "one_thread"]

_MOVED = frozenset({"optimizer_to_tensors", "optimizer_from_tensors", "check_optimizer_tensors", "ADAMW_STATE",
                    "ADAMW_FIXED"})


def __getattr__(name: str):
    """The optimizer's (de)serialization moved to :mod:`circuitfade.train.rundir` (the files it
    belongs to); the old names here still work, with a DeprecationWarning. (No import here: the
    package ``circuitfade.train`` loads ``rundir`` before any of its modules is used, and ``rundir``
    builds on this module, not the other way round.)"""
    if name in _MOVED:
        import sys
        import warnings

        warnings.warn(f"circuitfade.train.state.{name} moved to circuitfade.train.rundir.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(sys.modules["circuitfade.train.rundir"], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
    compile_seconds: float | None = None  # the first compiled step's seconds (config.train.compile)


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    # every parameter is registered (masked gate logits simply never get a gradient),
    # so optimizer state lines up across gate modes and branches can copy it
    # fused=True: one kernel per parameter instead of a Python loop of ops (4.3 -> 0.9 ms per step on the
    # base model, one CPU thread); deterministic on a given device. A resumed run keeps the implementation
    # recorded in its checkpoint's param_groups, so old checkpoints resume exactly as they started.
    return torch.optim.AdamW(list(model.parameters()), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)


def apply_hparams(opt: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """The config's lr and weight decay win over restored ``param_groups`` (branches may change them)."""
    for g in opt.param_groups:
        g["lr"], g["weight_decay"] = cfg.lr, cfg.weight_decay


@contextlib.contextmanager
def one_thread():
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
    opt = make_optimizer(model, cfg.train)
    data_gen = torch.Generator().manual_seed(cfg.seed)
    dropout_gen = torch.Generator().manual_seed(cfg.seed + 7919)
    return Run(cfg, model, opt, data_gen, dropout_gen)


def clone_run(run: Run, cfg: RunConfig | None = None) -> Run:
    """An in-memory copy of ``run`` (model, optimizer state, generators, step, metrics),
    optionally under a new config (e.g. another gate path, data mix, lr or weight decay:
    the new config's lr and weight decay apply to the copied optimizer)."""
    cfg = cfg or run.config
    new = new_run(cfg)
    new.model.load_state_dict(run.model.state_dict())
    new.optimizer.load_state_dict(copy.deepcopy(run.optimizer.state_dict()))
    apply_hparams(new.optimizer, cfg.train)
    new.data_gen.set_state(run.data_gen.get_state())
    new.dropout_gen.set_state(run.dropout_gen.get_state())
    new.step, new.metrics = run.step, copy.deepcopy(run.metrics)
    return new
