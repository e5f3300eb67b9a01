"""How long the job pool takes to start its workers: the fork server against spawned workers, side by side.

A child process per measurement makes ``--pools`` pools in a row with
:func:`circuitfade.train.jobs.run_jobs` (``--workers`` workers, one job each) whose job imports the
trainer (``circuitfade.train.sweep``, which a sweep's worker needs) and returns its pid; reported: the
wall time of each pool from its creation to its last result. The two start methods alternate over
``--rounds`` rounds (spawn first, then the fork server first, ...) so drifting load hits both alike.
With spawn every worker of every pool is a fresh interpreter importing torch and TransformerLens; with
the fork server (the pool's default where the platform has one) the first pool also starts the server,
which imports them once, and every later pool forks workers from it.

    python benchmarks/pool_start.py [--pools 3] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from circuitfade.train.jobs import START_METHOD_ENV
from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
from pool_start import job
from circuitfade.train import jobs as pool

pools, workers = int(sys.argv[1]), int(sys.argv[2])
if __name__ == "__main__":
    times = []
    for _ in range(pools):
        t0 = time.perf_counter()
        pids = [r for _, r in pool.run_jobs(job, list(range(workers)), workers=workers, inline=False)]
        times.append(time.perf_counter() - t0)
        assert len(set(pids)) >= 1 and os.getpid() not in pids
    print(json.dumps(times))
"""


def job(i: int) -> int:
    """A worker's first job: import the trainer, as a sweep's worker does."""
    import circuitfade.train.sweep  # noqa: F401

    return os.getpid()


def measure(method: str, pools: int, workers: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           START_METHOD_ENV: method}
    r = subprocess.run([sys.executable, "-c", _CHILD.format(bench=str(Path(__file__).parent)), str(pools),
                        str(workers)], capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(f"{method}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, default=3, help="pools made one after another in one process (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="workers per pool (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each method, alternating (default 3)")
    ap.add_argument("--out", help="JSON written with every figure, the markdown beside it "
                                  "(default results/benchmarks/pool_start.json)")
    args = ap.parse_args(argv)
    runs: dict[str, list[list[float]]] = {"spawn": [], "forkserver": []}
    for r in range(args.rounds):
        for method in (("spawn", "forkserver") if r % 2 == 0 else ("forkserver", "spawn")):
            t = measure(method, args.pools, args.workers)
            runs[method].append(t)
            print(f"round {r + 1} {method}: " + ", ".join(f"{x:.2f} s" for x in t), flush=True)
    med = {m: [statistics.median(run[i] for run in v) for i in range(args.pools)] for m, v in runs.items()}
    total = {m: statistics.median(sum(run) for run in v) for m, v in runs.items()}
    result = {"command": command_line(__file__, argv), "pools": args.pools, "workers": args.workers,
              "runs": runs, "median_per_pool_s": med, "median_total_s": total,
              "spawn_over_forkserver": total["spawn"] / total["forkserver"]}
    rows = "\n".join(f"| pool {i + 1} | {med['spawn'][i]:.2f} s | {med['forkserver'][i]:.2f} s |"
                     for i in range(args.pools))
    md = (f"`{result['command']}`: {args.pools} pools of {args.workers} workers made one after another in one "
          f"process, each worker's job importing the trainer; wall time from making a pool to its last result, "
          f"median of {args.rounds} measurements.\n\n"
          f"| | spawned workers | fork server (default) |\n|---|---|---|\n{rows}\n"
          f"| all {args.pools} pools | {total['spawn']:.2f} s | {total['forkserver']:.2f} s |\n\n"
          f"Spawned workers take **{result['spawn_over_forkserver']:.2f}×** the fork server's time for the "
          f"{args.pools} pools.\n")
    out = args.out or str(REPO / "results" / "benchmarks" / "pool_start.json")
    write_outputs(out, result, md)
    print(md)
    return result


if __name__ == "__main__":
    main()
