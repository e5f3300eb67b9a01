"""Ignition at a chosen step: the floor formula, the share->drive map, the mix schedule, the rules (planted)."""

import math

import numpy as np
import pandas as pd
import pytest

from studies.alignment import apparatus
from studies.alignment import parts as alignment
from studies.alignment import ignition as ig

# A = c * sites * attempts = 1; exp(beta * 3) = 8; delta = 0.01
PLANTED = {"c": 0.01, "sites": 1.0, "attempts": 100.0, "beta": math.log(2), "delta": 0.01}


def test_floor_and_budget_threshold_on_planted_constants():
    # rate = A * p * exp(-beta m) - delta = p / 8 - 0.01 is zero at p = 0.08
    assert ig.floor_share(PLANTED, m=3) == pytest.approx(0.08, rel=1e-12)
    # predicted wait = B = 100 where p / 8 - 0.01 = 0.01: p = 0.16
    assert ig.budget_share(PLANTED, budget=100, m=3) == pytest.approx(0.16, rel=1e-12)
    assert float(alignment.predict_wait(3, ig.share_to_drive(0.16), PLANTED)) == pytest.approx(100.0, rel=1e-9)
    # m = 1: exp(beta) = 2, floor 0.02
    assert ig.floor_share(PLANTED, m=1) == pytest.approx(0.02, rel=1e-12)
    pred = ig.predictions(PLANTED, [0.05, 0.16, 0.5], budget=100, m=3).set_index("share")
    assert np.isinf(pred.predicted_delay[0.05]) and not pred.predicted_ignites[0.05]  # below the floor: never
    assert pred.p_ignite_if_exponential[0.05] == 0.0
    assert pred.predicted_delay[0.5] == pytest.approx(1 / (0.5 / 8 - 0.01))  # 19.05 steps
    assert pred.predicted_ignites[0.16] and pred.predicted_ignites[0.5]
    assert pred.p_ignite_if_exponential[0.5] == pytest.approx(1 - math.exp(-100 / pred.predicted_delay[0.5]))


def test_share_to_drive_is_the_share_over_the_fit_share():
    assert ig.SHARE_IN_FIT == 1.0  # the fit runs trained on capability sequences only
    assert ig.share_to_drive(1.0) == 1.0  # share 1 is the fit's drive 1
    assert ig.share_to_drive(0.5) == 0.5 and ig.share_to_drive(0.002) == 0.002
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError):
            ig.share_to_drive(bad)


def test_job_spec_gives_the_intended_mix_schedule():
    cfg = ig.ignition_config(3, 0.02, 2000, switch=1000)
    assert cfg.seed == 3 and cfg.task["k"] == ig.K
    assert [cfg.mix_at(t)["p_capability"] for t in (0, 999, 1000, 1001, 1999)] == [0.0, 0.0, 0.02, 0.02, 0.02]
    specs = ig.ignition_specs()
    keys = [apparatus.job_key(s) for s in specs]
    assert len(set(keys)) == len(keys)  # no job twice
    by = pd.DataFrame(specs).groupby("share").seed.apply(sorted)
    assert by[ig.ABOVE_SHARE] == list(range(ig.ABOVE_SEEDS))
    assert by[ig.BELOW_SHARE] == list(range(ig.BELOW_SEEDS))
    for p in ig.SCAN_SHARES:
        assert by[p] == list(range(ig.SCAN_SEEDS))
    s = specs[0]
    c = ig.ignition_config(s["seed"], s["share"], s["switch"] + s["budget"], switch=s["switch"])
    assert c.mix_at(s["switch"] - 1)["p_capability"] == 0.0 and c.mix_at(s["switch"])["p_capability"] == s["share"]


