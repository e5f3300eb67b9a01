"""The one process pool: :func:`run_jobs` runs a function over job specs in spawned workers.

Sweeps (:mod:`circuitfade.train.sweep`), the ``circuitfade demo`` command and every study
use it, so a pool's three hard parts are solved once:

* **a worker that dies** (killed, out of memory) breaks a ``ProcessPoolExecutor`` and every
  unfinished job with it, without saying which job was at fault. The jobs it took down are
  retried, each in a pool of its own; a job whose own worker dies is reported through
  ``on_lost(job)`` (default: raise :class:`WorkerLost`), the others finish.
* **workers die with their parent**: on Linux each worker asks the kernel to kill it when the
  process that started it exits (``PR_SET_PDEATHSIG``), so a SIGTERM or SIGKILL to a sweep
  or the demo leaves no orphan training queued runs.
* **Ctrl-C stops the pool, not just the current jobs**: workers ignore SIGINT (the terminal
  sends it to the whole process group); the parent, on ``KeyboardInterrupt`` (or any other
  exception), cancels the queued jobs and kills its workers before re-raising, so it never
  waits for the rest of a sweep to train (the trainer's files are written atomically and its
  run lock is released by the kernel, so a killed worker leaves nothing half-done).
* **one thread per worker** is the caller's business (the trainer pins it); the pool uses
  the ``spawn`` start method, so nothing of the parent's state leaks into a worker.

``fn`` must be a module-level function (it is pickled by name). Exceptions raised by ``fn``
are re-raised in the parent; a function that should report failures as rows catches them
itself (as :func:`circuitfade.train.sweep.execute` does).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import active_children, get_context
from typing import Any, Callable, Iterator, Sequence

__all__ = ["run_jobs", "WorkerLost", "LOST_WORKER"]

LOST_WORKER = "worker process died (killed by a signal, e.g. out of memory) while running this job"


class WorkerLost(RuntimeError):
    """A job's own worker process died (killed by a signal, out of memory)."""


def _die_with_parent(parent: int) -> None:
    """Pool initializer: ignore Ctrl-C (the parent handles it) and ask Linux to SIGKILL this
    worker when its parent exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: orphans possible, nothing else to do
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


class _Pool:
    """A spawned ``ProcessPoolExecutor`` that knows its worker processes (the children of this
    process that appeared after it was made), so :meth:`kill` can stop them."""

    def __init__(self, workers: int):
        self._before = set(active_children())
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                            initializer=_die_with_parent, initargs=(os.getpid(),))

    def kill(self) -> None:
        """Cancel the queued jobs and SIGKILL the workers (running jobs end where they are)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        for p in set(active_children()) - self._before:
            p.kill()
        self.executor.shutdown(wait=True)


def _raise_lost(job: Any) -> Any:
    raise WorkerLost(f"{LOST_WORKER}: {job!r}"[:500])


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], *, workers: int = 1,
             inline: bool | None = None, on_lost: Callable[[Any], Any] = _raise_lost,
             on_wait: Callable[[], None] | None = None, wait_s: float = 0.5) -> Iterator[tuple[int, Any]]:
    """Run ``fn(job)`` for every job; yield ``(index, result)`` as jobs finish (any order).

    ``inline=True`` runs in this process, in order: no pool, easy to debug; the default
    (``None``) does so for one worker or a single job. Otherwise up to ``workers`` spawned
    processes. ``on_lost(job)`` gives the result
    of a job whose own worker died (default: raise :class:`WorkerLost`); ``on_wait()`` is
    called every ``wait_s`` seconds while waiting (e.g. to drain a progress queue).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"run_jobs: workers must be a positive integer, got {workers!r}")
    jobs = list(jobs)
    if inline is None:
        inline = workers == 1 or len(jobs) <= 1
    if inline:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    timeout = wait_s if on_wait is not None else None
    broken: list[int] = []
    pool = _Pool(min(workers, len(jobs)))
    try:
        futs = {pool.executor.submit(fn, job): i for i, job in enumerate(jobs)}
        pending = set(futs)
        while pending:
            done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if on_wait is not None:
                on_wait()
            for f in done:
                try:
                    res = f.result()
                except BrokenProcessPool:
                    broken.append(futs[f])
                    continue
                yield futs[f], res
    except BaseException:  # Ctrl-C, an error re-raised from fn, the caller closing the generator
        pool.kill()
        raise
    pool.executor.shutdown(wait=True)
    # isolation: one single-worker pool per job, so a death is that job's own
    queue, running = list(broken), {}
    try:
        while queue or running:
            while queue and len(running) < workers:
                i = queue.pop(0)
                p = _Pool(1)
                running[p.executor.submit(fn, jobs[i])] = (p, i)
            done, _ = wait(set(running), timeout=timeout, return_when=FIRST_COMPLETED)
            if on_wait is not None:
                on_wait()
            for f in done:
                p, i = running.pop(f)
                try:
                    res = f.result()
                except BrokenProcessPool:
                    res = on_lost(jobs[i])
                finally:
                    p.executor.shutdown(wait=True)
                yield i, res
    except BaseException:
        for p, _ in running.values():
            p.kill()
        raise
