"""What several studies share beyond the library: the command-line entry point."""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from circuitfade.cli import guarded

__all__ = ["study_main"]


def study_main(prog: str, main: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run a study's ``main(argv)`` as a command: a user error (bad input, a full disk, a diverged
    run) ends as one line on stderr and exit code 2, Ctrl-C as one line and exit code 130."""
    args = list(sys.argv[1:] if argv is None else argv)
    return guarded(prog, lambda: main(args))
