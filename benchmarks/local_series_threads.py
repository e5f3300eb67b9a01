"""Torch threads vs speed for the local developing series' model (why `circuitfade local-series` pins 1).

    python benchmarks/local_series_threads.py [--steps 300] [--rounds 2] [--out results/benchmarks/local_series_threads.json]

Trains ``local_run_config(steps)`` in memory with 1 and with 2 torch threads,
interleaved (1, 2, 1, 2, ...), and prints every time and the median ratio, measured
side by side in one run. ``train`` itself pins one thread while it computes, so this
script runs the training step itself (forward, backward, AdamW; no evaluation).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from circuitfade.train.recipes import local_run_config
from circuitfade.train import loop

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


def once(steps: int, threads: int) -> float:
    cfg = local_run_config(steps)
    run = loop.new_run(cfg)
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model, task = run.model, cfg.make_task()
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):  # the loop's own work, without evaluation, at this thread count
        batch = task.sample(cfg.train.batch_size, gen)
        loss = task.loss(model(batch.model_input), batch)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/local_series_threads.json in the repository)")
    ns = ap.parse_args(argv)
    if ns.steps < 1 or ns.rounds < 1:
        raise SystemExit("--steps and --rounds must be >= 1")
    out = Path(ns.out or REPO / "results" / "benchmarks" / "local_series_threads.json")
    times = {1: [], 2: []}
    for _ in range(ns.rounds):
        for th in (1, 2):
            times[th].append(once(ns.steps, th))
    for th, ts in times.items():
        print(f"{th} thread(s): " + ", ".join(f"{t:.1f} s" for t in ts) + f" ({ns.steps} steps each)")
    ratio = statistics.median(times[2]) / statistics.median(times[1])
    print(f"median ratio 2 threads / 1 thread: {ratio:.2f}")
    command = command_line(__file__, argv)
    write_outputs(out, {"command": command, "steps": ns.steps, "rounds": ns.rounds, "seconds": times, "ratio": ratio}, (
        f"`{command}` (training steps only, no evaluation; {ns.steps} steps per measurement, rounds interleaved): "
        + "; ".join(f"{th} thread{'s' if th > 1 else ''}: " + ", ".join(f"{t:.1f} s" for t in ts) for th, ts in times.items())
        + f". Median ratio 2 threads / 1 thread: **{ratio:.2f}**"
        + (" (a second thread is slower)." if ratio > 1 else " (a second thread is faster).") + "\n"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
