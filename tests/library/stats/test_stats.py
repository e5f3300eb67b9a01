"""Student t without scipy, and one interval per comparison (paired t, Welch t, Satterthwaite).

Planted cases with known answers (closed forms, textbook values) and, where scipy is
installed (the ``dev`` extra), agreement with ``scipy.stats`` to 1e-8.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from circuitfade import stats


# ---------------------------------------------------------------------------- t distribution
def test_t_quantile_closed_forms_and_tabulated_values():
    # df 1 (Cauchy): tan(pi (q - 1/2)); q = .99995 is 6366.1977, far above the old cap of 1000
    assert stats.t_quantile(0.99995, 1) == pytest.approx(1 / math.tan(math.pi * 5e-5), rel=1e-12)
    assert stats.t_quantile(0.99995, 1) == pytest.approx(6366.1977, abs=1e-4)
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302652729749464, rel=1e-12)  # 1 / sqrt(... ) closed form
    for df, t975 in ((3, 3.182446305284263), (4, 2.776445105197793), (10, 2.228138851986274),
                     (30, 2.042272456301238), (100, 1.983971518523552)):
        assert stats.t_quantile(0.975, df) == pytest.approx(t975, rel=1e-10)
    assert stats.t_quantile(0.5, 7) == 0.0
    assert stats.t_quantile(0.025, 4) == pytest.approx(-stats.t_quantile(0.975, 4), rel=1e-14)  # symmetry
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(stats.z_value(0.95), rel=1e-14)  # df inf: z
    assert stats.t_quantile(0.975, 2.5) == pytest.approx(3.5746548420036817, rel=1e-12)  # a real df (Welch)


@pytest.mark.parametrize("df", [1, 2, 3, 5, 12, 60])
def test_t_cdf_inverts_t_quantile(df):
    for q in (0.5001, 0.6, 0.9, 0.975, 0.999, 0.99995, 0.3, 1e-6):
        t = stats.t_quantile(q, df)
        assert stats.t_cdf(t, df) == pytest.approx(q, rel=1e-11)
    assert stats.t_cdf(0.0, df) == 0.5 and stats.t_cdf(math.inf, df) == 1.0 and stats.t_cdf(-math.inf, df) == 0.0


def test_t_quantile_agrees_with_scipy_to_1e8():
    st = pytest.importorskip("scipy.stats")
    qs = np.concatenate([np.linspace(0.5, 0.99995, 60), [0.975, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99995]])
    worst = 0.0
    for df in range(1, 101):
        for q, ref in zip(qs, st.t.ppf(qs, df)):
            ours = stats.t_quantile(float(q), df)
            err = abs(ours) if ref == 0 else abs(ours - ref) / abs(ref)
            worst = max(worst, err)
            assert err <= 1e-8, (df, q, ours, ref)
        t = np.array([0.1, 1.0, 2.5, 10.0, -3.0])
        assert np.allclose([stats.t_cdf(float(x), df) for x in t], st.t.cdf(t, df), rtol=1e-10, atol=1e-14)
    assert worst < 1e-10  # it is in fact accurate to ~1e-11 on this grid


def test_t_quantile_is_fast():
    t0 = time.perf_counter()
    for df in range(1, 101):
        stats.t_quantile(0.99995, df)
        stats.t_quantile(0.975, df)
    assert time.perf_counter() - t0 < 2.0  # 200 calls; bisection on Simpson's rule took ~180 ms per call


def test_t_functions_reject_bad_arguments():
    for q in (0.0, 1.0, 1.5, -0.1, math.nan, True):
        with pytest.raises(ValueError, match="q: expected a probability"):
            stats.t_quantile(q, 3)
    for df in (0, -1, math.nan, True, "3"):
        with pytest.raises(ValueError, match="df: expected degrees of freedom"):
            stats.t_quantile(0.9, df)
        with pytest.raises(ValueError, match="df: expected degrees of freedom"):
            stats.t_cdf(1.0, df)


# ------------------------------------------------------------------------- differences of means
def test_paired_t_interval_planted():
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t(.975, 2) = 4.302653
    base = np.array([0.3, 0.1, 0.7])
    d = stats.paired_t_interval(base + [1, 2, 3], base)
    half = 4.302652729749464 / math.sqrt(3)
    assert (d.estimate, d.lo, d.hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half), rel=1e-12)
    assert (d.method, d.df, d.n_a, d.n_b) == ("paired t", 2.0, 3, 3)
    est, lo, hi = d  # unpacks like a (value, lo, hi) tuple
    assert est == d.estimate and str(d) == f"+2.000 [{lo:+.3f}, {hi:+.3f}]"
    # a constant shift has no spread across pairs: a zero-width interval, whatever the arms' spread
    same = stats.paired_t_interval(base + 0.25, base)
    assert same.lo == pytest.approx(0.25) and same.hi == pytest.approx(0.25)
    # scale: a - 1.5 b
    s = stats.paired_t_interval([3.0, 3.0, 3.0], [2.0, 2.0, 2.0], scale=1.5)
    assert (s.estimate, s.lo, s.hi) == (0.0, 0.0, 0.0)
    # incomplete pairs are dropped; fewer than two pairs: no interval
    one = stats.paired_t_interval([1.0, math.nan], [0.0, 1.0])
    assert one.estimate == 1.0 and one.n_a == 1 and math.isnan(one.lo) and math.isnan(one.hi)
    with pytest.raises(ValueError, match="pair one to one"):
        stats.paired_t_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="a: expected a sequence of numbers"):
        stats.paired_t_interval(["x", "y"], [1.0, 2.0])


def test_paired_interval_is_the_removability_maps_margin_interval():
    """The map's margin (fade600->0 - forced_zero, L2 d64 recall, 3 seeds) is a paired t interval."""
    fade = [0.763671875, 0.76171875, 0.822265625]
    fz = [0.759765625, 0.705078125, 0.720703125]
    d = stats.paired_t_interval(fade, fz)
    m, lo, hi = stats.t_interval(np.subtract(fade, fz))
    assert (d.estimate, d.lo, d.hi) == pytest.approx((m, lo, hi), rel=1e-12)


