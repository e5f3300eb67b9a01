"""Every verdict rule can fail: planted data on which it must say "not reproduced", and data on
which it must say "reproduced", for each rule of the paper, history and removability studies.

The planted tables are keyed by the studies' rule registries and the tests check the keys are
the same, so a rule added without planted cases fails here. The same file checks the declared
protocols: the committed results record the hash of the declaration they name, the code's
grids and settings are the declared ones, and one comparison has one interval everywhere.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict

import pandas as pd
import pytest

from circuitfade.claims import Declaration, Outcome, grade
from studies.history import declaration as HD
from studies.history import study as history
from studies.paper import protocol as P
from studies.paper import rules as PR
from studies.removability import declaration as RD
from studies.removability import map as R
from repo_root import REPO

S = [0, 1, 2]


def acc(*values, seeds=S) -> P.Measure:
    return P.Measure.of(list(values), seeds=seeds)


def mse(*values, seeds=S) -> P.Measure:
    return P.Measure.of(list(values), seeds=seeds, proportion=False)


FADE = acc(0.75, 0.78, 0.80)
FZ_LOW = acc(0.10, 0.12, 0.09)

# rule key -> (arguments on which it must reproduce, arguments on which it must not)
PAPER_PLANTED = {
    "unforced_collapses": ((acc(0.10, 0.11, 0.12), acc(0.95, 0.96, 0.97)),
                           (acc(0.50, 0.52, 0.51), acc(0.60, 0.62, 0.61))),  # no collapse: zero − normal ≈ −.1
    "forced_zero_fails": ((FZ_LOW, FADE), (acc(0.70, 0.73, 0.75), FADE)),  # forced_zero learns: within .05
    "fade_keeps": ((FADE, FZ_LOW), (acc(0.30, 0.32, 0.31), FZ_LOW)),  # the fade at chance
    "switch_falls_short": ((acc(0.30, 0.32, 0.28), FADE), (acc(0.76, 0.79, 0.81), FADE)),  # switch = fade + .01
    "posthoc_falls_short": ((acc(0.20, 0.25, 0.22), FADE), (acc(0.76, 0.79, 0.81), FADE)),  # posthoc = fade + .01
    "fade_window": (([acc(0.75, 0.76, 0.77)] * 5, FZ_LOW),
                    ([acc(0.75, 0.76, 0.77)] * 4 + [acc(0.30, 0.31, 0.32)], FZ_LOW)),  # one start fails
    "shapes": (([FADE, FADE, FADE], acc(0.20, 0.21, 0.22)),
               ([FADE, acc(0.30, 0.31, 0.32), FADE], acc(0.20, 0.21, 0.22))),  # a smooth shape fails
    "markov": (([(acc(0.80, 0.81, 0.82), acc(0.20, 0.21, 0.22), acc(0.20, 0.21, 0.22))] * 3,),
               ([(acc(0.40, 0.41, 0.42), acc(0.35, 0.36, 0.37), acc(0.39, 0.40, 0.41))] * 3,)),  # fade − unforced ≈ .05
    "linreg": ((mse(0.60, 0.62, 0.61), mse(0.070, 0.072, 0.071), mse(0.065, 0.066, 0.064), mse(0.060, 0.061, 0.062)),
               (mse(0.60, 0.62, 0.61), mse(0.50, 0.52, 0.51), mse(0.065, 0.066, 0.064), mse(0.060, 0.061, 0.062))),
    "consolidation": (([(5, 5), (5, 5), (5, 5)],), ([(0, 5), (0, 5), (0, 5)],)),  # every crossing before g=0
}


def test_every_paper_rule_has_planted_cases():
    assert set(PAPER_PLANTED) == set(PR.RULES) == set(PR.DECLARATION.data["claims"])


@pytest.mark.parametrize("key", sorted(PAPER_PLANTED))
@pytest.mark.parametrize("version", sorted(PR.DECLARATIONS))
def test_paper_rule_can_fail_and_can_hold(key, version):
    good, bad = PAPER_PLANTED[key]
    decl = PR.declaration(version)
    assert grade(*PR.RULES[key](*good, decl=decl)) is Outcome.REPRODUCED
    assert grade(*PR.RULES[key](*bad, decl=decl)) is Outcome.NOT_REPRODUCED


def test_paper_difference_interval_paired_welch_or_normal():
    """v2: paired t where the two arms have the same seeds, Welch otherwise, normal only between two
    one-seed arms (each with its 512-example evaluation error); v1: always normal."""
    fade = acc(391 / 512, 390 / 512, 421 / 512)  # the committed fade600->0 seeds 0-2
    fz = acc(389 / 512, 361 / 512, 369 / 512)  # the committed forced_zero seeds 0-2
    d2, d1 = PR.diff(fade, fz, decl=PR.declaration(2)), PR.diff(fade, fz, decl=PR.declaration(1))
    assert d2.method == "paired t" and d2.df == 2 and str(d2) == "+0.054 [-0.067, +0.175]"
    assert d1.method == "normal" and str(d1) == "+0.054 [+0.004, +0.104]"  # the interval v1 quoted
    other = acc(391 / 512, 390 / 512, 421 / 512, seeds=[0, 1, 3])
    assert PR.diff(other, fz).method == "Welch t"
    one = PR.diff(acc(0.8, seeds=[0]), acc(0.5, seeds=[0]))
    assert one.method == "normal" and one.hi - one.lo == pytest.approx(
        2 * 1.959964 * math.hypot(math.sqrt(0.8 * 0.2 / 512), math.sqrt(0.25 / 512)), rel=1e-5)
    mixed = PR.diff(fade, acc(0.9, seeds=[0]))  # 3 seeds vs one seed's evaluation error: Satterthwaite
    assert mixed.method == "Welch t" and 2 < mixed.df < 10
    assert math.isnan(PR.diff(mse(0.5, seeds=[0]), mse(0.4, seeds=[0])).lo)  # one-seed MSE: no error, undecided


def test_paper_verdicts_differ_between_versions_on_planted_runs():
    """A claim decided under v1's normal interval and undecided under v2's paired t: fade − forced_zero
    ≥ .03 on 3 seeds whose margins vary (the fade keeps .60 either way)."""
    fade, fz = acc(0.80, 0.78, 0.88), acc(0.72, 0.72, 0.68)  # margins .08, .06, .20
    c = dict(PR.DECLARATION.data["claims"]["fade_keeps"], diff_min=0.03)
    v1 = Declaration("paper", 1, {**PR.declaration(1).data, "claims": {"fade_keeps": c}})
    v2 = Declaration("paper", 2, {**PR.declaration(2).data, "claims": {"fade_keeps": c}})
    assert grade(*PR.fade_keeps(fade, fz, v1)) is Outcome.REPRODUCED
    assert grade(*PR.fade_keeps(fade, fz, v2)) is Outcome.PARTLY


# ------------------------------------------------------------------------------ history
def q(mean, lo=None, hi=None, n=5):
    return {"mean": mean, "lo": mean if lo is None else lo, "hi": mean if hi is None else hi, "n": n}


HISTORY_PLANTED = {
    "gap_sign": ((q(0.10, 0.05, 0.15),), (q(-0.22, -0.27, -0.16),)),  # the opposite sign fails
    "gap_reverses": ((q(-0.03, -0.05, -0.01), q(0.10)), (q(0.05, 0.02, 0.08), q(0.10))),
    "gap_vanishes": ((q(0.001, -0.01, 0.012), q(0.10)), (q(0.08, 0.06, 0.10), q(0.10))),
    "heads_carry_gap": ((q(0.87, 0.80, 0.93),), (q(0.10, -0.10, 0.30),)),
    "patch_maps_agree": ((q(0.9995, 0.999, 1.0),), (q(0.90, 0.85, 0.95),)),
    "same_dominant_head": ((q(1.0),), (q(0.4),)),
}


def test_every_history_rule_has_planted_cases():
    assert set(HISTORY_PLANTED) == set(HD.RULES) == set(HD.DECLARATION.data["claims"])


@pytest.mark.parametrize("key", sorted(HISTORY_PLANTED))
def test_history_rule_can_fail_and_can_hold(key):
    good, bad = HISTORY_PLANTED[key]
    assert grade(*HD.RULES[key](*good)) is Outcome.REPRODUCED
    assert grade(*HD.RULES[key](*bad)) is Outcome.NOT_REPRODUCED


def test_history_reversal_needs_an_immediate_gap():
    assert HD.gap_reverses(q(-0.03, -0.05, -0.01), q(0.0)) == (False, False)


def _summary(**quantities) -> pd.DataFrame:
    return pd.DataFrame([{"quantity": k, "label": k, "mean": v["mean"], "ci_lo": v["lo"], "ci_hi": v["hi"], "n": v["n"],
                          "n_positive": 0, "p_signflip": 1.0, "study": ""} for k, v in quantities.items()])


def test_history_verdicts_from_a_planted_summary():
    s = _summary(gap_r0=q(-0.22, -0.27, -0.16), gap_r25=q(0.03, -0.02, 0.08), same_dominant_head=q(1.0),
                 patch_corr=q(0.9995, 0.999, 1.0))
    v = {x.claim.name: x for x in history.verdicts(s)}
    names = {k: c.name for k, c in HD.claims().items()}
    assert v[names["gap_sign"]].outcome is Outcome.NOT_REPRODUCED
    assert v[names["gap_reverses"]].outcome is Outcome.PARTLY and v[names["gap_reverses"]].note
    assert v[names["gap_vanishes"]].outcome is Outcome.NOT_RUN and v[names["heads_carry_gap"]].outcome is Outcome.NOT_RUN
    assert v[names["same_dominant_head"]].outcome is Outcome.REPRODUCED
    lines = history.verdict_sections(list(v.values()))
    assert lines.index("What reproduced:") < lines.index("What did not reproduce:")
    did_not = lines[lines.index("What did not reproduce:"):]
    assert any(names["gap_sign"] in x for x in did_not)


# ------------------------------------------------------------------------------ removability
@pytest.mark.parametrize("margins, earlier, cls", [
    ([-0.3, -0.25, -0.4], [False] * 3, "forced_zero better"),
    ([0.05, 0.0, 0.02], [False, False, True], "no difference"),
    ([0.05, 0.0, 0.02], [True, True, False], "prior only speeds learning"),
    ([0.3, 0.1, 0.05], [True] * 3, "mixed"),
    ([0.4], [True], "too few seeds"),
])
def test_classify_fails_the_papers_claim_on_planted_margins(margins, earlier, cls):
    """"path decides removability" is the paper's claim: every other class is a failing outcome."""
    assert R.classify(margins, earlier) == cls != "path decides removability"


