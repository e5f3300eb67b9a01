"""Tables as text: one markdown and one HTML renderer for every report and results file.

* :func:`markdown_table`: GitHub-flavoured markdown (``results.md``, the command line);
* :func:`html_table`: an HTML ``<table>`` wrapped in a horizontally scrolling box, so a
  wide table (the 14-column consolidation timeline) never overflows the page; a table
  with one row and many columns can be shown ``transpose``\\ d (one row per column).

Both write floats with 4 significant digits and missing values as ``NA``.
"""

from __future__ import annotations

import html
import math

import pandas as pd

__all__ = ["cell_text", "markdown_table", "html_table"]


def cell_text(v) -> str:
    """One cell as text: ``NA`` for missing values, floats with 4 significant digits."""
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "NA"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown_table(df: pd.DataFrame, *, transpose: bool = False) -> str:
    """``df`` as a GitHub-flavoured markdown table (no index; floats with 4 significant
    digits, missing values as ``NA``; ``|`` escaped). No dependency on ``tabulate``.

    ``transpose=True`` writes one row per column of ``df``: ``| column | value |`` for a
    one-row table (the readable form of the 25-column consolidation timeline), ``| column |
    0 | 1 | ... |`` for several rows."""
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"markdown_table: expected a DataFrame, got {type(df).__name__}")

    def md(v) -> str:
        return cell_text(v).replace("|", "\\|").replace("\n", " ")

    if transpose:
        heads = ["value"] if len(df) == 1 else [str(i) for i in range(len(df))]
        header = "| column | " + " | ".join(heads) + " |"
        rule = "|" + "|".join("---" for _ in range(len(heads) + 1)) + "|"
        body = ["| " + md(c) + " | " + " | ".join(md(v) for v in df[c]) + " |" for c in df.columns]
        return "\n".join([header, rule, *body])

    header = "| " + " | ".join(md(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(md(v) for v in row) + " |" for row in df.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *body])


def html_table(df: pd.DataFrame, *, transpose: bool = False, caption: str | None = None) -> str:
    """``df`` as an HTML table (class ``table``) inside ``<div class="table-wrap">``.

    ``transpose=True`` writes one row per column of ``df`` (the column name first, then
    one cell per row of ``df``): the readable form of a one-row table with many columns.
    Cell text is escaped.
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"html_table: expected a DataFrame, got {type(df).__name__}")
    esc = lambda v: html.escape(cell_text(v))  # noqa: E731
    if transpose:
        head = "" if len(df) <= 1 else "<tr><th></th>" + "".join(f"<th>{i}</th>" for i in range(len(df))) + "</tr>"
        rows = ["<tr><th>" + esc(c) + "</th>" + "".join(f"<td>{esc(v)}</td>" for v in df[c]) + "</tr>"
                for c in df.columns]
    else:
        head = "<tr>" + "".join(f"<th>{esc(c)}</th>" for c in df.columns) + "</tr>"
        rows = ["<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>"
                for row in df.itertuples(index=False, name=None)]
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    cls = "table transposed" if transpose else "table"
    return (f'<div class="table-wrap"><table class="{cls}">{cap}<thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")
