"""Command line: ``circuitfade train | demo | ...``.

Each subcommand is a function taking parsed arguments; :func:`main` takes an
``argv`` list so tests can call it directly. Every subcommand runs inside
:func:`~circuitfade.commands.boundary.guarded` (the command-line boundary every subcommand
shares, :mod:`circuitfade.commands.boundary`): a user error (bad input, a held lock, a full or
read-only disk, a diverged run) ends as one line on stderr naming the problem in the
command's own flags (never the library's Python argument names), at most a few hundred
characters, with a pointer to ``--help`` for bad input, and exit code 2; a usage error
found by the parser is one such line too. A command that fails leaves no output folder
it created behind. Ctrl-C ends as one line (exit 130) that says the command can be run
again to resume only for the commands that resume (``train``, ``demo``,
``local-series``); a second Ctrl-C while the process winds down ends it at once, quietly.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

# the boundary every subcommand shares (light: nothing heavy is imported)
from circuitfade.commands.boundary import (
    Parser,
    UsageError,
    check_count,
    flag_names,
    guarded,
    removing_new_folders,
)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# --------------------------------------------------------------------------------------
# typed parsing of --task-arg and --model
# --------------------------------------------------------------------------------------
def _parse_typed(what: str, text: str, tp):
    """:func:`circuitfade.io.parse_typed` (the one typed-value parser), as a :class:`UsageError`."""
    from circuitfade.io import parse_typed

    try:
        return parse_typed(what, text, tp)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _task_dict(name: str, kv: list[str] | None) -> dict:
    """``{"name": name, **task args}``, each value parsed by its field's type in the task's config
    (:func:`circuitfade.tasks.parse_task_args`)."""
    from circuitfade.tasks import parse_task_args

    try:
        return parse_task_args(name, kv)
    except ValueError as e:
        raise UsageError(str(e)) from None


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
    from circuitfade.train import RunConfig, train

    cfg = RunConfig.from_dict(args["config"])
    queue = args.get("queue")  # the demo's progress channel: (label, step) after each evaluation
    logger = (lambda step, _m, label=args.get("label", cfg.path): queue.put((label, step))) if queue else None
    run = train(cfg, args["out"], progress=args.get("progress", False), logger=logger)
    return {"path": cfg.path, "seed": cfg.seed, "out": args["out"], **run.metrics[-1]}


def _config_file(path: str) -> dict:
    """The RunConfig fields in the file ``path``: JSON, or YAML (``.yaml``/``.yml``, needs PyYAML);
    a :class:`UsageError` naming the file when it is missing, unreadable or not an object."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UsageError(f"--config {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {p}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"--config {p}: reading YAML needs PyYAML (pip install pyyaml); "
                             "or write the file as JSON") from None
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UsageError(f"--config {p}: not valid YAML ({' '.join(str(e).split())})") from None
    else:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--config {p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(d, dict):
        raise UsageError(f"--config {p}: expected an object with RunConfig fields (path, task, model, train, "
                         f"seed, mix), got {type(d).__name__}")
    return d


def run_config_from_args(ns: argparse.Namespace):
    """The :class:`~circuitfade.train.config.RunConfig` of a ``train`` command line: the
    ``--config`` file's fields (if any), then every flag given on the command line on top
    (``--model`` and ``--task-arg`` are merged into the file's model and task; ``--task`` naming
    another task replaces the file's task). Errors name the file or the flag."""
    from circuitfade.train import RunConfig

    src = f"--config {ns.config}: " if ns.config else ""
    d = {k: v for k, v in (_config_file(ns.config) if ns.config else {}).items() if k != "circuitfade_version"}
    for key in ("task", "model", "train"):
        if key in d and not isinstance(d[key], dict):
            raise UsageError(f"{src}{key!r} must be an object, got {d[key]!r}")
    if ns.path is not None:
        d["path"] = ns.path
    task = d.get("task") or {"name": "assoc"}
    if ns.task is not None and ns.task != task.get("name"):
        task = _task_dict(ns.task, ns.task_arg)
    elif ns.task_arg:
        if "name" not in task:
            raise UsageError(f"{src}'task' needs a 'name' (e.g. {{\"name\": \"assoc\"}})")
        task = {**task, **_task_dict(task["name"], ns.task_arg)}
    d["task"] = task
    if ns.model:
        d["model"] = {**d.get("model", {}), **_json_object("--model", ns.model)}
    d["train"] = {**d.get("train", {}), **_train_kwargs(ns, "steps", "eval_every", "checkpoint_every", "device",
                                                                "compile")}
    if ns.seed is not None:
        d["seed"] = ns.seed
    try:
        return RunConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{src}{_one_line(e)}") from None


def cmd_train(ns: argparse.Namespace) -> int:
    cfg = run_config_from_args(ns)
    if ns.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        return 0
    out = ns.out or f"runs/{cfg.task['name']}/{cfg.path.replace('->', 'to')}/seed{cfg.seed}"
    t0 = time.time()
    with removing_new_folders(out):  # a run that fails before writing anything leaves no folder
        res = _train_one({"config": cfg.to_dict(), "out": out, "progress": not ns.quiet})
    pm = cfg.make_task().primary_metric  # accuracy for token tasks, MSE for regression
    vals = "  ".join(f"{pm.key(c)} {res.get(pm.key(c), float('nan')):.3f}" for c in ("normal", "zero"))
    print(f"{out}: step {res['step']}  {vals}  ({time.time() - t0:.0f} s)")
    return 0


def _run_with_progress(jobs: list[dict], totals: dict[str, int]) -> list[dict]:
    """Train ``jobs`` in parallel processes (:func:`circuitfade.train.jobs.run_jobs`), one progress
    bar per run in this process.

    Each worker's trainer reports ``(label, step)`` after every evaluation through a manager
    queue (the trainer's ``logger=`` hook); a finished run that is reused reports nothing and
    its bar jumps to the end.
    """
    import multiprocessing as mp
    import queue as queue_mod

    from tqdm import tqdm

    from circuitfade.train.jobs import run_jobs

    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with mp.Manager() as manager:
        q = manager.Queue()
        bars = {label: tqdm(total=n, desc=f"{label:>12}", position=i, unit="step", leave=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} steps [{elapsed}<{remaining}]")
                for i, (label, n) in enumerate(totals.items())}

        def drain() -> None:
            while True:
                try:
                    label, step = q.get_nowait()
                except queue_mod.Empty:
                    return
                bar = bars[label]
                bar.update(max(0, min(step, bar.total) - bar.n))

        results: list[dict | None] = [None] * len(jobs)
        for i, res in run_jobs(_train_one, [{**job, "queue": q} for job in jobs], workers=workers,
                               inline=False, on_wait=drain):
            results[i] = res
        drain()
        for bar in bars.values():
            bar.update(bar.total - bar.n)
            bar.close()
    return results


DEMO_MARK = "<!-- written by circuitfade demo -->"


def _write_demo_summary(path: Path, lines: list[str]) -> None:
    from circuitfade.io import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join([DEMO_MARK, *lines]) + "\n")


