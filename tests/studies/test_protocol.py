"""The alignment study's declared protocol: seed counts from stated power targets, exact tests checked
against scipy, the experiments reading their grids from the declarations, stamps in the result tables,
and the pieces of version 2 that need no training (zero-gradient parameters, remaining-time errors)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from studies.alignment import cure, fdt, ignition, precursor, report, withheld
from studies.alignment.power import any_event_power, fisher_greater, fisher_power, seeds_for_power
from studies.alignment.protocol import (
    CURE_SEEDS_V2,
    DECLARATIONS,
    IGNITION_SEEDS_V2,
    POWER_TARGETS,
    VERDICT_COLUMNS,
    declared,
    stamp,
    stamped,
)

torch.set_num_threads(1)


@pytest.mark.parametrize("a,na,b,nb", [(5, 6, 2, 6), (10, 10, 5, 10), (0, 6, 0, 6), (3, 4, 1, 9), (6, 6, 0, 6)])
def test_fisher_greater_matches_scipy(a, na, b, nb):
    from scipy.stats import fisher_exact

    want = fisher_exact([[a, na - a], [b, nb - b]], alternative="greater").pvalue
    assert fisher_greater(a, na, b, nb) == pytest.approx(want, abs=1e-12)


def test_fisher_bad_input():
    with pytest.raises(ValueError, match="0 <= a <= n_a"):
        fisher_greater(7, 6, 0, 6)
    with pytest.raises(ValueError, match="int >= 0"):
        fisher_greater(1.5, 6, 0, 6)


def test_declared_seed_counts_are_the_power_targets():
    t = POWER_TARGETS["cure"]
    n = seeds_for_power(lambda n: fisher_power(n, t["p_arm"], t["p_untreated"]), t["power"])
    assert n == CURE_SEEDS_V2 == len(declared("cure", 2).data["seeds"]) == 10
    assert fisher_power(8, 1.0, 0.5) < 0.8 <= fisher_power(10, 1.0, 0.5)
    t = POWER_TARGETS["ignition"]
    n = seeds_for_power(lambda n: any_event_power(n, t["p_below"]), t["power"])
    assert n == IGNITION_SEEDS_V2 == len(declared("ignition", 2).data["seeds"]) == 8


def test_stamps_are_content_hashes_and_versions_differ():
    for (name, version), d in DECLARATIONS.items():
        assert stamp(name, version) == f"alignment.{name} v{version} (sha256 {d.sha256()[:12]})"
    assert declared("parts", 1).sha256() != declared("parts", 2).sha256()
    assert declared("cure", 2).data["pilot_sha256"] == declared("cure-pilot", 2).sha256()
    with pytest.raises(ValueError, match="no declaration"):
        declared("parts", 9)


def test_the_experiments_read_their_grids_from_the_declarations():
    assert cure.WS == tuple(declared("cure", 1).data["ws"]) and cure.CURE_SEEDS == 6
    assert ignition.BELOW_SHARE == declared("ignition", 1).data["below"]["share"]
    assert precursor.LEVELS == tuple(declared("precursor", 1).data["levels"])
    assert fdt.FDT_STEPS == declared("fdt", 1).data["steps"]
    assert {s["seed"] for s in ignition.dose_specs()} == set(declared("ignition", 2).data["seeds"])
    assert {s["share"] for s in ignition.dose_specs()} == set(declared("ignition", 2).data["shares"])
    # v2 ignition seeds are fresh: none of v1's scan jobs at these shares is reused
    from studies.alignment.apparatus import job_key

    v1 = {job_key(s) for s in ignition.ignition_specs()}
    assert not v1 & {job_key(s) for s in ignition.dose_specs()}


def test_stamped_adds_apparatus_and_protocol_in_order():
    v = cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, 1000)
    s = stamped(v, "cure", 1, "pinned")
    assert list(s.columns) == list(VERDICT_COLUMNS) and set(s.apparatus) == {"pinned"}
    assert set(s.protocol) == {stamp("cure", 1)} and s.verdict.iloc[0] == "reproduced"


def test_collect_verdicts_splits_the_versions(tmp_path):
    stamped(cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, 1000), "cure", 1, "pinned").to_csv(
        tmp_path / "cure_verdicts.csv", index=False)
    ignition.dose_verdicts((0, 8), (8, 8)).to_csv(tmp_path / "ignition_dose_verdicts.csv", index=False)
    v2, v1 = report.collect_verdicts(tmp_path, None)
    assert len(v1) == 3 and len(v2) == 2
    assert all(p.startswith("alignment.ignition v2") for p in v2.protocol)
    assert all(p.startswith("alignment.cure v1") for p in v1.protocol)


def test_b_k_gets_no_gradient_by_construction_and_is_left_out():
    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
    from circuitfade.tasks import make_task
    from circuitfade.tasks.kpart import kpart_model

    task = make_task("kpart", k=2, v=3, n_distractors=1)
    model = SoftPriorTransformer(SoftPriorConfig.from_json_dict(kpart_model(task, pinned=False), source="t"))
    with torch.no_grad():
        model.blocks[0].attn.b_K.normal_()  # even a non-zero key bias gets no gradient
    b = task.sample(64, torch.Generator().manual_seed(0))
    task.loss(model(b.tokens), b).backward()
    g_bk, g_wk = (float(getattr(model.blocks[0].attn, n).grad.abs().max()) for n in ("b_K", "W_K"))
    assert g_wk > 1e-4 and g_bk < 1e-6 * g_wk  # zero up to float32 rounding; learned routing: W_K gets one
    group = fdt.family_without(fdt.ZERO_GRADIENT["unpinned"])
    assert group("blocks.0.attn.b_K") is None and group("blocks.0.attn.W_K") == "QK"
    assert group("blocks.0.mlp.W_in") == "MLP"


def test_remaining_time_errors_on_planted_runs():
    ok = pd.DataFrame({"ignition": [1000.0, 1000.0, 500.0], "t_cross": [900.0, np.nan, 500.0],
                       "pred": [1010.0, np.nan, 520.0], "pred_median": [800.0, 800.0, 800.0]})
    r = precursor.remaining_errors(ok)
    assert r[0] == pytest.approx(0.1) and math.isinf(r[1]) and math.isinf(r[2])
    assert precursor.remaining_errors(ok, "pred_median")[0] == pytest.approx(2.0)


def test_pinned_cure_counts_from_the_v1_tables(tmp_path):
    pd.DataFrame({"w": [10] * 3 + [20] * 3, "seed": [0, 1, 2] * 2,
                  "status": ["ignited", "censored", "ignited", "censored", "censored", "censored"]}).to_csv(
        tmp_path / "cure_withheld_runs.csv", index=False)
    pd.DataFrame({"w": [10] * 6, "which": ["qk"] * 3 + ["ov"] * 3, "seed": [0, 1, 2] * 2,
                  "status": ["ignited"] * 3 + ["censored"] * 3}).to_csv(tmp_path / "cure_runs.csv", index=False)
    assert withheld.pinned_counts(tmp_path) == {10: {"none": (2, 3), "qk": (3, 3), "ov": (0, 3)}}


def test_choose_w_follows_the_declared_rule():
    t = lambda ig: pd.DataFrame({"w": [1000, 3000, 10000], "seeds": [4] * 3, "ignited": ig})  # noqa: E731
    assert withheld.choose_w(t([4, 3, 1])) == 3000  # 3/4 and 1/4 tie at 1/4 from 1/2: the smaller W
    assert withheld.choose_w(t([4, 2, 1])) == 3000
    assert withheld.choose_w(t([4, 4, 0])) == 5500  # sqrt(3000 * 10000) = 5477 -> 5500
    assert withheld.choose_w(t([0, 0, 0])) == 1000
    assert withheld.choose_w(t([4, 4, 4])) is None
