"""One trainer per run directory: an OS lock on the ``.lock`` file and :class:`RunLocked`.

The trainer holds an exclusive ``flock`` on ``RUN/.lock`` for the run's lifetime. The
kernel releases it when the holder's file is closed, which includes the holder's death
(killed, out of memory, power-cycled container): there is no stale lock to take over and no
process id to trust. The holder's pid is written into the file for the messages only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from circuitfade.train.rundir import LOCK_FILE

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

__all__ = ["RunLocked", "run_lock", "LOCK_FILE"]


class RunLocked(RuntimeError):
    """Another live process is training this run directory."""


def _holder(fd: int) -> str:
    """The pid written in the lock file open as ``fd`` (for messages), or ``"?"``."""
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:  # pragma: no cover
        return "?"
    return text if text.isdigit() else "?"


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (it was not unlinked or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold the run directory's lock while the block runs; :class:`RunLocked` if another holds it.

    ``RUN/.lock`` is opened (created if absent) and locked with a non-blocking exclusive
    ``flock``. A holder unlinks the file before closing it, so a process that opened the
    old file and locks it after the release finds that ``.lock`` is no longer the file it
    locked (checked by device and inode) and tries again on the new one: two processes never
    both hold the lock of one directory. Locks are per open file, so a second
    ``run_lock`` on the same directory in the same process is refused too.
    """
    run_dir = Path(run_dir)
    lock = run_dir / LOCK_FILE
    if fcntl is None:  # pragma: no cover - not POSIX: an exclusive create, removed on exit
        with _exclusive_create(lock, run_dir):
            yield
        return
    for _ in range(100):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunLocked(f"{run_dir} is being trained by process {holder} (it holds {lock})") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock):
            break
        os.close(fd)  # we locked a file its holder had just unlinked: lock the current one
    else:  # pragma: no cover - would need 100 lost races in a row
        raise RunLocked(f"could not lock {run_dir}")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still holding it: a waiter on this file then retries
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def _exclusive_create(lock: Path, run_dir: Path):  # pragma: no cover - not POSIX
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise RunLocked(f"{run_dir} is locked ({lock} exists; remove it if no process trains this run)") from None
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)
