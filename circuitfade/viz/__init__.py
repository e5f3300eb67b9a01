"""Figures, tables and HTML reports (layer 6: reads analysis results, never trains).

``from circuitfade.viz import plots`` for the figures; :mod:`circuitfade.viz.report`
for ``circuitfade analyze``'s HTML report.
"""
