"""The alignment study's protocol, declared in one place: every scan grid, seed count, arm and rule.

One :class:`~circuitfade.claims.Declaration` per experiment and version; the experiment modules
read their grids, seeds and arms from here, and every results file records the stamp (name,
version, sha256) of the declaration that produced it (:func:`stamp`, the ``protocol`` column of
``verdicts.csv``). A declaration is never edited once its results exist: a changed protocol is a
new version, and ``results.md`` shows the outcomes of both.

* **Version 1** is the protocol as it ran on the *pinned* apparatus (each part head's read-out
  fixed by :class:`~circuitfade.tasks.kpart.PinnedReadout`), including its amendments, which are
  recorded as such (the withheld scan extended twice, the occupation rule restated, the ignition
  and pin follow-ups).
* **Version 2** is the protocol on the *unpinned* apparatus (``kpart_model(task, pinned=False)``:
  every head learns its own query-key routing, so a part is QK *and* OV), with arms and seed
  counts from our own measured thresholds and a stated power target, and verdict rules that can
  fail (each has a planted failing case in the tests). The cure's confirmatory W comes from a
  pilot that is declared as a pilot (``cure-pilot``) before it ran; the confirmatory declaration
  (``cure`` v2) records the pilot's hash.
* **Version 3**, declared after the version-2 results and labelled so, re-judges the same jobs (no
  new runs): a part-level verdict only after a per-cell positive control shows the parts were
  identified (:data:`PARTS_V3`), a cure rule that can say "reproduced" where the published pattern
  would appear (:data:`CURE_V3`), and outcomes the apparatus forces relabelled "forced by the
  apparatus" (:data:`FORCED_V3`, :func:`forced`).

Seed counts from power targets (checked by the tests with :mod:`studies.alignment.power`):

* cure: ``CURE_SEEDS_V2`` = 10, the smallest n per arm at which a one-sided Fisher exact test at
  alpha 0.05 detects the study's effect (cure: every run ignites) against an untreated arm at 1/2
  with power >= 0.8 (power 0.83; 0.64 at n = 8).
* ignition: ``IGNITION_SEEDS_V2`` = 8, the smallest n at which "below the threshold it never
  ignites" fails with probability >= 0.8 if the true rate at share 0.1 is the 1/5 we measured
  there (``1 - 0.8^8 = 0.83``). Two shares, the ends of the bracket (0.1, 0.2); the shares inside it
  were not run (budget).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from circuitfade.claims import Declaration, Outcome, Provenance, Verdict, verdict_table

__all__ = ["DECLARATIONS", "declared", "stamp", "APPARATUS_OF", "CURE_SEEDS_V2", "IGNITION_SEEDS_V2",
           "POWER_TARGETS", "rules_of", "CURE_V2", "CURE_PILOT_V2", "verdict_frame", "stamped", "VERDICT_COLUMNS",
           "PARTS_V3", "CURE_V3", "FORCED_V3", "AFTER_V2", "IDENTIFY_MARGIN", "MIN_IDENTIFIED", "forced", "forced_v1",
           "provenance_of", "with_provenance"]

# ----------------------------------------------------------------------------- version 1 (as it ran)
_APPARATUS_V1 = {"task": {"name": "kpart", "v": 3, "n_distractors": 1}, "model": "kpart_model(task) (pinned)",
                 "optimizer": "AdamW lr 3e-3 wd 0.01 clip 1", "batch": 128, "eval_every": 25, "eval_size": 256,
                 "ignition": {"threshold": 0.5, "patience": 2}, "margin": 200}

PARTS_V1 = Declaration("alignment.parts", 1, {
    "apparatus": _APPARATUS_V1, "ks": [2, 3, 4, 5], "seeds": [0, 1, 2, 3, 4],
    "base_cap": {"2": 4000, "3": 4000, "4": 8000, "5": 20000}, "wait_cap": 12000, "reinit_eval_every": 5,
    "ablation": {"methods": ["mean", "zero", "resample"], "eval": "512 sequences, seed EVAL_SEED + 1",
                 "parts": "heads (0, 0..K-1)", "random": "every non-part head", "cells": "K x seed"},
    "drives": [0.5, 2.0], "drive_cells": [[3, 1], [3, 2], [3, 3], [4, 2], [4, 3]],
    "held_out": "every K = 5 cell and the K = 4 drive cells",
    "series": {"steps": 1000, "parts": "top induction and top previous-token head at the last checkpoint",
               "n_random": 4, "n": 256, "verdict": "none (reported, no verdict row)"},
    "rules": {
        "wait counts missing parts, not size: wait(5,3)/wait(3,3)":
            "reproduced if our 95% interval meets [1.19, 1.37]; partly if the ratio is in [0.5, 2]",
        "no partial credit: one part ablated leaves little":
            "reproduced if every discriminating cell is below (K-1)/K and sign-test p < 0.01; partly if the median "
            "is below 0.5",
        "a random non-part head leaves ~100%": "reproduced if the median retained is >= 95%; partly if >= 80%",
        "rate equation with frozen constants predicts held-out waits":
            "reproduced if the median relative error is <= 25%; partly if <= 50%"},
})

CURE_V1 = Declaration("alignment.cure", 1, {
    "apparatus": _APPARATUS_V1, "k": 3, "ws": [0, 300, 1000, 3000, 10000, 30000], "budget": 1500,
    "share": 0.5, "seeds": [0, 1, 2, 3, 4, 5], "extra_cure_ws": [10000],
    "arms": {"qk": "W_Q, b_Q, W_K, b_K of the parts (0, 0..2)", "ov": "W_V, b_V, W_O of the parts"},
    "cure_w": "the critical W (smallest W with no seed igniting); without one, the largest W",
    "amendments": ["the scan first ran W = 0, 300, 1000, 3000 (no critical W there); 10000 was added, then 30000 "
                   "(budget and rules unchanged)", "the cure arms were also run at W = 10000 as a control"],
    "rules": {
        "withheld capability: past a critical step it never ignites within the budget":
            "reproduced if some scanned W has 0 seeds igniting within the budget",
        "cure: re-initialising only the QK slices of the parts restores learnability":
            "reproduced if >= n-1 of n >= 5 runs ignite; partly if more than half",
        "cure: re-initialising only the OV slices does nothing":
            "reproduced if <= 1 of n >= 5 runs ignites; partly if at most half"},
})

IGNITION_V1 = Declaration("alignment.ignition", 1, {
    "apparatus": _APPARATUS_V1, "k": 3, "switch": 1000, "budget": 3000, "share_in_fit": 1.0,
    "above": {"share": 0.5, "seeds": 10}, "below": {"share": 0.005, "seeds": 12},
    "scan": {"shares": [0.002, 0.01, 0.02, 0.05, 0.1, 0.2], "seeds": 5},
    "long": {"shares": [0.02, 0.05], "budget": 12000, "seeds": 5},
    "amendments": ["the long-budget follow-up (shares 0.02, 0.05; 12000 steps) was added after the scan"],
    "arms_from": "the study's counts (10 above, 12 below)",
    "rules": {
        "ignition on schedule: above the floor a flat capability ignites after the switch (share 0.5)":
            "reproduced if >= n-1 of n >= 5 runs ignite within the budget; partly if more than half",
        "ignition on schedule: below the floor it never ignites (share 0.005; below the predicted budget "
        "threshold, the rate-zero floor is ~0)":
            "reproduced if none of n >= 5 runs ignites within the budget; partly if at most a quarter",
        "ignition step relative to the switch (above arm) vs the frozen rate equation's prediction":
            "reproduced if every run is at chance before the switch and the predicted delay is inside the 95% "
            "interval of the median delay; partly if flat and within a factor 2 of the median",
        "the concentration floor predicted from the frozen constants before the runs":
            "reproduced if the predicted budget threshold lies in the empirical bracket [s_lo, s_hi]; partly if "
            "within a factor 3 of it",
        "below the threshold it is blocked, not slow: share 0.05 with a 12000-step budget (follow-up)":
            "reproduced if none of n >= 5 runs ignites; not reproduced if more than half ignite; partly otherwise"},
})

PRECURSOR_V1 = Declaration("alignment.precursor", 1, {
    "apparatus": _APPARATUS_V1, "k": 4, "drives": [0.5, 0.7, 1.0], "fit_seeds": [0, 1, 2, 3, 4, 5],
    "held_seeds": [6, 7, 8, 9, 10, 11], "every": 5, "cap": 6000, "levels": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3],
    "window": 5, "precursor": "hidden_target", "max_error": 0.10,
    "statistic": "|predicted - actual| / actual ignition step (median over held-out runs)",
    "rules": {
        "dating an arrival: a precursor read while flat predicts the ignition step of held-out runs":
            "reproduced if the held-out median relative error is <= 10% and below the fit-median baseline's; "
            "partly if below that baseline's but > 10%"},
})

OCCUPATION_V1 = Declaration("alignment.occupation", 1, {
    "apparatus": "the gated-attention toy model of studies.alignment.occupation (no transformer)",
    "config": {"K": 3, "N": 8, "V": 8, "lr": 0.5, "wd": 0.0, "T": 1e-5, "share": 0.5, "budget": 3000,
               "init_sd": 0.01, "gate": 0.0, "beta": 4.0, "seeds": 5},
    "ws": [0, 3, 6, 9, 12, 15, 20, 25, 30, 50, 100, 1000, 10000, 30000], "margins": "0 .. 8 step 0.25",
    "amendments": ["the prediction rule first compared a median-based m_crit with the no-seed W* (25 vs 50); "
                   "both now use 'no seed ignites'"],
    "rules": {
        "occupation imposes a deadline (some W never ignites within the budget)":
            "reproduced if some scanned W has 0 seeds igniting within the budget",
        "the deadline is predicted from the occupation margin alone (W* = m^-1(D^-1(budget)))":
            "reproduced if predicted and measured W* are the same or adjacent grid points (or both absent)",
        "past the deadline, key side (QK) re-init restores ignition": "reproduced if >= n-1 of n >= 5 seeds ignite",
        "past the deadline, capability query side re-init does nothing": "reproduced if <= 1 of n >= 5 seeds ignite"},
})

ANNEAL_V1 = Declaration("alignment.anneal", 1, {
    "apparatus": {**_APPARATUS_V1, "optimizer": "plain SGD lr 0.2, clip 1, + LangevinNoise"}, "k": 2,
    "seeds": [0, 1, 2, 3, 4], "t_grid": [0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1], "melt_steps": 1000,
    "pin_steps": 1000, "hold": 500, "ramp": 1000, "anneal_steps": 2500, "form_cap": 3000,
    "amendments": ["pin arms none / circuit / control circuit also run at sqrt(lo * hi) of the melting interval "
                   "after the first result (no verdict uses them)"],
    "rules": {
        "melt: a formed circuit is destroyed above a temperature (melting point)":
            "reproduced if some grid T loses it in a majority of seeds, T=0 keeps it in >= n-1 and every higher T "
            "loses it in a majority; partly if only the first holds",
        "pin: a pinned circuit survives while the other parameters move":
            "reproduced if the circuit arm keeps it in >= n-1 seeds, the control arm loses it in >= n-1, pinned "
            "entries are bit-identical and free entries move >= 10x their T=0 displacement; partly if the circuit "
            "arm keeps it in more seeds than the control",
        "anneal: a flat capability ignites when T is lowered on schedule":
            "reproduced if >= n-1 annealed runs ignite, <= 1 constant-T runs ignite and none ignites before the "
            "ramp; partly if annealed ignitions exceed constant-T ones by >= 2"},
})

FDT_V1 = Declaration("alignment.fdt", 1, {
    "apparatus": {**_APPARATUS_V1, "optimizer": "plain SGD lr 0.2, clip 1"}, "k": 2, "seeds": [0, 1, 2, 3, 4],
    "steps": 4000, "wd": 0.03, "T": 1e-4, "spread_tol": 1.5, "min_coords": 200, "stationary_tol": 0.05,
    "groups": "param_family: embed, unembed, QK, OV, MLP (every parameter)",
    "rules": {
        "FDT: SGD's noise fails the fluctuation-dissipation test (equipartition at stationarity)":
            "every seed stationary (|O|/rhs <= 0.05) and >= n-1 seeds fails (hottest group's 95% bound beyond 1.5x "
            "the coldest's, groups >= 200 coordinates); not reproduced if >= n-1 passes",
        "FDT: installed Langevin noise (T = 0.0001) passes it":
            "every seed stationary (|O|/rhs <= 0.05) and >= n-1 seeds passes (hottest group's 95% bound beyond "
            "1.5x the coldest's, groups >= 200 coordinates); not reproduced if >= n-1 fails",
        "FDT: plain SGD obeys Yaida's relation <theta.g> = (lr/2)<|g|^2> at stationarity":
            "0 in the batch-means 95% interval of O in every seed"},
})

# ----------------------------------------------------------------------------- version 2 (unpinned)
_APPARATUS_V2 = {**_APPARATUS_V1, "model": "kpart_model(task, pinned=False): no prior, learned QK routing"}
CURE_SEEDS_V2 = 10
IGNITION_SEEDS_V2 = 8
POWER_TARGETS = {
    "cure": {"test": "one-sided Fisher exact, alpha 0.05", "p_arm": 1.0, "p_untreated": 0.5, "power": 0.8},
    "ignition": {"test": "at least one of n ignites", "p_below": 0.2, "power": 0.8},
}

PARTS_V2 = Declaration("alignment.parts", 2, {
    "apparatus": _APPARATUS_V2, "ks": [2, 3, 4], "seeds": [0, 1, 2, 3, 4],
    "base_cap": {"2": 4000, "3": 4000, "4": 8000},
    "not_run": "K = 5 (budget: the pinned K = 5 circuits took 9x the K = 4 training time); waiting times and the "
               "rate equation on the unpinned apparatus",
    "ablation": {"methods": ["mean", "zero", "resample"], "primary": "mean", "eval": "512 sequences, seed "
                 "EVAL_SEED + 1", "parts": "routing_parts: one distinct head per input, maximising the summed "
                 "query-row attention to the inputs on the evaluation batch", "random": "every non-part head",
                 "cells": "K x seed (value: mean retained over the K single-part ablations)"},
    "series": {"source": "results/alignment/part_ablation_series.csv (v1's table, mean ablation)",
               "cells": "checkpoint x part (one training run: the interval is over its ablations, not seeds)",
               "note": "the series' retained values were known (v1 table) when this rule was declared"},
    "pinned_control": "v1's pinned base jobs re-judged by the same credit rule (forced by construction there)",
    "credit_rule": {"split": 0.5, "level": 0.95, "function": "circuitfade.analysis.parts.credit_verdict"},
    "rules": {
        "no partial credit: one part ablated leaves little (credit rule)":
            "credit ratio c = retained / ((K-1)/K) per cell; reproduced if the distribution-free 95% interval of "
            "the median c lies below 0.5 (no partial credit), not reproduced if it lies above 0.5 (partial "
            "credit), inconclusive otherwise or with fewer than 6 cells",
        "a random non-part head leaves ~100%": "reproduced if the median retained is >= 95%; partly if >= 80%"},
})

CURE_PILOT_V2 = Declaration("alignment.cure-pilot", 2, {
    "apparatus": _APPARATUS_V2, "k": 3, "share": 0.5, "budget": 1500, "ws": [1000, 3000, 10000],
    "conditional_w": {"w": 30000, "only_if": "every seed ignites at W = 10000"},
    "seeds": [100, 101, 102, 103], "arms": ["none"],
    "choose_w": "the pilot W whose untreated fraction igniting within the budget is closest to 1/2 (ties: the "
                "smaller W); if every pilot W has 0/4 or 4/4, the geometric mean, rounded to 100 steps, of the "
                "largest W where all ignite and the smallest W where none does; if all ignite at every W, the "
                "confirmatory cure is not run (nothing to cure)",
    "val_loss": {"what": "cross-entropy on 512 fixed base sequences (seed EVAL_SEED + 7), every 25 steps of the "
                         "withholding (steps 0..W)", "floor": 1e-6,
                 "statistic": "R = total variation of log10 max(L, floor) / its net fall from step 0 to W "
                              "(1: monotone; R = 1 + 2 x total rise / net fall; inf if it does not fall)",
                 "smooth_if": 1.5},
    "rules": {
        "withheld capability: past a critical step it never ignites within the budget (declared grid)":
            "reproduced if some pilot W has 0 of its seeds igniting within the budget; not reproduced otherwise "
            "(the grid is not extended)",
        "validation loss falls smoothly through the withholding (no warning)":
            "R <= 1.5 counts as smooth; over every withheld run of v2 (pilot and confirmatory): reproduced if "
            ">= n-1 of n are smooth, not reproduced if more than half are not, partly otherwise"},
})

CURE_V2 = Declaration("alignment.cure", 2, {
    "apparatus": _APPARATUS_V2, "pilot": "alignment.cure-pilot v2 (its sha256 in pilot_sha256)",
    "pilot_sha256": CURE_PILOT_V2.sha256(), "k": 3, "share": 0.5, "budget": 1500,
    "w": 10000,  # fixed from the pilot by its choose_w rule, before the confirmatory runs
    "pilot_result": {"1000": "4/4", "3000": "4/4", "10000": "3/4"},
    "seeds": list(range(CURE_SEEDS_V2)), "power": "POWER_TARGETS['cure']",
    "arms": {"none": "continue unchanged from the checkpoint at W", "qk": "W_Q, b_Q, W_K, b_K of every head "
             "re-drawn from the model's initialisation", "ov": "W_V, b_V, W_O of every head re-drawn"},
    "optimizer": "state kept (as v1)", "same_w": "every arm starts from the same checkpoint and data stream",
    "pinned_control": "v1's pinned arms at W = 10000 (untreated 2/6) and 30000 (0/6) re-judged by these rules",
    "rules": {
        "cure: re-initialising the QK slices restores learnability (vs untreated at the same W)":
            "reproduced if one-sided Fisher exact p(QK > untreated) < 0.05; not reproduced if the QK rate is not "
            "above the untreated rate; inconclusive otherwise; not testable if the untreated arm is at 0/n or n/n",
        "cure: re-initialising the value slices does nothing (vs untreated at the same W)":
            "not reproduced if either one-sided Fisher exact test (value > untreated, value < untreated) has "
            "p < 0.05; reproduced if neither has and the rates differ by at most 0.2; inconclusive otherwise; not "
            "testable if the untreated arm is at 0/n or n/n"},
})

FDT_V2 = Declaration("alignment.fdt", 2, {
    "apparatus": {**_APPARATUS_V2, "optimizer": "plain SGD lr 0.2, clip 1"}, "k": 2, "seeds": [0, 1, 2],
    "budget_note": "3 seeds, not v1's 5: the compute budget of this version (about 60 core-minutes in all)",
    "steps": 4000, "wd": 0.03, "T": 1e-4, "spread_tol": 1.5, "min_coords": 200, "stationary_tol": 0.05,
    "groups": "param_family (embed, unembed, QK, OV, MLP) without the parameters whose gradient is zero by "
              "construction: b_K (softmax is invariant to a shift shared by every key of a query row); on the "
              "pinned control also W_Q, b_Q, W_K (the pinned query row gets gradient <= exp(-30))",
    "pinned_control": "v1's pinned jobs re-judged without QK (from their per-group statistics)",
    "yaida": "reported as a check, not a claim: for plain SGD O telescopes to the change of |theta|^2, so under "
             "the stationarity filter it cannot fail",
    "rules": {
        "FDT: SGD's noise fails the fluctuation-dissipation test (equipartition at stationarity)":
            "every seed stationary (|O|/rhs <= 0.05) and >= n-1 seeds fails (hottest group's 95% bound beyond 1.5x "
            "the coldest's, groups >= 200 coordinates, zero-gradient parameters excluded); not reproduced if "
            ">= n-1 passes; not testable if a seed is not stationary",
        "FDT: installed Langevin noise (T = 0.0001) passes it":
            "every seed stationary (|O|/rhs <= 0.05) and >= n-1 seeds passes (hottest group's 95% bound below "
            "1.5x the coldest's, zero-gradient parameters excluded); not reproduced if >= n-1 fails; not "
            "testable if a seed is not stationary"},
})

PRECURSOR_V2 = Declaration("alignment.precursor", 2, {
    "apparatus": _APPARATUS_V2, "k": 3, "drives": [0.5, 1.0], "fit_seeds": [0, 1, 2, 3],
    "held_seeds": [4, 5, 6, 7], "every": 5, "cap": 6000, "levels": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3],
    "window": 5, "precursor": "hidden_target (as v1; not re-selected)",
    "k_note": "K = 3 (v1: K = 4), two drives and 4 + 4 seeds (v1: three drives, 6 + 6) to fit the compute "
              "budget: unpinned K = 4 took ~1500 steps to ignite",
    "statistic": "|predicted - actual| / (actual - t_c): the error relative to the time still to go when the "
                 "date is given (t_c: the precursor's crossing step), median over held-out runs with a "
                 "bootstrap 95% interval; the fit-median baseline scored the same way",
    "pinned_control": "v1's pinned runs re-scored with this statistic (their values were known: the audit "
                      "computed ~10%)",
    "rules": {
        "dating an arrival: error relative to the time still to go (held-out runs)":
            "reproduced if the 95% interval of the held-out median |pred - actual| / (actual - t_c) lies below "
            "0.10 and the median is below the fit-median baseline's (same denominator); not reproduced if the "
            "median is at or above that baseline's; partly otherwise"},
})

IGNITION_V2 = Declaration("alignment.ignition", 2, {
    "apparatus": {**_APPARATUS_V1, "model": "kpart_model(task) (pinned: where the threshold was measured)"},
    "k": 3, "switch": 1000, "budget": 3000, "measured_threshold": [0.1, 0.2],
    "shares": [0.1, 0.2], "seeds": list(range(5, 5 + IGNITION_SEEDS_V2)),
    "arms_from": "our measured threshold bracket (0.1, 0.2] (v1 scan, seeds 0-4), not the study's counts; fresh "
                 "seeds 5-12 (v1 ran seeds 0-4 at these shares: they located the bracket and are not reused)",
    "not_run": "shares inside the bracket (0.125 - 0.175) and the dose-response on the unpinned apparatus (its "
               "threshold is unmeasured): budget",
    "rules": {
        "ignition: below the measured threshold it never ignites (share 0.1)":
            "reproduced if none of the n runs ignites within the budget; not reproduced if two or more do; "
            "partly if exactly one",
        "ignition: above the measured threshold a flat capability ignites (share 0.2)":
            "reproduced if >= n-1 of n runs ignite within the budget; partly if more than half; not reproduced "
            "otherwise"},
})

# ----------------------------------------------------------------------------- version 3 (after the v2 results)
AFTER_V2 = ("declared after the version-2 results were known: an audit found that the v2 credit verdict never "
            "checked that the parts it ablated had been identified, and that the v2 cure rule could not say "
            "'reproduced' where the published pattern would appear; version 2 stays as it ran")
IDENTIFY_MARGIN = 0.1
MIN_IDENTIFIED = 6

PARTS_V3 = Declaration("alignment.parts", 3, {
    "declared": AFTER_V2,
    "jobs": "no new runs: alignment.parts v2's unpinned jobs, v1's pinned jobs and the developing series, re-judged",
    "identification": {
        "control": "per cell, a positive control before any part-level verdict: every identified part, ablated "
                   "alone, leaves at least 0.1 less of the capability (retained) than every non-part head ablated "
                   "alone (mean ablation on 512 sequences: 0.1 is about three standard errors of a retained "
                   "fraction); a cell without a non-part head ablation is not identified",
        "margin": IDENTIFY_MARGIN, "min_cells": MIN_IDENTIFIED,
        "selection": "the control compares parts with non-part heads, not with (K-1)/K: an additive circuit "
                     "(parts leave (K-1)/K, non-parts 1) passes it and is judged partial credit"},
    "forced": "on the pinned apparatus every part is the only route for its input and the spare heads read a "
              "distractor, so both outcomes hold in any model: reported as 'forced by the apparatus'",
    "rules": {
        "no partial credit, parts identified first: one part ablated leaves little":
            "only cells whose parts pass the identification control; credit ratio c = retained / ((K-1)/K) per "
            "cell; reproduced if the distribution-free 95% interval of the median c lies below 0.5, not "
            "reproduced if it lies above 0.5, inconclusive otherwise; not testable (parts not identified) if "
            "fewer than 6 cells pass the control",
        "a random non-part head leaves ~100%, parts identified first":
            "the non-part heads of the cells that pass the identification control; reproduced if their median "
            "retained is >= 95%, partly if >= 80%, not reproduced otherwise; not testable (parts not identified) "
            "if fewer than 6 cells pass the control"},
})

_QK3 = "cure: re-initialising the QK slices restores learnability (vs untreated at the same W)"
_OV3 = "cure: re-initialising the value slices does nothing (vs untreated at the same W)"
CURE_V3 = Declaration("alignment.cure", 3, {
    "declared": AFTER_V2,
    "jobs": "no new runs: alignment.cure v2's confirmatory arms (unpinned, W = 10000) and v1's pinned arms "
            "(W = 10000, 30000), re-judged",
    "changed": "v2 said 'not testable' whenever the untreated arm was at 0/n or n/n, so the published pattern "
               "(untreated 0/6, QK 6/6, value 0/6) could never be reproduced; now only an untreated arm at n/n "
               "(nothing withheld to restore) is not testable, and the value row is judged only where the QK "
               "row shows that a cure is possible at that W (its positive control)",
    "forced": "on the pinned apparatus the parts' query-key weights cannot move their attention: the QK row is "
              "forced by the apparatus there",
    "rules": {
        _QK3: "reproduced if one-sided Fisher exact p(QK > untreated) < 0.05; not reproduced if the QK rate is not "
              "above the untreated rate; inconclusive otherwise; not testable if the untreated arm is at n/n",
        _OV3: "judged only where the QK row is reproduced: not reproduced if either one-sided Fisher exact test "
              "(value > untreated, value < untreated) has p < 0.05, reproduced if neither has and the rates "
              "differ by at most 0.2, inconclusive otherwise; not testable if the untreated arm is at n/n or the "
              "QK row is not reproduced (no arm shows a cure is possible)"},
})

FORCED_V3 = Declaration("alignment.forced", 3, {
    "declared": "after the version-1 and version-2 results: a relabelling of outcomes, not a new rule",
    "outcome": "forced by the apparatus",
    "meaning": "the rule's outcome holds in any model of the apparatus (or of the arm), so it tests nothing; the "
               "row keeps the rule's own word in its 'ours' column",
    "rows": {
        "parts v1 and v2, pinned: no partial credit, and a random non-part head leaves ~100%":
            "every part is the only route for its input on a shortcut-free task and the spare heads read a "
            "distractor",
        "cure v1, pinned: the QK cure": "the pin fixes the parts' attention: their query-key slices are inert",
        "cure v1, pinned: the OV cure does nothing, when every arm is at 0/n":
            "nothing restores ignition at that W, so 'does nothing' cannot fail",
        "ignition v1: below the floor it never ignites (share 0.005)":
            "the share lies 20-40x under the measured threshold bracket (0.1, 0.2]",
        "fdt v1: Yaida's relation": "for plain SGD it telescopes to the change of |theta|^2, so under the "
                                    "stationarity filter it cannot fail"},
    "rules": {},
})

DECLARATIONS: dict[tuple[str, int], Declaration] = {
    (d.name.split(".", 1)[1], d.version): d
    for d in (PARTS_V1, CURE_V1, IGNITION_V1, PRECURSOR_V1, OCCUPATION_V1, ANNEAL_V1, FDT_V1,
              PARTS_V2, CURE_PILOT_V2, CURE_V2, FDT_V2, PRECURSOR_V2, IGNITION_V2, PARTS_V3, CURE_V3, FORCED_V3)
}
"""``(experiment, version) -> Declaration``."""

APPARATUS_OF = {1: "pinned", 2: "unpinned", 3: "unpinned (pinned rows labelled)"}


def declared(name: str, version: int) -> Declaration:
    """The declaration of experiment ``name`` (``"parts"``, ``"cure"``, ..) at ``version``."""
    try:
        return DECLARATIONS[(name, int(version))]
    except KeyError:
        raise ValueError(f"no declaration {name!r} v{version}; declared: {sorted(DECLARATIONS)}") from None


def stamp(name: str, version: int) -> str:
    """``"alignment.<name> v<version> (sha256 <12 hex>)"``, recorded in result files."""
    return declared(name, version).stamp()


def rules_of(name: str, version: int) -> Mapping[str, str]:
    """The declared rules of an experiment version: ``{claim: rule}``."""
    return declared(name, version).data["rules"]


VERDICT_COLUMNS = ("claim", "ours", "study", "rule", "apparatus", "protocol", "verdict")
"""Columns of every verdict table of the study (``verdicts.csv``)."""


def verdict_frame(verdicts: Sequence[Verdict], name: str, version: int, apparatus: str | Sequence[str]) -> pd.DataFrame:
    """:func:`~circuitfade.claims.verdict_table` of ``verdicts`` with the ``apparatus`` (one for all, or one
    per verdict) and the ``protocol`` stamp of declaration ``name`` v``version`` (:data:`VERDICT_COLUMNS`)."""
    n = len(verdicts)
    app = [apparatus] * n if isinstance(apparatus, str) else list(apparatus)
    if len(app) != n:
        raise ValueError(f"verdict_frame: {len(app)} apparatus labels for {n} verdicts")
    return verdict_table(verdicts, extra={"apparatus": app, "protocol": [stamp(name, version)] * n})


def forced(frame: pd.DataFrame, reasons: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` (a verdict table) with every row whose claim is in ``reasons`` relabelled "forced by the
    apparatus" (:data:`FORCED_V3`): the rule's own word moves into ``ours`` with the reason; rows not run
    (or already relabelled) are kept."""
    out = frame.copy()
    word = str(Outcome.FORCED)
    for i in range(len(out)):
        claim, verdict = out["claim"].iloc[i], str(out["verdict"].iloc[i])
        if claim not in reasons or verdict.startswith((word, str(Outcome.NOT_RUN))):
            continue
        out.iloc[i, out.columns.get_loc("ours")] = (f"{out['ours'].iloc[i]}; the rule's own word: {verdict}; "
                                                     f"forced: {reasons[claim]} ({FORCED_V3.stamp()})")
        out.iloc[i, out.columns.get_loc("verdict")] = word
    return out