def test_welch_t_interval_planted_and_against_scipy():
    a, b = [20.0, 22.0, 19.0, 21.0, 23.0], [25.0, 30.0, 28.0]
    w = stats.welch_t_interval(a, b)
    va, vb = np.var(a, ddof=1) / 5, np.var(b, ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 4 + vb ** 2 / 2)
    half = stats.t_quantile(0.975, df) * math.sqrt(va + vb)
    assert w.method == "Welch t" and w.df == pytest.approx(df, rel=1e-12) and 2 < w.df < 6
    assert (w.estimate, w.lo, w.hi) == pytest.approx((21 - 83 / 3, 21 - 83 / 3 - half, 21 - 83 / 3 + half), rel=1e-12)
    assert math.isnan(stats.welch_t_interval([1.0], [1.0, 2.0]).lo)  # a side with one value: no interval
    st = pytest.importorskip("scipy.stats")
    ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (w.lo, w.hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    p = st.ttest_rel([1.0, 2.5, 3.0, 4.5], [0.5, 2.0, 3.2, 3.0]).confidence_interval(0.95)
    d = stats.paired_t_interval([1.0, 2.5, 3.0, 4.5], [0.5, 2.0, 3.2, 3.0])
    assert (d.lo, d.hi) == pytest.approx((p.low, p.high), rel=1e-9)


def test_satterthwaite_interval_normal_only_when_both_errors_are_large_sample():
    z = stats.satterthwaite_interval(0.7, 0.02, math.inf, 0.5, 0.02, math.inf)
    assert z.method == "normal" and math.isinf(z.df)
    assert (z.lo, z.hi) == pytest.approx((0.2 - 1.959964 * math.hypot(0.02, 0.02), 0.2 + 1.959964 * math.hypot(0.02, 0.02)),
                                         rel=1e-6)
    # one side estimated from 3 seeds: its 2 degrees of freedom dominate
    t = stats.satterthwaite_interval(0.7, 0.05, 2, 0.5, 0.001, math.inf)
    assert t.method == "Welch t" and t.df == pytest.approx(2 * (0.05 ** 2 + 0.001 ** 2) ** 2 / 0.05 ** 4, rel=1e-12)
    assert t.hi - t.lo > z.hi - z.lo
    nan = stats.satterthwaite_interval(0.7, math.nan, 2, 0.5, 0.01, 4)  # an arm without an error: undecided
    assert nan.estimate == pytest.approx(0.2) and math.isnan(nan.lo) and math.isnan(nan.hi)


def test_t_distribution_keeps_its_digits_at_large_df():
    """For large df the quantile is z + (z³ + z)/(4ν) + O(ν⁻²) (Cornish-Fisher); the continued
    fraction alone lost that correction (df 1e9: -2.6e-7 instead of +2.4e-9) and overflowed at 1e300."""
    z = stats.z_value(0.95)
    for df in (1e5, 1e9, 1e12):
        t = stats.t_quantile(0.975, df)
        assert t - z == pytest.approx((z ** 3 + z) / (4 * df), rel=1e-4)
        assert stats.t_cdf(t, df) == pytest.approx(0.975, rel=1e-14)
    assert stats.t_quantile(0.975, 1e300) == z and stats.t_cdf(-20.0, math.inf) == pytest.approx(2.7536241186e-89, rel=1e-9)
    st = pytest.importorskip("scipy.stats")
    for df in (1e3, 1e4, 99_999.0, 1e5, 1e6, 1e8, 1e12, 1e16):
        for q in (0.6, 0.975, 0.99995, 1e-6):
            assert stats.t_quantile(q, df) == pytest.approx(st.t.ppf(q, df), rel=1e-10), (df, q)
        for t in (0.3, 1.96, 5.0, 20.0):
            assert stats.t_cdf(-t, df) == pytest.approx(st.t.cdf(-t, df), rel=1e-9), (df, t)


# ------------------------------------------------------------------------- rank correlation
def test_spearman_planted_values_ties_and_nan():
    st = pytest.importorskip("scipy.stats")
    assert stats.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6*4/(5*24)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert stats.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)  # ties: average ranks
    assert stats.spearman([3.0, np.inf, 1.0], [2, 3, 1]) == pytest.approx(1.0)  # inf ranks last
    x, y = np.arange(12.0), np.sin(np.arange(12.0))
    assert stats.spearman(x, y) == pytest.approx(st.spearmanr(x, y)[0], abs=1e-12)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))  # a constant side
    assert math.isnan(stats.spearman([1, 2], [1, 2]))  # fewer than three pairs
    # a missing value gives NaN, never a correlation of the other pairs
    assert math.isnan(stats.spearman([1, 2, 3, math.nan, 5], [1, 2, 3, 4, 5]))
    assert math.isnan(stats.spearman([1, 2, 3, 4], [1, math.nan, 3, 4]))
    with pytest.raises(ValueError, match="same length"):
        stats.spearman([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="numbers"):
        stats.spearman("abc", [1, 2, 3])


def test_spearman_bootstrap_drops_nan_pairs_and_is_seeded():
    x = np.arange(20.0)
    y = x + np.sin(x) * 3
    b = stats.spearman_bootstrap(x, y, n_boot=300)
    assert b["lo"] <= b["rho"] <= b["hi"] and b["n"] == 20 and b["n_boot_valid"] == 300
    assert b == stats.spearman_bootstrap(x, y, n_boot=300)  # same seed, same interval
    xn, yn = np.append(x, math.nan), np.append(y, 7.0)
    assert stats.spearman_bootstrap(xn, yn, n_boot=300) == b  # the NaN pair is left out
    short = stats.spearman_bootstrap([1, 2], [2, 1])
    assert math.isnan(short["rho"]) and math.isnan(short["lo"]) and short["n_boot_valid"] == 0
    with pytest.raises(ValueError, match="level"):
        stats.spearman_bootstrap(x, y, level=1.5)


def test_frozen_payload_round_trip_refuses_a_different_payload_and_an_edit(tmp_path):
    import json

    from circuitfade.io import freeze_payload, load_frozen

    path = tmp_path / "constants.json"
    doc = freeze_payload(path, {"beta": 0.5, "c": [1, 2]}, what="frozen constants")
    assert len(doc["sha256"]) == 64 and load_frozen(path) == {"beta": 0.5, "c": [1, 2]}
    freeze_payload(path, {"c": [1, 2], "beta": 0.5})  # the same payload again: fine
    with pytest.raises(ValueError, match="holds different frozen constants"):
        freeze_payload(path, {"beta": 0.6, "c": [1, 2]})
    d = json.loads(path.read_text())
    d["payload"]["beta"] = 0.7  # edited by hand
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="content hash mismatch"):
        load_frozen(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no payload"):
        load_frozen(path)
