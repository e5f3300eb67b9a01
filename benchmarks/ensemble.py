"""Runs per hour and peak memory of the ensemble trainer against the sequential trainer, side by side.

Each measurement is a fresh process with one torch thread that trains real runs into a
temporary folder (checkpoints, metrics and evaluations included): the sequential trainer
trains ``--sequential-runs`` runs one after another (:func:`circuitfade.train.train`, as a sweep
worker does; more than one run makes the denominator of every ratio less noisy), the ensemble trainer trains E runs together
(:func:`circuitfade.train.ensemble.train_ensemble`, E = 1, 4, 16, 64 by default; seeds 0..E-1,
the default model, task and gate path, ``--steps`` steps with an evaluation every
``--eval-every`` steps and a checkpoint every ``--checkpoint-every``). The process measures
its own training time (wall clock and CPU time, imports excluded) and its peak resident
memory (``ru_maxrss``).

The measurements interleave round by round (sequential, E = 1, 4, 16 in turn, ``--rounds``
times; the largest E, which takes longest, in ``--big-rounds`` rounds), so a loaded machine
slows all of them alike. For each round and E, the ratio is

    ratio(E) = (E / ensemble seconds) / (runs / sequential seconds of the same round)

(runs per hour of the ensemble over runs per hour of the sequential trainer), on wall time
and on CPU time; the median over rounds is reported. The default ensemble size for the
device is the E with the highest median runs per hour (CPU time on a CPU, wall time on a
GPU); it is written with every figure to ``--out`` (``results/benchmarks/ensemble.json``)
and compared with :data:`circuitfade.train.ensemble.DEFAULT_MEMBERS`.

    python benchmarks/ensemble.py [--steps 100] [--rounds 3] [--sizes 1,4,16,64] [--big-rounds 1]
                                  [--device cpu] [--out results/benchmarks/ensemble.json]

Where the rest goes: a training step's time is a fixed part (Python, operator dispatch,
autograd bookkeeping, the optimizer: independent of the batch) plus a part proportional to
the batch. Each round also measures the single trainer's CPU milliseconds per step at batch
8, 64 and 128 (40 steps each, no evaluation) and fits ``t(batch) = fixed + batch * per_example``.
An ensemble removes at most the fixed part (its members' arithmetic is the single runs'),
so ``t(64) / (t(64) - fixed)`` is the ceiling of its ratio at batch 64; the ratio measured
at each E is reported next to it.

``--compare-full`` instead trains full default runs (3,600 steps, ``fade600->0``, seeds 0, 1, 2) once
as single runs and once as one ensemble of three, and reports the difference of their final
metrics next to the single runs' seed-to-seed spread (and whether their files are identical).

``--profile E`` instead prints a ``torch.profiler`` table of ten ensemble steps at E (and of
E single steps, for comparison): where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


def configs(n: int, steps: int, eval_every: int, checkpoint_every: int, device: str):
    from circuitfade.train import RunConfig, TrainConfig

    tc = TrainConfig(steps=steps, eval_every=eval_every, checkpoint_every=checkpoint_every, device=device)
    return [RunConfig(path="fade600->0", seed=s, train=tc) for s in range(n)]


def child(mode: str, n: int, args: argparse.Namespace) -> dict:
    """Train (one run, or ``n`` runs as an ensemble) in this process; time and memory."""
    import torch

    from circuitfade.train import train
    from circuitfade.train.ensemble import train_ensemble

    torch.set_num_threads(1)
    cfgs = configs(n, args.steps, args.eval_every, args.checkpoint_every, args.device)
    with tempfile.TemporaryDirectory(prefix="bench_ensemble_") as tmp:
        dirs = [Path(tmp) / f"r{i}" for i in range(n)]
        w0, c0 = time.perf_counter(), time.process_time()
        if mode == "sequential":
            for c, d in zip(cfgs, dirs):
                train(c, d, progress=False)
            status = ["done"] * n
        else:
            status = [o.status.value for o in train_ensemble(cfgs, dirs)]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    gpu = torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else None
    return {"mode": mode, "runs": n, "wall_s": wall, "cpu_s": cpu, "rss_mib": peak, "gpu_mib": gpu, "status": status}


def _fit_line(ms: dict) -> tuple[float, float]:
    """Least squares ``ms[b] = fixed + b * per_example``."""
    xs = list(ms)
    xm, ym = statistics.mean(xs), statistics.mean(ms.values())
    per_example = sum((x - xm) * (ms[x] - ym) for x in xs) / sum((x - xm) ** 2 for x in xs)
    return ym - per_example * xm, per_example


def step_costs(members: int) -> dict:
    """CPU milliseconds per training step and run at batch 8, 64, 128: the single trainer (40 steps
    each) and an ensemble of ``members`` (8 steps each, divided by ``members``); each split into
    a fixed part and a per-example part (least squares); the ceiling ``t(64) / (t(64) - fixed)``."""
    import torch

    from circuitfade.train import RunConfig, TrainConfig, fit, new_run
    from circuitfade.train.ensemble import Ensemble

    torch.set_num_threads(1)
    single, ens = {}, {}
    for bs in (8, 64, 128):
        # fit evaluates at the step it stops at: a one-example, one-condition evaluation keeps that out of the timing
        tc = TrainConfig(steps=10**6, eval_every=10**6, batch_size=bs, eval_size=1, eval_conditions=("normal",))
        cfgs = [RunConfig(path="fade600->0", seed=s, train=tc) for s in range(members)]
        run = new_run(cfgs[0])
        fit(run, until=3, progress=False)
        c0 = time.process_time()
        fit(run, until=run.step + 40, progress=False)
        single[bs] = (time.process_time() - c0) / 40 * 1e3
        e = Ensemble([new_run(c) for c in cfgs])
        task = cfgs[0].make_task()
        e.train_step(task)
        c0 = time.process_time()
        for _ in range(8):
            e.train_step(task)
        ens[bs] = (time.process_time() - c0) / 8 / members * 1e3
    fixed, per_example = _fit_line(single)
    e_fixed, e_per_example = _fit_line(ens)
    return {"mode": "step_costs", "members": members, "ms_per_step": single, "fixed_ms": fixed,
            "per_example_ms": per_example, "ceiling_at_64": single[64] / max(single[64] - fixed, 1e-9),
            "ensemble_ms_per_run_step": ens, "ensemble_fixed_ms": e_fixed, "ensemble_per_example_ms": e_per_example,
            "status": ["done"]}


def measure(mode: str, n: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, str(n), "--steps", str(args.steps), "--eval-every",
           str(args.eval_every), "--checkpoint-every", str(args.checkpoint_every), "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if any(s != "done" for s in r.get("status", [])):
        raise RuntimeError(f"{mode} E={n}: runs did not finish: {r['status']}")
    return r


def profile(n: int, args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile

    from circuitfade.train import fit, new_run
    from circuitfade.train.ensemble import Ensemble
    from circuitfade.train.state import one_thread

    cfgs = configs(n, 100_000, 100_000, 100_000, args.device)
    task = cfgs[0].make_task()
    ens = Ensemble([new_run(c) for c in cfgs])
    single = new_run(cfgs[0])
    with one_thread():
        ens.train_step(task)
        fit(single, until=2, progress=False)
        for name, fn in (("ensemble", lambda: [ens.train_step(task) for _ in range(10)]),
                         ("single", lambda: fit(single, until=single.step + 10 * n, progress=False))):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            print(f"--- {name}: 10 steps of E={n}" if name == "ensemble" else f"--- {name}: {10 * n} steps")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def compare_full(args: argparse.Namespace) -> dict:
    """Full default runs, single and as one ensemble: final metrics, their differences, the seed spread."""
    import torch

    from circuitfade.io import load_tensors
    from circuitfade.train.rundir import RunDir
    from circuitfade.train import RunConfig, TrainConfig, train
    from circuitfade.train.ensemble import train_ensemble

    torch.set_num_threads(1)
    seeds = (0, 1, 2)
    cfgs = [RunConfig(path="fade600->0", seed=s, train=TrainConfig(device=args.device)) for s in seeds]
    with tempfile.TemporaryDirectory(prefix="bench_full_") as tmp:
        tmp = Path(tmp)
        c0 = time.process_time()
        for c in cfgs:
            train(c, tmp / f"single{c.seed}", progress=False)
        c1 = time.process_time()
        outs = train_ensemble(cfgs, [tmp / f"ens{c.seed}" for c in cfgs])
        c2 = time.process_time()
        if any(o.status.value != "done" for o in outs):
            raise RuntimeError(f"ensemble members did not finish: {[o.error for o in outs]}")
        single = [RunDir(tmp / f"single{s}").read_done()["final"] for s in seeds]
        ens = [RunDir(tmp / f"ens{s}").read_done()["final"] for s in seeds]
        same_files = all(
            RunDir(tmp / f"single{s}").metrics_file.read_bytes() == RunDir(tmp / f"ens{s}").metrics_file.read_bytes()
            and all(torch.equal(a, b) for a, b in zip(
                load_tensors(RunDir(tmp / f"single{s}").weights_file(3600)).values(),
                load_tensors(RunDir(tmp / f"ens{s}").weights_file(3600)).values()))
            for s in seeds)
    keys = [k for k in single[0] if k.startswith(("acc_", "loss_")) or k == "train_loss"]
    print(f"3 default runs (3,600 steps, fade600->0, seeds {seeds}): single {c1 - c0:.0f} s, ensemble of 3 "
          f"{c2 - c1:.0f} s (cpu)")
    report = {}
    for k in keys:
        a, b = [r[k] for r in single], [r[k] for r in ens]
        diff = max(abs(x - y) for x, y in zip(a, b))
        spread = statistics.stdev(a)
        report[k] = {"single": a, "ensemble": b, "max_abs_difference": diff, "seed_sd": spread,
                     "seed_range": max(a) - min(a)}
        print(f"  {k:12s} single {' '.join(f'{x:.4f}' for x in a)}  ensemble {' '.join(f'{x:.4f}' for x in b)}  "
              f"max |diff| {diff:.2e}  seed sd {spread:.4f}  range {max(a) - min(a):.4f}")
    print(f"  metrics.csv and final weights identical: {same_files}")
    rep = {"command": "python benchmarks/ensemble.py --compare-full", "final_metrics": report,
           "identical_files": same_files, "cpu_s_single": c1 - c0, "cpu_s_ensemble": c2 - c1}
    write_outputs(Path(args.out).with_name("ensemble_full.json"), rep, full_markdown(rep))
    return rep


def full_markdown(rep: dict) -> str:
    """The --compare-full report as the markdown the docs include."""
    lines = [f"Three default runs (3,600 steps, `fade600->0`, seeds 0, 1, 2) as single runs and as one ensemble "
             f"of three (`{rep['command']}`): CPU {rep['cpu_s_single']:.0f} s single, {rep['cpu_s_ensemble']:.0f} s "
             "ensemble.", "", "| final metric | single runs | ensemble members | largest difference | seed sd |",
             "|---|---|---|---|---|"]
    for k, r in rep["final_metrics"].items():
        lines.append(f"| `{k}` | {' '.join(f'{x:.4f}' for x in r['single'])} | "
                     f"{' '.join(f'{x:.4f}' for x in r['ensemble'])} | {r['max_abs_difference']:.2g} | {r['seed_sd']:.4f} |")
    lines += ["", "`metrics.csv` and final weights identical to the single runs': "
              + ("**yes**" if rep["identical_files"] else "**no**") + "."]
    return "\n".join(lines) + "\n"


def bench_markdown(res: dict) -> str:
    """The runs-per-hour table, the step-cost split and the default E as the markdown the docs include."""
    seq, kind = res["sequential"], res["device"].split(":")[0]
    lines = [f"`{res['command'].strip()}` on {res['device']} ({res['cpus']} cores, one torch thread per process): the "
             f"base model, `fade600->0`, {res['steps']} steps (evaluation every {res['eval_every']}, checkpoint every "
             f"{res['checkpoint_every']}); the sequential trainer trains {res.get('sequential_runs', 1)} run(s) per round; "
             "medians over rounds.", "",
             "| trainer | runs/hour (wall) | runs/hour (CPU) | ratio (wall) | ratio (CPU) | peak RSS | rounds |",
             "|---|---|---|---|---|---|---|",
             f"| sequential | {seq['runs_per_hour_wall']:.0f} | {seq['runs_per_hour_cpu']:.0f} | 1 | 1 | "
             f"{seq['rss_mib']:.0f} MiB | |"]
    for n, e in sorted(res["ensemble"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| ensemble E = {n} | {e['runs_per_hour_wall']:.0f} | {e['runs_per_hour_cpu']:.0f} | "
                     f"{e['ratio_wall']:.2f} | {e['ratio_cpu']:.2f} | {e['rss_mib']:.0f} MiB | {e['rounds']} |")
    med = res.get("step_costs") or {}
    if med:
        lines += ["", f"A single step at batch 64 costs {med['fixed_ms']:.1f} ms fixed + "
                  f"{64 * med['per_example_ms']:.1f} ms proportional to the batch (CPU): removing all of the fixed "
                  f"part gives at most **{med['ceiling_at_64']:.2f}×**."]
        if "ensemble_fixed_ms" in med:
            lines[-1] += (f" Per run and step, the ensemble has {med['ensemble_fixed_ms']:.1f} ms fixed + "
                          f"{64 * med['ensemble_per_example_ms']:.1f} ms proportional to the batch.")
    best = res["default_members"][kind]
    lines += ["", f"Default E for {kind}: **{best}** (the smallest E within {res['tolerance']:.0%} of the highest "
              f"median ratio)."]
    return "\n".join(lines) + "\n"


def bench_figure(res: dict, stem: Path) -> None:
    """``stem.png`` (and ``.html``): runs per hour against E, both trainers, with the step-cost ceiling."""
    import plotly.graph_objects as go

    from circuitfade.viz.export import save_figure

    sizes = sorted(int(n) for n in res["ensemble"])
    fig = go.Figure()
    for key, name, dash in (("ratio_cpu", "ensemble / sequential (CPU time)", "solid"),
                            ("ratio_wall", "ensemble / sequential (wall time)", "dot")):
        fig.add_scatter(x=sizes, y=[res["ensemble"][str(n)][key] for n in sizes], mode="lines+markers", name=name,
                        line={"dash": dash})
    fig.add_hline(y=1.0, line={"color": "grey", "dash": "dash"}, annotation_text="sequential trainer")
    ceiling = (res.get("step_costs") or {}).get("ceiling_at_64")
    above = ceiling is not None and ceiling >= TARGET  # the higher line's label above it, the lower's below
    if ceiling:
        fig.add_hline(y=ceiling, line={"color": "firebrick", "dash": "dash"},
                      annotation_position="top right" if above else "bottom left",
                      annotation_text=f"ceiling from the fixed part of a step ({ceiling:.2f}x)")
    fig.add_hline(y=TARGET, line={"color": "seagreen", "dash": "dot"},
                  annotation_position="bottom left" if above else "top left",
                  annotation_text=f"target at E = 16 ({TARGET}x)")
    labels = [f"{n}<br>({res['ensemble'][str(n)]['rounds']} round{'s' if res['ensemble'][str(n)]['rounds'] > 1 else ''})"
              for n in sizes]
    fig.update_layout(title=f"Runs per hour of the ensemble trainer relative to the sequential one ({res['device']}, "
                            "one thread)", xaxis={"title": "ensemble size E", "type": "log", "tickvals": sizes,
                                                  "ticktext": labels},
                      yaxis={"title": "runs/hour ratio", "range": [0, max(1.75, 1.12 * (ceiling or 0), 1.1 * max(
                          max(e["ratio_cpu"], e["ratio_wall"]) for e in res["ensemble"].values()))]}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25}, height=450)
    save_figure(fig, stem)


TARGET = 1.5
"""Runs per hour the ensemble trainer should reach at E = 16 on a CPU, relative to the sequential trainer."""

TOLERANCE = 0.05
"""The default E is the smallest E whose median ratio is within this fraction of the best one
(more members cost memory and make fewer, larger jobs for the same gain)."""


def summarize(rows: list[dict], sizes: list[int], args: argparse.Namespace) -> dict:
    """Medians over rounds, ratios, the step-cost split and the default E; printed and returned."""
    seq = {m["round"]: m for m in rows if m["mode"] == "sequential"}
    summary = {}
    for n in sizes:
        ms = [m for m in rows if m["mode"] == "ensemble" and m["runs"] == n]
        ratio_wall = [n * seq[m["round"]]["wall_s"] / seq[m["round"]]["runs"] / m["wall_s"] for m in ms]
        ratio_cpu = [n * seq[m["round"]]["cpu_s"] / seq[m["round"]]["runs"] / m["cpu_s"] for m in ms]
        summary[n] = {
            "rounds": len(ms),
            "runs_per_hour_wall": statistics.median(3600 * n / m["wall_s"] for m in ms),
            "runs_per_hour_cpu": statistics.median(3600 * n / m["cpu_s"] for m in ms),
            "ratio_wall": statistics.median(ratio_wall), "ratio_cpu": statistics.median(ratio_cpu),
            "ratios_wall": ratio_wall, "ratios_cpu": ratio_cpu,
            "rss_mib": statistics.median(m["rss_mib"] for m in ms),
            "gpu_mib": ms[0]["gpu_mib"],
        }
    seq_rph_wall = statistics.median(3600 * m["runs"] / m["wall_s"] for m in seq.values())
    seq_rph_cpu = statistics.median(3600 * m["runs"] / m["cpu_s"] for m in seq.values())
    seq_rss = statistics.median(m["rss_mib"] for m in seq.values())
    costs = [m for m in rows if m["mode"] == "step_costs"]
    med = {k: statistics.median(m[k] for m in costs) for k in ("fixed_ms", "per_example_ms", "ceiling_at_64",
                                                                "ensemble_fixed_ms", "ensemble_per_example_ms")
           if costs and k in costs[0]}
    key = "ratio_wall" if args.device.startswith("cuda") else "ratio_cpu"
    top = max(summary[n][key] for n in sizes)
    best = min(n for n in sizes if summary[n][key] >= (1 - TOLERANCE) * top)
    kind = args.device.split(":")[0]
    from circuitfade.train.ensemble import DEFAULT_MEMBERS

    print(f"\nbase model, fade600->0, {args.steps} steps (evaluation every {args.eval_every}, checkpoint every "
          f"{args.checkpoint_every}), one thread, {args.device}; medians over rounds")
    print(f"  sequential     {seq_rph_wall:7.0f} runs/h (wall)  {seq_rph_cpu:7.0f} runs/h (cpu)  peak RSS "
          f"{seq_rss:5.0f} MiB")
    for n in sizes:
        s = summary[n]
        print(f"  ensemble E={n:<3d} {s['runs_per_hour_wall']:7.0f} runs/h (wall)  {s['runs_per_hour_cpu']:7.0f} "
              f"runs/h (cpu)  peak RSS {s['rss_mib']:5.0f} MiB  ratio {s['ratio_wall']:.2f} (wall) "
              f"{s['ratio_cpu']:.2f} (cpu)  [{s['rounds']} round(s)]")
    if med:
        print(f"where the rest goes: a single step at batch 64 is {med['fixed_ms']:.1f} ms fixed + "
              f"{64 * med['per_example_ms']:.1f} ms proportional to the batch (cpu); removing all of the fixed part "
              f"gives at most {med['ceiling_at_64']:.2f}x")
        if "ensemble_fixed_ms" in med:
            print(f"  per run and step, the ensemble of {costs[0]['members']} has {med['ensemble_fixed_ms']:.1f} ms fixed + "
                  f"{64 * med['ensemble_per_example_ms']:.1f} ms proportional to the batch")
    print(f"default E for {kind}: {best} (the smallest E within {TOLERANCE:.0%} of the highest median "
          f"{key.replace('_', ' ')}); DEFAULT_MEMBERS[{kind!r}] = {DEFAULT_MEMBERS.get(kind)}"
          + ("" if DEFAULT_MEMBERS.get(kind) == best else "  <- differs: update DEFAULT_MEMBERS"))
    return {
        "device": args.device, "arch": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "steps": args.steps, "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every,
        "sequential_runs": max(m["runs"] for m in seq.values()),
        "sequential": {"runs_per_hour_wall": seq_rph_wall, "runs_per_hour_cpu": seq_rph_cpu, "rss_mib": seq_rss},
        "ensemble": {str(n): s for n, s in summary.items()}, "step_costs": med,
        "default_members": {kind: best}, "tolerance": TOLERANCE, "measurements": rows,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100, help="as a default run (default %(default)s)")
    ap.add_argument("--checkpoint-every", type=int, default=300, help="as a default run (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-rounds", type=int, default=1, help="rounds for the largest E (default %(default)s)")
    ap.add_argument("--sizes", default="1,4,16,64", help="ensemble sizes E (comma-separated)")
    ap.add_argument("--sequential-runs", type=int, default=2,
                    help="runs the sequential trainer trains per round, one after another (default %(default)s)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/ensemble.json in the repository)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, metavar="E", help="print where an ensemble step's time goes at E")
    ap.add_argument("--compare-full", action="store_true", help="3 full default runs, single vs one ensemble")
    ap.add_argument("--summarize", metavar="JSON", help="print the summary of measurements saved by an earlier run")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "ensemble.json")
    if min(args.steps, args.eval_every, args.checkpoint_every, args.rounds, args.big_rounds, args.sequential_runs) < 1:
        raise SystemExit("--steps, --eval-every, --checkpoint-every, --rounds, --big-rounds and --sequential-runs "
                         "must be >= 1")
    if args.child:
        mode, n = args.child[0], int(args.child[1])
        print(json.dumps(step_costs(n) if mode == "step_costs" else child(mode, n, args)))
        return {}
    if args.profile:
        profile(args.profile, args)
        return {}
    if args.compare_full:
        return compare_full(args)
    if args.summarize:
        path = Path(args.summarize)
        saved = json.loads(path.read_text())
        sizes = sorted(int(n) for n in saved["ensemble"])
        result = summarize(saved["measurements"], sizes, argparse.Namespace(**{**vars(args), **{
            k: saved[k] for k in ("steps", "eval_every", "checkpoint_every", "device")}}))
        result.update({k: saved[k] for k in ("command", "seconds") if k in saved})
        md = path.with_suffix(".md")
        from circuitfade.io import write_text

        write_text(md, bench_markdown(result))
        bench_figure(result, path.with_suffix(""))
        print(f"wrote {md} and {path.with_suffix('.png').name}")
        return result
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if not sizes or sizes[0] < 1:
        raise SystemExit(f"--sizes: expected positive integers, got {args.sizes!r}")
    big = sizes[-1] if len(sizes) > 1 else None
    rows: list[dict] = []
    t0 = time.time()
    for r in range(max(args.rounds, args.big_rounds)):
        plan = [("sequential", args.sequential_runs)] + [("ensemble", n) for n in sizes if n != big and r < args.rounds]
        plan.append(("step_costs", max([n for n in sizes if n <= 16] or [sizes[0]])))
        if big is not None and r < args.big_rounds:
            plan.append(("ensemble", big))
        if r % 2:  # alternate the order round by round
            plan = [plan[0]] + plan[:0:-1]
        for mode, n in plan:
            m = measure(mode, n, args)
            m["round"] = r
            rows.append(m)
            if mode == "step_costs":
                print(f"round {r}: ms per step and run at batch 8/64/128 (cpu): single "
                      + "/".join(f"{v:.1f}" for v in m["ms_per_step"].values())
                      + f" = {m['fixed_ms']:.1f} fixed + {m['per_example_ms']:.3f} per example (ceiling at 64: "
                      f"{m['ceiling_at_64']:.2f}); ensemble of {n} "
                      + "/".join(f"{v:.1f}" for v in m["ensemble_ms_per_run_step"].values())
                      + f" = {m['ensemble_fixed_ms']:.1f} + {m['ensemble_per_example_ms']:.3f}", flush=True)
                continue
            print(f"round {r}: {mode:10s} {'runs' if mode == 'sequential' else 'E'}={n:<4d} wall {m['wall_s']:7.1f} s  cpu {m['cpu_s']:7.1f} s  "
                  f"peak RSS {m['rss_mib']:6.0f} MiB", flush=True)
    result = summarize(rows, sizes, args)
    result["command"] = command_line(__file__, argv)
    result["seconds"] = time.time() - t0
    write_outputs(Path(args.out), result, bench_markdown(result))
    bench_figure(result, Path(args.out).with_suffix(""))
    return result


if __name__ == "__main__":
    main()
