"""circuitfade: annealable soft-prior Transformers and circuit analysis across checkpoints.

The package is layered; each layer imports only the ones above it in this list
(``tests/library/structure/test_layering.py`` enforces it):

0. ``io``                    atomic writes, pickle-free tensor files, content hashes
   ``stats``                 every statistic (t intervals, Wilson, bootstrap, sign tests)
   ``claims``                pre-registered claims: Claim, Outcome, interval rules, verdict tables
   ``compat``                which TransformerLens line (3.9 / 4.x) is installed; the only
                             module outside ``model`` that names one line's classes
1. ``model``                 SoftPriorConfig / SoftPriorTransformer, the prior registry
2. ``tasks``, ``gating``     data; schedules, gate paths, evaluation conditions
3. ``train``                 configs, the loop, run directories, the job pool, sweeps, recipes
4. ``store``                 checkpoint series from any source, ``trace``
5. ``analysis``              metrics on models and traced series
6. ``viz``                   figures, tables, HTML reports, saving figures (from finished results)
7. ``commands``              the analyze and screen pipelines and command lines; the command-line
                             boundary the subcommands and the studies' commands share
8. ``cli``                   the ``circuitfade`` command (train, demo, local-series, analyze, screen)

The studies built on the library (the papers' protocols) live beside the package, in the
repository's ``studies/`` folder, and are run as ``python -m studies.<name>``; nothing here
imports them.

The front door: ``import circuitfade as cf`` gives the names a notebook needs (:data:`__all__`),
each the object of the module named in :data:`FRONT_DOOR` (imported on first use, so
``import circuitfade`` stays cheap)::

    import circuitfade as cf

    series = cf.example_series("fade600to0")
    traced = cf.trace(series, [cf.head_diagnostics])
    cf.plots.head_small_multiples(traced, "ablation_importance")
"""

__version__ = "0.1.0"


def _quiet_tqdm_in_a_kernel() -> None:
    """Inside a Jupyter kernel, import ``tqdm.auto`` now with tqdm's "IProgress not found"
    warning silenced. TransformerLens's dependencies (transformers, huggingface_hub) import
    ``tqdm.auto`` when they are first imported; without ``ipywidgets`` tqdm warns at that
    import and falls back to its text bar. Importing it here first gives the same text bar
    without the warning (``pip install 'circuitfade[notebook]'`` gives widget bars)."""
    import sys

    if "ipykernel" not in sys.modules or "tqdm.autonotebook" in sys.modules:
        return
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import tqdm.auto  # noqa: F401


_quiet_tqdm_in_a_kernel()


FRONT_DOOR = {
    # the model
    "SoftPriorConfig": "circuitfade.model", "SoftPriorTransformer": "circuitfade.model",
    # data
    "make_task": "circuitfade.tasks", "eval_set": "circuitfade.tasks",
    # training trajectories
    "RunConfig": "circuitfade.train", "TrainConfig": "circuitfade.train", "train": "circuitfade.train",
    "branch": "circuitfade.train", "run_sweep": "circuitfade.train.sweep",
    # checkpoint series
    "attach": "circuitfade.store", "open_run": "circuitfade.store", "trace": "circuitfade.store",
    "example_series": "circuitfade.store.examples",
    # analyses
    "head_diagnostics": "circuitfade.analysis", "successor_mass": "circuitfade.analysis",
    "mean_ablation_importance": "circuitfade.analysis", "consolidation_timeline": "circuitfade.analysis",
    "evaluate": "circuitfade.analysis", "gate_intervention_table": "circuitfade.analysis",
    "edge_attribution": "circuitfade.analysis", "circuit_timeline": "circuitfade.analysis",
    # figures
    "plots": "circuitfade.viz.plots",
    # claims
    "Claim": "circuitfade.claims", "Outcome": "circuitfade.claims", "Declaration": "circuitfade.claims",
    "grade": "circuitfade.claims",
}
"""``name -> module`` of every name ``import circuitfade as cf`` gives."""
MODULES = frozenset({"plots"})
"""Front-door names that are modules themselves: ``cf.plots`` is :mod:`circuitfade.viz.plots`."""

__all__ = ["__version__", *FRONT_DOOR]

DEPRECATED = {"successor_value_mass": ("circuitfade.analysis", "successor_mass")}
"""Front-door names of the previous release: ``cf.successor_value_mass`` still resolves, with a
``DeprecationWarning`` naming the replacement (:func:`circuitfade.compat.deprecated_names`)."""


def __getattr__(name):  # lazy: ``import circuitfade`` stays cheap
    module = FRONT_DOOR.get(name)
    if module is None:
        if name in DEPRECATED:
            from circuitfade.compat import deprecated_names

            return deprecated_names("circuitfade", DEPRECATED)(name, stacklevel=3)
        raise AttributeError(f"module 'circuitfade' has no attribute {name!r}")
    import importlib

    mod = importlib.import_module(module)
    value = mod if name in MODULES else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(FRONT_DOOR))
