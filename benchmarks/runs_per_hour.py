"""Whole default runs of this code against a previous release, side by side in one script run.

Checks the baseline commit out with ``git worktree add`` (a temporary directory,
removed at the end), then trains the same run with each tree as a whole process
(``python -m circuitfade train``: one torch thread, evaluations and checkpoints
included), alternating the order pair by pair (AB, BA, AB, ...) so drifting machine
load hits both alike, after one untimed 2-step warm-up run per tree (a fresh
checkout's first run would otherwise also pay for byte-compiling it). Reports
every run's wall time, peak resident memory (the child's own ``ru_maxrss`` from
``os.wait4``) and final metrics, then the median
wall times, the ratio baseline / this code (> 1: this code is faster), the
implied runs per hour, and the median peak memory.

    python benchmarks/runs_per_hour.py [--baseline 4932890] [--pairs 3] [--steps 3600] [--path fade600->0]
                                       [--current-args="--compile"] [--out results/benchmarks/runs_per_hour.json]

``--current-args`` adds options to this code's command only (e.g. ``--compile``: its warm-up run
then fills TorchInductor's cache on disk, so the timed runs compile with the cache warm).

Every figure is written to ``--out`` (JSON) and the table the docs include beside it (``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from circuitfade.train.rundir import RunDir
from pathlib import Path

from results_files import command_line, with_machine_line, write_outputs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "4932890"  # main when the answer-position path was started


def run_once(tree: Path, out: Path, args: argparse.Namespace, extra: list[str] = ()) -> dict:
    """Train one run with the code in ``tree`` (``extra``: more options of ``circuitfade train``);
    wall seconds, peak RSS (MiB) and final metrics."""
    cmd = [args.python, "-m", "circuitfade", "train", "--steps", str(args.steps), "--path", args.path,
           "--seed", str(args.seed), "--out", str(out), "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (in {tree}) failed with exit code {proc.returncode}:\n{stderr[-2000:]}")
    final = RunDir(out).read_done()["final"]
    rss_mib = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    return {"wall_s": wall, "rss_mib": rss_mib, "acc_normal": final.get("acc_normal"),
            "acc_zero": final.get("acc_zero"), "loss_normal": final.get("loss_normal"), "stdout": stdout.strip()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="commit of the previous release (default %(default)s)")
    ap.add_argument("--pairs", type=int, default=3, help="A/B pairs (each trains the run once per tree)")
    ap.add_argument("--steps", type=int, default=3600, help="steps per run (default: a full default run)")
    ap.add_argument("--path", default="fade600->0", help="gate path of the run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--python", default=sys.executable, help="interpreter for both trees")
    ap.add_argument("--current-args", default="", help="options added to this code's `circuitfade train` only "
                                                       "(e.g. --current-args=--compile)")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/runs_per_hour.json in the repository)")
    ap.add_argument("--target", type=float, default=None,
                    help=f"speed-up the table checks (default {TARGET_SPEEDUP}, the target against the default baseline)")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the markdown beside a saved JSON")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "runs_per_hour.json")
    if args.render:
        from circuitfade.io import write_text

        saved = json.loads(Path(args.render).read_text())
        write_text(Path(args.render).with_suffix(".md"), with_machine_line(markdown(saved), saved))
        return saved
    if args.pairs < 1 or args.steps < 1:
        raise SystemExit("--pairs and --steps must be >= 1")
    with tempfile.TemporaryDirectory(prefix="runs_per_hour_") as tmp:
        tmp = Path(tmp)
        base = tmp / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True, text=True)
        try:
            trees = {"baseline": base, "current": REPO}
            extra = {"baseline": [], "current": shlex.split(args.current_args)}
            results: dict[str, list[dict]] = {"baseline": [], "current": []}
            # untimed warm-up of each tree: byte-compiles the fresh checkout and warms the file cache,
            # which would otherwise land on the first timed run only
            warm = argparse.Namespace(**{**vars(args), "steps": 2})
            for name, tree in trees.items():
                run_once(tree, tmp / f"warmup-{name}", warm, extra[name])
            for i in range(args.pairs):
                order = ["baseline", "current"] if i % 2 == 0 else ["current", "baseline"]
                for name in order:
                    r = run_once(trees[name], tmp / f"{name}-{i}", args, extra[name])
                    results[name].append(r)
                    print(f"pair {i + 1} {name:8s} {r['wall_s']:7.1f} s  peak {r['rss_mib']:6.0f} MiB  "
                          f"acc_normal {r['acc_normal']:.3f}  acc_zero {r['acc_zero']:.3f}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    med = {n: statistics.median(r["wall_s"] for r in rs) for n, rs in results.items()}
    rss = {n: statistics.median(r["rss_mib"] for r in rs) for n, rs in results.items()}
    pair_ratios = [b["wall_s"] / c["wall_s"] for b, c in zip(results["baseline"], results["current"])]
    print(f"\n{args.pairs} pair(s), {args.steps} steps, path {args.path}, seed {args.seed}; baseline {args.baseline}")
    for n in results:
        print(f"  {n:8s} median {med[n]:7.1f} s/run = {3600 / med[n]:6.1f} runs/hour (runs of this length, "
              f"one per process)  median peak RSS {rss[n]:.0f} MiB")
    print(f"  speed-up baseline/current: ratio of medians {med['baseline'] / med['current']:.2f}, "
          f"median of pair ratios {statistics.median(pair_ratios):.2f} "
          f"(pairs: {', '.join(f'{r:.2f}' for r in pair_ratios)}; target >= {args.target or TARGET_SPEEDUP} on "
          f"full-length runs)")
    result = {"command": command_line(__file__, argv), "baseline": args.baseline, "steps": args.steps, "path": args.path,
              "seed": args.seed, "current_args": args.current_args, "target": args.target or TARGET_SPEEDUP, "median_s": med, "peak_rss_mib": rss, "pair_ratios": pair_ratios,
              "runs": {n: [{k: v for k, v in r.items() if k != "stdout"} for r in rs] for n, rs in results.items()}}
    write_outputs(args.out, result, markdown(result))
    return result


TARGET_SPEEDUP = 1.6
"""Whole default runs per hour of this code over the previous release."""


def markdown(res: dict) -> str:
    """The table the docs include: wall time, runs per hour, speed-up, peak memory, final accuracies."""
    med, rss, runs = res["median_s"], res["peak_rss_mib"], res["runs"]
    ratio = statistics.median(res["pair_ratios"])
    pairs = ", ".join(f"{r:.2f}" for r in res["pair_ratios"])

    def walls(name: str) -> str:
        return ", ".join(f"{r['wall_s']:.1f}" for r in runs[name])

    def finals(name: str) -> str:
        accs = {(r["acc_normal"], r["acc_zero"]) for r in runs[name]}
        return " or ".join(f"{a:.3f} / {z:.3f}" for a, z in sorted(accs))

    accs_same = len({(r["acc_normal"], r["acc_zero"]) for rs in runs.values() for r in rs}) == 1
    within = all(len({r["loss_normal"] for r in rs}) == 1 for rs in runs.values())
    across = max(abs(a["loss_normal"] - b["loss_normal"]) for a in runs["baseline"] for b in runs["current"])
    target = res.get("target", TARGET_SPEEDUP)
    met = "met" if ratio >= target else "**not met**"
    mem = "below" if rss["current"] < rss["baseline"] else "**not below**"
    current = "this code" + (f" with `{res['current_args']}`" if res.get("current_args") else "")
    lines = [f"`{res['command']}` ({res['steps']} steps, `{res['path']}`, seed {res['seed']}; previous release "
             f"`{res['baseline']}`):", "", f"| | previous release | {current} |", "|---|---|---|",
             f"| wall time per run, median (runs) | {med['baseline']:.1f} s ({walls('baseline')}) | "
             f"{med['current']:.1f} s ({walls('current')}) |",
             f"| runs per hour (one process) | {3600 / med['baseline']:.1f} | {3600 / med['current']:.1f} |",
             f"| speed-up, median of pair ratios (target ≥ {target}) | | **{ratio:.2f}** (pairs {pairs}): {met} |",
             f"| peak resident memory per run, median (target: below the previous release's) | "
             f"{rss['baseline']:.0f} MiB | **{rss['current']:.0f} MiB**: {mem} |",
             f"| final accuracy, gates as trained / zeroed | {finals('baseline')} | {finals('current')} |", "",
             ("Final accuracies identical in every run of both trees" if accs_same else
              "Final accuracies **differ** between runs or trees")
             + ("; final loss identical between runs of one tree" if within else "; final loss **differs** within a tree")
             + (f", and {across:.1e} apart between the trees." if across else ", and between the trees.")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
