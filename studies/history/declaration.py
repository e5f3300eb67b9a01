"""The history study's protocol, declared in one place: settings, seeds, the claims compared
with the study, and the rule that judges each (:data:`RULES`).

Version 1 was written after the five-seed results in ``results/history`` existed (before it,
the report put the study's numbers beside ours under a fixed heading and judged nothing):
its verdicts on those results are therefore not a pre-registered test; the next run of the
study is. Changing any of it now means a new version in :data:`DECLARATIONS`.

Every rule takes the across-seed summary of one or two quantities (``mean``, 95% Student-t
``lo``/``hi``, seeds ``n`` and ``n_positive``) and returns ``(full, partial)`` three-valued
decisions for :func:`circuitfade.claims.grade`.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from circuitfade.claims import Claim, Declaration, all_of, at_least, at_most, Provenance

__all__ = ["DECLARATION", "DECLARATIONS", "RULES", "claims", "rule_inputs"]

_CONFIG = {  # HistoryConfig() field by field (tests check the dataclass against it)
    "p0": 0.5, "delta": 0.3, "period": 400, "anchor_steps": 3000, "relax_steps": [0, 25, 100], "relax_every": 5,
    "trace_every": 20, "batch_size": 64, "lr": 0.001, "n_pairs": 8, "table_seed": 0, "eval_size": 2048,
    "patch_size": 512,
    "model": {"n_layers": 2, "n_heads": 4, "d_model": 64, "d_head": 16, "d_mlp": 128, "attn_only": False,
              "act_fn": "gelu", "positional_embedding_type": "standard", "priors": [], "d_vocab": 32, "n_ctx": 32},
}

_CLAIMS = {
    "gap_sign": {
        "name": "history dependence with the study's sign (from below ends above from above)",
        "quantity": "gap_r0", "study": "+0.0976 (5/5 seeds > 0, p = 0.0625)",
        "statistic": "margin gap (below − above) at the end of the schedule, mean over seeds [95% t]",
        "rule": "interval ≥ 0 (partly: mean > 0)",
        "fails_if": "the interval lies below 0 (the gap has the opposite sign)"},
    "gap_reverses": {
        "name": "the gap reverses slightly after 25 updates at p0",
        "quantity": "gap_r25", "study": "reverses slightly",
        "statistic": "gap after 25 updates, signed by the immediate gap's mean sign s: s × gap_r25 [95% t]",
        "rule": "s × interval ≤ 0 (partly: s × mean < 0)",
        "fails_if": "s × interval lies above 0 (the gap keeps its sign)"},
    "gap_vanishes": {
        "name": "the gap vanishes after 100 updates at p0",
        "quantity": "gap_r100", "study": "≈ 0 (vanished)", "fraction": 0.2,
        "statistic": "gap after 100 updates [95% t], against 0.2 × |mean immediate gap|",
        "rule": "interval within ±0.2 |gap_r0| (partly: |mean| ≤ 0.2 |gap_r0|)",
        "fails_if": "the interval lies wholly outside ±0.2 |gap_r0|"},
    "heads_carry_gap": {
        "name": "mean-replacing all query heads removes most of the gap",
        "quantity": "frac_removed_all_heads", "study": "86.8 %", "bound": 0.5,
        "statistic": "fraction of the gap removed, mean over seeds [95% t]",
        "rule": "interval ≥ 0.5 (partly: mean ≥ 0.5)",
        "fails_if": "the interval lies below 0.5"},
    "patch_maps_agree": {
        "name": "the two patching maps agree",
        "quantity": "patch_corr", "study": "> 0.999", "bound": 0.99,
        "statistic": "correlation of the two patching maps, mean over seeds [95% t]",
        "rule": "interval ≥ 0.99 (partly: mean ≥ 0.99)",
        "fails_if": "the interval lies below 0.99"},
    "same_dominant_head": {
        "name": "the same dominant head in both histories",
        "quantity": "same_dominant_head", "study": "same head in both histories",
        "statistic": "fraction of seeds whose dominant head is the same in both branches",
        "rule": "every seed (partly: more than half)",
        "fails_if": "half the seeds or fewer"},
}

DECLARATIONS: dict[int, Declaration] = {
    1: Declaration("history", 1, {"config": _CONFIG, "seeds": 5, "claims": _CLAIMS,
                                  "interval": "95% Student t over seeds; p: exact two-sided sign flip",
                                  "declared": "after the five-seed results existed (first rules of this study)"}),
}
DECLARATION = DECLARATIONS[1]
"""The declaration the history report is judged by now."""
PROVENANCE = {1: Provenance.DECLARED_AFTER}
"""When each version was written relative to the results it grades (v1: after the five-seed results)."""


def claims(decl=DECLARATION) -> dict[str, Claim]:
    """The declared claims, keyed as :data:`RULES`."""
    return {k: Claim(c["name"], rule=c["rule"], study=c["study"], statistic=c["statistic"], fails_if=c["fails_if"])
            for k, c in decl.data["claims"].items()}


# ------------------------------------------------------------------------------- the rules
def gap_sign(gap: Mapping, decl=DECLARATION):
    """``gap``: summary of ``gap_r0``. Full: ``lo ≥ 0``; partial: ``mean > 0``."""
    return at_least(gap["lo"], gap["hi"], 0.0), bool(gap["mean"] > 0)


def gap_reverses(gap25: Mapping, gap0: Mapping, decl=DECLARATION):
    """Full: ``s × gap_r25``'s interval ≤ 0 with ``s`` the sign of ``mean(gap_r0)``; partial:
    ``s × mean(gap_r25) < 0``. ``s = 0`` (no immediate gap): nothing to reverse, both False."""
    s = math.copysign(1.0, gap0["mean"]) if gap0["mean"] else 0.0
    if s == 0.0:
        return False, False
    lo, hi = sorted((s * gap25["lo"], s * gap25["hi"]))
    return at_most(lo, hi, 0.0), bool(s * gap25["mean"] < 0)


def gap_vanishes(gap100: Mapping, gap0: Mapping, decl=DECLARATION):
    """Full: ``gap_r100``'s interval within ``±f |mean(gap_r0)|``; partial: ``|mean| ≤ f |mean(gap_r0)|``."""
    b = decl.data["claims"]["gap_vanishes"]["fraction"] * abs(gap0["mean"])
    return (all_of(at_least(gap100["lo"], gap100["hi"], -b), at_most(gap100["lo"], gap100["hi"], b)),
            bool(abs(gap100["mean"]) <= b))


