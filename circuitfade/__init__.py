"""circuitfade: annealable soft-prior Transformers and circuit analysis across checkpoints.

The package is layered; each layer imports only the ones above it in this list
(``tests/test_layering.py`` enforces it):

0. ``io``                    atomic writes, pickle-free tensor files
   ``compat``                which TransformerLens line (3.9 / 4.x) is installed; the only
                             module outside ``model`` that names one line's classes
1. ``model``                 SoftPriorConfig / SoftPriorTransformer, the prior registry
2. ``tasks``, ``gating``     data; schedules, gate paths, evaluation conditions
3. ``train``                 the trainer, run directories, sweeps
4. ``store``                 checkpoint series from any source, ``trace``
5. ``analysis``              metrics on models and traced series
6. ``viz``                   plots, tables, HTML reports
7. ``experiments``           the papers' protocols
8. ``cli``                   the ``circuitfade`` command

``circuitfade.plots`` still resolves (to :mod:`circuitfade.viz.plots`) for older notebooks.
"""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: ``import circuitfade`` stays cheap
    if name == "plots":
        from circuitfade.viz import plots

        return plots
    raise AttributeError(f"module 'circuitfade' has no attribute {name!r}")
