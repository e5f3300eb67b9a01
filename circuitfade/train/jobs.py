"""The one process pool: :func:`run_jobs` runs a function over job specs in worker processes.

Sweeps (:mod:`circuitfade.train.sweep`), the ``circuitfade demo`` command and every study
use it, so a pool's hard parts are solved once:

* **a worker that dies** (killed, out of memory) breaks a ``ProcessPoolExecutor`` and every
  unfinished job with it, without saying which job was at fault. The jobs it took down are
  retried, each in a pool of its own; a job whose own worker dies is reported through
  ``on_lost(job)`` (default: raise :class:`WorkerLost`), the others finish.
* **workers die with their parent**: each worker watches the process that made its pool (a
  thread waiting on its pidfd on Linux) and kills itself when that process exits, and asks the
  kernel to kill it when its own parent exits (``PR_SET_PDEATHSIG``), so a SIGTERM or SIGKILL
  to a sweep or the demo leaves no orphan training queued runs.
* **Ctrl-C stops the pool, not just the current jobs**: workers ignore SIGINT (the terminal
  sends it to the whole process group); the parent, on ``KeyboardInterrupt`` (or any other
  exception), cancels the queued jobs and kills its workers before re-raising, so it never
  waits for the rest of a sweep to train (the trainer's files are written atomically and its
  run lock is released by the kernel, so a killed worker leaves nothing half-done).
* **one thread per worker** is the caller's business (the trainer pins it).
* **nothing of the parent's state leaks into a worker, and starting one is cheap**: where the
  platform has it (Linux, macOS) the pool uses the ``forkserver`` start method: a server
  process started fresh (not forked from the caller) imports torch, TransformerLens and the
  trainer once, and every worker of every pool this process makes is forked from it, instead
  of a fresh interpreter importing them again for each worker (seconds each). A worker gets
  the caller's environment variables as they are when its pool is made, as a spawned one
  does (those read when torch is imported take the server's values). Elsewhere, or with
  ``CIRCUITFADE_START_METHOD=spawn``: ``spawn``.

``fn`` must be a module-level function (it is pickled by name). Exceptions raised by ``fn``
are re-raised in the parent; a function that should report failures as rows catches them
itself (as :func:`circuitfade.train.sweep.execute` does).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import active_children, get_all_start_methods, get_context
from typing import Any, Callable, Iterator, Sequence

__all__ = ["run_jobs", "WorkerLost", "LOST_WORKER", "START_METHOD_ENV"]

LOST_WORKER = "worker process died (killed by a signal, e.g. out of memory) while running this job"


class WorkerLost(RuntimeError):
    """A job's own worker process died (killed by a signal, out of memory)."""


# what the fork server imports once (its workers are forked with these loaded): torch, TransformerLens, the trainer
PRELOAD = ["circuitfade.model", "circuitfade.train.sweep"]


START_METHOD_ENV = "CIRCUITFADE_START_METHOD"
"""Environment variable naming the pool's start method: ``forkserver`` (the default where the
platform has it) or ``spawn`` (a fresh interpreter per worker, as on Windows)."""


def _context():
    """``forkserver`` (preloading :data:`PRELOAD`) where the platform has it, else ``spawn``;
    :data:`START_METHOD_ENV` chooses one."""
    chosen = os.environ.get(START_METHOD_ENV, "").strip()
    if chosen not in ("", "forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV}={chosen!r}: expected 'forkserver' or 'spawn'")
    if chosen == "spawn":
        return get_context("spawn")
    if "forkserver" in get_all_start_methods():
        ctx = get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return get_context("spawn")  # pragma: no cover - Windows


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, another user's
        return True
    return True


def _die_with_parent(parent: int, environ: dict[str, str]) -> None:
    """Pool initializer: take the caller's environment, ignore Ctrl-C (the caller handles it) and
    die with the caller: a daemon thread waits on the caller's pidfd (Linux; elsewhere it polls the
    pid each second) and SIGKILLs this worker when the caller exits, and Linux is asked to SIGKILL it
    when the process that started it exits (the caller, or the fork server)."""
    os.environ.clear()
    os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started_by = os.getppid()
    try:
        caller = os.pidfd_open(parent)
    except (AttributeError, OSError):  # pragma: no cover - not Linux >= 5.3
        caller = None
    if not _alive(parent):
        os._exit(1)
    threading.Thread(target=_kill_self_when_gone, args=(parent, caller), daemon=True,
                     name="circuitfade-watch-caller").start()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != started_by:  # the parent died before the request took effect
        os._exit(1)


def _kill_self_when_gone(parent: int, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the caller has exited
    else:  # pragma: no cover - not Linux >= 5.3
        while _alive(parent):
            time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


class _Pool:
    """A ``ProcessPoolExecutor`` that knows its worker processes (the children of this
    process that appeared after it was made), so :meth:`kill` can stop them."""

    def __init__(self, workers: int):
        self._before = set(active_children())
        self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_die_with_parent,
                                            initargs=(os.getpid(), dict(os.environ)))

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
    (``None``) does so for one worker or a single job. Otherwise up to ``workers`` worker
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
