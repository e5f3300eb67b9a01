"""Melt / pin / anneal with Langevin noise: pinning keeps pinned entries bit for bit, the rules on planted data."""

import numpy as np
import pandas as pd
import pytest
import torch

from studies.alignment import anneal
from circuitfade.gating.schedules import as_schedule


def _model(seed=0):
    from studies.alignment.apparatus import base_config
    from circuitfade.train import new_run

    return new_run(base_config(anneal.K, seed, 10)).model


def _steps(model, groups, restore, n=5, T=1e-2):
    from studies.alignment.apparatus import BATCH
    from circuitfade.gating.evaluation import answer_logits

    task = model_task()
    opt = anneal.sgd(groups, T, 3, n)
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        b = task.sample(BATCH, gen)
        opt.zero_grad()
        task.loss(answer_logits(model, b), b).backward()
        opt.step()
        if restore is not None:
            restore()


def model_task():
    from studies.alignment.apparatus import TASK
    from circuitfade.tasks import make_task

    return make_task(**{**TASK, "k": anneal.K})


@pytest.mark.parametrize("heads,prefixes", [((0, 1), ()), ((2, 3), anneal.READOUT), ((), ("blocks.0.mlp.",))])
def test_pinned_entries_bit_identical_under_noise_and_free_entries_move(heads, prefixes):
    torch.set_num_threads(1)
    m = _model()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    groups, restore, masks = anneal.pin_param_groups(m, heads, prefixes)
    _steps(m, groups, restore)
    n_pinned = n_moved = 0
    for n, p in m.named_parameters():
        if n not in masks:
            continue
        mk = masks[n]
        assert torch.equal(p.detach()[mk], before[n][mk]), n  # bit for bit
        n_pinned += int(mk.sum())
        n_moved += int((p.detach()[~mk] != before[n][~mk]).sum())
    assert n_pinned > 0
    free = sum(int((~masks[n]).sum()) for n in masks)
    assert n_moved > 0.9 * free  # noise moves (almost) every free entry


def test_pin_masks_select_exactly_the_named_head_slices():
    m = _model()
    _, _, masks = anneal.pin_param_groups(m, (1,), ())
    assert masks["blocks.0.attn.W_Q"][1].all() and not masks["blocks.0.attn.W_Q"][[0, 2, 3]].any()
    assert masks["blocks.0.attn.W_O"][1].all() and not masks["blocks.0.attn.W_O"][0].any()
    assert not masks["blocks.0.attn.b_O"].any() and not masks["blocks.0.mlp.W_in"].any()
    assert "blocks.0.attn.gate_kpart_pin_logit" not in masks  # not trainable
    groups, _, _ = anneal.pin_param_groups(m, (), ("unembed.",))
    assert len(groups) == 2 and groups[1]["lr"] == 0.0 and groups[1]["noise_scale"] == 0.0
    assert {id(p) for p in groups[1]["params"]} == {id(m.unembed.W_U), id(m.unembed.b_U)}
    with pytest.raises(ValueError):
        anneal.pin_param_groups(m, (9,), ())


def test_without_restore_partially_pinned_slices_would_move():
    # the restore step is what keeps head slices fixed (a tensor holds all heads): the test above can fail
    m = _model()
    before = m.blocks[0].attn.W_V.detach().clone()
    groups, _, masks = anneal.pin_param_groups(m, (0,), ())
    _steps(m, groups, None, n=2)
    assert not torch.equal(m.blocks[0].attn.W_V.detach()[0], before[0])


def test_anneal_schedule_value_at_step():
    s = as_schedule(anneal.anneal_schedule(0.01, hold=100, ramp=200), 1000)
    assert s(0) == 0.01 and s(99) == 0.01 and s(100) == 0.01
    assert s(200) == pytest.approx(0.005) and s(250) == pytest.approx(0.0025)
    assert s(300) == 0.0 and s(999) == 0.0


def _melt_table(lost_by_T):
    rows = [{"seed": s, "T": T, "lost": bool(x)} for T, col in lost_by_T.items() for s, x in enumerate(col)]
    return pd.DataFrame(rows)


