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


class _TwoGroups(torch.nn.Module):
    """L = sum k/2 theta^2 + xi . theta with fresh noise xi ~ N(0, sigma_G^2) per group and step:
    g = k theta + xi, so plain SGD at stationarity has T_G = lr sigma_G^2 / (2 - lr k) (+ T / (1 - lr k / 2)
    with Langevin noise of temperature T)."""

    def __init__(self, n, var, generator):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(n, generator=generator, dtype=torch.float64) * var[0] ** 0.5)
        self.b = torch.nn.Parameter(torch.randn(n, generator=generator, dtype=torch.float64) * var[1] ** 0.5)


def _run_two_groups(sigma, T, steps=2000, n=1000, k=1.0, lr=0.1, seed=0):
    from circuitfade.train.langevin import LangevinNoise

    gen = torch.Generator().manual_seed(seed)
    var = [(lr * s * s + 2 * T) / (k * (2 - lr * k)) for s in sigma]  # the exact stationary variance
    model = _TwoGroups(n, var, gen)
    opt = LangevinNoise(torch.optim.SGD(model.parameters(), lr=lr), T, seed=seed + 1000)  # its own stream
    rec = FDTRecorder(group_of=lambda name: name)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(0.5 * k * (p * p).sum() + (torch.randn(n, generator=gen, dtype=torch.float64) * s * p).sum()
                   for p, s in zip((model.a, model.b), sigma))
        loss.backward()
        rec.record(model)
        opt.step()
    return rec


def test_equipartition_measures_sgd_noise_temperatures_per_group():
    from circuitfade.analysis.fdt import equipartition

    lr, k, sigma = 0.1, 1.0, (1.0, 3.0)
    rec = _run_two_groups(sigma, 0.0)
    eq = equipartition(rec, lr, start=200, min_coords=500)
    want = {g: lr * s * s / (2 - lr * k) for g, s in zip("ab", sigma)}  # 0.0526 and 0.474
    by = {r["group"]: r for r in eq["groups"]}
    for g in "ab":
        assert by[g]["lo"] <= want[g] <= by[g]["hi"], (g, by[g], want[g])
        assert abs(by[g]["T_kin"] / want[g] - 1) < 0.05
        assert by[g]["d"] == 1000 and abs(by[g]["T_sgd"] / want[g] - 1) < 0.05  # Yaida per group
    assert eq["hottest"] == "b" and eq["coldest"] == "a" and abs(eq["spread"] / 9.0 - 1) < 0.1
    with pytest.raises(ValueError, match="fewer than 2 groups"):
        equipartition(rec, lr, min_coords=5000)


def test_equipartition_holds_when_langevin_noise_dominates():
    from circuitfade.analysis.fdt import equipartition

    lr, k, T = 0.1, 1.0, 1.0
    rec = _run_two_groups((0.1, 0.3), T)
    eq = equipartition(rec, lr, T, start=200)
    for r in eq["groups"]:  # T / (1 - lr k / 2) = 1.053 plus SGD's 0.0005 / 0.0047
        assert abs(r["T_kin"] / (T / (1 - lr * k / 2)) - 1) < 0.03, r
    assert eq["spread"] < 1.05
    with pytest.raises(ValueError, match="no groups"):
        equipartition(FDTRecorder(), lr)


def test_param_family_covers_the_base_model():
    from studies.alignment.fdt import param_family
    from circuitfade.model import SoftPriorTransformer

    model = SoftPriorTransformer(seed=0)
    sizes = {}
    for name, p in model.named_parameters():
        sizes[param_family(name)] = sizes.get(param_family(name), 0) + p.numel()
    assert set(sizes) == {"embed", "unembed", "QK", "OV", "prior", "norm"}
    c = model.cfg
    assert sizes["QK"] == c.n_layers * 2 * c.n_heads * (c.d_model * c.d_head + c.d_head)  # W_Q, W_K, b_Q, b_K
    assert sizes["OV"] == sizes["QK"] - c.n_layers * c.n_heads * c.d_head + c.n_layers * c.d_model  # b_O: d_model
    assert sizes["embed"] == model.cfg.d_vocab * model.cfg.d_model
    assert sum(sizes.values()) == sum(p.numel() for p in model.parameters())


def _g(group, T, half, d=1000):
    return {"group": group, "d": d, "T_kin": T, "lo": T - half, "hi": T + half}


def test_thermal_call_rule():
    from studies.alignment.fdt import thermal_call

    assert thermal_call([_g("a", 1.0, 0.1), _g("b", 2.0, 0.1)]) == "fails"  # 1.9 > 1.5 * 1.1
    assert thermal_call([_g("a", 1.0, 0.1), _g("b", 1.2, 0.1)]) == "passes"  # 1.3 < 1.5 * 0.9
    assert thermal_call([_g("a", 1.0, 0.1), _g("b", 1.5, 0.1)]) == "inconclusive"
    assert thermal_call([_g("a", 1e-9, 1e-8), _g("b", 1.0, 0.1)]) == "fails"  # a group SGD's noise misses
    assert thermal_call([_g("a", 1e-9, 1e-8), _g("b", 1e-9, 1e-8)]) == "inconclusive"  # lower bound <= 0
    # a small group is left out: 10 coordinates at 100x do not make a run fail
    assert thermal_call([_g("a", 1.0, 0.1), _g("b", 1.1, 0.1), _g("c", 100.0, 1.0, d=10)]) == "passes"


def test_fdt_verdicts_follow_the_rules():
    from studies.alignment.fdt import fdt_verdicts

    def run(arm, thermal, stationary=True, yaida="consistent"):
        return {"arm": arm, "status": "done", "thermal": thermal, "stationary": stationary, "spread": 3.0,
                "spread_without_qk": 2.0, "yaida": {"verdict": yaida, "relative": 0.01}}

    runs = [run("sgd", "fails") for _ in range(4)] + [run("sgd", "inconclusive")]
    runs += [run("langevin", "passes") for _ in range(3)] + [run("langevin", "fails") for _ in range(2)]
    v = fdt_verdicts(runs).set_index("claim").verdict.tolist()
    assert v == ["reproduced", "inconclusive", "reproduced"]
    runs[0]["stationary"] = False
    runs[1]["yaida"] = {"verdict": "violated", "relative": 0.3}
    runs[5:] = [run("langevin", "fails") for _ in range(5)]
    assert [str(x) for x in fdt_verdicts(runs).verdict] == ["not testable", "not reproduced", "not reproduced"]
