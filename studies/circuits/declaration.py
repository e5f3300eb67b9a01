"""The circuits study's protocol, declared in one place before its runs: the arms, seeds,
training budget, the edge-attribution metric, the checkpoints traced, the top-``k`` circuit and
the claims with the rules that judge them (:data:`RULES`).

The question: in the soft-prior model, is the edge circuit that works at gate zero the one that
formed while the gate was on? ``fade600->0`` holds the priors' gates at 0.5 until step 600 and
fades them to 0 by step 1050; its last checkpoint with the gate on is step 900 (gate 1/6).

Version 1 was committed before any of its nine runs was trained. Before it, only the shipped
seed-0 ``fade600->0`` series was looked at, to time the trace (about a second per checkpoint)
and to see that a checkpoint carries its own gate (the content-prior edges score 0 at step 3600);
no circuit overlap and no ``unforced`` or ``forced_zero`` number was seen. Changing any of it
now means a new version in :data:`DECLARATIONS`.

Every rule takes the across-seed summary of one quantity (``mean``, 95% Student-t ``lo``/``hi``,
seeds ``n``; :func:`circuitfade.stats.seed_summary`) and returns ``(full, partial)`` three-valued
decisions for :func:`circuitfade.claims.grade`.
"""

from __future__ import annotations

from typing import Callable, Mapping

from circuitfade.claims import Claim, Declaration, Provenance, at_least

__all__ = ["DECLARATION", "DECLARATIONS", "PROVENANCE", "RULES", "claims", "rule_inputs"]

_DATA = {
    "arms": ["fade600->0", "forced_zero", "unforced"],
    "seeds": [0, 1, 2],
    "train": {"steps": 3600, "checkpoint_every": 300},  # every other setting: the base model's defaults
    "task": {"name": "assoc"},
    "metric": {"method": "eap-ig", "steps": 5, "objective": "logit_diff", "examples": 128,
               "corrupted": "counterfactual_batch (answers shifted by one)", "eval_seed": "the package's EVAL_SEED"},
    "checkpoints": "every checkpoint, steps 0 to 3600 every 300",
    "circuit": {"k": 10, "by": "abs"},
    "overlap": "Jaccard overlap of two top-k edge sets",
    "gate_on_step": 900,  # fade600->0: the last checkpoint before the gate reaches 0 at step 1050
    "final_step": 3600,
    "claims": {
        "fade_keeps_circuit": {
            "name": "after the fade, the gate-zero circuit is the one that formed while the gate was on",
            "quantity": "overlap_fade_final_on", "bound": 0.5,
            "statistic": "fade600->0: Jaccard overlap of the top-10 circuits at step 3600 (gate 0) and step 900 "
                         "(gate on), mean over seeds [95% t]",
            "rule": "interval ≥ 0.5 (partly: mean ≥ 0.5)",
            "fails_if": "the interval lies below 0.5"},
        "fade_closer_to_own_past": {
            "name": "the fade's final circuit is closer to its own gate-on circuit than to the never-gated model's",
            "quantity": "overlap_gap",
            "statistic": "per seed: overlap(fade 3600, fade 900) − overlap(fade 3600, forced_zero 3600), same seed "
                         "(same initialisation and data), mean over seeds [95% t]",
            "rule": "interval ≥ 0 (partly: mean > 0)",
            "fails_if": "the interval lies below 0 (the final circuit is closer to forced_zero's)"},
        "unforced_prior_share": {
            "name": "with the prior on, the content-prior edges carry at least their share of the attribution",
            "quantity": "prior_share_unforced", "bound": "n_prior_edges / n_edges",
            "statistic": "unforced at step 3600: Σ|score| of the content-prior edges / Σ|score| of all edges, "
                         "mean over seeds [95% t], against their share of the edges (8 of 89)",
            "rule": "interval ≥ 8/89 (partly: mean ≥ 8/89)",
            "fails_if": "the interval lies below 8/89"},
    },
    "interval": "95% Student t over seeds",
}

DECLARATIONS: dict[int, Declaration] = {1: Declaration("circuits", 1, _DATA)}
DECLARATION = DECLARATIONS[1]
"""The declaration the circuits study is judged by now."""
PROVENANCE = {1: Provenance.DECLARED_BEFORE}
"""When each version was written relative to the results it grades (v1: before the runs)."""


def claims(decl=DECLARATION) -> dict[str, Claim]:
    """The declared claims, keyed as :data:`RULES`."""
    return {k: Claim(c["name"], rule=c["rule"], statistic=c["statistic"], fails_if=c["fails_if"])
            for k, c in decl.data["claims"].items()}


# ------------------------------------------------------------------------------- the rules
def fade_keeps_circuit(q: Mapping, decl=DECLARATION):
    """``q``: summary of ``overlap_fade_final_on``. Full: ``lo ≥ bound``; partial: ``mean ≥ bound``."""
    b = decl.data["claims"]["fade_keeps_circuit"]["bound"]
    return at_least(q["lo"], q["hi"], b), bool(q["mean"] >= b)


def fade_closer_to_own_past(q: Mapping, decl=DECLARATION):
    """``q``: summary of ``overlap_gap``. Full: ``lo ≥ 0``; partial: ``mean > 0``."""
    return at_least(q["lo"], q["hi"], 0.0), bool(q["mean"] > 0)


def unforced_prior_share(q: Mapping, share_of_edges: float, decl=DECLARATION):
    """``q``: summary of ``prior_share_unforced``; ``share_of_edges``: content-prior edges / all
    edges of the graph (8/89 for the base model). Full: ``lo ≥`` it; partial: ``mean ≥`` it."""
    return at_least(q["lo"], q["hi"], float(share_of_edges)), bool(q["mean"] >= share_of_edges)


RULES: dict[str, Callable] = {"fade_keeps_circuit": fade_keeps_circuit,
                              "fade_closer_to_own_past": fade_closer_to_own_past,
                              "unforced_prior_share": unforced_prior_share}
"""Claim key -> rule; the keys are the declaration's claims."""

_ARMS = {"fade_keeps_circuit": ("fade600->0",), "fade_closer_to_own_past": ("fade600->0", "forced_zero"),
         "unforced_prior_share": ("unforced",)}


def rule_inputs(key: str) -> tuple[str, ...]:
    """The arms (gate paths) claim ``key`` is measured on."""
    return _ARMS[key]