def test_melting_point_rule_on_planted_data():
    t = _melt_table({0.0: [0, 0, 0, 0, 0], 1e-3: [0, 0, 1, 0, 0], 3e-3: [1, 1, 1, 0, 0],
                     1e-2: [1, 1, 1, 1, 0], 3e-2: [1, 1, 1, 1, 1]})
    mp = anneal.melting_point(t)
    assert mp["T_m"] == 3e-3 and mp["lo"] == 1e-3 and mp["hi"] == 3e-3
    assert mp["per_seed"] == {0: 3e-3, 1: 3e-3, 2: 1e-3, 3: 1e-2, 4: 3e-2}
    assert anneal.hot_temperature(mp["counts"]) == (3e-2, True)
    v = anneal.verdicts(t, None, None)
    assert v.verdict.iloc[0] == "reproduced"
    # 2 of 5 is no majority; never melted -> no melting point
    none = anneal.melting_point(_melt_table({0.0: [0] * 5, 1e-2: [1, 1, 0, 0, 0]}))
    assert none["T_m"] is None and anneal.hot_temperature(none["counts"]) == (1e-2, False)
    assert anneal.verdicts(_melt_table({0.0: [0] * 5, 1e-2: [1, 1, 0, 0, 0]}), None, None).verdict.iloc[0] == \
        "not reproduced"
    # lost already at T = 0 in 2 seeds: only partly (the loss is not the temperature's)
    bad = _melt_table({0.0: [1, 1, 0, 0, 0], 1e-2: [1] * 5})
    assert anneal.melting_point(bad)["T_m"] == 1e-2 and anneal.verdicts(bad, None, None).verdict.iloc[0] == "partly"
    # the lowest grid T already melts: its interval is open below
    assert anneal.melting_point(_melt_table({1e-3: [1] * 5}))["lo"] is None


def _pin(kc, kk, disp=0.5, disp0=0.001, change=0.0, n=5):
    rows = []
    for arm, kept in (("circuit", kc), ("control circuit", kk)):
        rows += [{"arm": arm, "seed": s, "lost": s >= kept, "pinned_max_change": change, "free_disp": disp,
                  "free_disp_t0": disp0} for s in range(n)]
    return pd.DataFrame(rows)


def test_pin_and_anneal_verdict_rules_on_planted_outcomes():
    v = lambda p: anneal.verdicts(None, p, None).verdict.iloc[1]  # noqa: E731
    assert v(_pin(5, 0)) == "reproduced" and v(_pin(4, 1)) == "reproduced"
    assert v(_pin(5, 0, change=1e-7)) == "partly"  # a pinned entry moved
    assert v(_pin(5, 0, disp=0.005)) == "partly"  # free entries hardly moved
    assert v(_pin(3, 2)) == "partly" and v(_pin(2, 2)) == "not reproduced"
    h = anneal.HOLD

    def a(anneal_ig, const_ig):
        rows = [{"arm": "anneal", "seed": i, "ignition": x} for i, x in enumerate(anneal_ig)]
        rows += [{"arm": "constant", "seed": i, "ignition": x} for i, x in enumerate(const_ig)]
        return anneal.verdicts(None, None, pd.DataFrame(rows)).verdict.iloc[2]

    nan = np.nan
    assert a([h + 10, h + 50, h + 300, h + 400, nan], [nan] * 5) == "reproduced"
    assert a([h - 10, h + 50, h + 300, h + 400, h + 1], [nan] * 5) == "partly"  # one ignited while still hot
    assert a([h + 10] * 5, [100.0, 200.0, nan, nan, nan]) == "partly"  # the hot control ignites too
    assert a([h + 10, nan, nan, nan, nan], [nan] * 5) == "not reproduced"


def test_anneal_is_a_registered_alignment_experiment():
    from studies.alignment.report import EXPERIMENTS, STANDALONE, build_parser

    assert "anneal" in EXPERIMENTS and "anneal" in STANDALONE  # writes OUT/anneal.md + anneal_verdicts.csv
    assert build_parser().parse_args(["anneal"]).experiments == ["anneal"]
