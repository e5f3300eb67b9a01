"""One prepared script for a GPU machine: the single run, ensembles up to E = 1,024 and the paper's seeds, timed there.

Three parts, measured on the machine the script runs on and written to ``--out`` (JSON, and the
markdown beside it) after each part, so a run cut short keeps what it finished:

1. **single**: one default run (base model, ``fade600->0``, seed 0) of ``--steps`` steps with
   evaluation and checkpoints, trained on the device and on the CPU (one torch thread), each in a
   fresh process (:func:`ensemble.measure`); wall seconds and runs per hour, device / CPU.
2. **ensemble**: E runs (seeds 0..E-1) trained as one stacked model on the device for each E of
   ``--sizes`` (default 1, 16, 128, 1024), each in a fresh process: runs per hour, the ratio to the
   single run on the device and the peak GPU memory.
3. **paper**: ``python -m studies.paper reproduce --device DEV --executor ensemble --ensemble-size E
   --workers W`` (every experiment, 3 seeds, one large-model seed; ``--paper quick`` adds
   ``--quick``: 360-step runs) into a temporary folder: wall time, runs trained, failed runs and
   the verdict outcomes it reached.

    python benchmarks/gpu.py [--device cuda] [--steps 300] [--sizes 1,16,128,1024] [--paper full|quick|skip]
                             [--paper-ensemble-size 256] [--paper-workers 2] [--out results/benchmarks/gpu.json]

On a machine without the device the script stops in one line; ``--device cpu --steps 20 --sizes 1,2
--paper skip --out /tmp/gpu.json`` runs every code path on a CPU in seconds (how the tests run it).
Expected cost on one H100-class GPU: parts 1-2 a few minutes (most of it the CPU reference and
E = 1,024's files); the full paper part trains 125 runs, 460,200 steps in all, in 10 stacked
groups plus 4 branches.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ensemble import measure
from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]
PARTS = ("single", "ensemble", "paper")


def part_args(device: str, args: argparse.Namespace) -> argparse.Namespace:
    """What :func:`ensemble.measure` reads, for ``device``."""
    return argparse.Namespace(steps=args.steps, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
                              device=device)


def single(args: argparse.Namespace) -> dict:
    """One default run on the device and on the CPU, each in a fresh process."""
    dev = measure("sequential", 1, part_args(args.device, args))
    cpu = measure("sequential", 1, part_args("cpu", args))
    return {"device": dev, "cpu": cpu, "device_vs_cpu": cpu["wall_s"] / dev["wall_s"]}


def ensembles(args: argparse.Namespace, sizes: list[int], on_device_single: dict) -> dict:
    """E runs as one ensemble on the device for each E, each in a fresh process."""
    out = {}
    for n in sizes:
        m = measure("ensemble", n, part_args(args.device, args))
        m["runs_per_hour"] = 3600 * n / m["wall_s"]
        m["vs_single"] = m["runs_per_hour"] / (3600 / on_device_single["wall_s"])
        out[str(n)] = m
        print(f"  E={n:<5d} {m['wall_s']:7.1f} s  {m['runs_per_hour']:9.0f} runs/h  {m['vs_single']:6.1f}x the single run"
              + (f"  peak GPU {m['gpu_mib']:.0f} MiB" if m.get("gpu_mib") else ""), flush=True)
    return out


def paper(args: argparse.Namespace) -> dict:
    """The paper's reproduction on the device, into a temporary folder; wall time and what it reached."""
    with tempfile.TemporaryDirectory(prefix="circuitfade-gpu-paper-") as tmp:
        cmd = [sys.executable, "-m", "studies.paper", "reproduce", "--device", args.device, "--executor", "ensemble",
               "--ensemble-size", str(args.paper_ensemble_size), "--workers", str(args.paper_workers),
               "--out", tmp, "--force"] + (["--quick"] if args.paper == "quick" else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{proc.stderr[-2000:]}")
        with open(Path(tmp) / "results_runs.csv", newline="") as f:
            status = Counter(row["status"] for row in csv.DictReader(f))
        with open(Path(tmp) / "verdicts.csv", newline="") as f:
            verdicts = Counter(row["verdict"] for row in csv.DictReader(f))
    shown = " ".join(cmd[1:]).replace(tmp, "TMP")
    runs = sum(status.values())
    return {"command": f"python {shown}", "wall_s": wall, "runs": runs, "status": dict(status),
            "runs_per_hour": 3600 * runs / wall, "verdicts": dict(verdicts), "mode": args.paper}


def markdown(res: dict) -> str:
    """The tables the docs include."""
    lines = [f"`{res['command']}` ({res['steps']} steps per run for the single run and the ensembles, evaluation "
             f"every {res['eval_every']}, checkpoint every {res['checkpoint_every']}; each measurement a fresh "
             "process, one torch thread):", ""]
    s = res.get("single")
    if s:
        lines += ["| trainer | wall time | runs/hour | vs the single run on the device |", "|---|---|---|---|",
                  f"| single run, CPU | {s['cpu']['wall_s']:.1f} s | {3600 / s['cpu']['wall_s']:.0f} | "
                  f"{1 / s['device_vs_cpu']:.2f} |",
                  f"| single run, {res['device']} | {s['device']['wall_s']:.1f} s | {3600 / s['device']['wall_s']:.0f} | 1 |"]
        for n, e in sorted((res.get("ensemble") or {}).items(), key=lambda kv: int(kv[0])):
            mem = f", peak GPU memory {e['gpu_mib']:.0f} MiB" if e.get("gpu_mib") else ""
            lines.append(f"| ensemble of {n}{mem} | {e['wall_s']:.1f} s | {e['runs_per_hour']:.0f} | "
                         f"**{e['vs_single']:.1f}** |")
    p = res.get("paper")
    if p:
        status = ", ".join(f"{v} {k}" for k, v in sorted(p["status"].items()))
        verdicts = ", ".join(f"{v} {k}" for k, v in sorted(p["verdicts"].items()))
        lines += ["", f"The paper's seeds (`{p['command']}`): **{p['wall_s'] / 60:.1f} min** for {p['runs']} runs "
                  f"({p['runs_per_hour']:.0f} runs/hour; {status}). Verdicts reached: {verdicts}."]
    elif "paper" in res.get("parts", ()):
        lines += ["", "The paper's seeds: not measured (the part did not finish)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="the device measured (default %(default)s; cpu runs the "
                                                     "script's code paths on any machine)")
    ap.add_argument("--steps", type=int, default=300, help="steps per run in parts 1-2 (default %(default)s)")
    ap.add_argument("--eval-every", type=int, default=100, help="as a default run (default %(default)s)")
    ap.add_argument("--checkpoint-every", type=int, default=300, help="as a default run (default %(default)s)")
    ap.add_argument("--sizes", default="1,16,128,1024", help="ensemble sizes E (comma-separated)")
    ap.add_argument("--paper", choices=("full", "quick", "skip"), default="full",
                    help="the paper's seeds at full length, with --quick, or not at all (default %(default)s)")
    ap.add_argument("--paper-ensemble-size", type=int, default=256, help="--ensemble-size of the paper part")
    ap.add_argument("--paper-workers", type=int, default=2, help="--workers of the paper part (processes sharing "
                                                                  "the device)")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/gpu.json in the repository)")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "gpu.json")
    if min(args.steps, args.eval_every, args.checkpoint_every, args.paper_ensemble_size, args.paper_workers) < 1:
        raise SystemExit("--steps, --eval-every, --checkpoint-every, --paper-ensemble-size and --paper-workers "
                         "must be >= 1")
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        raise SystemExit(f"--sizes: expected comma-separated positive integers, got {args.sizes!r}") from None
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"--sizes: expected comma-separated positive integers, got {args.sizes!r}")
    from circuitfade.model.devices import check_device_name, resolve_device

    try:
        resolve_device(check_device_name(args.device))
    except ValueError as e:
        raise SystemExit(f"benchmarks/gpu.py: {e}") from None
    parts = [p for p in PARTS if not (p == "paper" and args.paper == "skip")]
    res = {"command": command_line(__file__, argv), "device": args.device, "steps": args.steps,
           "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every, "parts": parts}
    print(f"single run: {args.steps} steps on {args.device} and on the CPU", flush=True)
    res["single"] = single(args)
    print(f"  {args.device} {res['single']['device']['wall_s']:.1f} s, cpu {res['single']['cpu']['wall_s']:.1f} s "
          f"({res['single']['device_vs_cpu']:.2f}x)", flush=True)
    write_outputs(args.out, res, markdown(res))
    print(f"ensembles on {args.device}: E = {', '.join(map(str, sizes))}", flush=True)
    res["ensemble"] = ensembles(args, sizes, res["single"]["device"])
    write_outputs(args.out, res, markdown(res))
    if "paper" in parts:
        print(f"the paper's seeds ({args.paper}) on {args.device}", flush=True)
        res["paper"] = paper(args)
        print(f"  {res['paper']['wall_s'] / 60:.1f} min, {res['paper']['runs']} runs, {res['paper']['status']}",
              flush=True)
        write_outputs(args.out, res, markdown(res))
    return res


if __name__ == "__main__":
    main()
