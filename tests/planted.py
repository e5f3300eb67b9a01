"""Planted tasks shared by several test files (importable because ``tests/conftest.py``
puts this folder on ``sys.path``)."""

from __future__ import annotations

import torch

from circuitfade.tasks import Batch, Task
from circuitfade.tasks.base import IGNORE_INDEX

V, P = 8, 6  # vocabulary and sequence length of the copy task


class CopyTask(Task):
    """``P`` distinct tokens; the answer at the last position is the token at position ``src``."""

    name = "copy"

    def __init__(self, src: int = 0) -> None:
        self.src, self.d_vocab, self.n_ctx, self.chance = src, V, P, 1.0 / V

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        tokens = torch.rand(n, V, generator=generator).argsort(dim=1)[:, :P]
        targets = torch.full((n, P), IGNORE_INDEX, dtype=torch.long)
        targets[:, -1] = tokens[:, self.src]
        mask = torch.zeros(n, P, dtype=torch.bool)
        mask[:, -1] = True
        sources = torch.zeros(n, P, P, dtype=torch.bool)
        sources[:, -1, self.src] = True
        return Batch(tokens, targets, mask, sources)


def run_study(name: str, argv: list[str]) -> int:
    """``python -m studies.<name> ARGV`` in this process (one-line errors, exit codes as the command's)."""
    import importlib

    from studies.common import study_main

    module = {"paper": "studies.paper.cli", "removability": "studies.removability.map",
              "history": "studies.history.study", "development": "studies.development.study",
              "alignment": "studies.alignment.report"}[name]
    return study_main(f"python -m studies.{name}", importlib.import_module(module).main, argv)
