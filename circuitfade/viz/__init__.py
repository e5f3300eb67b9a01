"""Figures, tables and HTML reports (reads analysis results, never trains).

* :mod:`circuitfade.viz.plots`: the figures (``go.Figure``) and :func:`~circuitfade.viz.plots.save`
  (HTML always; PNG/SVG/PDF with the ``[figures]`` extra);
* :mod:`circuitfade.viz.attention`: attention patterns across a checkpoint series;
* :mod:`circuitfade.viz.tables`: the one markdown / HTML table renderer;
* :mod:`circuitfade.viz.html`: the one HTML page builder every report uses;
* :mod:`circuitfade.viz.report`: ``circuitfade analyze``'s report;
* :mod:`circuitfade.viz.command`: the command-line boundary every subcommand shares (one-line
  errors in the command's flags, the checkpoint-finding flags of ``analyze`` and ``screen``).

Imported inside a Jupyter kernel, this package makes figures survive notebook export
(:func:`circuitfade.viz.plots.use_exportable_renderer`).
"""

import sys as _sys

if "ipykernel" in _sys.modules:  # inside a Jupyter kernel: figures that survive nbconvert export
    from circuitfade.viz.plots import use_exportable_renderer

    use_exportable_renderer()
