"""The removability map's protocol, declared in one place: the grid (models, tasks, budgets,
seeds, paths), how it was extended, and every rule (:func:`studies.removability.map.classify`
and the thresholds it uses). :mod:`studies.removability.map` reads its constants from here,
and its ``results.md`` records :meth:`Declaration.stamp`. Changing any of it after results
exist means a new version in :data:`DECLARATIONS` (the old one stays, unchanged).
"""

from __future__ import annotations

from circuitfade.claims import Declaration, Provenance

__all__ = ["DECLARATION", "DECLARATIONS", "PROVENANCE"]

_V1 = {
    "models": {  # label -> RunConfig.model overrides (4 heads throughout)
        "L2 d64": {},
        "L2 d128": {"d_model": 128, "d_head": 32},
        "L4 d64": {"n_layers": 4},
        "L4 d128": {"n_layers": 4, "d_model": 128, "d_head": 32, "n_heads": 4},
    },
    "tasks": {  # label -> RunConfig.task
        "recall (default)": {"name": "assoc"},
        "recall (shared vocab)": {"name": "assoc", "shared_vocab": True},
        "markov (p=0.5)": {"name": "markov", "p": 0.5},
    },
    "grid_tasks": ["recall (default)", "recall (shared vocab)"],
    "paths": {"baseline": "forced_zero", "fade": "fade600->0", "unforced": "unforced"},
    "seeds": [0, 1, 2],
    "unforced_seeds": [0],
    "steps": [3600],
    "extensions": {
        "five_seeds": "seeds 3 and 4 for a cell flagged needs_5_seeds at 3 seeds (the rule below)",
        "budget_10800": "10,800 steps for every cell with a positive 3,600-step mean margin except L2 d128 "
                        "(chosen after the 3,600-step results were seen; L2 d128 left out for cost)",
        "markov": "markov (p=0.5) on L4 d64 only: the paper's Markov runs, shared",
    },
    "rules": {
        "plateau_acc": 0.3,
        "threshold": 0.5,
        "decides_margin": 0.2,
        "margin": "per seed, fade600->0 − forced_zero final zero-gate accuracy (same seed); 95% paired Student t "
                  "over the seeds",
        "classify": "fewer than 2 paired seeds: too few seeds; every margin ≥ 0.2: path decides removability; every "
                    "margin ≤ −0.2: forced_zero better; some ≥ 0.2: mixed; the fade reaches 0.5 strictly first in "
                    "more than half the seeds: prior only speeds learning; else no difference",
        "needs_5_seeds": "fewer than 5 paired seeds and |mean margin − 0.2| < 2 SE",
        "t50": "first evaluated step (every 100) with zero-gate accuracy ≥ threshold; never = infinitely late",
    },
    "continuation": {"signal_step": 600, "primary": "circuit_share", "k": 2,
                     "test": "Spearman rho of the step-600 signal with the final zero-gate accuracy over "
                             "fade600->0 runs, 95% percentile bootstrap (2000 resamples), smallest budget"},
}

_V2 = {
    **_V1,
    "rules": {
        **_V1["rules"],
        "classify": "from the margin's 95% paired t interval over the seeds, per cell: fewer than 2 paired seeds: "
                    "too few seeds; every seed of both paths on the plateau: not testable; lower end ≥ 0.2: path "
                    "decides removability; upper end < 0.2: margin below 0.2; otherwise undecided",
        "family": "the grid claim 'the path decides removability in some cell' is judged over every testable cell "
                  "at once with Bonferroni intervals (level 1 − 0.05 / testable cells): reproduced if some cell's "
                  "lower end is ≥ 0.2, not reproduced if every cell's upper end is < 0.2, else inconclusive; "
                  "the per-cell classes at 95% are claims about one cell each",
        "faster": "descriptive only: the seeds in which the fade reaches the threshold strictly first",
    },
}

DECLARATIONS: dict[int, Declaration] = {1: Declaration("removability-map", 1, _V1),
                                        2: Declaration("removability-map", 2, _V2)}
PROVENANCE = {1: Provenance.DECLARED_AFTER, 2: Provenance.DECLARED_AFTER}
"""v1 was written after the first map results were committed, and its 10,800-step budget after the
3,600-step results; v2 (interval classes, the plateau guard, the family of cells) after all of them."""
DECLARATION = DECLARATIONS[2]
"""The declaration the map is built and judged by now."""