def cmd_demo(ns: argparse.Namespace) -> int:
    """Train the two demo runs, print and write the comparison, write the fade run's report."""
    summary = Path(ns.summary) if ns.summary else Path(ns.out) / "demo.md"
    if summary.exists() and (not summary.is_file() or not summary.read_text(errors="replace").startswith(DEMO_MARK)):
        raise UsageError(f"{summary} exists and was not written by the demo; name another file with --summary")
    with removing_new_folders(ns.out, summary.parent):
        return _demo(ns, summary)


def _demo(ns: argparse.Namespace, summary: Path) -> int:
    from circuitfade.train import RunConfig, TrainConfig

    tc = TrainConfig(**_train_kwargs(ns, "steps"))
    ns.steps = tc.steps
    paths = ["unforced", "fade600->0"]
    jobs = []
    for p in paths:
        cfg = RunConfig(path=p, train=tc, seed=ns.seed)
        jobs.append({"config": cfg.to_dict(), "label": p,
                     "out": str(Path(ns.out) / p.replace("->", "to") / f"seed{ns.seed}")})
    print(f"circuitfade demo: training {paths} on associative recall, seed {ns.seed}, {ns.steps} steps each, "
          f"in parallel, into {ns.out}/ (finished runs are reused)", flush=True)
    t0 = time.time()
    results = _run_with_progress(jobs, {p: ns.steps for p in paths})
    train_s = time.time() - t0
    table = ["| path | accuracy, gates as trained | accuracy, gates zeroed | gate at end |", "|---|---|---|---|"]
    table += [f"| {r['path']} | {r['acc_normal']:.3f} | {r['acc_zero']:.3f} | {r['gate_pos']:.2f} |" for r in results]
    print("\n" + "\n".join(table))
    gate_end = results[1]["gate_pos"]
    if gate_end > 0:
        note = (f"the fade path's gate is still {gate_end:.2f} at step {ns.steps} (it reaches 0 at step 600 of a "
                f"3,600-step run): this short run shows the machinery, not the paper's comparison")
    else:
        note = "'normal' = gates as at the final step (0 for fade600->0, so normal = zero-gate there)"
    print(f"\ntraining: {train_s:.0f} s. {note}. The main paper's numbers and ours over seeds: "
          "docs/studies/paper.md.", flush=True)
    command = "circuitfade demo" + "".join(f" {a}" for a in getattr(ns, "argv", []))
    _write_demo_summary(summary, [f"`{command}` (seed {ns.seed}, {ns.steps} steps per run; the numbers are "
                                  f"deterministic for the seed and this code; training took {train_s:.0f} s, the two "
                                  "runs in parallel):", "", *table, "", f"{note[0].upper()}{note[1:]}."])
    print(f"summary: {summary}")
    if not ns.no_report:
        import torch

        from circuitfade.commands.analyze import analyze

        fade_dir = Path(jobs[1]["out"])
        out = Path(ns.out) / "fade600to0_report.html"
        print(f"\ntracing {fade_dir} for the HTML report (every checkpoint, n = 256)...", flush=True)
        torch.set_num_threads(1)
        t1 = time.time()
        analyze(fade_dir, out, n=256, progress=True)
        print(f"report: {out.resolve()} ({time.time() - t1:.0f} s; open it in a browser)")
    print(f"wall time {time.time() - t0:.0f} s")
    return 0


