"""Milliseconds per training step, measured side by side (one helper for every benchmark).

:func:`time_steps` times several zero-argument step functions in interleaved
rounds (each round runs ``steps`` calls of every function in turn), so machine
noise hits all of them alike, and returns every round's milliseconds per call;
report the median. :func:`adamw_step` builds the step the trainer takes (forward,
task loss, backward, clipping at 1, AdamW).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Iterator, Mapping

import torch

from circuitfade.train.optim import clip_grad_norm

__all__ = ["time_steps", "median_ms", "adamw_step", "torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)`` (``None``: leave it), then restore."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def adamw_step(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], *, lr: float = 1e-3,
               weight_decay: float = 0.01, grad_clip: float = 1.0, fused: bool = True) -> Callable[[], None]:
    """A zero-argument training step: ``loss_fn()``, backward, clip, one AdamW step
    (``fused=True`` and a foreach clip, as the trainer does)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)

    def step() -> None:
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(params, grad_clip)
        opt.step()

    return step


def time_steps(fns: Mapping[str, Callable[[], None]], *, steps: int = 30, rounds: int = 5, warmup: int = 5,
               threads: int | None = 1, clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """``{name: [ms per call in round 1, round 2, ...]}`` with the functions interleaved round by round.
    ``clock``: wall time (``time.perf_counter``, the default) or this process's CPU time
    (``time.process_time``: with one thread, steadier than wall time on a machine shared with
    other work)."""
    if steps < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"steps and rounds must be >= 1 and warmup >= 0; got {steps}, {rounds}, {warmup}")
    times: dict[str, list[float]] = {n: [] for n in fns}
    with torch_threads(threads):
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = clock()
                for _ in range(steps):
                    fn()
                times[name].append((clock() - t0) / steps * 1e3)
    return times


def median_ms(times: Mapping[str, list[float]]) -> dict[str, float]:
    """The median of each entry of :func:`time_steps`'s result."""
    return {n: statistics.median(v) for n, v in times.items()}
