"""LangevinNoise: the base optimizer bit for bit at T = 0; the analytic stationary variance on a quadratic."""

from __future__ import annotations

import math

import pytest
import torch

from circuitfade.gating.schedules import Linear
from circuitfade.model.transformer import SoftPriorTransformer
from circuitfade.train.langevin import LangevinNoise


def _train(wrap: bool, opt_cls, steps=6, **opt_kw):
    model = SoftPriorTransformer(seed=0)
    opt = opt_cls(model.parameters(), **opt_kw)
    if wrap:
        opt = LangevinNoise(opt, temperature=0.0, seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tokens = torch.randint(0, 32, (4, 12), generator=gen)
        opt.zero_grad()
        model(tokens, return_type="loss").backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("opt_cls,kw", [(torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                                        (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01))])
def test_zero_temperature_is_the_base_optimizer_bit_for_bit(opt_cls, kw):
    plain, wrapped = _train(False, opt_cls, **kw), _train(True, opt_cls, **kw)
    assert all(torch.equal(a, b) for a, b in zip(plain, wrapped))
    assert not all(torch.equal(a, b) for a, b in zip(plain, _train(False, opt_cls, steps=5, **kw)))


def _quadratic(lr, T, k, steps, seed=0, snapshots=()):
    x = torch.nn.Parameter(torch.zeros(k.numel(), dtype=torch.float64))
    opt = LangevinNoise(torch.optim.SGD([x], lr=lr), temperature=T, seed=seed)
    snaps = []
    for t in range(steps):
        opt.zero_grad()
        (0.5 * k * x * x).sum().backward()
        opt.step()
        if t + 1 in snapshots:
            snaps.append(x.detach().clone())
    return x, opt, snaps


def test_stationary_variance_on_a_quadratic_matches_the_discrete_time_value():
    # L = k x^2 / 2 per coordinate, 10k coordinates at k = 1 and 10k at k = 4, SGD lr 0.1, T 0.5.
    # x' = (1 - lr k) x + sqrt(2 lr T) xi has variance T / (k (1 - lr k / 2)) (continuous time: T / k).
    # Relaxation time 1 / (lr k) <= 10 steps: from x = 0 after 300 steps the chain is stationary to
    # (1 - lr k)^600 ~ 1e-27; 5 snapshots 50 steps apart are independent to 0.9^50 = 0.5%.
    # The variance of 50k draws has relative se sqrt(2 / 50k) = 0.63%; tolerance 2.5% (4 se) while
    # the continuous-time value T / k differs from the discrete one by 5.3% (k=1) and 25% (k=4).
    lr, T, n = 0.1, 0.5, 10_000
    k = torch.cat([torch.full((n,), 1.0), torch.full((n,), 4.0)]).double()
    _, _, snaps = _quadratic(lr, T, k, 500, snapshots=(300, 350, 400, 450, 500))
    x = torch.stack(snaps)  # [5, 2n]
    for sl, kk in ((slice(0, n), 1.0), (slice(n, 2 * n), 4.0)):
        var = float((x[:, sl] ** 2).mean())  # mean is 0 exactly by symmetry
        exact = T / (kk * (1 - lr * kk / 2))
        assert abs(var / exact - 1) < 0.025, (kk, var, exact)
        assert abs(var / (T / kk) - 1) > 0.04  # the test tells the discrete-time correction apart


def test_schedule_state_dict_round_trip_is_bit_identical():
    k = torch.ones(100, dtype=torch.float64)
    sched = Linear(1.0, 0.0, 0, 30)
    x = torch.nn.Parameter(torch.zeros(100, dtype=torch.float64))
    opt = LangevinNoise(torch.optim.SGD([x], lr=0.05), temperature=sched, seed=3)

    def run(opt, x, n):
        for _ in range(n):
            opt.zero_grad()
            (0.5 * k * x * x).sum().backward()
            opt.step()

    run(opt, x, 10)
    state, x_mid = opt.state_dict(), x.detach().clone()
    assert state["langevin"]["steps"] == 10 and math.isclose(opt.temperature_now, 1.0 - 10 / 30)
    run(opt, x, 25)
    y = torch.nn.Parameter(x_mid.clone())
    opt2 = LangevinNoise(torch.optim.SGD([y], lr=0.05), temperature=sched.spec, seed=99)
    opt2.load_state_dict(state)
    run(opt2, y, 25)
    assert torch.equal(x, y)
    # past the schedule's end T = 0: no more noise, plain SGD
    before = x.detach().clone()
    run(opt, x, 1)
    assert torch.equal(x.detach(), before.add(before, alpha=-0.05))
    with pytest.raises(ValueError, match="differs"):
        LangevinNoise(torch.optim.SGD([y], lr=0.05), temperature=0.2).load_state_dict(state)


def test_noise_scale_zero_pins_a_group_and_bad_input_is_refused():
    a = torch.nn.Parameter(torch.zeros(50))
    b = torch.nn.Parameter(torch.zeros(50))
    opt = LangevinNoise(torch.optim.SGD([{"params": [a]}, {"params": [b], "noise_scale": 0.0}], lr=0.1), 1.0)
    opt.zero_grad()
    (a.sum() * 0 + b.sum() * 0).backward()
    opt.step()
    assert float(a.abs().sum()) > 0 and torch.equal(b.detach(), torch.zeros(50))
    with pytest.raises(ValueError, match=">= 0"):
        LangevinNoise(torch.optim.SGD([a], lr=0.1), temperature="linear1->-1@0:10")
    with pytest.raises(TypeError):
        LangevinNoise(object())


def test_anneal_demo_sgd_stays_trapped_and_annealing_escapes():
    from studies.alignment.fdt import anneal_demo

    res = anneal_demo(n=300, steps=600, lr=0.01, t_start=0.3, seed=0)
    assert res["sgd"]["deep_well_fraction"] == 0.0  # gradient descent from x = 1 never crosses the barrier
    assert res["anneal"]["lo"] > 0.05  # with noise some particles reach the deep well and stay
    assert res["anneal"]["mean_loss"] < res["sgd"]["mean_loss"]
