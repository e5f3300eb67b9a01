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
   the run's ``metrics.csv`` curves; written as one self-contained HTML file.
"""

from __future__ import annotations

import argparse
import html
import math
import numbers
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from circuitfade.viz import plots
from circuitfade.analysis import (
    ABLATION_IMPORTANCE,
    DEFAULT_THRESHOLDS,
    SUCCESSOR_MASS,
    consolidation_timeline,
    gate_intervention_table,
    head_diagnostics,
    timeline_long,
)
from circuitfade.gating.evaluation import has_gates
from circuitfade.io import atomic_write, check_outputs, default_output_dir
from circuitfade.store import CheckpointSeries, attach, trace
from circuitfade.tasks import Batch, Task, eval_set, make_task
from circuitfade.train.loop import EVAL_SEED, read_metrics

__all__ = ["analyze", "analyze_main", "build_parser", "markdown_table", "report_html", "default_report_path"]


def _diagnostics(model, batch: Batch, task: Task) -> pd.DataFrame:
    """:func:`head_diagnostics` with zero-gate ablation for gated models, plain ablation otherwise."""
    return head_diagnostics(model, batch, task, ablation_gates="zero" if has_gates(model) else None)


def _thin(series: CheckpointSeries, every: int | None) -> CheckpointSeries:
    if every is None:
        return series
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise ValueError(f"every: expected a positive number of steps, got {every!r}")
    steps = series.steps
    keep = series.range(start=steps[0], every=int(every)).steps
    return series.select(sorted(set(keep) | {steps[-1]}))


def _metrics_of(series: CheckpointSeries) -> pd.DataFrame | None:
    run_dir = series.metadata.get("run_dir")
    if series.gate_path is None or not run_dir or not (Path(run_dir) / "metrics.csv").is_file():
        return None
    return read_metrics(run_dir)


def analyze(
    source,
    out_html: str | Path | None = None,
    *,
    n: int = 256,
    every: int | None = None,
    task: Task | None = None,
    thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS,
    progress: bool = True,
) -> dict:
    """Trace head diagnostics over a checkpoint series; build the timeline, interventions and figures.

    Args:
        source: a :class:`CheckpointSeries` or anything :func:`circuitfade.store.attach`
            accepts (a circuitfade run directory, state-dict files, models in memory, ...).
        out_html: if given, the HTML report is written there (one self-contained file).
        n: evaluation examples (``eval_set(task, n, EVAL_SEED)``: a circuitfade run's own
            eval set, truncated to ``n``) for tracing and for the intervention table.
        every: analyse only checkpoints ``first + k * every`` (and always the last).
        task: the task to evaluate on; default the series' own (circuitfade runs). Other
            sources need it (``ValueError`` otherwise).
        thresholds: ``{metric: threshold}`` of the consolidation timeline (default the
            paper's: successor mass >= .25, ablation importance >= .03).
        progress: show a progress bar while tracing.

    Returns:
        ``{"series", "task", "traced"`` (the tidy trace), ``"timeline"`` (one row per
        series, :func:`consolidation_timeline`), ``"timeline_long"``, ``"interventions"``
        (DataFrame, or ``None`` for models without gates), ``"metrics"`` (the run's
        ``metrics.csv`` or ``None``), ``"notes"`` (list of str: what was skipped and why),
        ``"figures"`` (``{name: go.Figure}``, in report order), ``"html"`` (the path
        written, or ``None``)``}``.
    """
    series = source if isinstance(source, CheckpointSeries) else attach(source)
    if len(series) == 0:
        raise ValueError("the series has no checkpoints to analyse")
    series = _thin(series, every)
    task = task if task is not None else series.task
    if task is None:
        raise ValueError(
            f"{series.source}: not a circuitfade run, so the task is unknown; pass task= "
            "(e.g. circuitfade.tasks.make_task('assoc')) or --task NAME"
        )
    if not isinstance(task, Task):
        raise ValueError(f"task: expected a circuitfade.tasks.Task, got {type(task).__name__}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n: expected a positive number of examples, got {n!r}")
    batch = eval_set(task, n=int(n), seed=EVAL_SEED)
    notes: list[str] = []

    traced = trace(series, {"head_diagnostics": _diagnostics}, task, batch=batch, progress=progress)
    gz = None if "gate_zero_step" in traced.columns else series.gate_zero_step()
    timeline = consolidation_timeline(traced, thresholds, gate_zero_step=gz)
    long = timeline_long(traced, thresholds, gate_zero_step=gz)
    if gz is None:
        gz_vals = timeline["gate_zero_step"].dropna().unique() if "gate_zero_step" in timeline else []
        gz = int(gz_vals[0]) if len(gz_vals) == 1 else None

    final_step = series.steps[-1]
    final = series[final_step]
    if has_gates(final):
        interventions = gate_intervention_table(final, task, batch=batch)
        interventions.insert(0, "step", final_step)
    else:
        interventions = None
        notes.append(f"gate interventions skipped: the model at step {final_step} ({type(final).__name__}) has no gates")
    del final
    metrics = _metrics_of(series)
    if metrics is None:
        notes.append("no training curves: the source is not a circuitfade run directory with metrics.csv")

    gate = None
    if metrics is not None and any(str(c).startswith("gate_") for c in metrics.columns):
        gate = metrics[["step", *[c for c in metrics.columns if str(c).startswith("gate_")]]]
    elif series.gate_path is not None and series.gate_path.mode != "learned":
        gate = series.gate_value

    figures: dict[str, go.Figure] = {}
    for metric in (SUCCESSOR_MASS, ABLATION_IMPORTANCE):
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
    }
    if out_html is not None:
        out = Path(out_html)
        title = f"circuitfade analysis: {series.metadata.get('run', series.source)}"
        atomic_write(out, report_html(result, title=title).encode("utf-8"))
        result["html"] = out
    return result


# -------------------------------------------------------------------------- output
def _cell(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "NA"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame) -> str:
    """``df`` as a GitHub-flavoured markdown table (no index; floats with 4 significant
    digits, missing values as ``NA``). No dependency on ``tabulate``."""
    header = "| " + " | ".join(_cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *body])


def _html_table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, na_rep="NA", float_format=lambda v: f"{v:.4g}", border=0, classes="table")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table.table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0 1.5em; }
table.table th, table.table td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }
.note { color: #666; font-style: italic; }
.figure { margin-bottom: 2em; }
"""


def report_html(result: Mapping, *, title: str = "circuitfade analysis") -> str:
    """One self-contained HTML page from an :func:`analyze` result.

    Sections: series description, the consolidation timeline and gate intervention
    tables, notes, then every figure in ``result["figures"]`` order. plotly.js is
    embedded once (with the first figure), so the file works offline.
    """
    series = result["series"]
    meta = ", ".join(f"{k} = {v}" for k, v in series.metadata.items() if k != "run_dir")
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Source: <code>{html.escape(str(series.source))}</code>; {len(series)} checkpoints, steps "
        f"{series.steps[0]}&ndash;{series.steps[-1]}; task <code>{html.escape(getattr(result['task'], 'name', '?'))}"
        f"</code>{'; ' + html.escape(meta) if meta else ''}.</p>",
        "<h2>Consolidation timeline</h2>",
        "<p>First checkpoint step at which any head reaches the threshold (successor-value mass &ge; .25, "
        "zero-gate mean-ablation accuracy drop &ge; .03 by default), that head, the top head at the last "
        "checkpoint, and whether the crossing came after the gate reached zero.</p>",
        _html_table(result["timeline"]),
    ]
    if result.get("interventions") is not None:
        parts += ["<h2>Gate interventions (final checkpoint)</h2>", _html_table(result["interventions"])]
    for note in result.get("notes", []):
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts.append("<h2>Figures</h2>")
    for i, fig in enumerate(result["figures"].values()):
        div = fig.to_html(full_html=False, include_plotlyjs=i == 0, default_height=f"{fig.layout.height or 450}px")
        parts.append(f'<div class="figure">{div}</div>')
    parts.append("</body></html>")
    return "\n".join(parts)


