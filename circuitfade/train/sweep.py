"""Sweeps: a run is a pure function of its config; a sweep is a list of configs.

:func:`run_sweep` trains every config into ``root/<key>/`` where ``key`` is a
readable slug plus a hash of the config, so any executor finds finished runs
and never recomputes them. Executors:

* ``"local"`` (default) - a process pool, one worker per core, one torch thread
  per worker;
* ``"ensemble"`` - runs of one model shape, task and step budget
  (:func:`~circuitfade.train.ensemble.ensemble_key`) trained together as stacked
  models of up to ``ensemble_size`` members
  (:func:`~circuitfade.train.ensemble.train_ensemble`; each member computes what its
  single run computes and writes the usual run directory), ensembles in the
  process pool; runs that cannot be members (branches, rotary positions) and
  finished runs go through the single trainer;
* ``"ray"`` - Ray tasks (``pip install 'circuitfade[ray]'``), on a local
  instance or the cluster at ``address`` (checked within seconds: an address
  where nothing answers is a one-line ``ValueError``; a task whose worker dies on
  every attempt is reported failed, :data:`LOST_WORKER`);
* ``"serial"`` - in this process (debugging).

A failed run is reported with its error and does not stop the others: an
exception, a diverged run (non-finite loss, :class:`~circuitfade.train.config.TrainingDiverged`,
status "failed" with the step), or a worker process that died (killed, out of
memory: status "failed", :data:`LOST_WORKER`; the runs it shared a pool with are
retried, each in its own process, and resume from their checkpoints).
Re-running a sweep after a crash trains only what is missing (and resumes
half-finished runs from their last checkpoint); a finished run is reused whichever
executor trained it (the run directory is the same). Runs that branch from another
run of the same sweep (``config.parent``) wait for it: the sweep runs in waves.
"""

from __future__ import annotations

import math
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
from tqdm import tqdm

from circuitfade.io import content_hash
from circuitfade.train.config import RunConfig
from circuitfade.train.ensemble import default_ensemble_size, ensemble_key, ensemble_refusal
from circuitfade.train.jobs import LOST_WORKER, run_jobs
from circuitfade.train.loop import branch_config
from circuitfade.train.rundir import RunDir

__all__ = ["run_key", "run_dir_for", "child_of", "execute", "execute_job", "execute_ensemble", "run_sweep",
           "plan_jobs", "check_ray_address", "EXECUTORS", "EXECUTOR_HELP"]

EXECUTORS = ("local", "ensemble", "auto", "ray", "serial")
EXECUTOR_HELP = ("auto (default: the ensemble where it measured faster on this machine for these runs' shape, else the "
                 "local pool; cached), ensemble (runs of one shape as stacked models, members identical to their single "
                 "runs), local process pool, ray or serial; CIRCUITFADE_EXECUTOR=local|ensemble forces auto's choice")
RAY_CONNECT_TIMEOUT_S = 5.0  # an --address where nothing answers fails after this long
RAY_MAX_RETRIES = 1  # a Ray task whose worker dies is tried once more, then reported failed


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
        already = RunDir(run_dir).is_done()
        run = train(cfg, run_dir, progress=False)
        final = run.metrics[-1] if run.metrics else {}
        return {"status": "cached" if already else "done", "error": None, "seconds": time.time() - t0, **final}
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return {"status": "failed", "error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}",
                "seconds": time.time() - t0}


def execute_ensemble(configs: Sequence[dict], run_dirs: Sequence[str]) -> list[dict]:
    """Worker: train runs as one ensemble (:func:`~circuitfade.train.ensemble.train_ensemble`) and
    report one row per member, as :func:`execute` does for one run; never raises. ``seconds``
    is the ensemble's wall time (every member's, trained together); ``ensemble`` the number of
    members."""
    from circuitfade.train.ensemble import train_ensemble

    t0 = time.time()
    already = [RunDir(d).is_done() for d in run_dirs]
    try:
        outs = train_ensemble([RunConfig.from_dict(c) for c in configs], list(run_dirs), progress=False)
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        failed = {"status": "failed", "error": err, "seconds": time.time() - t0, "ensemble": len(configs)}
        return [_finished(d, was, failed) for d, was in zip(run_dirs, already)]
    dt = time.time() - t0
    return [{"status": o.status.value, "error": o.error, "seconds": dt, "ensemble": len(configs), **o.final}
            for o in outs]


