"""History dependence between in-context and in-weights learning: ``python -m studies.history``.

After "Testing History Dependence Between In-Context and In-Weights Learning": cloned model and
optimizer branches on balanced triangular mix schedules, logit margins on conflict trials,
activation patching, an exact sign-flip test over seeds; writes ``results/history/``. Modules:
:mod:`.protocol` (one seed), :mod:`.study` (seeds, tables, verdict), :mod:`.figures`.
"""
