"""Sweeps: a run is a pure function of its config; a sweep is a list of configs.

:func:`run_sweep` trains every config into ``root/<key>/`` where ``key`` is a
readable slug plus a hash of the config, so any executor finds finished runs
and never recomputes them. Executors:

* ``"local"`` (default) - a process pool, one worker per core, one torch thread
  per worker;
* ``"ray"`` - Ray tasks (``pip install 'circuitfade[ray]'``), on a local
  instance or the cluster at ``address``;
* ``"serial"`` - in this process (debugging).

A failed run is reported with its error and does not stop the others: an
exception, a diverged run (non-finite loss, :class:`~circuitfade.train.config.TrainingDiverged`,
status "failed" with the step), or a worker process that died (killed, out of
memory: status "failed", :data:`LOST_WORKER`; the runs it shared a pool with are
retried, each in its own process, and resume from their checkpoints).
Re-running a sweep after a crash trains only what is missing (and resumes
half-finished runs from their last checkpoint). Runs that branch from another
run of the same sweep (``config.parent``) wait for it: the sweep runs in waves.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
from tqdm import tqdm

from circuitfade.io import content_hash
from circuitfade.train.config import RunConfig
from circuitfade.train.jobs import LOST_WORKER, run_jobs
from circuitfade.train.loop import branch_config

__all__ = ["run_key", "run_dir_for", "child_of", "execute", "execute_job", "run_sweep", "EXECUTORS"]

EXECUTORS = ("local", "ray", "serial")


def _canonical(cfg: RunConfig) -> dict:
    d = cfg.identity()  # the device is not part of a run's identity
    d.pop("circuitfade_version", None)
    if d.get("parent"):
        d["parent"] = {"run": Path(d["parent"]["run"]).name, "step": d["parent"]["step"]}
    return d


def run_key(cfg: RunConfig) -> str:
    """Readable, unique directory name: ``<task>-<path>-s<seed>-<hash8>``."""
    h = content_hash(_canonical(cfg))[:8]
    slug = f"{cfg.task['name']}-{cfg.path}".replace("->", "to").replace("@", "at").replace(":", "_")
    slug = "".join(c if c.isalnum() or c in "._+-" else "_" for c in slug)
    return f"{slug}-s{cfg.seed}-{h}"


def run_dir_for(root: str | Path, cfg: RunConfig) -> Path:
    return Path(root) / run_key(cfg)


def child_of(root: str | Path, parent: RunConfig, step: int, *, path: str, steps: int | None = None,
             **train_overrides) -> RunConfig:
    """Config of a branch from ``parent`` (trained in the same sweep root) at ``step``
    (:func:`circuitfade.train.loop.branch_config` with the parent's sweep directory)."""
    return branch_config(parent, run_dir_for(root, parent), step, path=path, steps=steps, **train_overrides)


def execute(config: dict, run_dir: str) -> dict:
    """Worker: train one run (``train`` computes with one torch thread) and report; never raises."""
    from circuitfade.train.loop import train

    t0 = time.time()
    try:
        cfg = RunConfig.from_dict(config)
        already = (Path(run_dir) / "done.json").is_file()
        run = train(cfg, run_dir, progress=False)
        final = run.metrics[-1] if run.metrics else {}
        return {"status": "cached" if already else "done", "error": None, "seconds": time.time() - t0, **final}
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return {"status": "failed", "error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}",
                "seconds": time.time() - t0}


def _waves(items: list[tuple[RunConfig, Path]]) -> list[list[tuple[RunConfig, Path]]]:
    dirs = {str(d.resolve()) for _, d in items}
    waves, placed = [], set()
    remaining = list(items)
    while remaining:
        wave = [
            (c, d) for c, d in remaining
            if not c.parent or str(Path(c.parent["run"]).resolve()) not in dirs or str(Path(c.parent["run"]).resolve()) in placed
        ]
        if not wave:
            raise ValueError("sweep configs have a cycle of parents")
        waves.append(wave)
        placed |= {str(d.resolve()) for _, d in wave}
        remaining = [x for x in remaining if x not in wave]
    return waves


def run_sweep(
    configs: Iterable[RunConfig],
    root: str | Path,
    *,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Train every config into ``root``; return one row per run (status, error, final metrics).

    Finished runs (``done.json`` present, same config) are not retrained. The local
    executor *spawns* worker processes, so a script calling this must do so under
    ``if __name__ == "__main__":`` (notebooks and the CLI need nothing).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    items, seen = [], set()
    for c in configs:
        d = run_dir_for(root, c)
        if d not in seen:
            items.append((c, d))
            seen.add(d)
    workers = workers or max(1, os.cpu_count() or 1)
    results: dict[Path, dict] = {}
    bar = tqdm(total=len(items), desc="runs", disable=not progress, unit="run")
    submit = _make_submitter(executor, workers, address)
    try:
        for wave in _waves(items):
            for d, res in submit([(c.to_dict(), str(d)) for c, d in wave]):
                results[Path(d)] = res
                bar.update(1)
                failed = sum(r["status"] == "failed" for r in results.values())
                bar.set_postfix(failed=failed)
    finally:
        bar.close()
    rows = []
    for c, d in items:
        r = results.get(d, {"status": "failed", "error": "not run"})
        rows.append({"run": d.name, "run_dir": str(d), "path": c.path, "seed": c.seed, "task": c.task["name"], **r})
    return pd.DataFrame(rows)


def _make_submitter(executor: str, workers: int, address: str | None):
    """A function mapping [(config, dir)] -> iterator of (dir, result) as runs finish."""
    if executor == "serial":
        def serial(jobs):
            for cfg, d in jobs:
                yield d, execute(cfg, d)
        return serial

    if executor == "local":
        return lambda jobs: _local_pool(jobs, workers)

    try:
        import ray
    except ImportError as e:
        raise ImportError("executor 'ray' needs Ray: pip install 'circuitfade[ray]'") from e

    def ray_submit(jobs):
        if not ray.is_initialized():
            if address:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
        remote = ray.remote(num_cpus=1)(execute)
        refs = {remote.remote(cfg, d): d for cfg, d in jobs}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                yield refs[r], ray.get(r)

    return ray_submit


def execute_job(job: tuple[dict, str]) -> dict:
    return execute(*job)


def _lost(job: tuple[dict, str]) -> dict:
    return {"status": "failed", "error": LOST_WORKER, "seconds": math.nan}


def _local_pool(jobs, workers: int):
    """Run ``jobs`` in the one process pool (:func:`circuitfade.train.jobs.run_jobs`): a run whose
    own worker dies is reported failed (:data:`LOST_WORKER`), the others resume and finish."""
    for i, res in run_jobs(execute_job, jobs, workers=workers, inline=False, on_lost=_lost):
        yield jobs[i][1], res


def summarize(results: pd.DataFrame, by: Sequence[str] = ("path",), metrics: Sequence[str] = ("acc_zero", "acc_normal")) -> pd.DataFrame:
    """Mean ± sd over seeds of final metrics, grouped by ``by`` (failed runs excluded)."""
    ok = results[results.status != "failed"]
    agg = ok.groupby(list(by))[list(metrics)].agg(["mean", "std", "count"])
    return agg
