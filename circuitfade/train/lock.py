"""One trainer per run directory: the ``.lock`` file and :class:`RunLocked`."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["RunLocked", "run_lock", "pid_alive"]


class RunLocked(RuntimeError):
    """Another live process is training this run directory."""



def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_owner(lock: Path) -> int | None:
    """The pid in ``lock`` (0 if the file is empty or garbage), or ``None`` if there is no lock."""
    try:
        text = lock.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else 0


def _live_other(pid: int | None) -> bool:
    return bool(pid) and pid != os.getpid() and pid_alive(pid)


@contextlib.contextmanager
def _dir_mutex(folder: Path):
    """An exclusive ``flock`` on ``folder`` (released by the kernel if we die): serialises lock takeovers."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """One trainer per run directory: ``.lock`` holds the owner's pid from the moment it exists.

    The pid is written to a private temp file first, which is then hard-linked to
    ``.lock`` (fails if a lock exists) - so no process ever sees an empty lock. A
    lock whose pid is dead (or empty/garbage, from an older version) is stale: it
    is replaced by an atomic rename, under an ``flock`` on the directory so that two
    processes taking over the same stale lock cannot both win.
    """
    run_dir = Path(run_dir)
    lock = run_dir / ".lock"
    me = os.getpid()
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".lock.{me}.", suffix=".pid")
    try:
        os.write(fd, str(me).encode())
        os.fsync(fd)
        os.close(fd)
        for _ in range(100):
            try:
                os.link(tmp, lock)
                break
            except FileExistsError:
                pass
            owner = _lock_owner(lock)
            if owner is None:
                continue  # released in the meantime: try to create it again
            if _live_other(owner):
                raise RunLocked(f"{run_dir} is being trained by process {owner} (remove {lock} if that is wrong)")
            with _dir_mutex(run_dir):
                owner = _lock_owner(lock)
                if owner is None:
                    continue
                if _live_other(owner):
                    raise RunLocked(f"{run_dir} is being trained by process {owner} (remove {lock} if that is wrong)")
                os.replace(tmp, lock)  # the stale lock is replaced by ours in one step
                break
        else:  # pragma: no cover - would need 100 lost races in a row
            raise RunLocked(f"could not lock {run_dir}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:
        yield
    finally:
        if _lock_owner(lock) == me:
            lock.unlink(missing_ok=True)
