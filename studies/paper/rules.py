"""The main paper's protocol, declared in one place: experiments (arms, seeds), the budget,
the claims with their rules and thresholds, and the interval every comparison uses.

:data:`DECLARATION` is the protocol the tables are judged by; every results file records its
stamp (``paper vN (sha256 ...)``). Editing a declaration after results exist means a new
version: earlier versions stay in :data:`DECLARATIONS`, unchanged, so a results file can always
be checked against the declaration it names, and ``results.md`` shows the outcomes under the
earlier versions beside the current ones.

* v1 - the rules as first applied: a difference of two measurements had the normal interval
  ``z · sqrt(se_a² + se_b²)`` (z = 1.96 even with 3 seeds per arm).
* v2 - one interval per comparison: a Student-t interval of the difference, paired where the
  two arms have the same seeds (two or more), Welch otherwise; an arm with one seed carries
  only its evaluation's binomial error (512 examples: a large-sample error, ``df = inf``), so
  two one-seed arms compare by the normal interval. Thresholds unchanged.
* v3 - seeds as declared: a claim whose arms ran on fewer seeds than its experiment declares
  (3 per arm) is "not run (k of n seeds)", whatever its rule says on the seeds it has (a
  one-seed Wilson interval covers evaluation noise, not seed-to-seed variation). Intervals and
  thresholds as in v2.

Every version was written after results of its experiments existed (:data:`PROVENANCE`): v1
was declared after the results, v2 and v3 restate it after the results.

Each rule is a pure function of :class:`~studies.paper.protocol.Measure` values returning
``(full, partial)`` three-valued decisions (:mod:`circuitfade.claims`); :data:`RULES` maps a
claim key to its rule, and ``tests/studies/test_verdict_rules.py`` feeds every rule planted data on
which it must say "reproduced" and data on which it must say "not reproduced".
"""

from __future__ import annotations

from typing import Callable, Sequence

from circuitfade import stats
from circuitfade.claims import Claim, Declaration, Provenance, all_of, any_of, at_least, at_most
from circuitfade.tasks import EVAL_SEED
from circuitfade.train import RunConfig
from studies.paper.protocol import LARGE, Measure

__all__ = ["DECLARATION", "DECLARATIONS", "RULES", "VERSION_NOTES", "PROVENANCE", "CLAIM_EXPERIMENT", "arm_label",
           "claim", "diff", "declaration", "declared_seeds"]

