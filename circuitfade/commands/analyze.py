"""``circuitfade analyze``: trace a checkpoint series, tabulate consolidation, write an HTML report.

The flow (:func:`analyze`), composed from the layers below:

1. :func:`circuitfade.store.attach` the source (a run directory or anything else
   ``attach`` accepts; a :class:`~circuitfade.store.CheckpointSeries` is used as is),
   optionally thinned to every ``every`` steps (the last checkpoint is always kept);
2. :func:`circuitfade.store.trace` the per-head diagnostics
   (:func:`~circuitfade.analysis.heads.head_diagnostics`: successor-value mass and
   zero-gate mean-ablation importance; models without gates are ablated as they are)
   on ``eval_set(task, n)`` - the run's own evaluation set;
3. :func:`~circuitfade.analysis.timeline.consolidation_timeline` (paper Table 3) with
   the run's gate-zero step;
4. the gate intervention table of the final checkpoint
   (:func:`~circuitfade.analysis.gates.gate_intervention_table`; skipped, with a note,
   for models without gates);
5. figures (:mod:`circuitfade.viz.plots`): heatmaps with a step slider, per-head timelines
   with the gate overlaid and threshold crossings marked, the intervention bars and
   the run's ``metrics.csv`` curves; written as one self-contained HTML file
   (:func:`circuitfade.viz.report.report_html`).

:func:`analyze_main` is the command line ``circuitfade analyze RUN_DIR [--out FILE] ...``.
"""

from __future__ import annotations

import argparse
import numbers
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis import consolidation_timeline, gate_intervention_table, head_diagnostics
from circuitfade.analysis.heads import ABLATION_IMPORTANCE, SUCCESSOR_MASS
from circuitfade.analysis.timeline import DEFAULT_THRESHOLDS, timeline_long
from circuitfade.gating.evaluation import has_gates
from circuitfade.io import atomic_write, check_outputs, default_output_dir
from circuitfade.store import CheckpointSeries, attach, check_series_weights, trace
from circuitfade.commands.boundary import (Parser, add_source_arguments, flag_names, guarded, removing_new_folders,
                                           source_from_args)
from circuitfade.tasks import EVAL_SEED, EVAL_SIZE, Batch, Task, as_task, eval_set, parse_task_args
from circuitfade.tasks.base import eval_label
from circuitfade.train import read_metrics
from circuitfade.train.rundir import RunDir
from circuitfade.viz import plots
from circuitfade.viz.report import report_html
from circuitfade.viz.tables import markdown_table

__all__ = ["analyze", "analyze_main", "build_parser", "default_report_path"]


def _thin(series: CheckpointSeries, every: int | None) -> CheckpointSeries:
    if every is None:
        return series
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"every: expected a positive number of steps, got {every!r}")
    steps = series.steps
    keep = series.range(start=steps[0], every=int(every)).steps
    return series.select(sorted(set(keep) | {steps[-1]}))


def _metrics_of(series: CheckpointSeries) -> tuple[pd.DataFrame | None, str | None]:
    """``(the run's metrics.csv, None)``, ``(None, None)`` without one, or ``(None, why)`` when
    the file is there but unreadable, empty or without a ``step`` column (``why`` names it)."""
    run_dir = series.metadata.get("run_dir")
    f = RunDir(run_dir).metrics_file if run_dir else None
    if series.gate_path is None or f is None or not f.exists():
        return None, None
    try:
        df = read_metrics(run_dir)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
        return None, f"no training curves: {f} is unreadable ({type(e).__name__}: {' '.join(str(e).split())})"
    if "step" not in df.columns or df.empty:
        return None, f"no training curves: {f} has no rows with a 'step' column (columns: {list(df.columns)[:8]})"
    return df, None


