"""The controlled occupation model: its symmetry claim, the planted states, the
prediction rule and the verdict rules, on cases with known answers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from studies.alignment import occupation as O

QUIET = replace(O.CONFIG, init_sd=0.0, T=0.0, seeds=2)


def test_base_training_keeps_the_state_on_the_one_parameter_family():
    """From a symmetric start, GD on base data keeps theta == phi_b, every non-source entry of a part
    equal and the sum zero: the state is a function of the key-side margin alone."""
    margins, states = O.base_margins(QUIET, ws=(0, 40))
    theta, phi_b, phi_c = states[40]
    assert torch.allclose(theta, phi_b, atol=1e-12) and float(phi_c.abs().max()) == 0.0
    k = torch.arange(QUIET.K)
    others = theta.clone()
    others[:, k, k] = float("nan")
    rest = others[~torch.isnan(others)].view(QUIET.seeds, QUIET.K, QUIET.N - 1)
    assert torch.allclose(rest, rest[..., :1].expand_as(rest), atol=1e-12)
    assert torch.allclose(theta.sum(-1), torch.zeros(QUIET.seeds, QUIET.K, dtype=theta.dtype), atol=1e-12)
    m40 = margins[margins.w == 40].margin.to_numpy()
    assert (m40 > 0.5).all()
    planted = O._planted_state(QUIET, float(m40[0]), QUIET.seeds, seed=0)
    assert torch.allclose(planted[0], theta, atol=1e-9) and torch.allclose(planted[1], phi_b, atol=1e-9)


def test_planted_state_has_the_asked_margin():
    theta, phi_b, _ = O._planted_state(QUIET, 2.5, 3, seed=0)
    k = torch.arange(QUIET.K)
    m = theta[:, k, k] - theta[:, k, QUIET.K + k]
    assert torch.allclose(m, torch.full_like(m, 2.5)) and torch.equal(theta, phi_b)


def test_capability_accuracy_is_the_product_of_part_attentions():
    cfg = replace(QUIET, gate=0.0)
    theta = torch.zeros(1, cfg.K, cfg.N, dtype=torch.float64)
    assert float(O._accuracy(cfg, theta, theta)) == pytest.approx((1 / cfg.N) ** cfg.K)
    gated = replace(cfg, gate=1.0, beta=math.log(cfg.N - 1))  # prior makes the source weigh as all others
    assert float(O._accuracy(gated, theta, theta)) == pytest.approx(0.5 ** cfg.K)


def test_prediction_rule_on_planted_delays_and_margins():
    nan = math.nan
    delays = pd.DataFrame({"margin": [0, 0, 1, 1, 2, 2, 3, 3], "seed": [0, 1] * 4,
                           "delay": [100, 120, 300, nan, nan, nan, nan, nan]})
    margins = pd.DataFrame({"w": [0, 10, 20, 40], "seed": [0] * 4, "margin": [0.0, 0.5, 1.5, 2.2]})
    p = O.predict_critical_w(margins, delays)
    assert p["m_crit"] == 2.0 and p["w_star"] == 40
    assert p["predicted_delay"][0] == 110.0  # median over seeds at m = 0
    assert math.isinf(p["predicted_delay"][10])  # m = 0.5: beyond the last margin with a finite median delay
    two = O.predict_critical_w(margins, delays.assign(delay=[100, 120, 300, 320, nan, nan, nan, nan]))
    assert two["predicted_delay"][10] == pytest.approx((110 + 310) / 2)  # linear in m between 0 and 1
    assert math.isinf(p["predicted_delay"][40])
    never = O.predict_critical_w(margins, delays.assign(delay=100.0))
    assert never["m_crit"] is None and never["w_star"] is None


def test_critical_w_and_verdict_rules():
    scan = pd.DataFrame({"w": [0, 0, 5, 5, 9, 9], "seed": [0, 1] * 3, "ignited": [True, True, True, False, False, False]})
    assert O.critical_w(scan) == 9 and O.critical_w(scan[scan.w < 9]) is None
    ws = [0, 5, 9, 20]
    good = O.occupation_verdicts({"w_star": 20, "m_crit": 2.0}, 9, {"key side (QK) re-init": (5, 5),
                                                                     "capability query side re-init": (1, 5)}, ws)
    assert list(good.verdict) == ["reproduced"] * 4
    bad = O.occupation_verdicts({"w_star": 0, "m_crit": 0.5}, 20, {"key side (QK) re-init": (3, 5)}, ws)
    assert list(bad.verdict) == ["reproduced", "not reproduced", "not reproduced"]
    none = O.occupation_verdicts({"w_star": None, "m_crit": None}, None, {}, ws)
    assert list(none.verdict) == ["not reproduced", "reproduced"]  # no deadline predicted, none found


def test_no_capability_before_the_switch_and_ignition_from_scratch():
    cfg = replace(O.CONFIG, seeds=3, budget=1500)
    state = O._init(cfg, 3, seed=0)
    never = O.simulate(cfg, state, steps=200, share_from=10**9, seed=0)
    assert (never["ignited"] < 0).all()
    fresh = O.simulate(cfg, state, steps=cfg.budget, share_from=0, seed=0)
    assert (fresh["ignited"] > 0).all() and (np.asarray(fresh["acc"]) > 0.5).all()