def test_classify_reproduces_on_planted_margins_and_rejects_nan():
    assert R.classify([0.3, 0.25, 0.2], [True] * 3) == "path decides removability"
    with pytest.raises(ValueError, match="margins must be finite"):
        R.classify([0.3, math.nan, 0.25], [True] * 3)


# ------------------------------------------------------------------------------ declarations
REGISTRIES = {"paper": PR.DECLARATIONS, "removability-map": RD.DECLARATIONS, "history": HD.DECLARATIONS}
COMMITTED = ["results/paper/results.md", "results/paper/large/results.md", "results/removability/results.md",
             "results/history/results.md"]
STAMP = re.compile(r"Declaration: (\S+) v(\d+) \(sha256 ([0-9a-f]{12})\)")


@pytest.mark.parametrize("path", COMMITTED)
def test_committed_results_record_the_hash_of_their_declaration(path):
    """A results file names its declaration and version; that version's data must hash as recorded. Editing a
    declaration after results exist therefore fails here: declare a new version instead."""
    found = STAMP.findall((REPO / path).read_text())
    assert found, f"{path}: no 'Declaration: NAME vN (sha256 ...)' line"
    for name, version, digest in found:
        decl = REGISTRIES[name][int(version)]
        assert (decl.name, decl.version) == (name, int(version))
        assert decl.sha256()[:12] == digest, f"{path}: {name} v{version} changed after its results; declare v{int(version) + 1}"