_CLAIMS = {
    "unforced_collapses": {
        "name": "unforced collapses at zero gate", "statistic": "unforced acc: zero-gate / normal",
        "rule": "zero ≤ .20 and normal ≥ .70 (partly: zero − normal ≤ −.30)",
        "zero_max": 0.20, "normal_min": 0.70, "partly_diff_max": -0.30,
        "fails_if": "zero-gate interval above .20 and zero − normal above −.30"},
    "forced_zero_fails": {
        "name": "forced_zero fails", "statistic": "forced_zero zero-gate acc; minus {fade}",
        "rule": "≤ .20 (partly: difference ≤ −.20)", "zero_max": 0.20, "partly_diff_max": -0.20,
        "fails_if": "forced_zero's interval above .20 and its difference from the fade above −.20"},
    "fade_keeps": {
        "name": "{fade} keeps zero-gate accuracy", "statistic": "fade zero-gate acc; minus forced_zero",
        "rule": "≥ .60 and difference ≥ .20 (partly: ≥ .60)", "zero_min": 0.60, "diff_min": 0.20,
        "fails_if": "the fade's zero-gate interval below .60"},
    "switch_falls_short": {
        "name": "hard switch at {switch_step} falls short", "statistic": "{switch} zero-gate acc; minus fade",
        "rule": "difference ≤ −.20 (partly: ≤ −.05)", "diff_max": -0.20, "partly_diff_max": -0.05,
        "fails_if": "switch − fade interval above −.05"},
    "posthoc_falls_short": {
        "name": "post hoc continuation falls short", "statistic": "posthoc zero-gate acc; minus fade",
        "rule": "difference ≤ −.20 (partly: ≤ −.05)", "diff_max": -0.20, "partly_diff_max": -0.05,
        "fails_if": "posthoc − fade interval above −.05"},
    "fade_window": {
        "name": "robust to fade start (400–800)", "statistic": "zero-gate acc per start",
        "rule": "each ≥ .60, max − min ≤ .10 (interval of the spread), each − forced_zero ≥ .20 (partly: first two)",
        "each_min": 0.60, "spread_max": 0.10, "diff_min": 0.20,
        "fails_if": "some start's interval below .60, or the spread's interval above .10"},
    "shapes": {
        "name": "smooth shapes work, two-step does not", "statistic": "linear/cosine/convex vs two-step zero-gate acc",
        "rule": "each smooth ≥ .60 and two-step − worst smooth ≤ −.20 (partly: smooth ≥ .60)",
        "smooth_min": 0.60, "diff_max": -0.20, "fails_if": "some smooth shape's interval below .60"},
    "markov": {
        "name": "Markov induction replicates the pattern", "statistic": "zero-gate acc per p",
        "rule": "fade − unforced ≥ .20 and fade − forced_zero ≥ .20 at every p (partly: fade − unforced ≥ .20 at some p)",
        "diff_min": 0.20, "ps": [0.2, 0.5, 0.8], "fails_if": "fade − unforced below .20 at every p"},
    "linreg": {
        "name": "linear ICL is the boundary (forced_zero learns it; unforced degrades at zero gate)",
        "statistic": "zero-gate MSE unforced / forced_zero / fade; unforced normal MSE",
        "rule": "forced_zero − 1.5 × fade ≤ 0 and unforced zero − 1.5 × unforced normal > 0 (partly: first)",
        "scale": 1.5, "fails_if": "forced_zero's MSE above 1.5 × the fade's (whole interval)"},
    "consolidation": {
        "name": "consolidation happens after the gate reaches zero",
        "statistic": "per seed: evaluation sets on which both first crossings (succ ≥ .25, abl ≥ .03) come after g=0 "
                     "(before g=0)",
        "rule": "after g=0 on every set of every seed (partly: on some set of some seed)",
        "fails_if": "no set of any seed has both crossings after g=0"},
}

_EXPERIMENTS = {  # arms (arm_label of each config) and seeds, at the full budget
    "paths": {"arms": ["fade600->0", "linear0.5->0", "forced_const0.5", "unforced", "forced_zero",
                       "fade600->0 large", "linear0.5->0 large", "forced_const0.5 large", "unforced large",
                       "forced_zero large"],
              "seeds": "base: --seeds (3); large: the first --large-seeds"},
    "controls": {"arms": ["fade600->0", "switch@1050", "switch@600", "unforced", "forced_zero",
                          "posthoc2550 from unforced@3600", "fade600->0 large", "switch@1050 large", "switch@600 large",
                          "unforced large", "forced_zero large", "posthoc2550 from unforced@3600 large"],
                 "seeds": "base: --seeds (3); large: the first min(--large-seeds, base seeds)"},
    "fade_window": {"arms": ["fade400->0", "fade500->0", "fade600->0", "fade700->0", "fade800->0"], "seeds": 3},
    "shapes": {"arms": ["fade600->0", "fade600->0:cosine", "fade600->0:convex", "fade600->0:concave",
                        "twostep600->0"], "seeds": 3},
    "fixes": {"arms": ["unforced prior_dropout=0.5", "unforced dual_loss", "unforced", "fade600->0"], "seeds": 3},
    "markov": {"arms": [f"{p} task=markov,p={q}" for q in (0.2, 0.5, 0.8)
                        for p in ("fade600->0", "unforced", "forced_zero")], "seeds": 3},
    "linreg": {"arms": ["unforced task=linreg", "forced_zero task=linreg", "fade600->0 task=linreg"], "seeds": 3},
    "mechanism": {"arms": ["fade600->0"], "seeds": "the first 3",
                  "eval_sets": 5, "thresholds": {"successor_mass": 0.25, "ablation_importance": 0.03}},
    "interventions": {"arms": ["unforced"], "seeds": 3},
    "format": {"arms": [f"{p}{t}" for t in ("", " task=assoc,shared_vocab=True", " task=assoc,n_pairs=4",
                                           " task=assoc,n_distractors=14,n_keys=8,n_pairs=8,n_values=8")
                        for p in ("forced_zero", "unforced", "fade600->0")], "seeds": 3},
}

