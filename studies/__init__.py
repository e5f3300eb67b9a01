"""Research studies built on circuitfade's public API, beside the package (not in the wheel).

Each study is a package run as ``python -m studies.<name>`` from the repository root and
writes only under ``results/<name>/`` (and, while it runs, the staging folder
``results/.<name>.study/`` beside it, so that the folder holds one run's complete outputs):

* :mod:`studies.paper` - the main paper's experiments ("Training Trajectories Determine Circuit
  Removability in Annealable Soft-Prior Transformers", arXiv:2609.10287) and its static baselines;
* :mod:`studies.removability` - the removability map over model size x task x budget;
* :mod:`studies.history` - history dependence between in-context and in-weights learning;
* :mod:`studies.development` - developmental screens of a revision series;
* :mod:`studies.alignment` - no-partial-credit circuit formation.

Claims, rules and verdicts come from :mod:`circuitfade.claims`; :mod:`studies.common` holds
the little the studies share beyond the library.
"""