_V1_FORCED = {
    "parts": {"no partial credit: one part ablated leaves little":
              "parts v1 and v2, pinned: no partial credit, and a random non-part head leaves ~100%",
              "a random non-part head leaves ~100%":
              "parts v1 and v2, pinned: no partial credit, and a random non-part head leaves ~100%"},
    "cure": {"cure: re-initialising only the QK slices of the parts restores learnability":
             "cure v1, pinned: the QK cure"},
    "ignition": {"ignition on schedule: below the floor it never ignites (share 0.005; below the predicted budget "
                 "threshold, the rate-zero floor is ~0)": "ignition v1: below the floor it never ignites (share 0.005)"},
    "fdt": {"FDT: plain SGD obeys Yaida's relation <theta.g> = (lr/2)<|g|^2> at stationarity": "fdt v1: Yaida's relation"},
}
_OV_ALL_ZERO = ("cure: re-initialising only the OV slices does nothing",
                "cure v1, pinned: the OV cure does nothing, when every arm is at 0/n")


def forced_v1(frame: pd.DataFrame, experiment: str, *, every_arm_zero: bool = False) -> pd.DataFrame:
    """A version-1 verdict table of ``experiment`` with the rows :data:`FORCED_V3` names relabelled
    (:func:`forced`); ``every_arm_zero``: the cure's arms all at 0/n, so its OV row is forced too."""
    rows = FORCED_V3.data["rows"]
    reasons = {claim: rows[key] for claim, key in _V1_FORCED.get(experiment, {}).items()}
    if experiment == "cure" and every_arm_zero:
        reasons[_OV_ALL_ZERO[0]] = rows[_OV_ALL_ZERO[1]]
    return forced(frame, reasons)


