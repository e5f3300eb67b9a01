"""Runs per hour of a local sweep with one worker per core against one worker, back to back.

Trains the same ``--runs`` default runs of ``--steps`` steps (seeds 0..runs-1, path ``--path``) with
:func:`~circuitfade.train.sweep.run_sweep` (``executor="local"``, each worker one torch thread)
into a fresh folder per sweep, alternating the worker counts round by round (1, N, then N, 1, ...)
so drifting machine load hits both alike. Wall time is the clock here (parallelism is the point),
including spawning the workers. Checks that every run's ``metrics.csv`` is the same bytes
whichever the worker count. Reports each sweep's wall time, the medians, runs per hour and the
speed-up.

    python benchmarks/sweep_workers.py [--runs 4] [--steps 300] [--rounds 2] [--workers N]

``--workers`` defaults to ``os.cpu_count()`` (what ``run_sweep`` uses when not told).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


def sweep_once(cfgs, root: Path, workers: int) -> float:
    from circuitfade.train.sweep import run_sweep

    t0 = time.perf_counter()
    table = run_sweep(cfgs, root, executor="local", workers=workers, progress=False)
    wall = time.perf_counter() - t0
    if not (table["status"] == "done").all():
        raise RuntimeError(f"a run did not finish:\n{table.to_string()}")
    return wall


def metrics_bytes(cfgs, root: Path) -> dict[str, bytes]:
    """Each run's metrics file, by its folder's name under ``root``."""
    from circuitfade.train.rundir import RunDir
    from circuitfade.train.sweep import run_dir_for

    return {run_dir_for(root, c).name: RunDir(run_dir_for(root, c)).metrics_file.read_bytes() for c in cfgs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs per sweep")
    ap.add_argument("--steps", type=int, default=300, help="steps per run")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each sweeps once per worker count")
    ap.add_argument("--workers", type=int, default=None, help="the parallel setting (default: os.cpu_count())")
    ap.add_argument("--path", default="fade600->0")
    ap.add_argument("--out", default=str(REPO / "results" / "benchmarks" / "sweep_workers.json"))
    args = ap.parse_args(argv)
    from circuitfade.train.config import RunConfig, TrainConfig

    many = args.workers or max(1, os.cpu_count() or 1)
    settings = [1, many]
    cfgs = [RunConfig(path=args.path, seed=s, train=TrainConfig(steps=args.steps)) for s in range(args.runs)]
    walls: dict[int, list[float]] = {w: [] for w in settings}
    files: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sweep_workers_") as tmp:
        for r in range(args.rounds):
            for w in (settings if r % 2 == 0 else list(reversed(settings))):
                root = Path(tmp) / f"r{r}-w{w}"
                wall = sweep_once(cfgs, root, w)
                walls[w].append(wall)
                files.setdefault(w, metrics_bytes(cfgs, root))
                if metrics_bytes(cfgs, root) != files[w]:
                    raise RuntimeError("metrics.csv differs between two sweeps with the same worker count")
                print(f"round {r + 1} workers {w}: {wall:6.1f} s wall for {args.runs} runs of {args.steps} steps "
                      f"= {3600 * args.runs / wall:6.0f} runs/hour", flush=True)
    identical = files[1] == files[many]
    med = {w: statistics.median(t) for w, t in walls.items()}
    speedup = med[1] / med[many]
    print(f"median wall: 1 worker {med[1]:.1f} s, {many} workers {med[many]:.1f} s; speed-up {speedup:.2f}; "
          f"metrics.csv identical across worker counts: {identical}")
    result = {"command": command_line(__file__, argv), "runs": args.runs, "steps": args.steps, "path": args.path,
              "rounds": args.rounds, "workers": settings, "wall_s": {str(w): t for w, t in walls.items()},
              "median_wall_s": {str(w): v for w, v in med.items()},
              "runs_per_hour": {str(w): 3600 * args.runs / v for w, v in med.items()},
              "speedup": speedup, "metrics_identical": identical}
    write_outputs(args.out, result, markdown(result))
    return result


def markdown(res: dict) -> str:
    lines = [f"`{res['command']}` ({res['runs']} runs of {res['steps']} steps, `{res['path']}`, "
             f"`run_sweep(executor=\"local\")`, wall time including the workers' start, {res['rounds']} alternating "
             "rounds):", "", "| workers | wall time per sweep (rounds) | median | runs per hour |", "|---|---|---|---|"]
    for w in res["workers"]:
        k = str(w)
        lines.append(f"| {w} | {', '.join(f'{t:.1f}' for t in res['wall_s'][k])} s | {res['median_wall_s'][k]:.1f} s | "
                     f"{res['runs_per_hour'][k]:.0f} |")
    lines += ["", f"Speed-up of {res['workers'][-1]} workers over 1: **{res['speedup']:.2f}**. Every run's "
              f"`metrics.csv` {'is the same bytes' if res['metrics_identical'] else '**differs**'} whichever the "
              "worker count."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
