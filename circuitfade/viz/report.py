"""The HTML report of ``circuitfade analyze``, from a finished result.

:func:`report_html` renders the dictionary :func:`circuitfade.commands.analyze.analyze` returns
(figures, the consolidation timeline, the gate intervention table, notes) as one
self-contained page; :func:`report_sections` gives its sections for a page of your own
(:func:`circuitfade.viz.html.page`). Nothing here traces or trains: the pipeline and its
command line are :mod:`circuitfade.commands.analyze`.
"""

from __future__ import annotations

from collections.abc import Mapping

from circuitfade.viz import moved_names
from circuitfade.viz.html import Note, Section, Table, page

__all__ = ["report_sections", "report_html"]

__getattr__ = moved_names(__name__, {
    "circuitfade.commands.analyze": ("analyze", "analyze_main", "build_parser", "default_report_path", "NO_RESUME"),
    "circuitfade.viz.tables": ("markdown_table",),
})


def report_sections(result: Mapping) -> list[Section]:
    """The sections of :func:`report_html`: figures first, then the tables and notes."""
    figs = list(result["figures"].values())
    timeline = result["timeline"]
    sections = [Section("Figures", figs)] if figs else []
    sections.append(Section("Consolidation timeline", [
        "First checkpoint step at which any head reaches the threshold (successor-value mass >= .25, "
        "zero-gate mean-ablation accuracy drop >= .03 by default), that head, the top head at the last "
        "checkpoint, and whether the crossing came after the gate reached zero.",
        Table(timeline, transpose=len(timeline) <= 3),
    ]))
    if result.get("interventions") is not None:
        sections.append(Section("Gate interventions (final checkpoint)", [result["interventions"]]))
    notes = [Note(n) for n in result.get("notes", [])]
    if notes:
        sections.append(Section("Notes", notes))
    return sections


def report_html(result: Mapping, *, title: str = "circuitfade analysis") -> str:
    """One self-contained HTML page (:func:`circuitfade.viz.html.page`) from an
    :func:`~circuitfade.commands.analyze.analyze` result.

    A line describing the series, then every figure in ``result["figures"]`` order,
    the consolidation timeline (transposed: one row per column, as it is wide), the gate
    intervention table and the notes. plotly.js is embedded once, so the file works offline.
    """
    series = result["series"]
    meta = ", ".join(f"{k} = {v}" for k, v in series.metadata.items() if k != "run_dir")
    intro = (f"Source: {series.source}; {len(series)} checkpoints, steps {series.steps[0]}-{series.steps[-1]}; "
             f"task {getattr(result['task'], 'name', '?')}{'; ' + meta if meta else ''}; {result.get('eval', '')}.")
    return page(title, report_sections(result), intro=intro)