def test_declarations_are_versioned_data():
    for registry in REGISTRIES.values():
        assert all(d.version == k for k, d in registry.items())
        assert len({d.name for d in registry.values()}) == 1
        json.dumps(max(registry.values(), key=lambda d: d.version).payload())  # plain data
    assert PR.DECLARATION is PR.DECLARATIONS[max(PR.DECLARATIONS)] and RD.DECLARATION is RD.DECLARATIONS[2]
    assert set(PR.PROVENANCE) == set(PR.DECLARATIONS) and set(RD.PROVENANCE) == set(RD.DECLARATIONS)
    edited = Declaration("paper", 2, {**PR.DECLARATION.data, "plateau_acc": 0.31})
    assert edited.sha256() != PR.DECLARATION.sha256()  # any edit shows in the hash
    with pytest.raises(ValueError, match="does not exist"):
        PR.declaration(9)


def test_paper_arms_are_the_declared_ones():
    from studies.paper.reproduce import EXPERIMENTS, LARGE_ROWS

    for name, e in EXPERIMENTS.items():
        cfgs = e.configs(S, "r", P.FULL, 1) if name in LARGE_ROWS else e.configs(S, "r", P.FULL)
        assert {PR.arm_label(c) for c in cfgs} == set(PR.DECLARATION.data["experiments"][name]["arms"]), name
    assert set(EXPERIMENTS) == set(PR.DECLARATION.data["experiments"])
    assert P.PLATEAU_ACC == PR.DECLARATION.data["plateau_acc"]
    assert (P.FULL.steps, P.FULL.eval_size) == (PR.DECLARATION.data["budget"]["steps"],
                                                PR.DECLARATION.data["budget"]["eval_size"])