def plan_jobs(items: Sequence[tuple[RunConfig, Path]], size: int, workers: int = 1) -> list[list[tuple[RunConfig, Path]]]:
    """The ensemble executor's jobs: runs that share :func:`~circuitfade.train.ensemble.ensemble_key`
    in groups of at most ``size`` (sweep order kept within a group); a run that cannot be a member,
    or is already finished (``done.json``), is a job of its own (the single trainer).

    A group becomes ``ceil(members / size)`` ensembles, members spread evenly over them; while
    there are fewer jobs than ``workers``, the group with the most members per ensemble is split
    once more, so no worker idles while another trains a large ensemble (one ensemble computes
    with one thread)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"ensemble_size must be a positive integer, got {size!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    jobs: list[list[tuple[RunConfig, Path]]] = []
    groups: dict[str, list[tuple[RunConfig, Path]]] = {}
    for c, d in items:
        if ensemble_refusal(c) is not None or RunDir(d).is_done():
            jobs.append([(c, d)])
        else:
            groups.setdefault(ensemble_key(c), []).append((c, d))
    members = list(groups.values())
    splits = [math.ceil(len(m) / size) for m in members]
    while members and len(jobs) + sum(splits) < workers:
        g = max(range(len(members)), key=lambda i: len(members[i]) / splits[i])
        if len(members[g]) <= splits[g]:
            break  # every ensemble is down to one member
        splits[g] += 1
    for group, n in zip(members, splits):
        for k in range(n):
            jobs.append(group[k::n])
    return jobs


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
    ensemble_size: int | None = None,
) -> pd.DataFrame:
    """Train every config into ``root``; return one row per run (status, error, final metrics).

    Finished runs (``done.json`` present, same config) are not retrained, whichever executor
    trained them. The local and ensemble executors start worker processes that import the
    calling script's main module, so a script calling this must do so under
    ``if __name__ == "__main__":`` (notebooks and the CLI need nothing). ``ensemble_size``: most members per ensemble (executor ``"ensemble"``; default on the
    CPU: the size that trained the most runs per second in this machine's calibration,
    :func:`~circuitfade.train.calibrate.ensemble_size_here`, cached; on another device
    :func:`~circuitfade.train.ensemble.default_ensemble_size`). With
    ``executor="ray"`` and an ``address``, an address where nothing answers within
    :data:`RAY_CONNECT_TIMEOUT_S` seconds raises ``ValueError`` (one line) before any work.
    ``executor="auto"``: the ensemble or the local pool, whichever
    :func:`~circuitfade.train.calibrate.choose_executor` measured faster on this machine for
    these runs' shape (cached; a few seconds the first time), with its ensemble size unless
    ``ensemble_size`` is given.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
    configs = list(configs)
    if executor == "auto":
        from circuitfade.train.calibrate import choose_executor

        choice = choose_executor(configs)
        if progress:
            tqdm.write(choice.describe())
        executor = choice.executor
        ensemble_size = ensemble_size or choice.members
    if ensemble_size is not None and (isinstance(ensemble_size, bool) or not isinstance(ensemble_size, int)
                                      or ensemble_size < 1):
        raise ValueError(f"ensemble_size must be a positive integer, got {ensemble_size!r}")
    if executor == "ensemble" and ensemble_size is None and configs \
            and all(c.train.device == "cpu" for c in configs):
        from circuitfade.train.calibrate import ensemble_size_here

        ensemble_size = ensemble_size_here(configs)  # measured on this machine (cached), not a constant
    if executor == "ray" and address:
        check_ray_address(address)
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
            if executor == "ensemble":
                stream = _ensemble_pool(wave, workers, ensemble_size)
            else:
                stream = submit([(c.to_dict(), str(d)) for c, d in wave])
            for d, res in stream:
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

    if executor in ("local", "ensemble"):
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
        # execute_job is looked up now (as the local pool does), so it can be replaced in tests
        remote = ray.remote(num_cpus=1, max_retries=RAY_MAX_RETRIES)(execute_job)
        refs = {remote.remote((cfg, d)): d for cfg, d in jobs}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                try:
                    res = ray.get(r)
                except ray.exceptions.RayError as e:  # the worker died on every attempt (killed, out of memory)
                    res = {"status": "failed", "error": f"{LOST_WORKER} ({type(e).__name__}, "
                                                        f"{RAY_MAX_RETRIES + 1} attempts)", "seconds": math.nan}
                yield refs[r], res

    return ray_submit


def execute_job(job: tuple[dict, str]) -> dict:
    return execute(*job)


def _lost(job: tuple[dict, str]) -> dict:
    return {"status": "failed", "error": LOST_WORKER, "seconds": math.nan}


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise ``ValueError`` (one line) unless something accepts a TCP connection at Ray ``address``
    (``host:port`` or ``ray://host:port``) within ``timeout`` seconds; ``"auto"`` and ``"local"``
    are left to Ray. (``ray.init`` itself retries an unreachable address for minutes.)"""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: expected host:port, ray://host:port, 'auto' or 'local'")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ValueError(f"--address {address!r}: no Ray cluster answers there within {timeout:g} s "
                         f"({reason})") from None


def execute_plan(job: list[tuple[dict, str]]) -> list[tuple[str, dict]]:
    """Worker of the ensemble executor: one run (:func:`execute`) or an ensemble (:func:`execute_ensemble`)."""
    if len(job) == 1:
        cfg, d = job[0]
        return [(d, {**execute(cfg, d), "ensemble": 1})]
    rows = execute_ensemble([c for c, _ in job], [d for _, d in job])
    return [(d, r) for (_, d), r in zip(job, rows)]


def _lost_plan(job: list[tuple[dict, str]]) -> list[tuple[str, dict]]:
    lost = {"status": "failed", "error": LOST_WORKER, "seconds": math.nan, "ensemble": len(job)}
    return [(d, _finished(d, False, lost)) for _, d in job]


def _finished(run_dir: str | Path, already: bool, failed: dict) -> dict:
    """The row of an ensemble member when its ensemble stopped: a member with ``done.json`` is done
    (``cached`` when it was before), with its recorded final metrics; any other is ``failed``."""
    try:
        rec = RunDir(run_dir).read_done()
        final = rec.get("final", {}) if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return dict(failed)
    return {**{k: v for k, v in failed.items() if k in ("seconds", "ensemble")},
            "status": "cached" if already else "done", "error": None, **(final if isinstance(final, dict) else {})}


def _ensemble_pool(wave: list[tuple[RunConfig, Path]], workers: int, size: int | None):
    """The ensemble executor on one wave: :func:`plan_jobs`, then the process pool (an ensemble whose
    own worker dies is reported failed for every member, the other jobs finish)."""
    if size is None:
        size = default_ensemble_size(wave[0][0].train.device) if wave else 1
    jobs = [[(c.to_dict(), str(d)) for c, d in job] for job in plan_jobs(wave, size, workers)]
    for _, rows in run_jobs(execute_plan, jobs, workers=workers, inline=False, on_lost=_lost_plan):
        for d, res in rows:
            yield Path(d), res


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
