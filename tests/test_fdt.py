"""The fluctuation-dissipation statistic: zero within its interval at the stated rate on planted
stationary processes, clearly nonzero on a run still descending."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitfade.analysis.fdt import FDTRecorder, displacement_statistic, fdt_observation, fdt_statistic
from circuitfade.stats import batch_means_interval

LR, K, D = 0.1, 1.0, 4  # relaxation time of x: 1 / (lr k) = 10 steps
STEPS, BATCHES = 2000, 20  # batches of 100 steps = 10 relaxation times
R = 400  # independent draws; binomial se of a 95% coverage: 1.1%


def _planted(rng, sigma=1.0, T=0.0, independent=False, x0_scale=1.0, steps=STEPS, k=K):
    """SGD on L = k x^2 / 2 with gradient noise N(0, sigma^2) (and Langevin noise of temperature T), for R
    draws of D coordinates, started from the exact stationary law (x0_scale = 1): per-step theta.g, |g|^2."""
    var = (LR**2 * sigma**2 + 2 * LR * T) / (1 - (1 - LR * k) ** 2)
    x = rng.normal(0, np.sqrt(var) * x0_scale, (R, D))
    dot, sq, start_sq = np.empty((steps, R)), np.empty((steps, R)), (x * x).sum(1)
    for t in range(steps):
        g = k * x + rng.normal(0, sigma, (R, D))
        g_meas = k * x + rng.normal(0, sigma, (R, D)) if independent else g
        dot[t], sq[t] = (x * g_meas).sum(1), (g * g).sum(1)
        x = x - LR * g + (np.sqrt(2 * LR * T) * rng.normal(0, 1, (R, D)) if T else 0.0)
    return dot, sq, start_sq, (x * x).sum(1)


def _coverage(dot, sq, T=0.0):
    res = [fdt_statistic(dot[:, r], sq[:, r], LR, T, n_params=D, n_batches=BATCHES) for r in range(R)]
    return np.mean([s["lo"] <= 0 <= s["hi"] for s in res]), res


@pytest.mark.parametrize("case", ["langevin", "independent_measurement"])
def test_zero_within_the_interval_at_the_stated_rate(case):
    rng = np.random.default_rng(0 if case == "langevin" else 1)
    kw = dict(T=0.3) if case == "langevin" else dict(independent=True)
    dot, sq, _, _ = _planted(rng, **kw)
    cov, res = _coverage(dot, sq, kw.get("T", 0.0))
    assert 0.90 <= cov <= 0.99, cov  # nominal 0.95; batch means is slightly anti-conservative for short batches
    values = np.array([s["value"] for s in res])
    assert abs(values.mean()) < 3 * values.std() / np.sqrt(R)  # unbiased over draws
    if case == "langevin":  # the d T term is there and large: without it the relation is violated
        wrong = fdt_statistic(dot[:, 0], sq[:, 0], LR, 0.0, n_params=D)
        assert wrong["verdict"] == "violated" and abs(wrong["relative"]) > 0.5


def test_plain_sgd_telescopes_and_its_interval_is_conservative():
    rng = np.random.default_rng(2)
    dot, sq, first, last = _planted(rng)
    s = fdt_statistic(dot[:, 0], sq[:, 0], LR)
    # the window mean is exactly (|theta_a|^2 - |theta_b|^2) / (2 lr n)
    assert np.isclose(s["value"], (first[0] - last[0]) / (2 * LR * STEPS), rtol=1e-8, atol=1e-12)
    cov, _ = _coverage(dot, sq)
    assert cov >= 0.99  # zero long-run variance: the batch-means interval is wider than needed


def test_nonzero_while_still_descending():
    rng = np.random.default_rng(3)
    # k = 0.02: relaxation time 500 steps, so over 200 steps from 10 sd the run descends throughout
    dot, sq, _, _ = _planted(rng, x0_scale=10.0, steps=200, k=0.02)
    s = fdt_statistic(dot[:, 0], sq[:, 0], LR, n_batches=10)
    assert s["verdict"] == "violated" and s["lo"] > 0 and s["relative"] > 1.0


def test_recorder_reads_the_gradient_the_step_applies():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    rec = FDTRecorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    theta_sq = []
    for _ in range(40):
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        rec.record(model)
        theta_sq.append(sum(float((p.double() ** 2).sum()) for p in model.parameters()))
        opt.step()
    theta_sq.append(sum(float((p.double() ** 2).sum()) for p in model.parameters()))
    dot, sq, d = fdt_observation(model)
    assert d == 8 and len(rec) == 40
    # per step: theta.g - lr/2 |g|^2 = (|theta_t|^2 - |theta_t+1|^2) / (2 lr) (float32 weights)
    o = np.array(rec.theta_dot_grad) - 0.05 * np.array(rec.grad_sq)
    assert np.allclose(o, -np.diff(theta_sq) / 0.2, rtol=1e-4, atol=1e-5)
    s = rec.statistic(0.1, start=0, n_batches=4)
    assert np.isclose(s["value"], o.mean())


def test_displacement_form_and_bad_input():
    rng = np.random.default_rng(4)
    theta = rng.normal(size=(1001, 3))  # an iid (so stationary) sequence of parameter vectors
    delta = np.diff(theta, axis=0)
    s = displacement_statistic((theta[:-1] * delta).sum(1), (delta**2).sum(1), n_batches=10)
    assert s["verdict"] == "consistent"
    with pytest.raises(ValueError, match="n_params"):
        fdt_statistic([1.0] * 40, [1.0] * 40, 0.1, 0.5)
    with pytest.raises(ValueError, match="lr"):
        fdt_statistic([1.0] * 40, [1.0] * 40, 0.0)
    with pytest.raises(ValueError, match="too few"):
        batch_means_interval([1.0] * 10, n_batches=20)
    with pytest.raises(ValueError, match="non-finite"):
        batch_means_interval([1.0, float("nan")] * 20)
    bm = batch_means_interval(np.arange(40.0), n_batches=4)
    assert bm["batch_len"] == 10 and np.isclose(bm["mean"], 19.5)


def test_langevin_wrapper_satisfies_the_relation_end_to_end():
    """SGD + LangevinNoise on L = k x^2 / 2 (1,000 coordinates started at the stationary law), read by the
    recorder: O = <x.g> - (lr/2)<|g|^2> - d T is 0 within its interval and small against d T."""
    from circuitfade.train.langevin import LangevinNoise

    lr, T, k, d, steps = 0.1, 0.5, 1.0, 1000, 2000
    gen = torch.Generator().manual_seed(0)
    x = torch.nn.Parameter(torch.randn(d, generator=gen, dtype=torch.float64) * (T / (k * (1 - lr * k / 2))) ** 0.5)
    opt = LangevinNoise(torch.optim.SGD([x], lr=lr), temperature=T, seed=0)
    rec = FDTRecorder()
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * k * x * x).sum().backward()
        rec.record([x])
        opt.step()
    s = rec.statistic(lr, T)
    assert s["verdict"] == "consistent", s
    assert abs(s["value"]) < 0.01 * d * T  # the d T term (500) is recovered to 1%
    assert rec.statistic(lr, 0.0)["verdict"] == "violated"  # leaving the noise term out is detected
