"""Which executor trains a sweep fastest *on this machine*: measured, cached, never assumed.

Whether training runs together as one stacked model (:mod:`circuitfade.train.ensemble`) beats
training them one by one depends on the machine: on a CPU whose single step has a large fixed
part the ensemble is faster, on one with a small fixed part it is not. So no speed figure
measured on one machine decides the default on another. ``run_sweep(executor="auto")`` (and the
studies' default ``--executor auto``) asks :func:`choose_executor`, which times short runs of
the sweep's own model shape here, one by one and as ensembles of a few sizes, and picks the
ensemble only where it is faster by a margin (:data:`MARGIN`); otherwise the pool of single
runs. The measurement is cached per machine (:func:`~circuitfade.model.devices.machine`), model
shape and version of the timed code (:func:`code_fingerprint`) in ``$CIRCUITFADE_CACHE`` (default ``~/.cache/circuitfade``) and takes a few
seconds; ``executor="local"`` or ``"ensemble"`` (or ``CIRCUITFADE_EXECUTOR``) forces either.

Runs are the same files whichever executor trains them (each ensemble member is bit-identical
to its single run on the CPU), so the choice changes only the time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from circuitfade.io import read_json, write_json
from circuitfade.model.devices import machine
from circuitfade.train.config import RunConfig

__all__ = ["ExecutorChoice", "choose_executor", "ensemble_size_here", "decide", "measure_speedups", "code_fingerprint",
           "CANDIDATE_MEMBERS", "MARGIN", "TIMED_CODE",
           "CACHE_ENV", "EXECUTOR_ENV"]

CANDIDATE_MEMBERS = (4, 16)
"""Ensemble sizes the calibration tries (larger ones cost memory: about 30 MiB a member for the base model)."""
MARGIN = 1.05
"""The ensemble is chosen only if it trains at least this many times as many runs per second as
single runs do: within the margin the two are the same to the timer's noise, and the pool of
single runs (one run per core, no shared state) is the safer default."""
CACHE_ENV = "CIRCUITFADE_CACHE"
EXECUTOR_ENV = "CIRCUITFADE_EXECUTOR"
CALIBRATION_STEPS = 24


@dataclass(frozen=True)
class ExecutorChoice:
    """What :func:`choose_executor` decided and why."""

    executor: str  # "local" or "ensemble"
    members: int | None  # most members per ensemble (None for "local")
    speedups: dict[int, float] = field(default_factory=dict)  # E -> runs/second of an ensemble of E / of single runs
    machine: dict = field(default_factory=dict)
    source: str = "measured"  # measured | cache | forced | not applicable

    def describe(self) -> str:
        """One line for logs and study pages."""
        measured = ", ".join(f"E={e}: {s:.2f}x" for e, s in sorted(self.speedups.items()))
        what = self.executor if self.members is None else f"{self.executor} (E <= {self.members})"
        return f"executor {what} [{self.source}{'; ' + measured if measured else ''}]"


def decide(speedups: dict[int, float], margin: float = MARGIN) -> tuple[str, int | None]:
    """The rule: the ensemble size with the highest speedup over single runs if that speedup is at
    least ``margin``, else single runs (``("local", None)``)."""
    if not speedups:
        return "local", None
    best = max(speedups, key=lambda e: (speedups[e], -e))
    return ("ensemble", best) if speedups[best] >= margin else ("local", None)


def _short(cfg: RunConfig, seed: int, steps: int) -> RunConfig:
    """A ``steps``-step run of ``cfg``'s shape, eager (a compile would cost more than such a run's steps)."""
    d = cfg.to_dict()
    d["seed"] = seed
    d["train"] = {**d["train"], "steps": steps, "eval_every": steps, "checkpoint_every": steps,
                  "extra_checkpoints": []}
    d["train"].pop("compile", None)
    try:
        return RunConfig.from_dict(d)
    except ValueError:  # a gate path whose transitions lie past the short budget: time the same shape unforced
        return RunConfig.from_dict({**d, "path": "unforced"})


def measure_speedups(cfg: RunConfig, members: Sequence[int] = CANDIDATE_MEMBERS, *,
                     steps: int = CALIBRATION_STEPS) -> dict[int, float]:
    """Runs per second of ensembles of each size in ``members`` over runs per second of single runs,
    for short runs (``steps`` steps, one evaluation) of ``cfg``'s shape, timed here in this process
    by its CPU time (one torch thread), which other processes on the machine disturb less than
    wall time does."""
    from circuitfade.train.ensemble import train_ensemble
    from circuitfade.train.loop import train

    with tempfile.TemporaryDirectory(prefix="circuitfade-calibration-") as tmp:
        root = Path(tmp)
        train(_short(cfg, 0, 2), root / "warmup", progress=False)  # first-call costs out of the timings
        single = []
        for i in range(2):
            t0 = time.process_time()
            train(_short(cfg, 1 + i, steps), root / f"single{i}", progress=False)
            single.append(time.process_time() - t0)
        per_run = min(single)
        speedups = {}
        for e in members:
            cfgs = [_short(cfg, 100 + j, steps) for j in range(e)]
            t0 = time.process_time()
            train_ensemble(cfgs, [root / f"ens{e}" / str(j) for j in range(e)])
            speedups[int(e)] = per_run / ((time.process_time() - t0) / e)
    return speedups


def _cache_file() -> Path:
    base = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "circuitfade")
    return Path(base) / "executor.json"


TIMED_CODE = ("circuitfade.model.fused", "circuitfade.model.priors", "circuitfade.train.stacked",
              "circuitfade.train.ensemble", "circuitfade.train.loop", "circuitfade.train.optim")
"""The modules whose code the calibration times: a change to any of them (a new release, a local
edit) measures again instead of reading what the old code measured."""


def code_fingerprint() -> str:
    """A hash of the package version and the source of :data:`TIMED_CODE`."""
    import importlib

    from circuitfade import __version__

    h = hashlib.sha256(__version__.encode())
    for name in TIMED_CODE:
        h.update(Path(importlib.import_module(name).__file__).read_bytes())
    return h.hexdigest()[:16]


def _key(cfg: RunConfig, info: dict) -> str:
    from circuitfade.train.ensemble import ensemble_key

    blob = json.dumps({"machine": info, "shape": json.loads(ensemble_key(cfg)), "code": code_fingerprint()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _measured(configs: Sequence[RunConfig], measure: Callable[[RunConfig], dict[int, float]] | None,
              cache: bool) -> tuple[dict[int, float], dict, str] | None:
    """``(speedups, machine, "cache" | "measured")`` of :func:`measure_speedups` for the most common
    model shape among ``configs`` that can share an ensemble, cached per machine and shape; ``None``
    when fewer than two of them share a shape."""
    from circuitfade.train.ensemble import ensemble_refusal

    members = [c for c in configs if ensemble_refusal(c) is None]
    if len(members) < 2:
        return None
    by_shape: dict[str, list[RunConfig]] = {}
    info = machine()
    for c in members:
        by_shape.setdefault(_key(c, info), []).append(c)
    key, group = max(by_shape.items(), key=lambda kv: len(kv[1]))
    if len(group) < 2:
        return None
    path = _cache_file()
    table = {}
    if cache and path.is_file():
        try:
            table = dict(read_json(path))
        except (OSError, ValueError):
            table = {}  # an unreadable cache is measured again and rewritten
        if key in table:
            return {int(e): float(s) for e, s in table[key]["speedups"].items()}, info, "cache"
    speedups = (measure or measure_speedups)(group[0])
    if cache:
        table[key] = {"speedups": {str(k): v for k, v in speedups.items()}, "machine": info,
                      "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, table)
        except OSError:
            pass  # a read-only home: the choice stands, measured again next time
    return speedups, info, "measured"


def choose_executor(configs: Sequence[RunConfig], *, measure: Callable[[RunConfig], dict[int, float]] | None = None,
                    cache: bool = True) -> ExecutorChoice:
    """The executor for training ``configs`` here: ``CIRCUITFADE_EXECUTOR`` if set (``local`` or
    ``ensemble``); ``local`` when fewer than two runs could share an ensemble; else the
    :func:`decide` rule on :func:`measure_speedups` of the most common model shape, cached per
    machine and shape. ``measure`` replaces the timing (tests)."""
    forced = os.environ.get(EXECUTOR_ENV)
    if forced:
        if forced not in ("local", "ensemble"):
            raise ValueError(f"{EXECUTOR_ENV}={forced!r}: expected 'local' or 'ensemble'")
        return ExecutorChoice(forced, None, source="forced")
    measured = _measured(configs, measure, cache)
    if measured is None:
        return ExecutorChoice("local", None, source="not applicable")
    speedups, info, source = measured
    executor, e = decide(speedups)
    return ExecutorChoice(executor, e, speedups, info, source)


def ensemble_size_here(configs: Sequence[RunConfig], *, measure: Callable[[RunConfig], dict[int, float]] | None = None,
                       cache: bool = True) -> int | None:
    """The ensemble size of :data:`CANDIDATE_MEMBERS` that trained the most runs per second here
    (the same cached measurement as :func:`choose_executor`), for ``run_sweep(executor="ensemble")``
    without an ``ensemble_size``; ``None`` when fewer than two of ``configs`` share a shape."""
    measured = _measured(configs, measure, cache)
    if measured is None:
        return None
    speedups = measured[0]
    return max(speedups, key=lambda e: (speedups[e], -e))
