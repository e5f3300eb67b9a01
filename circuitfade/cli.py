"""Command line: ``circuitfade train | demo | ...``.

Each subcommand is a function taking parsed arguments; :func:`main` takes an
``argv`` list so tests can call it directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

def _task_dict(name: str, kv: list[str]) -> dict:
    d: dict = {"name": name}
    for item in kv or []:
        if "=" not in item:
            raise SystemExit(f"--task-arg expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        d[k] = json.loads(v) if v[:1] in "0123456789-[{tf" and v not in ("-",) else v
    return d


def _train_one(args: dict) -> dict:
    """Worker: train one run (own process, one torch thread) and return its final metrics."""
    import torch

    from circuitfade.train.loop import RunConfig, train

    torch.set_num_threads(1)
    cfg = RunConfig.from_dict(args["config"])
    run = train(cfg, args["out"], progress=args.get("progress", False))
    return {"path": cfg.path, "seed": cfg.seed, "out": args["out"], **run.metrics[-1]}


def cmd_train(ns: argparse.Namespace) -> int:
    from circuitfade.train.loop import RunConfig, TrainConfig

    tc = TrainConfig(steps=ns.steps, eval_every=ns.eval_every, checkpoint_every=ns.checkpoint_every,
                     device=ns.device)
    model = json.loads(ns.model) if ns.model else {}
    cfg = RunConfig(path=ns.path, task=_task_dict(ns.task, ns.task_arg), model=model, train=tc, seed=ns.seed)
    out = ns.out or f"runs/{ns.task}/{ns.path.replace('->', 'to')}/seed{ns.seed}"
    t0 = time.time()
    res = _train_one({"config": cfg.to_dict(), "out": out, "progress": not ns.quiet})
    print(f"{out}: step {res['step']}  acc_normal {res['acc_normal']:.3f}  acc_zero {res.get('acc_zero', float('nan')):.3f}"
          f"  ({time.time() - t0:.0f} s)")
    return 0


def cmd_demo(ns: argparse.Namespace) -> int:
    from circuitfade.train.loop import RunConfig, TrainConfig

    paths = ["unforced", "fade600->0"]
    jobs = []
    for p in paths:
        cfg = RunConfig(path=p, train=TrainConfig(steps=ns.steps), seed=ns.seed)
        jobs.append({"config": cfg.to_dict(), "out": str(Path(ns.out) / p.replace("->", "to") / f"seed{ns.seed}")})
    print(f"circuitfade demo: training {paths} on associative recall, seed {ns.seed}, {ns.steps} steps each, "
          f"into {ns.out}/ (finished runs are reused)")
    t0 = time.time()
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_train_one, jobs))
    print()
    print("| path | normal acc (ours) | zero-gate acc (ours) | gate at end | paper zero-gate | paper normal |")
    print("|---|---|---|---|---|---|")
    from circuitfade.experiments.paper import PAPER_T1_BASE  # published (zero-gate, normal), Table 1

    for r in results:
        pz, pn = PAPER_T1_BASE[r["path"]]
        print(f"| {r['path']} | {r['acc_normal']:.3f} | {r['acc_zero']:.3f} | {r['gate_pos']:.2f} | {pz} | {pn} |")
    print(f"\nwall time {time.time() - t0:.0f} s. 'normal' = gates as at the final step (0 for fade600->0, "
          f"so normal = zero-gate there); paper numbers are mean ± sd over seeds (Table 1).")
    return 0


# Subcommands whose argument parsing lives in their own module: name -> (module, function, help)
DELEGATED = {
    "reproduce": ("circuitfade.experiments.reproduce", "main", "run the main paper's experiments, write results.md"),
    "history": ("circuitfade.experiments.history", "main",
                "history dependence between in-context and in-weights learning (balanced mix schedules)"),
    "screen": ("circuitfade.experiments.development", "main",
               "screen a revision series for induction / previous-token / BOS heads, write an HTML report"),
    "analyze": ("circuitfade.viz.report", "analyze_main",
                "trace head diagnostics over a run's checkpoints, print the consolidation timeline, write an HTML report"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="circuitfade", description="Annealable soft-prior Transformers: train, trace, reproduce.")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one run along a gate path")
    t.add_argument("--task", default="assoc", help="task name (assoc, markov)")
    t.add_argument("--task-arg", action="append", metavar="KEY=VALUE", help="task parameter, e.g. p=0.2")
    t.add_argument("--path", default="fade600->0", help="gate path spec, e.g. unforced, forced_zero, fade600->0")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=3600)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--checkpoint-every", type=int, default=300)
    t.add_argument("--model", help="JSON of SoftPriorConfig overrides, e.g. '{\"n_layers\": 4}'")
    t.add_argument("--out", help="run directory (default runs/TASK/PATH/seedN)")
    t.add_argument("--device", default="cpu",
                   help="cpu (default), cuda, cuda:N, mps or auto; not part of the run's identity")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("demo", help="train unforced and fade600->0 and compare zero-gate accuracy")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--steps", type=int, default=3600)
    d.set_defaults(func=cmd_demo)
    for name, (_, _, helptext) in DELEGATED.items():
        sub.add_parser(name, help=helptext + f" (see: circuitfade {name} --help)", add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        module, func, _ = DELEGATED[argv[0]]
        try:
            return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
        except (ValueError, FileNotFoundError) as e:
            print(f"circuitfade {argv[0]}: error: {e}", file=sys.stderr)
            return 2
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, FileNotFoundError) as e:
        print(f"circuitfade: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