def provenance_of(protocol: str, apparatus: str) -> Provenance:
    """When the rule of a verdict row was fixed relative to the results it grades, from the row's declaration
    stamp and apparatus: version 1 was written down as it ran, with amendments after results (restated);
    version 2 before its runs, except its rows that re-judge version-1 runs or the developing series (their
    values were known); version 3 after the version-2 results."""
    version = int(str(protocol).split(" (sha256")[0].rsplit(" v", 1)[1])
    if version == 1:
        return Provenance.RESTATED
    if version == 2 and not any(x in apparatus for x in ("v1 runs", "control", "developing series")):
        return Provenance.DECLARED_BEFORE
    return Provenance.DECLARED_AFTER


def with_provenance(frame: pd.DataFrame) -> pd.DataFrame:
    """A study verdict table (:data:`VERDICT_COLUMNS`) with a ``provenance`` column after ``verdict``
    (:func:`provenance_of` per row)."""
    out = frame.copy()
    out["provenance"] = [str(provenance_of(p, a)) for p, a in zip(out["protocol"], out["apparatus"])]
    return out


def stamped(frame: pd.DataFrame, name: str, version: int, apparatus: str) -> pd.DataFrame:
    """A verdict frame (``claim, ours, study, rule, verdict``) with the ``apparatus`` and ``protocol`` columns
    added where missing, in :data:`VERDICT_COLUMNS` order; the verdict column as words."""
    out = frame.copy()
    if "apparatus" not in out:
        out["apparatus"] = apparatus
    if "protocol" not in out:
        out["protocol"] = stamp(name, version)
    out["verdict"] = [str(v) for v in out["verdict"]]
    return out[list(VERDICT_COLUMNS)]
