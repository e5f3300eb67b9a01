"""Every verdict rule of the alignment study can fail: for each rule declared in
``studies.alignment.protocol`` (both versions) a planted input on which it must say "not reproduced"
and one on which it must say "reproduced". A rule without a case here fails the coverage test."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from studies.alignment import anneal, cure, fdt, ignition, occupation, precursor, unpinned, withheld
from studies.alignment import parts as P
from studies.alignment.protocol import DECLARATIONS, VERDICT_COLUMNS, rules_of
from repo_root import REPO


def _word(table: pd.DataFrame, claim: str) -> str:
    row = table[table.claim == claim]
    assert len(row) >= 1, (claim, list(table.claim))
    return str(row.verdict.iloc[0])


# ------------------------------------------------------------------ version 1 planted inputs
_POOL = {"n_discriminating": 20, "n_below": 20, "p_sign": 2 ** -20, "median": 0.01, "median_lo": 0.0,
         "median_hi": 0.02}


def _parts(good: bool):
    if good:
        return P.verdicts({"ratio": (1.3, 1.1, 1.5), "pooled": _POOL, "random_median": 1.0, "rate_error": 0.2,
                           "rate_n": 4})
    return P.verdicts({"ratio": (3.0, 2.5, 3.5), "pooled": {**_POOL, "n_below": 10, "p_sign": 0.6, "median": 0.6},
                       "random_median": 0.5, "rate_error": 0.9, "rate_n": 4})


def _cure(good: bool):
    if good:
        return cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, 1000)
    no_critical = cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, None)  # every scanned W had an igniting seed
    return pd.concat([no_critical.iloc[:1], cure.cure_verdicts({"qk": (2, 6), "ov": (5, 6)}, 1000).iloc[1:]])


def _ignition(good: bool):
    kw = dict(above=(10, 10), below=(0, 12), delay=(258.0, 200.0, 300.0), predicted_delay=258.0, flat=True,
              p_budget=0.043, p_floor=1e-10, bracket=(0.02, 0.05), long=(0, 5))
    if not good:
        kw.update(above=(5, 10), below=(4, 12), delay=(1200.0, 900.0, 1500.0), bracket=(0.2, 0.5), long=(3, 5))
    return ignition.ignition_verdicts(**kw)


def _precursor(good: bool):
    return precursor.precursor_verdicts((0.05, 0.04, 0.06), 0.4, 0.3, 18) if good else \
        precursor.precursor_verdicts((0.5, 0.4, 0.6), 0.4, 0.3, 18)


def _occupation(good: bool):
    ws = [0, 5, 9, 20]
    if good:
        return occupation.occupation_verdicts({"w_star": 9, "m_crit": 2.0}, 9, {"key side (QK) re-init": (5, 5),
                                              "capability query side re-init": (1, 5)}, ws)
    bad = occupation.occupation_verdicts({"w_star": 0, "m_crit": 0.5}, 20, {"key side (QK) re-init": (3, 5),
                                         "capability query side re-init": (3, 5)}, ws)
    none = occupation.occupation_verdicts({"w_star": 9, "m_crit": 0.5}, None, {}, ws)
    return pd.concat([none.iloc[:1], bad.iloc[1:]], ignore_index=True)


def _melt(lost: dict) -> pd.DataFrame:
    return pd.DataFrame([{"seed": s, "T": t, "lost": bool(x)} for t, xs in lost.items() for s, x in enumerate(xs)])


def _pin(kc, kk, n=5):
    return pd.DataFrame([{"arm": arm, "seed": s, "lost": s >= kept, "pinned_max_change": 0.0, "free_disp": 0.5,
                          "free_disp_t0": 0.001} for arm, kept in (("circuit", kc), ("control circuit", kk))
                         for s in range(n)])


def _anneal(good: bool):
    h, nan = anneal.HOLD, np.nan
    if good:
        melt = _melt({0.0: [0] * 5, 1e-2: [1] * 5})
        ann = [h + 10, h + 50, h + 300, h + 400, nan], [nan] * 5
        pin = _pin(5, 0)
    else:
        melt = _melt({0.0: [0] * 5, 1e-2: [1, 1, 0, 0, 0]})
        ann = [h + 10, nan, nan, nan, nan], [nan] * 5
        pin = _pin(2, 2)
    rows = [{"arm": arm, "seed": i, "ignition": x} for arm, xs in zip(("anneal", "constant"), ann)
            for i, x in enumerate(xs)]
    return anneal.verdicts(melt, pin, pd.DataFrame(rows))


def _fdt_run(arm, thermal, yaida="consistent"):
    return {"arm": arm, "status": "done", "thermal": thermal, "stationary": True, "spread": 3.0,
            "spread_without_qk": 2.0, "yaida": {"verdict": yaida, "relative": 0.01}}


def _fdt(good: bool):
    if good:
        runs = [_fdt_run("sgd", "fails") for _ in range(5)] + [_fdt_run("langevin", "passes") for _ in range(5)]
    else:
        runs = [_fdt_run("sgd", "passes", "violated") for _ in range(5)] + [_fdt_run("langevin", "fails")
                                                                             for _ in range(5)]
    return fdt.fdt_verdicts(runs)


# ------------------------------------------------------------------ version 2 planted inputs
def _abl(retained_by_cell: list[float], random: float) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(retained_by_cell):
        k = 2 + i % 3
        rows += [{"kind": "part", "k": k, "seed": i, "retained": r * (k - 1) / k, "partial_credit": (k - 1) / k}]
        rows += [{"kind": "random", "k": k, "seed": i, "retained": random, "partial_credit": (k - 1) / k}]
    return pd.DataFrame(rows)


def _series(ratio: float) -> pd.DataFrame:
    return pd.DataFrame([{"step": s, "kind": "part", "part": p, "retained": 0.5 * ratio, "partial_credit": 0.5}
                         for s in (100, 200, 300) for p in ("a", "b")])


def _parts_v2(good: bool):
    table, _ = unpinned.unpinned_verdicts(_abl([0.0] * 9, 1.0) if good else _abl([1.0] * 9, 0.5), None,
                                          _series(0.0 if good else 1.0))
    return table


def _pilot(good: bool):
    pilot = pd.DataFrame({"w": [1000, 3000], "seeds": [4, 4], "ignited": [4, 0 if good else 1]})
    smooth = [1.0, 1.1, 1.2, 1.0] if good else [3.0, 2.0, 1.0, 5.0]
    return pd.DataFrame([{"claim": v.claim.name, "verdict": v.word} for v in withheld.pilot_verdicts(pilot, smooth)])


def _cure_v2(good: bool):
    counts = {"none": (5, 10), "qk": (10, 10), "ov": (5, 10)} if good else \
        {"none": (5, 10), "qk": (4, 10), "ov": (10, 10)}
    return pd.DataFrame([{"claim": v.claim.name, "verdict": v.word} for v in withheld.cure_verdicts_v2(counts)])


def _fdt_groups(spread: float):
    return [{"group": "OV", "d": 500, "T_kin": 1.0, "lo": 0.95, "hi": 1.05},
            {"group": "MLP", "d": 500, "T_kin": spread, "lo": spread * 0.95, "hi": spread * 1.05}]


def _fdt_v2(good: bool):
    runs = [{"arm": "sgd", "status": "done", "stationary": True, "groups": _fdt_groups(30.0 if good else 1.1)}
            for _ in range(3)]
    runs += [{"arm": "langevin", "status": "done", "stationary": True, "groups": _fdt_groups(1.1 if good else 30.0)}
             for _ in range(3)]
    return fdt.fdt_verdicts_v2(runs, apparatus="planted")


def _precursor_v2(good: bool):
    return precursor.precursor_verdicts_v2((0.04, 0.02, 0.08), 0.5, 8, "planted") if good else \
        precursor.precursor_verdicts_v2((0.6, 0.3, 0.9), 0.5, 8, "planted")


def _ignition_v2(good: bool):
    return ignition.dose_verdicts((0, 8), (8, 8)) if good else ignition.dose_verdicts((3, 8), (4, 8))


# ------------------------------------------------------------------ version 3 planted inputs
def _abl3(part: float, other: float, n: int = 9) -> pd.DataFrame:
    """Cells K x seed whose parts leave ``part`` x (K-1)/K and whose non-part heads leave ``other``."""
    rows = []
    for i in range(n):
        k = 2 + i % 3
        rows += [{"kind": "part", "k": k, "seed": i, "part": f"p{j}", "retained": part * (k - 1) / k,
                  "partial_credit": (k - 1) / k} for j in range(k)]
        rows += [{"kind": "random", "k": k, "seed": i, "part": f"r{j}", "retained": other,
                  "partial_credit": (k - 1) / k} for j in range(2)]
    return pd.DataFrame(rows)


def _parts_v3(good: bool):
    if good:
        return unpinned.unpinned_verdicts_v3(_abl3(0.0, 1.0), None, None)[0]
    credit_fails = unpinned.unpinned_verdicts_v3(_abl3(1.0, 1.0), None, None)[0]  # identified, partial credit
    random_fails = unpinned.unpinned_verdicts_v3(_abl3(0.0, 0.5), None, None)[0]  # identified, non-parts matter
    return pd.concat([credit_fails.iloc[:1], random_fails.iloc[1:2]], ignore_index=True)


def _cure_v3(good: bool):
    if good:  # the published pattern
        return withheld.cure_verdicts_v3({"none": (0, 6), "qk": (6, 6), "ov": (0, 6)})
    qk_fails = withheld.cure_verdicts_v3({"none": (0, 6), "qk": (0, 6), "ov": (0, 6)})
    ov_fails = withheld.cure_verdicts_v3({"none": (0, 6), "qk": (6, 6), "ov": (6, 6)})
    return pd.concat([qk_fails.iloc[:1], ov_fails.iloc[1:]], ignore_index=True)


CASES = {("parts", 1): _parts, ("cure", 1): _cure,
         ("ignition", 1): _ignition, ("precursor", 1): _precursor, ("occupation", 1): _occupation,
         ("anneal", 1): _anneal, ("fdt", 1): _fdt, ("parts", 2): _parts_v2, ("cure-pilot", 2): _pilot,
         ("cure", 2): _cure_v2, ("fdt", 2): _fdt_v2, ("precursor", 2): _precursor_v2, ("ignition", 2): _ignition_v2,
         ("parts", 3): _parts_v3, ("cure", 3): _cure_v3, ("forced", 3): lambda good: pd.DataFrame(
             columns=list(VERDICT_COLUMNS))}
RULES = [(key, claim) for key in DECLARATIONS for claim in DECLARATIONS[key].data["rules"]]


def test_every_declared_rule_has_a_planted_case():
    assert set(DECLARATIONS) == set(CASES)
    assert len(RULES) >= 30


@pytest.mark.parametrize("key,claim", RULES, ids=[f"{k[0]}-v{k[1]}-{i}" for i, (k, _) in enumerate(RULES)])
def test_the_rule_can_fail_and_can_hold(key, claim):
    fails, holds = CASES[key](False), CASES[key](True)
    assert _word(fails, claim) == "not reproduced"
    assert _word(holds, claim) == "reproduced"


@pytest.mark.parametrize("key", list(CASES), ids=[f"{k[0]}-v{k[1]}" for k in CASES])
def test_the_rule_text_in_every_table_is_the_declared_one(key):
    declared = rules_of(*key)
    for good in (True, False):
        table = CASES[key](good)
        if "rule" not in table:
            continue
        for claim, rule in zip(table.claim, table.rule):
            if claim in declared and rule != "—":
                assert rule.startswith(declared[claim]), (claim, rule, declared[claim])


def test_version_2_tables_carry_apparatus_and_protocol():
    for key in [k for k in CASES if k[1] == 2 and k[0] not in ("cure-pilot", "cure")]:
        table = CASES[key](True)
        assert list(table.columns) == list(VERDICT_COLUMNS)
        assert all(p.startswith(f"alignment.{key[0]} v2 (sha256 ") for p in table.protocol)


def test_the_series_row_and_the_pinned_control_follow_the_credit_rule():
    table, summary = unpinned.unpinned_verdicts(_abl([1.0] * 9, 1.0), _abl([0.0] * 9, 1.0), _series(1.7))
    assert list(table.verdict) == ["not reproduced", "reproduced", "forced by the apparatus", "not reproduced"]
    assert "the rule's own word: reproduced" in table.ours.iloc[2]
    assert list(table.apparatus)[-1].startswith("developing series") and summary["series"]["n"] == 6
    few, _ = unpinned.unpinned_verdicts(_abl([0.0] * 3, 1.0), None, None)
    assert list(few.verdict) == ["inconclusive", "reproduced", "not run", "not run"]


def test_cure_rows_are_not_testable_when_the_untreated_arm_is_at_zero_or_all():
    for none in ((0, 10), (10, 10)):
        words = [v.word for v in withheld.cure_verdicts_v2({"none": none, "qk": (10, 10), "ov": (0, 10)})]
        assert all(w.startswith("not testable") for w in words)
    v = withheld.cure_verdicts_v2({"none": (2, 6), "qk": (2, 6), "ov": (5, 6)})  # v1's pinned W = 10000
    assert [x.word for x in v] == ["not reproduced", "inconclusive"]
    assert "p(arm > untreated) = 0.121" in v[1].ours


def test_smoothness_statistic_on_planted_curves():
    assert withheld.smoothness(np.exp(-np.arange(50) / 5.0)) == pytest.approx(1.0)
    saw = [1.0, 0.1, 0.5, 0.01, 0.05, 0.001]
    rise = math.log10(5) * 2
    assert withheld.smoothness(saw) == pytest.approx((3 + 2 * rise) / 3)
    assert withheld.smoothness([1e-9, 1e-8, 1e-7]) == math.inf  # at the floor, then up: no fall
    with pytest.raises(ValueError, match="two finite"):
        withheld.smoothness([1.0])


# ------------------------------------------------------------------ version 3 through the study's own code path
def _redundant_model(task, margin: float = 10.0):
    """A planted conjunction in which two heads carry each input: heads ``j`` and ``K + j`` both attend to input
    ``j`` and write its one-hot on the same K x V block of the residual; an MLP unit per input tuple fires only
    when every block is on (threshold 2K - 1.2: both heads give 2, one head mean-ablated gives about 4/3), so
    either head of a pair alone is enough. Ablating any single head leaves the capability."""
    import itertools

    import torch

    from circuitfade.tasks.kpart import hand_built_model

    k, v = task.k, task.v
    model, _ = hand_built_model(task, pinned=False, spare_heads=k)
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    base = task.n_ctx + task.d_vocab + 2 + v  # the residual after the answer directions is free
    assert base + k * v <= model.cfg.d_model and v ** k <= model.cfg.d_mlp
    with torch.no_grad():
        for w in (attn.W_V, attn.W_O, mlp.W_in, mlp.b_in, mlp.W_out):
            w.zero_()
        a = float(attn.W_Q[0].abs().max())  # the hand-set routing score of every head
        for j in range(k):
            for h in (j, k + j):
                attn.W_Q[h] = attn.W_Q[0]
                attn.W_K[h] = 0.0
                attn.W_K[h, task.positions[j], 0] = a  # the position one-hot of input j
                attn.W_V[h, task.n_ctx + torch.arange(v), torch.arange(v)] = 1.0  # value token t -> dim t
                attn.W_O[h, torch.arange(v), base + j * v + torch.arange(v)] = 1.0
        for u, tup in enumerate(itertools.product(range(v), repeat=k)):
            for j, t in enumerate(tup):
                mlp.W_in[base + j * v + t, u] = 1.0
            mlp.b_in[u] = -(2 * k - 1.2)
            answer = sum(int(task.perms[j][t]) for j, t in enumerate(tup)) % v
            mlp.W_out[u, task.n_ctx + task.d_vocab + 2 + answer] = margin
    model.eval()
    return model


def _cells(build, ks=(2, 3), seeds=range(3), batch=None):
    from circuitfade.tasks import eval_set, make_task

    frames = []
    for k in ks:
        task = make_task("kpart", k=k, v=3, n_distractors=1)
        model = build(task)
        for seed in seeds:
            b = eval_set(task, n=256, seed=seed) if batch is None else batch(task, seed)
            rows, _ = unpinned.ablate_cell(model, task, b, k=k, seed=seed, methods=("mean",))
            frames.append(rows)
    return pd.concat(frames, ignore_index=True)


def test_redundant_routes_are_not_testable_in_version_3_never_no_partial_credit():
    from circuitfade.gating.evaluation import evaluate_batch
    from circuitfade.tasks import eval_set, make_task

    task = make_task("kpart", k=3, v=3, n_distractors=1)
    model = _redundant_model(task)
    assert float(evaluate_batch(model, task, eval_set(task, n=256, seed=0))["accuracy"]) == 1.0
    rows = _cells(_redundant_model)
    assert rows.retained.min() > 0.9  # every single head, part or not, is dispensable
    table, summary = unpinned.unpinned_verdicts_v3(rows, None, None)
    assert summary["unpinned"]["identified"] == 0
    assert list(table.verdict[:2]) == ["not testable (parts not identified)"] * 2
    old, _ = unpinned.unpinned_verdicts(rows, None, None)  # version 2: a verdict for the wrong reason
    assert old.verdict.iloc[0] == "not reproduced" and "partial credit" in old.ours.iloc[0]


def test_planted_conjunction_and_additive_circuits_pass_identification_and_get_their_verdicts():
    import torch

    from circuitfade.tasks.kpart import additive_batch, hand_built_additive_model, hand_built_model

    conj = _cells(lambda t: hand_built_model(t, pinned=False)[0])
    table, summary = unpinned.unpinned_verdicts_v3(conj, None, None)
    assert summary["unpinned"]["identified"] == 6
    assert list(table.verdict[:2]) == ["reproduced", "reproduced"]  # no partial credit; non-parts leave 100%
    add = _cells(lambda t: hand_built_additive_model(t, pinned=False)[0],
                 batch=lambda t, s: additive_batch(t, 256, torch.Generator().manual_seed(s)))
    table, summary = unpinned.unpinned_verdicts_v3(add, None, None)
    assert summary["unpinned"]["identified"] == 6
    assert table.verdict.iloc[0] == "not reproduced" and "partial credit" in table.ours.iloc[0]


def test_identification_needs_every_part_below_every_non_part_head():
    cells = unpinned.identification(_abl3(0.0, 1.0, n=3), ["k", "seed"])
    assert cells.identified.all() and list(cells.part_max) == [0.0] * 3
    rows = _abl3(0.0, 1.0, n=3)
    rows.loc[(rows.seed == 1) & (rows.kind == "random"), "retained"] = 0.05  # a non-part head matters as much
    assert list(unpinned.identification(rows, ["k", "seed"]).identified) == [True, False, True]
    with pytest.raises(ValueError, match="lack columns"):
        unpinned.identification(rows.drop(columns=["kind"]), ["k", "seed"])


def test_cure_v3_says_yes_to_the_published_pattern_and_no_where_the_data_cannot_speak():
    words = lambda c, **kw: [v.word for v in withheld.count_rows_v3(c, **kw)]  # noqa: E731
    assert words({"none": (0, 6), "qk": (6, 6), "ov": (0, 6)}) == ["reproduced", "reproduced"]  # v2: not testable
    assert words({"none": (0, 6), "qk": (0, 6), "ov": (6, 6)}) == [
        "not reproduced", "not testable (no arm shows a cure is possible at this W)"]
    assert words({"none": (0, 6), "qk": (6, 6), "ov": (6, 6)}) == ["reproduced", "not reproduced"]
    assert all(w.startswith("not testable (untreated arm at n/n")
               for w in words({"none": (10, 10), "qk": (9, 10), "ov": (10, 10)}))
    pinned = words({"none": (0, 6), "qk": (0, 6), "ov": (0, 6)}, pinned=True)
    assert pinned[0] == "forced by the apparatus" and pinned[1].startswith("not testable")
    v2 = [v.word for v in withheld.cure_verdicts_v2({"none": (0, 6), "qk": (6, 6), "ov": (0, 6)})]
    assert all(w.startswith("not testable") for w in v2)  # version 2 as it ran, unchanged


def test_forced_outcomes_are_never_reproduced_in_version_1_tables():
    from studies.alignment.protocol import forced_v1

    good = forced_v1(_parts(True), "parts")
    assert _word(good, "no partial credit: one part ablated leaves little") == "forced by the apparatus"
    assert _word(good, "a random non-part head leaves ~100%") == "forced by the apparatus"
    assert _word(good, "rate equation with frozen constants predicts held-out waits") == "reproduced"
    zero = forced_v1(cure.cure_verdicts({"qk": (0, 6), "ov": (0, 6)}, 30000), "cure", every_arm_zero=True)
    assert set(zero.verdict.iloc[1:]) == {"forced by the apparatus"}
    assert "the rule's own word: reproduced" in zero.ours.iloc[2]
    some = forced_v1(cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, 1000), "cure")
    assert _word(some, "cure: re-initialising only the OV slices does nothing") == "reproduced"
    assert _word(forced_v1(_fdt(True), "fdt"), "FDT: plain SGD obeys Yaida's relation <theta.g> = (lr/2)<|g|^2> "
                                                "at stationarity") == "forced by the apparatus"
    ign = forced_v1(_ignition(True), "ignition")
    assert (ign.verdict == "forced by the apparatus").sum() == 1


def test_provenance_follows_the_declaration_and_the_runs_it_grades():
    from studies.alignment.protocol import provenance_of, stamp

    assert str(provenance_of(stamp("parts", 1), "pinned")) == "restated after the results"
    assert str(provenance_of(stamp("parts", 2), "unpinned")) == "declared before the runs"
    assert str(provenance_of(stamp("cure", 2), "pinned (v1 runs), W = 30000")) == "declared after the results"
    assert str(provenance_of(stamp("parts", 2), "developing series (local induction model)")) == \
        "declared after the results"
    assert str(provenance_of(stamp("cure", 3), "unpinned, W = 10000")) == "declared after the results"


def test_the_committed_verdicts_label_what_the_apparatus_forced():
    from pathlib import Path

    v = pd.read_csv(REPO / "results" / "alignment" / "verdicts.csv")
    ablation = v.claim.str.contains("partial credit|non-part head")
    pinned_parts = v[ablation & v.apparatus.str.startswith("pinned") & v.protocol.str.startswith("alignment.parts")]
    assert len(pinned_parts) == 5 and set(pinned_parts.verdict) == {"forced by the apparatus"}
    yaida = v[v.claim.str.contains("Yaida")]
    assert list(yaida.verdict) == ["forced by the apparatus"]
    v3 = v[v.protocol.str.contains(" v3 ")]
    assert set(v3.provenance) == {"declared after the results"}
    unpinned_v3 = v3[v3.apparatus == "unpinned"]
    assert set(unpinned_v3.verdict) == {"not testable (parts not identified)"}
