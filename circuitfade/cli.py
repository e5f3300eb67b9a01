"""Command line: ``circuitfade train | demo | ...``.

Each subcommand is a function taking parsed arguments; :func:`main` takes an
``argv`` list so tests can call it directly. Every subcommand runs inside
:func:`guarded`: a user error (bad input, a held lock, a full or read-only disk,
a diverged run) ends as one line on stderr naming the problem and exit code 2;
Ctrl-C ends as one line saying the command can be run again to resume (exit 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
import time
import types
import typing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


# --------------------------------------------------------------------------------------
# error handling shared by every subcommand
# --------------------------------------------------------------------------------------
class UsageError(ValueError):
    """A bad command-line value (reported as one line, exit code 2)."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from concurrent.futures import BrokenExecutor  # a worker process died (killed, out of memory)

    from circuitfade.train.loop import RunLocked, TrainingDiverged

    return (ValueError, OSError, RunLocked, TrainingDiverged, BrokenExecutor)


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else ""
        hint = " (disk full)" if e.errno == errno.ENOSPC else ""
        return f"{where}{e.strerror}{hint}"
    return " ".join(str(e).split()) or type(e).__name__


def guarded(prog: str, fn, *args) -> int:
    """Run ``fn(*args)``; user errors -> one line + exit 2, Ctrl-C -> one line + exit 130."""
    try:
        return int(fn(*args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished checkpoints are kept: run the same command again to resume",
              file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - filtered just below; anything else is a bug: traceback
        if not isinstance(e, _user_errors()):
            raise
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------
# typed parsing of --task-arg and --model
# --------------------------------------------------------------------------------------
_NONE = ("none", "null")
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def _parse_typed(what: str, text: str, tp):
    """``text`` as a value of type ``tp`` (int, float, bool, str, X | None, tuple[...], list[...])."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in _NONE and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return _parse_typed(what, text, a)
            except UsageError:
                continue
        raise UsageError(f"{what}: cannot read {text!r} as {tp}")
    if tp is bool:
        if text.lower() not in _BOOLS:
            raise UsageError(f"{what}: expected true or false, got {text!r}")
        return _BOOLS[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise UsageError(f"{what}: expected {'an integer' if tp is int else 'a number'}, got {text!r}") from None
    if tp is str:
        return text
    if origin in (tuple, list) or tp in (tuple, list):
        try:
            items = json.loads(text) if text.startswith("[") else [t for t in text.split(",") if t]
        except json.JSONDecodeError as e:
            raise UsageError(f"{what}: not a JSON list ({e.msg})") from None
        elem = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis or len(set(args)) == 1) else None
        if elem is not None:
            items = [_parse_typed(what, str(x), elem) if isinstance(x, str) else x for x in items]
        return (tuple if (origin or tp) is tuple else list)(items)
    try:  # anything else (Any, dicts, unannotated): JSON, else the string
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _task_dict(name: str, kv: list[str] | None) -> dict:
    """``{"name": name, **task args}``, each value parsed by its field's type in the task's config."""
    from circuitfade.tasks import make_task

    cfg = getattr(make_task(name), "config", None)  # unknown task names raise, listing the known ones
    types = typing.get_type_hints(type(cfg)) if dataclasses.is_dataclass(cfg) else None
    d: dict = {"name": name}
    for item in kv or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--task-arg expects KEY=VALUE, got {item!r}")
        if types is not None and k not in types:
            raise UsageError(f"--task-arg {k}: task {name!r} has no parameter {k!r}; its parameters: {sorted(types)}")
        d[k] = _parse_typed(f"--task-arg {k}", v, types[k]) if types is not None else _parse_typed(k, v, typing.Any)
    return d


def _json_object(flag: str, text: str | None) -> dict:
    if not text:
        return {}
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag}: not valid JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(d, dict):
        raise UsageError(f"{flag}: expected a JSON object such as '{{\"n_layers\": 4}}', got {text!r}")
    return d


# --------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------
def _train_one(args: dict) -> dict:
    """Worker: train one run (``train`` computes with one torch thread) and return its final metrics."""
    from circuitfade.train.loop import RunConfig, train

    cfg = RunConfig.from_dict(args["config"])
    run = train(cfg, args["out"], progress=args.get("progress", False))
    return {"path": cfg.path, "seed": cfg.seed, "out": args["out"], **run.metrics[-1]}


def cmd_train(ns: argparse.Namespace) -> int:
    from circuitfade.train.loop import RunConfig, TrainConfig

    tc = TrainConfig(steps=ns.steps, eval_every=ns.eval_every, checkpoint_every=ns.checkpoint_every,
                     device=ns.device)
    model = _json_object("--model", ns.model)
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
    "static": ("circuitfade.experiments.static_baselines", "main",
               "static baselines (13 methods) and removability of published priors, write results.md"),
    "analyze": ("circuitfade.viz.report", "analyze_main",
                "trace head diagnostics over a run's checkpoints, print the consolidation timeline, write an HTML report"),
}


def _train_default(name: str):
    """A flag's default, read from :class:`~circuitfade.train.loop.TrainConfig` (never copied)."""
    from circuitfade.train.loop import TrainConfig

    return {f.name: f.default for f in dataclasses.fields(TrainConfig)}[name]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="circuitfade", description="Annealable soft-prior Transformers: train, trace, reproduce.")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one run along a gate path")
    t.add_argument("--task", default="assoc", help="task name (assoc, markov)")
    t.add_argument("--task-arg", action="append", metavar="KEY=VALUE", help="task parameter, e.g. p=0.2")
    t.add_argument("--path", default="fade600->0", help="gate path spec, e.g. unforced, forced_zero, fade600->0")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=_train_default("steps"), help="global step at which the run ends")
    t.add_argument("--eval-every", type=int, default=_train_default("eval_every"))
    t.add_argument("--checkpoint-every", type=int, default=_train_default("checkpoint_every"))
    t.add_argument("--model", help="JSON of SoftPriorConfig overrides, e.g. '{\"n_layers\": 4}'")
    t.add_argument("--out", help="run directory (default runs/TASK/PATH/seedN)")
    t.add_argument("--device", default=_train_default("device"),
                   help="cpu (default), cuda, cuda:N, mps or auto; not part of the run's identity")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("demo", help="train unforced and fade600->0 and compare zero-gate accuracy")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--steps", type=int, default=_train_default("steps"))
    d.set_defaults(func=cmd_demo)
    for name, (_, _, helptext) in DELEGATED.items():
        sub.add_parser(name, help=helptext + f" (see: circuitfade {name} --help)", add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        module, func, _ = DELEGATED[argv[0]]
        return guarded(f"circuitfade {argv[0]}", lambda: getattr(importlib.import_module(module), func)(argv[1:]))
    ns = build_parser().parse_args(argv)
    return guarded(f"circuitfade {ns.command}", ns.func, ns)


if __name__ == "__main__":
    sys.exit(main())