def _at_least_bound(key: str):
    def rule(q: Mapping, decl=DECLARATION):
        b = decl.data["claims"][key]["bound"]
        return at_least(q["lo"], q["hi"], b), bool(q["mean"] >= b)

    rule.__name__ = key
    rule.__doc__ = f"Full: the interval ≥ the declared bound of ``{key}``; partial: the mean ≥ it."
    return rule


heads_carry_gap = _at_least_bound("heads_carry_gap")
patch_maps_agree = _at_least_bound("patch_maps_agree")


def same_dominant_head(share: Mapping, decl=DECLARATION):
    """``share``: fraction of seeds with the same dominant head. Full: 1; partial: more than half."""
    return bool(share["mean"] >= 1.0), bool(share["mean"] > 0.5)


RULES: dict[str, Callable] = {"gap_sign": gap_sign, "gap_reverses": gap_reverses, "gap_vanishes": gap_vanishes,
                              "heads_carry_gap": heads_carry_gap, "patch_maps_agree": patch_maps_agree,
                              "same_dominant_head": same_dominant_head}
"""Claim key -> rule; the keys are the declaration's claims."""

_INPUTS = {"gap_sign": ("gap_r0",), "gap_reverses": ("gap_r25", "gap_r0"), "gap_vanishes": ("gap_r100", "gap_r0"),
           "heads_carry_gap": ("frac_removed_all_heads",), "patch_maps_agree": ("patch_corr",),
           "same_dominant_head": ("same_dominant_head",)}


def rule_inputs(key: str) -> tuple[str, ...]:
    """The summary quantities (``summary.csv``'s ``quantity``) rule ``key`` reads, in argument order."""
    return _INPUTS[key]
