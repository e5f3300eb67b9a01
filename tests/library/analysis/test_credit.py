"""The unpinned K-part apparatus and the part-ablation verdict rule: planted additive circuits come out
"partial credit", planted conjunction circuits "no partial credit", on the pinned and the unpinned preset."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade.analysis.parts import (
    CREDIT_SPLIT,
    Credit,
    credit_verdict,
    median_order_interval,
    part_ablation,
    pool_cells,
    routing_parts,
)
from circuitfade.model import SoftPriorConfig
from circuitfade.tasks import KPart, KPartConfig, eval_set, make_task
from circuitfade.tasks.kpart import additive_batch, hand_built_additive_model, hand_built_model, kpart_model
from circuitfade.train.surgery import reinit_slices

torch.set_num_threads(1)


def _cells(builder, batch_of, pinned: bool) -> pd.DataFrame:
    frames = []
    for k in (2, 3, 4):
        task = make_task("kpart", k=k, v=3, n_distractors=1)
        model, parts = builder(task, pinned=pinned)
        for s in (0, 1):
            frames.append(part_ablation(model, batch_of(task, s), task, parts=parts, n_random=2).assign(k=k, seed=s))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("pinned", [True, False])
def test_additive_circuit_is_partial_credit_and_conjunction_is_not(pinned):
    add = _cells(hand_built_additive_model, lambda t, s: additive_batch(t, 512, torch.Generator().manual_seed(s)),
                 pinned)
    con = _cells(hand_built_model, lambda t, s: eval_set(t, n=512, seed=s), pinned)
    assert (add.acc_intact == 1.0).all() and (con.acc_intact == 1.0).all()
    parts_add = add[add.kind == "part"]
    # each part answers 1/K of the sequences: ablating one leaves ~(K-1)/K of the capability
    assert (parts_add.retained - parts_add.partial_credit).abs().max() < 0.1
    v_add = credit_verdict(pool_cells(add, ["k", "seed"]))
    v_con = credit_verdict(pool_cells(con, ["k", "seed"]))
    assert v_add["verdict"] is Credit.PARTIAL and v_add["lo"] > 0.9 and v_add["n"] == 6
    assert v_con["verdict"] is Credit.NONE and v_con["hi"] < 0.1
    assert str(Credit.PARTIAL) == "partial credit" and str(Credit.NONE) == "no partial credit"


def test_the_old_all_cells_below_rule_cannot_tell_a_slightly_degraded_additive_circuit():
    """Why a new rule: "every cell below (K-1)/K" also holds for an additive circuit whose cells sit a
    little below their prediction; the credit rule calls it partial credit."""
    cells = pd.DataFrame({"retained": [0.45, 0.62, 0.71, 0.44, 0.6, 0.7], "partial_credit": [0.5, 2 / 3, 0.75] * 2})
    assert (cells.retained < cells.partial_credit).all()
    assert credit_verdict(cells)["verdict"] is Credit.PARTIAL


def test_credit_verdict_undecided_when_the_interval_holds_the_split_or_cells_are_few():
    pc = [0.5] * 9
    straddle = pd.DataFrame({"retained": np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]) * 0.5,
                             "partial_credit": pc})
    out = credit_verdict(straddle)
    assert out["verdict"] is Credit.UNDECIDED and out["lo"] <= CREDIT_SPLIT <= out["hi"]
    few = pd.DataFrame({"retained": [0.0, 0.01, 0.0], "partial_credit": [0.5] * 3})
    out = credit_verdict(few)
    assert out["verdict"] is Credit.UNDECIDED and out["coverage"] == pytest.approx(0.75)
    nan = pd.DataFrame({"retained": [float("nan")] * 8, "partial_credit": [0.5] * 8})
    assert credit_verdict(nan)["verdict"] is Credit.UNDECIDED and credit_verdict(nan)["n"] == 0


def test_credit_verdict_bad_input():
    with pytest.raises(ValueError, match="columns retained"):
        credit_verdict(pd.DataFrame({"x": [1.0]}))
    with pytest.raises(ValueError, match="split"):
        credit_verdict(pd.DataFrame({"retained": [0.1], "partial_credit": [0.5]}), split=1.5)
    with pytest.raises(ValueError, match="partial_credit must be > 0"):
        credit_verdict(pd.DataFrame({"retained": [0.1], "partial_credit": [0.0]}))


@pytest.mark.parametrize("n", [1, 3, 5, 6, 9, 15, 32])
def test_median_order_interval_matches_the_binomial(n):
    from scipy.stats import binom

    x = np.arange(n, 0, -1, dtype=float)  # unsorted on purpose
    med, lo, hi, cov = median_order_interval(x)
    assert med == np.median(x)
    ls = [l for l in range(1, (n + 1) // 2 + 1) if 1 - 2 * binom.cdf(l - 1, n, 0.5) >= 0.95]
    l = max(ls) if ls else 1
    assert (lo, hi) == (float(l), float(n + 1 - l))
    assert cov == pytest.approx(1 - 2 * binom.cdf(l - 1, n, 0.5), abs=1e-12)
    assert (cov >= 0.95) == (n >= 6)


def test_unpinned_preset_has_no_prior_and_any_positions():
    task = KPart(KPartConfig(k=2, n_distractors=2, positions=(1, 3)))
    cfg = SoftPriorConfig.from_json_dict(kpart_model(task, pinned=False), source="test")
    assert cfg.priors == () and cfg.n_heads == 4 and cfg.d_vocab == task.d_vocab and cfg.n_ctx == task.n_ctx
    with pytest.raises(ValueError, match="pinned"):
        kpart_model(make_task("kpart", k=2), pinned="no")


def test_unpinned_hand_built_routes_by_its_query_key_slices():
    """On the unpinned preset a part is QK and OV: re-drawing a part's QK slices breaks the circuit;
    on the pinned preset the same surgery changes nothing (the pin routes, not QK)."""
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    b = eval_set(task, n=512)
    for pinned, broken in ((False, True), (True, False)):
        model, parts = hand_built_model(task, pinned=pinned)
        reinit_slices(model, [parts[0]], which="qk", generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            acc = float(task.accuracy(model(b.tokens), b))
        assert (acc < 0.6) == broken, (pinned, acc)


def test_routing_parts_finds_planted_routes_and_shared_inputs():
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    model, _ = hand_built_model(task, pinned=False)
    attn = model.blocks[0].attn
    with torch.no_grad():  # swap the routing of heads 0 and 2: head 2 now reads input 0, head 0 input 2
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            p = getattr(attn, name)
            p[[0, 2]] = p[[2, 0]].clone()
    tokens = eval_set(task, n=128).tokens
    r = routing_parts(model, tokens, [0, 1, 2], task.query_pos)
    assert r["parts"] == [(0, 2), (0, 1), (0, 0)]
    assert min(r["own"]) > 0.99 and max(r["shared"]) < 1e-6
    with torch.no_grad():  # head 3 (a spare) now also reads input 1: shared
        attn.W_K[3] = attn.W_K[1]
    r = routing_parts(model, tokens, [0, 1, 2], task.query_pos)
    assert r["shared"][1] > 0.99 and r["parts"][0] == (0, 2)
    with pytest.raises(ValueError, match="sources"):
        routing_parts(model, tokens, [0, 9], task.query_pos)


def test_additive_batch_has_one_live_input_holding_the_answer():
    task = make_task("kpart", k=4, v=3, n_distractors=1)
    b = additive_batch(task, 400, torch.Generator().manual_seed(3))
    inputs = b.tokens[:, :4]
    live = inputs != task.base_query_token
    assert bool((live.sum(1) == 1).all())
    assert torch.equal(inputs[live], b.targets[:, -1])
    assert bool((b.tokens[:, -1] == task.query_token).all()) and int(b.tokens[:, 4].max()) < 3
    counts = live.sum(0).float() / 400
    assert float((counts - 0.25).abs().max()) < 0.08
    assert math.isclose(float(b.answer_sources[:, -1, :4].sum()), 400)
