"""Live training state: :class:`Run` (model, optimizer, generators, step, metrics), how a
fresh one is made (:func:`new_run`) and copied (:func:`clone_run`), and the optimizer's state
as flat tensors (so checkpoints need no pickle).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from dataclasses import dataclass, field
from typing import Mapping

import torch

from circuitfade.io import CheckpointError
from circuitfade.model import SoftPriorTransformer
from circuitfade.model.devices import resolve_device
from circuitfade.train.config import RunConfig, TrainConfig

__all__ = ["Run", "new_run", "clone_run", "make_optimizer", "apply_hparams", "one_thread",
           "optimizer_to_tensors", "optimizer_from_tensors", "check_optimizer_tensors", "ADAMW_STATE",
           "ADAMW_FIXED"]

ADAMW_STATE = ("exp_avg", "exp_avg_sq", "step")
"""The optimizer state kept per parameter (AdamW without amsgrad), saved as ``optim.<index>.<key>``."""


def optimizer_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, val in state.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(val)
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": json.dumps(groups)}


def check_optimizer_tensors(opt: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str],
                            source: str, step: int, required: tuple[int, ...] = ()) -> None:
    """Raise :class:`~circuitfade.io.CheckpointError` naming ``source`` unless the ``optim.*``
    tensors and ``param_groups`` metadata are a state :func:`optimizer_from_tensors` can load
    into ``opt`` for global step ``step``.

    Checked: every ``optim.<i>.<key>`` names a parameter index ``i`` of ``opt`` and a key of
    :data:`ADAMW_STATE`; each index present has all three keys; ``exp_avg`` and
    ``exp_avg_sq`` have the parameter's shape and dtype and finite values, ``exp_avg_sq`` none
    below 0; ``step`` is a
    scalar whole number in ``[1, step]`` (a parameter is stepped at most once per global
    step); every index in ``required`` is present; ``param_groups`` is JSON naming each
    parameter index exactly once, and each group holds the settings of ``opt``'s (betas, eps,
    amsgrad, maximize...: :data:`ADAMW_FIXED`) and a finite lr and weight decay >= 0.
    """
    params = [p for g in opt.param_groups for p in g["params"]]
    seen: dict[int, set[str]] = {}
    for name, t in tensors.items():
        if not name.startswith("optim."):
            continue
        parts = name.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params) or parts[2] not in ADAMW_STATE:
            raise CheckpointError(f"{source}: unexpected optimizer tensor {name!r} (expected optim.<index>."
                                  f"{{{'|'.join(ADAMW_STATE)}}} with index < {len(params)}, the model's parameters)")
        i, key = int(parts[1]), parts[2]
        p = params[i]
        if key == "step":
            v = float(t) if t.dim() == 0 and t.is_floating_point() else math.nan
            if not (math.isfinite(v) and v == int(v) and 1 <= v <= step):
                raise CheckpointError(f"{source}: {name} should be a scalar step count in [1, {step}], got "
                                      f"{tuple(t.shape)} {t.dtype} {t.flatten()[:1].tolist()}")
        else:
            if tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
                raise CheckpointError(f"{source}: {name} has shape {tuple(t.shape)} {t.dtype}; the parameter it "
                                      f"belongs to has {tuple(p.shape)} {p.dtype}")
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{source}: {name} holds non-finite values (a corrupt file: the trainer "
                                      "never writes them)")
            if key == "exp_avg_sq" and not bool((t >= 0).all()):
                raise CheckpointError(f"{source}: {name} holds negative values (a corrupt file: AdamW's second "
                                      "moment is a running mean of squares, never below 0)")
        seen.setdefault(i, set()).add(key)
    partial = sorted(i for i, keys in seen.items() if keys != set(ADAMW_STATE))
    if partial:
        i = partial[0]
        raise CheckpointError(f"{source}: optimizer state of parameter {i} is incomplete: has "
                              f"{sorted(seen[i])}, expected {list(ADAMW_STATE)}")
    missing = [i for i in required if i not in seen]
    if missing:
        raise CheckpointError(f"{source}: no optimizer state for {len(missing)} parameters (indices "
                              f"{missing[:6]}) at step {step}; every parameter but the gate logits has it "
                              "after the first step")
    if "param_groups" not in meta:
        raise CheckpointError(f"{source}: no 'param_groups' metadata (the optimizer's settings)")
    try:
        groups = json.loads(meta["param_groups"])
        ids = sorted(i for g in groups for i in g["params"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{source}: 'param_groups' metadata is not the optimizer's settings ({e})") from None
    if ids != list(range(len(params))) or len(groups) != len(opt.param_groups):
        raise CheckpointError(f"{source}: 'param_groups' metadata names parameters {ids[:6]}...; the model has "
                              f"{len(params)} in {len(opt.param_groups)} group(s)")
    for k, (g, mine) in enumerate(zip(groups, opt.param_groups)):
        _check_group(g, mine, f"{source}: 'param_groups' metadata, group {k}")


ADAMW_FIXED = ("betas", "eps", "amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
"""AdamW settings a state file must share with the optimizer the config makes (lr and weight decay
may differ: the config's win on resume, see :func:`apply_hparams`; fused/foreach are the kernel)."""


def _check_group(saved, mine: Mapping, where: str) -> None:
    """Raise :class:`CheckpointError` unless the saved param group ``saved`` holds the settings of the
    fresh optimizer's group ``mine`` (:data:`ADAMW_FIXED`, those recorded) and a usable lr and weight decay."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where} is not a settings object")
    for key in ADAMW_FIXED:
        if key not in saved or key not in mine:
            continue  # older torch versions record fewer settings; torch fills its defaults
        want, got = mine[key], saved[key]
        if not _same_setting(got, want):
            raise CheckpointError(f"{where}: {key} is {got!r}, but this run's AdamW has {want!r} (a corrupt or "
                                  "foreign file: the trainer never changes it)")
    for key in ("lr", "weight_decay"):
        v = saved.get(key)
        if not (_number(v) and math.isfinite(v) and v >= 0):
            raise CheckpointError(f"{where}: {key} is {v!r}; expected a finite number >= 0")


def _same_setting(got, want) -> bool:
    """Whether a setting read from JSON equals the optimizer's (tuples are lists there)."""
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_same_setting(a, b) for a, b in zip(got, want)))
    if isinstance(want, bool) or want is None:
        return got is want
    return _number(got) and float(got) == float(want)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def optimizer_from_tensors(opt: torch.optim.Optimizer, tensors: Mapping, meta: Mapping) -> None:
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