def test_empirical_floor_bracket_on_planted_tables():
    t = pd.DataFrame({"share": [0.002, 0.01, 0.05, 0.2, 0.5], "seeds": [5, 12, 5, 5, 10],
                      "ignited": [0, 1, 3, 5, 10]})
    assert ig.empirical_floor(t) == (0.01, 0.05)
    # a lucky low share below a failing one does not move the bracket down
    assert ig.empirical_floor(t.assign(ignited=[3, 1, 3, 5, 10])) == (0.01, 0.05)
    assert ig.empirical_floor(t.assign(ignited=[5, 12, 5, 5, 10])) == (None, 0.002)  # below the scan
    assert ig.empirical_floor(t.assign(ignited=[0, 0, 0, 0, 4])) == (0.5, None)  # above the scan


def _v(**kw):
    base = dict(above=(10, 10), below=(0, 12), delay=(300.0, 200.0, 400.0), predicted_delay=258.0, flat=True,
                p_budget=0.043, p_floor=1e-10, bracket=(0.02, 0.05))
    return ig.ignition_verdicts(**{**base, **kw}).verdict.tolist()


def test_verdict_rules_on_planted_counts():
    assert _v() == ["reproduced"] * 4
    assert _v(above=(9, 10), below=(1, 12)) == ["reproduced", "partly", "reproduced", "reproduced"]
    assert _v(above=(6, 10), below=(3, 12)) == ["partly", "partly", "reproduced", "reproduced"]
    assert _v(above=(5, 10), below=(4, 12))[:2] == ["not reproduced", "not reproduced"]
    assert _v(above=(4, 4))[0] == "partly"  # fewer than 5 runs cannot reproduce
    # delay: the prediction outside the interval but within a factor 2 is partly; not flat is never better
    assert _v(delay=(500.0, 400.0, 900.0))[2] == "partly"  # 258 / 500 = 0.52
    assert _v(delay=(525.0, 400.0, 900.0))[2] == "not reproduced"  # 258 / 525 = 0.49
    assert _v(delay=(1200.0, 900.0, 1500.0))[2] == "not reproduced"
    assert _v(flat=False)[2] == "not reproduced"
    # floor: inside the bracket, within a factor 3, outside, nothing located
    assert _v(bracket=(0.05, 0.1))[3] == "partly"
    assert _v(bracket=(0.2, 0.5))[3] == "not reproduced"
    assert _v(bracket=(None, 0.002))[3] == "not reproduced"
    assert _v(bracket=(0.5, None))[3] == "not reproduced"
    assert _v(above=None, below=(0, 0), delay=None, bracket=None) == ["not run"] * 4


def test_a_run_that_never_ignites_is_censored_and_flat_before_the_switch(tmp_path):
    import torch

    torch.set_num_threads(1)
    spec = {"kind": "ignition", "k": ig.K, "seed": 0, "share": 0.5, "switch": 30, "budget": 20}
    r = ig.ignition_job(spec, str(tmp_path))
    assert r["status"] == "censored" and r["delay"] is None and r["ignition"] is None
    assert r["flat_before_switch"] and r["pre_switch_max_acc"] < 0.67
    assert r["final_step"] == 50 and r["curve"][0][0] == 30


def test_follow_up_rule_and_specs():
    assert _v(long=(0, 5))[4] == "reproduced"
    assert _v(long=(3, 5))[4] == "not reproduced"  # most ignite: a slow rate, not a floor
    assert _v(long=(1, 5))[4] == "partly"
    assert _v(long=(0, 4))[4] == "partly"  # too few runs to reproduce
    assert len(_v()) == 4  # no follow-up row unless asked
    specs = ig.long_specs()
    assert {(s["share"], s["budget"]) for s in specs} == {(p, ig.LONG_BUDGET) for p in ig.LONG_SHARES}
    assert len(specs) == len(ig.LONG_SHARES) * ig.LONG_SEEDS
    short = {apparatus.job_key(s) for s in ig.ignition_specs()}
    assert not short & {apparatus.job_key(s) for s in specs}  # the follow-up never overwrites a scan job
