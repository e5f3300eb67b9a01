"""Figures, tables and HTML reports (reads analysis results, never trains, traces or parses a
command line).

* :mod:`circuitfade.viz.plots`: the figures (``go.Figure``) of traces, gate interventions and
  training curves;
* :mod:`circuitfade.viz.export`: :func:`~circuitfade.viz.export.save` (HTML always;
  PNG/SVG/PDF with the ``[figures]`` extra), also reachable as ``circuitfade.plots.save``;
* :mod:`circuitfade.viz.panels`: the layer x head heatmap panels both of them draw;
* :mod:`circuitfade.viz.attention`: figures of attention patterns across a checkpoint series
  (:func:`circuitfade.analysis.attention.attention_series` computes them);
* :mod:`circuitfade.viz.circuits`: figures of edge scores and faithfulness;
* :mod:`circuitfade.viz.tables`: the one markdown / HTML table renderer;
* :mod:`circuitfade.viz.html`: the one HTML page builder every report uses;
* :mod:`circuitfade.viz.report`: ``circuitfade analyze``'s report, from its result;
* :mod:`circuitfade.viz.screens`: ``circuitfade screen``'s figures and report, from its tables.

The pipelines that compute what these draw, and the command lines, are
:mod:`circuitfade.commands`.

Imported inside a Jupyter kernel, this package makes figures survive notebook export
(:func:`circuitfade.viz.export.use_exportable_renderer`).
"""

import sys as _sys


def moved_names(module: str, moved: dict[str, tuple[str | tuple[str, str], ...]]):
    """A module ``__getattr__`` for names that left ``module``: asking for one (an attribute or
    ``from module import name``) raises an ``ImportError`` naming where it is now;
    ``moved`` maps each new module to the names it took (a name renamed on the way as
    ``(old, new)``). Other names raise the usual ``AttributeError``."""
    where = {}
    for new_module, names in moved.items():
        for name in names:
            old, new = (name, name) if isinstance(name, str) else name
            where[old] = (new_module, new)

    def __getattr__(name: str):
        if name in where:
            new_module, new = where[name]
            raise ImportError(f"{module}.{name} has moved: use {new_module}.{new} "
                              f"(from {new_module} import {new})", name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


if "ipykernel" in _sys.modules:  # inside a Jupyter kernel: figures that survive nbconvert export
    from circuitfade.viz.export import use_exportable_renderer

    use_exportable_renderer()