_COMMON = {
    "budget": {"steps": 3600, "eval_size": 512, "eval_seed": EVAL_SEED},
    "experiments": _EXPERIMENTS,
    "measure": "mean over seeds, 95% Student-t interval clipped to [0, 1]; one seed: the Wilson interval of its "
               "512-example evaluation (evaluation noise only)",
    "plateau_acc": 0.30,
    "testable": "a claim is not testable when none of its runs left the initial plateau (best accuracy's Wilson "
                "lower bound above plateau_acc)",
    "decision": "x ≤ c holds if the whole 95% interval is ≤ c, fails if the whole interval is > c, else undecided",
    "claims": _CLAIMS,
}

DECLARATIONS: dict[int, Declaration] = {
    1: Declaration("paper", 1, {**_COMMON, "difference": "normal"}),
    2: Declaration("paper", 2, {**_COMMON, "difference": "paired t (same seeds, n >= 2), else Welch t; "
                                                       "a one-seed arm: binomial error, df = inf"}),
    3: Declaration("paper", 3, {**_COMMON, "difference": "paired t (same seeds, n >= 2), else Welch t; "
                                                       "a one-seed arm: binomial error, df = inf",
                                "seeds_as_declared": "a claim whose arms ran on fewer seeds than its experiment "
                                                     "declares is not run (k of n seeds)"}),
}
VERSION_NOTES = {1: "a difference of two measurements has the normal interval z·sqrt(se_a² + se_b²)",
                 2: "paired t over seeds where both arms share their seeds, Welch t otherwise",
                 3: "as v2, and a claim whose arms ran on fewer seeds than declared is not run"}
"""What each version changed, for the table of verdicts by version."""
PROVENANCE = {1: Provenance.DECLARED_AFTER, 2: Provenance.RESTATED, 3: Provenance.RESTATED}
"""When each version was written relative to the results it grades (from the repository's history:
the first paper results were committed before the first declaration)."""
CLAIM_EXPERIMENT = {"unforced_collapses": "paths", "forced_zero_fails": "paths", "fade_keeps": "paths",
                    "switch_falls_short": "controls", "posthoc_falls_short": "controls",
                    "fade_window": "fade_window", "shapes": "shapes", "markov": "markov", "linreg": "linreg",
                    "consolidation": "mechanism"}
"""The experiment whose declared seeds a claim's arms must have."""
DECLARATION = DECLARATIONS[3]
"""The declaration the paper's tables are judged by now."""


def declaration(version: int | None = None) -> Declaration:
    """The declaration of ``version`` (default: the current one); ``ValueError`` for an unknown version."""
    if version is None:
        return DECLARATION
    if version not in DECLARATIONS:
        raise ValueError(f"paper declaration version {version!r} does not exist (have {sorted(DECLARATIONS)})")
    return DECLARATIONS[version]


def declared_seeds(key: str, base_seeds: int = 3) -> int:
    """The seeds claim ``key``'s arms are declared to have: its experiment's count, or
    ``base_seeds`` (the ``--seeds`` default, 3) where the experiment names the base seeds."""
    seeds = DECLARATION.data["experiments"][CLAIM_EXPERIMENT[key]]["seeds"]
    return seeds if isinstance(seeds, int) else base_seeds


def claim(key: str, decl: Declaration = DECLARATION, **names: str) -> Claim:
    """The declared :class:`~circuitfade.claims.Claim` ``key``, its name and statistic filled with
    ``names`` (``fade``, ``switch``, ``switch_step``: the paths at the run's budget)."""
    c = decl.data["claims"][key]
    return Claim(c["name"].format(**names), rule=c["rule"], statistic=c["statistic"].format(**names),
                 fails_if=c["fails_if"])