def analyze(
    source,
    out_html: str | Path | None = None,
    *,
    n: int = EVAL_SIZE,
    seed: int = EVAL_SEED,
    every: int | None = None,
    task: Task | str | Mapping | Batch | None = None,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    progress: bool = True,
) -> dict:
    """Trace head diagnostics over a checkpoint series; build the timeline, interventions and figures.

    Args:
        source: a :class:`CheckpointSeries` or anything :func:`circuitfade.store.attach`
            accepts (a circuitfade run directory, state-dict files, models in memory, ...).
        out_html: if given, the HTML report is written there (one self-contained file).
        n, seed: the evaluation set ``eval_set(task, n, seed)`` for tracing and for the
            intervention table; default the package's one convention (512 examples,
            ``EVAL_SEED``: a circuitfade run's own eval set, the one ``metrics.csv`` logs).
        every: analyse only checkpoints ``first + k * every`` (and always the last).
        task: the task to evaluate on (a Task, a task name, a dict ``{"name": ..., **config}``
            or your own :class:`~circuitfade.tasks.Batch`); default the series' own
            (circuitfade runs). Other sources need it (``ValueError`` otherwise).
        thresholds: ``{metric: threshold}`` of the consolidation timeline (default the
            paper's: successor mass >= .25, ablation importance >= .03).
        progress: show a progress bar while tracing.

    Returns:
        ``{"series", "task", "traced"`` (the tidy trace), ``"timeline"`` (one row per
        series, :func:`consolidation_timeline`), ``"timeline_long"``, ``"interventions"``
        (DataFrame, or ``None`` for models without gates), ``"metrics"`` (the run's
        ``metrics.csv`` or ``None``), ``"notes"`` (list of str: what was skipped and why),
        ``"figures"`` (``{name: go.Figure}``, in report order), ``"html"`` (the path
        written, or ``None``), ``"eval"`` (``"eval: N examples, seed S"``)``}``.
    """
    series = source if isinstance(source, CheckpointSeries) else attach(source)
    if len(series) == 0:
        raise ValueError("the series has no checkpoints to analyse")
    series = _thin(series, every)
    check_series_weights(series)  # a truncated Hugging Face revision fails now, not mid-trace
    task = as_task(task if task is not None else series.task)
    if task is None:
        raise ValueError(
            f"{series.source}: this series has no task; pass task= (a name such as 'assoc', a dict, a Task "
            "or your own Batch) or --task NAME"
        )
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"n: expected at least 2 evaluation examples, got {n!r} (mean ablation and the intervals "
                         "over examples are undefined for one)")
    batch = eval_set(task, n=int(n), seed=int(seed))
    evaluation = eval_label(len(batch), seed)
    notes: list[str] = []

    traced = trace(series, {"head_diagnostics": head_diagnostics}, task, batch=batch, progress=progress)
    gz = None if "gate_zero_step" in traced.columns else series.gate_zero_step()
    timeline = consolidation_timeline(traced, thresholds, gate_zero_step=gz)
    long = timeline_long(traced, thresholds, gate_zero_step=gz)
    if gz is None:
        gz_vals = timeline["gate_zero_step"].dropna().unique() if "gate_zero_step" in timeline else []
        gz = int(gz_vals[0]) if len(gz_vals) == 1 else None

    final_step = series.steps[-1]
    final = series[final_step]
    if has_gates(final):
        interventions = gate_intervention_table(final, batch, task)
        interventions.insert(0, "step", final_step)
    else:
        interventions = None
        notes.append(f"gate interventions skipped: the model at step {final_step} ({type(final).__name__}) has no gates")
    del final
    metrics, why = _metrics_of(series)
    if metrics is None:
        notes.append(why or "no training curves: the source is not a circuitfade run directory with metrics.csv")

    gate = None
    if metrics is not None and any(str(c).startswith("gate_") for c in metrics.columns):
        gate = metrics[["step", *[c for c in metrics.columns if str(c).startswith("gate_")]]]
    elif series.gate_path is not None and series.gate_path.mode != "learned":
        gate = series.gate_value

    figures: dict[str, go.Figure] = {}
    for metric in (SUCCESSOR_MASS, ABLATION_IMPORTANCE):
        rows = traced[traced["metric"] == metric]
        if not rows["value"].notna().any():
            why = sorted({str(n) for n in rows["note"].dropna()}) if "note" in rows else []
            notes.append(f"no {metric} figures: every value is NaN" + (f" ({'; '.join(why)})" if why else ""))
            continue
        figures[f"{metric}_heatmap"] = plots.head_heatmap(traced, metric)
        figures[f"{metric}_timeline"] = plots.head_timeline(
            traced, metric, gate=gate, threshold=thresholds.get(metric), gate_zero_step=gz,
        )
    if interventions is not None:
        figures["gate_interventions"] = plots.gate_intervention_bar(interventions, chance=getattr(task, "chance", None))
    if metrics is not None:
        figures["training_curves"] = plots.training_curves(metrics)

    result = {
        "series": series, "task": task, "traced": traced, "timeline": timeline, "timeline_long": long,
        "interventions": interventions, "metrics": metrics, "notes": notes, "figures": figures, "html": None,
        "eval": evaluation,
    }
    if out_html is not None:
        out = Path(out_html)
        title = f"circuitfade analysis: {series.metadata.get('run', series.source)}"
        atomic_write(out, report_html(result, title=title).encode("utf-8"))
        result["html"] = out
    return result