def cmd_local_series(ns: argparse.Namespace) -> int:
    """Train the local developing series (for ``circuitfade screen``) with one torch thread and a progress bar."""
    import torch

    from circuitfade.train.recipes import LOCAL_STEPS, build_local_series, local_run_config

    steps = LOCAL_STEPS if ns.steps is None else check_count("--steps", ns.steps)
    cfg = local_run_config(steps, seed=ns.seed)
    n_ckpt = len(cfg.train.extra_checkpoints) + 1
    print(f"circuitfade local-series: {steps} steps, seed {ns.seed}, {n_ckpt} checkpoints (step 0 and log-spaced) "
          f"into {ns.out}/, one torch thread (measured: 59 s idle, 189 s on a loaded 2-core machine; "
          "a finished run is reused)", flush=True)
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the series must not depend on the thread count (docs: Benchmarks, threads)
    t0 = time.time()
    try:
        with removing_new_folders(ns.out):
            build_local_series(ns.out, steps=steps, seed=ns.seed, progress=not ns.quiet)
    finally:
        torch.set_num_threads(old)
    print(f"{ns.out}: done in {time.time() - t0:.0f} s. Next: circuitfade screen {ns.out}")
    return 0


# Subcommands whose argument parsing lives in their own module: name -> (module, function, help)
DELEGATED = {
    "analyze": ("circuitfade.commands.analyze", "analyze_main",
                "trace head diagnostics over a run's checkpoints, print the consolidation timeline, write an HTML report"),
    "screen": ("circuitfade.commands.screen", "main",
               "screen a revision series for induction / previous-token / BOS heads, write an HTML report"),
}


