"""Jobs for the process-pool tests (importable by spawned workers): each writes its worker's
pid to a FIFO the test reads, then blocks reading another FIFO that nobody ever writes to."""

from __future__ import annotations

import os


def hold(spec: tuple[str, str]) -> None:
    """Report this process's pid on FIFO ``spec[0]``, then block forever on FIFO ``spec[1]``."""
    ready, block = spec
    fd = os.open(ready, os.O_WRONLY)  # the test keeps the FIFO open, so this does not block
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    with open(block, "rb") as f:  # opening for reading blocks until a writer comes: none does
        f.read()


def environ_and_parent(name: str) -> tuple[str | None, int, bool]:
    """The worker's value of the environment variable ``name``, its parent pid and whether torch was
    already imported before this job ran (the fork server preloads it)."""
    import sys

    return os.environ.get(name), os.getppid(), "torch" in sys.modules
