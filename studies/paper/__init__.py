"""The main paper: "Training Trajectories Determine Circuit Removability in Annealable Soft-Prior
Transformers" (arXiv:2609.10287).

``python -m studies.paper reproduce [EXPERIMENT ...]`` runs its experiments (Tables 1-2, the
fade window, shapes, fixes, Markov, linear regression, format, mechanism, interventions) and
writes ``results/paper/results.md`` with a claim-by-claim verdict table;
``python -m studies.paper static`` runs the static baselines and the removability of published
priors (``results/paper/static/``). Modules: :mod:`.protocol` (configs and table builders),
:mod:`.reproduce`, :mod:`.static_baselines`.
"""
