"""mkdocs hook: show Sphinx roles in docstrings as plain code.

The package's docstrings cross-reference with Sphinx roles (``:func:`fit```,
``:class:`~circuitfade.store.CheckpointSeries```). Markdown renders those as the role's name
followed by inline code; this hook drops the role's name and, as Sphinx does, shortens a
``~``-prefixed target to its last component. Nothing else on a page changes.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const|ref|doc|term):(<code[^>]*>)(~?)([^<]*)</code>")


def _plain(m: re.Match) -> str:
    target = m.group(3)
    if m.group(2):
        target = target.rsplit(".", 1)[-1]
    return f"{m.group(1)}{target}</code>"


def on_page_content(html: str, **kwargs) -> str:
    """The page's HTML with every ``:role:<code>target</code>`` shown as ``<code>target</code>``."""
    return ROLE.sub(_plain, html)
