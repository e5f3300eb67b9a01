"""The K-part apparatus every experiment of the alignment study shares: its fixed settings,
the base run config, job keys, training until ignition, and the cached job runner.

The apparatus (:mod:`circuitfade.tasks.kpart`, V = 3, one distractor, the pinned one-layer
preset of :func:`circuitfade.tasks.kpart.kpart_model`) is fixed here once; the experiments
(:mod:`.parts`, :mod:`.cure`, :mod:`.ignition`, :mod:`.precursor`, :mod:`.occupation`,
:mod:`.anneal`, :mod:`.fdt`) import it and nothing from each other's internals.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Callable, Mapping

from tqdm import tqdm

from circuitfade.analysis.ignition import ignition_step
from circuitfade.gating.evaluation import evaluate_batch
from circuitfade.io import content_hash, read_json, write_json
from circuitfade.tasks import EVAL_SEED, eval_set, make_task
from circuitfade.tasks.kpart import kpart_model
from circuitfade.train import RunConfig, TrainConfig, load_checkpoint, new_run, save_checkpoint, train
from circuitfade.train.checkpoints import write_metrics
from circuitfade.train.jobs import run_jobs
from circuitfade.train.rundir import RunDir
from studies.alignment.protocol import PARTS_V1

__all__ = ["TASK", "V", "N_DISTRACTORS", "BATCH", "LR", "EVAL_EVERY", "EVAL_SIZE", "CHUNK", "REINIT_EVAL_EVERY",
           "THRESHOLD", "PATIENCE", "MARGIN", "BASE_CAP", "WAIT_CAP", "base_config", "job_key", "acc_curve",
           "until_ignition", "check_finite", "persist", "first_acc", "run_cached_jobs", "cached_job", "is_pinned",
           "from_scratch", "from_source", "cure_row"]

V, N_DISTRACTORS = 3, 1
TASK = {"name": "kpart", "v": V, "n_distractors": N_DISTRACTORS}
"""Task settings of every cell (K is added per cell). V = 3 keeps K = 5 trainable in
~7k steps; the K = 6 circuit did not ignite within 2,500 steps in a probe and is left
out of the trained cells (the apparatus and the hand-built circuit cover K = 2..6)."""
BATCH, LR = 128, 3e-3
EVAL_EVERY, EVAL_SIZE, CHUNK = 25, 256, 100
REINIT_EVAL_EVERY = 5  # re-ignition can take only tens of steps: evaluate finely after re-initialisation
THRESHOLD, PATIENCE = 0.5, 2  # ignition: half way from chance to 1, two evaluations in a row
MARGIN = 200  # steps observed after ignition before a job stops
BASE_CAP = {int(k): int(v) for k, v in PARTS_V1.data["base_cap"].items()}
WAIT_CAP = int(PARTS_V1.data["wait_cap"])  # steps after re-initialisation


def base_config(k: int, seed: int, steps: int, *, pinned: bool = True) -> RunConfig:
    """The run config of the K-part circuit trained from scratch for ``steps`` steps, on the pinned
    (default) or the unpinned preset of :func:`~circuitfade.tasks.kpart.kpart_model`."""
    task = {**TASK, "k": int(k)}
    tc = TrainConfig(steps=int(steps), batch_size=BATCH, lr=LR, eval_every=EVAL_EVERY, eval_size=EVAL_SIZE,
                     checkpoint_every=int(steps), eval_conditions=("normal",))
    return RunConfig(path="unforced", task=task, model=kpart_model(make_task(**task), pinned=pinned), train=tc,
                     seed=int(seed))


def is_pinned(spec: Mapping) -> bool:
    """Whether a job spec runs on the pinned apparatus (``spec["apparatus"]``, absent: pinned)."""
    apparatus = spec.get("apparatus", "pinned")
    if apparatus not in ("pinned", "unpinned"):
        raise ValueError(f"job spec: apparatus must be 'pinned' or 'unpinned', got {apparatus!r}")
    return apparatus == "pinned"


def from_scratch(run, cfg_at: Callable[[int], RunConfig], cap: int, chance: float) -> tuple[float | None, list, list]:
    """Train a new ``run`` (its step-0 evaluation recorded) in chunks of CHUNK steps until ignition + MARGIN
    or step ``cap``; returns the ignition step (None: censored) and the accuracy curve as recorded."""
    while True:
        steps = [int(m["step"]) for m in run.metrics]
        accs = [float(m["acc_normal"]) for m in run.metrics]
        ig = ignition_step(accs, steps=steps, baseline=chance, threshold=THRESHOLD, patience=PATIENCE)
        if (ig is not None and steps[-1] - ig >= MARGIN) or run.step >= cap:
            return ig, steps, accs
        train(cfg_at(min(run.step + CHUNK, cap)), None, run=run, progress=False)
        check_finite(run)


def job_key(spec: Mapping) -> str:
    """``<kind>[-<apparatus>]-k<K>[-m<m>]-s<seed>[-d<drive>]-<hash8>`` of a job spec (the apparatus only when
    the spec names one)."""
    h = content_hash(dict(spec))[:8]
    kind = spec["kind"] + (f"-{spec['apparatus']}" if "apparatus" in spec else "")
    parts = [kind, f"k{spec['k']}"] + ([f"m{spec['m']}"] if "m" in spec else []) + [f"s{spec['seed']}"]
    if spec.get("drive", 1.0) != 1.0:
        parts.append(f"d{spec['drive']}")
    return "-".join(parts) + f"-{h}"


def acc_curve(metrics: list[dict], start: int) -> tuple[list[int], list[float]]:
    rows = [(int(m["step"]), float(m["acc_normal"])) for m in metrics if int(m["step"]) > start]
    return [r[0] for r in rows], [r[1] for r in rows]


def until_ignition(run, cfg_at: Callable[[int], RunConfig], *, start: int, first: float, cap: int,
                    chance: float, before: Callable | None = None) -> tuple[float | None, list, list]:
    """Train ``run`` in chunks of CHUNK steps until ignition + MARGIN or ``start + cap``."""
    while True:
        steps, accs = acc_curve(run.metrics, start)
        steps, accs = [start] + steps, [first] + accs
        ig = ignition_step(accs, steps=steps, baseline=chance, threshold=THRESHOLD, patience=PATIENCE)
        if (ig is not None and steps[-1] - ig >= MARGIN) or run.step >= start + cap:
            return ig, steps, accs
        cfg = cfg_at(min(run.step + CHUNK, start + cap))
        if before is not None:
            before(run)
        train(cfg, None, run=run, progress=False)
        check_finite(run)


def check_finite(run) -> None:
    last = float(run.metrics[-1].get("train_loss", float("nan")))
    if not math.isfinite(last):
        raise FloatingPointError(f"non-finite training loss at step {run.step}: the run diverged")


def persist(run, run_dir: Path) -> None:
    """Write ``run`` (stopped at ``run.step``) as a run directory whose config ends at that step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    RunDir(run_dir).write_config(run.config)
    write_metrics(run_dir, run.metrics)
    save_checkpoint(run, run_dir)
    RunDir(run_dir).finish(run)