def default_report_path(source: str | Path) -> Path:
    """Where ``circuitfade analyze SOURCE`` writes without ``--out``:
    ``reports/<SOURCE name>-analysis/analysis.html`` (never inside the source)."""
    return default_output_dir(source, "analysis") / "analysis.html"


def build_parser(prog: str = "circuitfade analyze") -> argparse.ArgumentParser:
    """The ``circuitfade analyze`` parser: the report's options and the checkpoint-finding group
    it shares with ``circuitfade screen`` (:func:`~circuitfade.commands.boundary.add_source_arguments`)."""
    ap = Parser(
        prog=prog,
        description="Trace per-head diagnostics over a checkpoint series, print the consolidation timeline "
                    "and write an HTML report (heatmaps with a step slider, timelines, gate interventions).",
    )
    ap.add_argument("run_dir", metavar="RUN_DIR",
                    help="a circuitfade run directory (or a folder/file of checkpoints that attach() accepts)")
    ap.add_argument("--out", metavar="FILE",
                    help="HTML report path (default reports/<RUN_DIR name>-analysis/analysis.html)")
    ap.add_argument("--force", action="store_true", help="replace the report if it exists")
    ap.add_argument("--n", type=int, default=EVAL_SIZE, help=f"evaluation examples (default {EVAL_SIZE})")
    ap.add_argument("--seed", type=int, default=EVAL_SEED, help=f"evaluation seed (default {EVAL_SEED}, the trainer's)")
    ap.add_argument("--every", type=int, metavar="STEPS", help="analyse only every STEPS steps (last always kept)")
    ap.add_argument("--task", metavar="NAME", help="task for sources that are not circuitfade runs (e.g. assoc)")
    ap.add_argument("--task-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="task config argument (repeatable; typed by the task's config fields), with --task")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_source_arguments(ap, "RUN_DIR")
    return ap


def analyze_main(argv: list[str] | None = None) -> int:
    """``circuitfade analyze RUN_DIR [--out FILE] [--n N] [--every STEPS] ...``: exit status 0, 2 on bad
    input (one line in the command's flags, :func:`~circuitfade.commands.boundary.guarded`; a report folder
    the command created is removed again), 130 on Ctrl-C."""
    ap = build_parser()
    ns = ap.parse_args(argv)
    return guarded(ap.prog, _analyze_command, ns, resume=NO_RESUME, flags=flag_names(ap), also=(KeyError,))


NO_RESUME = "no report was written (an analysis does not resume: run the command again to start it over)"


def _analyze_command(ns: argparse.Namespace) -> int:
    t0 = time.time()
    out = Path(ns.out) if ns.out else default_report_path(ns.run_dir)
    if ns.task_arg and not ns.task:
        raise ValueError("--task-arg needs --task NAME")
    with removing_new_folders(out.parent):
        check_outputs([out], force=ns.force)  # before any tracing
        task = parse_task_args(ns.task, ns.task_arg) if ns.task else None
        source = source_from_args(ns, ns.run_dir)
        res = analyze(source, out, n=ns.n, seed=ns.seed, every=ns.every, task=task, progress=not ns.quiet)
    series = res["series"]
    print(f"{series.source}: {len(series)} checkpoints (steps {series.steps[0]}..{series.steps[-1]}), "
          f"task {res['task'].name}; {res['eval']}\n")
    print("Consolidation timeline:\n")
    print(markdown_table(res["timeline"], transpose=len(res["timeline"]) <= 3))
    if res["interventions"] is not None:
        print(f"\nGate interventions at step {series.steps[-1]}:\n")
        print(markdown_table(res["interventions"]))
    for note in res["notes"]:
        print(f"\nnote: {note}")
    print(f"\nreport: {res['html']} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(analyze_main())