def arm_label(c: RunConfig) -> str:
    """How the declaration names a run's arm: its path, then what differs from the base setting."""
    parts = [c.path]
    if c.parent:
        parts[0] += f" from {c.parent['run'].rsplit('/', 1)[-1].split('-')[1]}@{c.parent['step']}"
    if dict(c.task) != {"name": "assoc"}:
        parts.append("task=" + ",".join([c.task["name"]] + [f"{k}={v}" for k, v in sorted(c.task.items()) if k != "name"]))
    if c.train.prior_dropout:
        parts.append(f"prior_dropout={c.train.prior_dropout}")
    if c.train.dual_loss:
        parts.append("dual_loss")
    if c.model:
        parts.append("large" if dict(c.model) == dict(LARGE) else f"model={dict(c.model)}")
    return " ".join(parts)


# ------------------------------------------------------------------------------- the interval
def diff(a: Measure, b: Measure, scale: float = 1.0, decl: Declaration = DECLARATION) -> stats.Difference:
    """The declared interval of ``a - scale · b``.

    v2: paired t over the seeds when both arms have the same two or more seeds
    (:func:`~circuitfade.stats.paired_t_interval`), Welch t when both have two or more
    (:func:`~circuitfade.stats.welch_t_interval`), otherwise Welch-Satterthwaite on the arms'
    standard errors (a one-seed arm: its evaluation's binomial error, ``df = inf``).
    v1: the normal interval ``z · sqrt(se_a² + scale² se_b²)``.
    """
    if decl.data["difference"] == "normal":
        return stats.satterthwaite_interval(a.mean, a.se, float("inf"), b.mean, b.se, float("inf"), scale=scale)
    if a.n >= 2 and b.n >= 2:
        if a.seeds and a.seeds == b.seeds:
            return stats.paired_t_interval(a.values, b.values, scale=scale)
        return stats.welch_t_interval(a.values, b.values, scale=scale)
    return stats.satterthwaite_interval(a.mean, a.se, a.df, b.mean, b.se, b.df, scale=scale)


def _lohi(d: stats.Difference) -> tuple[float, float]:
    return d.lo, d.hi


Rule = Callable[..., tuple]


# ------------------------------------------------------------------------------- the rules
def unforced_collapses(zero: Measure, normal: Measure, decl: Declaration = DECLARATION):
    """``(full, partial)``: unforced zero-gate ≤ zero_max and normal ≥ normal_min (partly: zero − normal
    ≤ partly_diff_max)."""
    c = decl.data["claims"]["unforced_collapses"]
    full = all_of(at_most(zero.lo, zero.hi, c["zero_max"]), at_least(normal.lo, normal.hi, c["normal_min"]))
    return full, at_most(*_lohi(diff(zero, normal, decl=decl)), c["partly_diff_max"])


def forced_zero_fails(fz: Measure, fade: Measure, decl: Declaration = DECLARATION):
    """forced_zero's zero-gate accuracy ≤ zero_max (partly: forced_zero − fade ≤ partly_diff_max)."""
    c = decl.data["claims"]["forced_zero_fails"]
    return at_most(fz.lo, fz.hi, c["zero_max"]), at_most(*_lohi(diff(fz, fade, decl=decl)), c["partly_diff_max"])


def fade_keeps(fade: Measure, fz: Measure, decl: Declaration = DECLARATION):
    """fade ≥ zero_min and fade − forced_zero ≥ diff_min (partly: fade ≥ zero_min)."""
    c = decl.data["claims"]["fade_keeps"]
    keeps = at_least(fade.lo, fade.hi, c["zero_min"])
    return all_of(keeps, at_least(*_lohi(diff(fade, fz, decl=decl)), c["diff_min"])), keeps


def _falls_short(key: str, other: Measure, fade: Measure, decl: Declaration):
    c = decl.data["claims"][key]
    lo, hi = _lohi(diff(other, fade, decl=decl))
    return at_most(lo, hi, c["diff_max"]), at_most(lo, hi, c["partly_diff_max"])


def switch_falls_short(switch: Measure, fade: Measure, decl: Declaration = DECLARATION):
    """switch − fade ≤ diff_max (partly: ≤ partly_diff_max)."""
    return _falls_short("switch_falls_short", switch, fade, decl)


