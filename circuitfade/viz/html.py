"""One HTML page builder for every report (``analyze``, ``screen``, ``history``, ``reproduce``).

    from circuitfade.viz.html import page, write_page, Section, Table, Note, Raw
    text = page("My report", [Section("Figures", [fig1, fig2]), Section("Tables", [df])], intro="...")
    write_page("out/report.html", "My report", sections)     # atomic write

A page is a title, an optional intro paragraph and a list of sections; each section is
a heading and a list of items, rendered in order:

* ``go.Figure``: the figure (``fig.layout.height`` as its height); plotly.js is put in
  the page once, with the first figure (``plotlyjs="embed"``, the default: works
  offline, ~4.8 MB) or loaded from its CDN (``plotlyjs="cdn"``, small files);
* ``pd.DataFrame`` or :class:`Table`: :func:`circuitfade.viz.tables.html_table` (wide
  tables scroll inside their box instead of overflowing the page);
* ``str`` or :class:`Note`: an escaped paragraph (a note in grey italics);
* :class:`Raw`: an HTML fragment inserted as is (the caller escapes it).

Headings, text and titles are escaped.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from circuitfade.io import atomic_write
from circuitfade.viz.tables import html_table

__all__ = ["STYLE", "Section", "Table", "Note", "Raw", "page", "write_page"]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
.table-wrap { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1.5em; }
table.table { border-collapse: collapse; font-size: 0.9em; }
table.table th, table.table td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; white-space: nowrap; }
table.transposed th { background: #f6f6f6; }
table.table caption { text-align: left; color: #555; padding-bottom: 4px; }
.note { color: #666; font-style: italic; }
.figure { margin-bottom: 2em; }
"""
"""The one stylesheet of every circuitfade report."""


@dataclass(frozen=True)
class Table:
    """A DataFrame item with options (see :func:`circuitfade.viz.tables.html_table`)."""

    df: pd.DataFrame
    transpose: bool = False
    caption: str | None = None


@dataclass(frozen=True)
class Note:
    """A grey, italic paragraph (escaped)."""

    text: str


@dataclass(frozen=True)
class Raw:
    """An HTML fragment inserted as is."""

    html: str


@dataclass(frozen=True)
class Section:
    """A ``<h2>`` heading (``level=3``: ``<h3>``) and its items, in order."""

    heading: str
    items: Sequence = field(default_factory=tuple)
    level: int = 2


def _render(item, state: dict) -> str:
    if isinstance(item, go.Figure):
        first = not state["plotlyjs_done"]
        state["plotlyjs_done"] = True
        inc = (True if state["plotlyjs"] == "embed" else "cdn") if first else False
        div = item.to_html(full_html=False, include_plotlyjs=inc, default_height=f"{item.layout.height or 450}px")
        return f'<div class="figure">{div}</div>'
    if isinstance(item, pd.DataFrame):
        return html_table(item)
    if isinstance(item, Table):
        return html_table(item.df, transpose=item.transpose, caption=item.caption)
    if isinstance(item, Note):
        return f'<p class="note">{html.escape(item.text)}</p>'
    if isinstance(item, Raw):
        return item.html
    if isinstance(item, str):
        return f"<p>{html.escape(item)}</p>"
    raise ValueError(
        f"page item: expected a plotly Figure, a DataFrame, Table, Note, Raw or str, got {type(item).__name__}"
    )


def page(title: str, sections: Iterable[Section | tuple], *, intro: str | Raw | None = None,
         plotlyjs: str = "embed") -> str:
    """One self-contained HTML page: ``<h1>title</h1>``, ``intro``, then each section.

    ``sections``: :class:`Section` objects or ``(heading, items)`` tuples.
    ``plotlyjs``: ``"embed"`` (default; the page works offline) or ``"cdn"``.
    """
    if plotlyjs not in ("embed", "cdn"):
        raise ValueError(f"plotlyjs: expected 'embed' or 'cdn', got {plotlyjs!r}")
    state = {"plotlyjs": plotlyjs, "plotlyjs_done": False}
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if intro is not None:
        parts.append(_render(intro, state))
    for sec in sections:
        if isinstance(sec, tuple):
            sec = Section(*sec)
        if not isinstance(sec, Section):
            raise ValueError(f"sections: expected Section objects or (heading, items) tuples, got {type(sec).__name__}")
        parts.append(f"<h{sec.level}>{html.escape(sec.heading)}</h{sec.level}>")
        parts.extend(_render(item, state) for item in sec.items)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(path: str | os.PathLike, title: str, sections: Iterable[Section | tuple], **kwargs) -> Path:
    """:func:`page` written atomically to ``path`` (folders created); returns the path."""
    return atomic_write(Path(path), page(title, sections, **kwargs).encode("utf-8"))