def from_source(spec: Mapping, out: str):
    """``(run, t0)``: the withheld run ``spec["source"]`` (under ``out/runs``) loaded at its step
    ``spec["w"]`` on one torch thread, and the process CPU clock when loading began (a cure job's start)."""
    import torch

    torch.set_num_threads(1)
    src = Path(out) / "runs" / job_key(spec["source"])
    t0 = time.process_time()
    run = new_run(RunDir(src).read_config())
    load_checkpoint(run, src, int(spec["w"]))
    return run, t0


def cure_row(spec: Mapping, run, ignition: int | None, curve: tuple[list, list], first: float, t0: float) -> dict:
    """A cure job's result: ``spec`` with status, ignition, delay after ``spec["w"]``, the accuracy
    right after re-initialisation, the final step, the accuracy curve and the CPU seconds since ``t0``."""
    w = int(spec["w"])
    return {**spec, "status": "ignited" if ignition is not None else "censored", "ignition": ignition,
            "delay": None if ignition is None else ignition - w, "acc_after_reinit": first, "final_step": run.step,
            "curve": list(curve), "cpu_s": time.process_time() - t0}


def first_acc(run) -> float:
    """Accuracy of ``run``'s model on the fixed evaluation set (``EVAL_SIZE`` sequences, seed ``EVAL_SEED``)."""
    task = run.config.make_task()
    return float(evaluate_batch(run.model, task, eval_set(task, n=EVAL_SIZE, seed=EVAL_SEED))["accuracy"])


def _guarded(fn: Callable[[Mapping, str], dict], out: str, spec: dict) -> dict:
    """Run one job; an exception becomes a ``"failed"`` record (reported, never a number)."""
    try:
        res = fn(spec, out)
        res["status"] = res.get("status", "done")
    except Exception as e:  # noqa: BLE001 - reported, never a number
        res = {**spec, "status": "failed", "error": f"{type(e).__name__}: {e}"}
    return res


def run_cached_jobs(fn: Callable[[Mapping, str], dict], specs: list[dict], out: Path, *, workers: int = 1,
                    progress: bool = False, desc: str = "jobs") -> list[dict]:
    """``fn(spec, out)`` for every spec not finished yet (``OUT/jobs/<job_key>.json``); every job's result.

    ``fn`` is a module-level function (it runs in :func:`circuitfade.train.jobs.run_jobs`'
    worker processes). A failed job is reported and retried next time (its record is not written).
    """
    out = Path(out)
    jobs = out / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    results, todo = {}, []
    for s in specs:
        f = jobs / f"{job_key(s)}.json"
        if f.is_file():
            results[job_key(s)] = read_json(f)
        else:
            todo.append(s)
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc=desc, disable=not progress)
    for i, res in run_jobs(functools.partial(_guarded, fn, str(out)), todo, workers=max(1, min(workers, len(todo) or 1))):
        spec = todo[i]
        if res.get("status") != "failed":  # a failure is reported, and retried next time
            write_json(jobs / f"{job_key(spec)}.json", res)
        results[job_key(spec)] = res
        bar.update(1)
    bar.close()
    return [results[job_key(s)] for s in specs]


def cached_job(fn: Callable[[Mapping, str], dict], spec: dict, out: Path) -> dict:
    """One job in this process, through the same cache as :func:`run_cached_jobs`."""
    return run_cached_jobs(fn, [spec], out)[0]