def posthoc_falls_short(posthoc: Measure, fade: Measure, decl: Declaration = DECLARATION):
    """posthoc − fade ≤ diff_max (partly: ≤ partly_diff_max)."""
    return _falls_short("posthoc_falls_short", posthoc, fade, decl)


def spread(ms: Sequence[Measure], decl: Declaration = DECLARATION) -> stats.Difference:
    """``max - min`` of the means with the extreme pair's difference interval."""
    hi_m, lo_m = max(ms, key=lambda x: x.mean), min(ms, key=lambda x: x.mean)
    return diff(hi_m, lo_m, decl=decl)


def fade_window(starts: Sequence[Measure], fz: Measure, decl: Declaration = DECLARATION):
    """Every start ≥ each_min, the spread ≤ spread_max, every start − forced_zero ≥ diff_min
    (partly: the first two)."""
    c = decl.data["claims"]["fade_window"]
    each = all_of(*[at_least(x.lo, x.hi, c["each_min"]) for x in starts])
    spread_ok = at_most(*_lohi(spread(starts, decl)), c["spread_max"])
    margin = all_of(*[at_least(*_lohi(diff(x, fz, decl=decl)), c["diff_min"]) for x in starts])
    return all_of(each, spread_ok, margin), all_of(each, spread_ok)


def shapes(smooth: Sequence[Measure], twostep: Measure, decl: Declaration = DECLARATION):
    """Every smooth shape ≥ smooth_min and two-step − worst smooth ≤ diff_max (partly: the first)."""
    c = decl.data["claims"]["shapes"]
    ok = all_of(*[at_least(x.lo, x.hi, c["smooth_min"]) for x in smooth])
    worst = min(smooth, key=lambda x: x.mean)
    return all_of(ok, at_most(*_lohi(diff(twostep, worst, decl=decl)), c["diff_max"])), ok


def markov(per_p: Sequence[tuple[Measure, Measure, Measure]], decl: Declaration = DECLARATION):
    """``per_p``: (fade, unforced, forced_zero) per transition probability. Full: fade − unforced ≥ diff_min
    and fade − forced_zero ≥ diff_min at every p; partly: fade − unforced ≥ diff_min at some p."""
    c = decl.data["claims"]["markov"]
    over_u = [at_least(*_lohi(diff(f, u, decl=decl)), c["diff_min"]) for f, u, _ in per_p]
    over_z = [at_least(*_lohi(diff(f, z, decl=decl)), c["diff_min"]) for f, _, z in per_p]
    return all_of(*[all_of(a, b) for a, b in zip(over_u, over_z)]), any_of(*over_u)


def linreg(unforced: Measure, fz: Measure, fade: Measure, unforced_normal: Measure, decl: Declaration = DECLARATION):
    """Zero-gate MSE: forced_zero − scale × fade ≤ 0 and unforced zero − scale × unforced normal ≥ 0
    (partly: the first)."""
    s = decl.data["claims"]["linreg"]["scale"]
    learns = at_most(*_lohi(diff(fz, fade, s, decl=decl)), 0.0)
    return all_of(learns, at_least(*_lohi(diff(unforced, unforced_normal, s, decl=decl)), 0.0)), learns


def consolidation(counts: Sequence[tuple[int, int]], decl: Declaration = DECLARATION):
    """``counts``: per seed, (evaluation sets with both crossings after g=0, sets). Full: every set of
    every seed; partly: some set of some seed."""
    return all(k == n for k, n in counts), any(k > 0 for k, _ in counts)


RULES: dict[str, Rule] = {
    "unforced_collapses": unforced_collapses, "forced_zero_fails": forced_zero_fails, "fade_keeps": fade_keeps,
    "switch_falls_short": switch_falls_short, "posthoc_falls_short": posthoc_falls_short,
    "fade_window": fade_window, "shapes": shapes, "markov": markov, "linreg": linreg,
    "consolidation": consolidation,
}
"""Claim key -> rule; the keys are the declaration's claims."""