def _train_kwargs(ns: argparse.Namespace, *names: str) -> dict:
    """The :class:`~circuitfade.train.config.TrainConfig` fields given on the command line (the
    others keep the config's own defaults, never copied here, so ``--help`` imports nothing heavy)."""
    return {n: getattr(ns, n) for n in names if getattr(ns, n, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    """The ``circuitfade`` parser (:class:`~circuitfade.commands.boundary.Parser`: usage errors are one
    line); each built-in subcommand's defaults carry its ``func`` and its ``flags``
    (:func:`~circuitfade.commands.boundary.flag_names`, for errors in the command's own syntax)."""
    ap = Parser(prog="circuitfade", description="Annealable soft-prior Transformers: train, trace, reproduce.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                            help="one of the subcommands below; circuitfade COMMAND --help for its options")

    t = sub.add_parser(
        "train", help="train one run along a gate path",
        description="Train one run (a RunConfig) into a run directory; a killed run resumes when the command is "
                    "run again. --config FILE gives the whole RunConfig as a JSON object (YAML for .yaml/.yml "
                    "files when PyYAML is installed), e.g. {\"path\": \"fade600->0\", \"task\": {\"name\": "
                    "\"assoc\"}, \"model\": {\"n_layers\": 4}, \"train\": {\"steps\": 3600, \"lr\": 0.001, "
                    "\"batch_size\": 64}, \"seed\": 0} (a run's config.json is such a file). Flags given on the "
                    "command line override the file: --path, --seed and the train flags replace its values, "
                    "--model and --task-arg are merged into its model and task, --task naming another task "
                    "replaces its task. --print-config prints the resulting config and trains nothing.")
    t.add_argument("--config", metavar="FILE", help="RunConfig as JSON (or YAML with PyYAML); flags override it")
    t.add_argument("--print-config", action="store_true", help="print the resulting RunConfig as JSON and exit")
    t.add_argument("--task", help="task name (assoc, markov, ...; default assoc)")
    t.add_argument("--task-arg", action="append", metavar="KEY=VALUE", help="task parameter, e.g. p=0.2")
    t.add_argument("--path", help="gate path: a named path (unforced, forced_zero, fade600->0, linear0.5->0, "
                                  "switch@600, ...) or a schedule spec such as fade600+450->0, "
                                  "linear0.5->0@0:1000, switch@1050 or pw(0:0.5,600:0.5,1050:0) "
                                  "(default fade600->0)")
    t.add_argument("--seed", type=int, help="seed (default 0)")
    t.add_argument("--steps", type=int, help="global step at which the run ends (default: TrainConfig's, 3600)")
    t.add_argument("--eval-every", type=int, help="evaluate every N steps (default: TrainConfig's)")
    t.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default: TrainConfig's)")
    t.add_argument("--model", help="JSON of SoftPriorConfig overrides, e.g. '{\"n_layers\": 4}'")
    t.add_argument("--out", help="run directory (default runs/TASK/PATH/seedN)")
    t.add_argument("--device",
                   help="cpu (default), cuda, cuda:N, mps or auto; not part of the run's identity")
    t.add_argument("--compile", nargs="?", const=True, metavar="BACKEND",
                   help="torch.compile the training forward (inductor, or the backend named); the first step "
                        "compiles (tens of seconds on a CPU), so it pays only for long runs (docs/benchmarks.md); "
                        "not part of the run's identity")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("demo", help="train unforced and fade600->0 and compare zero-gate accuracy",
                       description="Train the unforced and the fade600->0 paths on associative recall in parallel "
                                   "(one progress bar each; finished runs are reused), print accuracy with the "
                                   "gates as trained and zeroed, write the table to a markdown summary and an "
                                   "HTML report of the fade run.")
    d.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="folder for both runs, the summary and the report (default runs/demo)")
    d.add_argument("--seed", type=int, default=0, help="seed of both runs (default 0)")
    d.add_argument("--steps", type=int, help="steps per run (default: TrainConfig's, 3600)")
    d.add_argument("--no-report", action="store_true", help="skip the HTML report of the fade run")
    d.add_argument("--summary", help="markdown file for the table and the command (default OUT/demo.md; "
                                     "a file the demo did not write is never replaced)")
    d.set_defaults(func=cmd_demo)
    ls = sub.add_parser("local-series", help="train the local developing series that `circuitfade screen` screens "
                                             "(no download; one torch thread, progress bar)",
                        description="Train the local developing series (a small model on the repeats task, "
                                    "checkpoints at step 0 and log-spaced steps) that circuitfade screen screens; "
                                    "a finished run is reused.")
    ls.add_argument("out", nargs="?", default="runs/local_series", help="run directory (default runs/local_series)")
    ls.add_argument("--steps", type=int, help="training steps (default 3000, the measured series)")
    ls.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    ls.add_argument("--quiet", action="store_true", help="no progress bar")
    ls.set_defaults(func=cmd_local_series)
    for name, (_, _, helptext) in DELEGATED.items():
        sub.add_parser(name, help=helptext + f" (see: circuitfade {name} --help)", add_help=False)
    for p in (t, d, ls):
        p.set_defaults(flags=flag_names(p))
    return ap


TRAINING_COMMANDS = ("train", "demo", "local-series")
"""The commands that train (and resume): they import :mod:`circuitfade.train`."""


def import_collector_paused(module: str):
    """``importlib.import_module(module)`` with the garbage collector paused (restored after): importing
    torch and TransformerLens allocates about a million objects, none of them garbage, and the
    collections their allocation triggers take close to a second of the import."""
    import importlib

    enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        if enabled:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        module, func, _ = DELEGATED[argv[0]]  # analysis commands: nothing to resume
        return guarded(f"circuitfade {argv[0]}", lambda: getattr(import_collector_paused(module), func)(argv[1:]),
                       resume=None)
    ns = build_parser().parse_args(argv)
    ns.argv = argv[1:]  # as typed, for the files that record their command

    def command(ns: argparse.Namespace) -> int:
        if ns.command in TRAINING_COMMANDS:
            import_collector_paused("circuitfade.train")
        return ns.func(ns)

    return guarded(f"circuitfade {ns.command}", command, ns, flags=ns.flags)  # train, demo, local-series: they resume


def run() -> NoReturn:
    """The ``circuitfade`` program (``python -m circuitfade``, the ``circuitfade`` script): :func:`main`
    on ``sys.argv``, then exit with its code. Before exiting it moves the objects left to the
    garbage collector's permanent generation (``gc.freeze()``), so the interpreter's exit does not
    search them for reference cycles: with torch and TransformerLens imported that search takes
    about a second, longer than the rest of a short command. Exit handlers still run and streams are
    still flushed; only garbage caught in reference cycles is left to the operating system."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