def default_report_path(source: str | Path) -> Path:
    """Where ``circuitfade analyze SOURCE`` writes without ``--out``:
    ``reports/<SOURCE name>-analysis/analysis.html`` (never inside the source)."""
    return default_output_dir(source, "analysis") / "analysis.html"


def build_parser(prog: str = "circuitfade analyze") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Trace per-head diagnostics over a checkpoint series, print the consolidation timeline "
                    "and write an HTML report (heatmaps with a step slider, timelines, gate interventions).",
    )
    ap.add_argument("run_dir", metavar="RUN_DIR",
                    help="a circuitfade run directory (or a folder/file of checkpoints that attach() accepts)")
    ap.add_argument("--out", metavar="FILE",
                    help="HTML report path (default reports/<RUN_DIR name>-analysis/analysis.html)")
    ap.add_argument("--force", action="store_true", help="replace the report if it exists")
    ap.add_argument("--n", type=int, default=256, help="evaluation examples (default 256)")
    ap.add_argument("--every", type=int, metavar="STEPS", help="analyse only every STEPS steps (last always kept)")
    ap.add_argument("--task", metavar="NAME", help="task for sources that are not circuitfade runs (e.g. assoc)")
    ap.add_argument("--config", metavar="JSON", help="model config for a folder of state-dict files (attach config=)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def analyze_main(argv: list[str] | None = None) -> int:
    """``circuitfade analyze RUN_DIR [--out FILE] [--n N] [--every STEPS]``: exit status 0, or 2 on bad input."""
    ns = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        out = Path(ns.out) if ns.out else default_report_path(ns.run_dir)
        check_outputs([out], force=ns.force)  # before any tracing
        source = attach(ns.run_dir, config=ns.config) if ns.config else ns.run_dir
        task = make_task(ns.task) if ns.task else None
        res = analyze(source, out, n=ns.n, every=ns.every, task=task, progress=not ns.quiet)
    except (ValueError, FileNotFoundError) as e:
        print(f"circuitfade analyze: error: {e}", file=sys.stderr)
        return 2
    series = res["series"]
    print(f"{series.source}: {len(series)} checkpoints (steps {series.steps[0]}..{series.steps[-1]}), "
          f"task {res['task'].name}, n = {ns.n}\n")
    print("Consolidation timeline:\n")
    print(markdown_table(res["timeline"]))
    if res["interventions"] is not None:
        print(f"\nGate interventions at step {series.steps[-1]}:\n")
        print(markdown_table(res["interventions"]))
    for note in res["notes"]:
        print(f"\nnote: {note}")
    print(f"\nreport: {res['html']} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(analyze_main())