def test_removability_grid_and_rules_are_the_declared_ones():
    d = RD.DECLARATION.data
    ns = R.build_parser().parse_args([])
    assert (ns.seeds, ns.unforced_seeds, ns.steps) == (d["seeds"], d["unforced_seeds"], d["steps"])
    assert (R.PLATEAU_ACC, R.THRESHOLD, R.DECIDES_MARGIN) == (d["rules"]["plateau_acc"], d["rules"]["threshold"],
                                                              d["rules"]["decides_margin"])
    assert R.MODELS == d["models"] and R.TASKS == d["tasks"] and list(R.GRID_TASKS) == d["grid_tasks"]


def test_history_settings_are_the_declared_ones():
    assert json.loads(json.dumps(asdict(history.HistoryConfig()))) == HD.DECLARATION.data["config"]
    assert history.departures(history.HistoryConfig(), 5) == []
    assert history.departures(history.HistoryConfig(delta=0.2), 3) == ["delta 0.2 vs declared 0.3",
                                                                       "3 seeds vs declared 5"]


def test_fade_minus_forced_zero_has_one_interval_everywhere():
    """Base model, 3 seeds: the paper's verdict table and the removability map quote the same interval."""
    cells = pd.read_csv(REPO / "results/removability/map_cells.csv")
    c = cells[(cells.model == "L2 d64") & (cells.task == "recall (default)") & (cells.steps == 3600)].iloc[0]
    interval = f"{c.margin_mean:+.3f} [{c.margin_lo:+.3f}, {c.margin_hi:+.3f}]"
    mirrored = f"{-c.margin_mean:+.3f} [{-c.margin_hi:+.3f}, {-c.margin_lo:+.3f}]"
    assert interval == "+0.054 [-0.067, +0.175]"
    assert f"| {interval} |" in (REPO / "results/removability/results.md").read_text()
    for path in ("results/paper/results.md", "results/paper/large/results.md"):
        text = (REPO / path).read_text()
        assert f"; {interval} (paired t)" in text and f"; {mirrored} (paired t)" in text, path
        assert "+0.054 [+0.004, +0.104] |" not in text.split("## Verdicts under every declaration version")[0]
