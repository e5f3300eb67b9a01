"""One input contract for every statistic and rule (``circuitfade.stats``, ``circuitfade.claims``).

Two parts. First, planted cases with known answers, one per defect the contract removes (each
failed before it). Second, a property-style table: every public name of both modules (read from
``__all__``, so a new function without cases fails :func:`test_every_public_name_has_contract_cases`)
is fed NaN, inf, empty, length-1, mismatched, inverted, string and numpy inputs, and each call
either raises one clear ``ValueError`` or returns an honest value (checked by a predicate, and
never an inverted interval).
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

from circuitfade import claims, stats
from circuitfade.analysis.precursor import median_interval
from circuitfade.claims import Claim, Declaration, Outcome, Verdict, all_of, any_of, at_least, at_most, grade

NAN, INF = math.nan, math.inf


# ---------------------------------------------------------------------------------- planted cases
def test_t_interval_checks_level_and_infinities():
    # level=-0.5 gave an inverted interval that the rules called "reproduced"; level=0 a zero-width one
    for level in (-0.5, 0, 1, 1.5, NAN, "0.95", True):
        with pytest.raises(ValueError, match="level: expected a coverage in \\(0, 1\\)"):
            stats.t_interval([0.71, 0.75, 0.69], level)
    # [.7, .7, inf] had mean inf, graded "partly" by the module docstring's recipe
    with pytest.raises(ValueError, match="t_interval: values: expected finite values"):
        stats.t_interval([0.7, 0.7, INF])
    m, lo, hi = stats.t_interval([0.71, 0.75, 0.69], 0.95)
    assert lo < m < hi and grade(at_least(lo, hi, 0.60), m >= 0.60) is Outcome.REPRODUCED


def test_interval_rules_refuse_inverted_intervals():
    with pytest.raises(ValueError, match="at_least: interval: inverted interval"):
        at_least(0.9, 0.1, 0.5)  # was True
    with pytest.raises(ValueError, match="at_most: interval: inverted interval"):
        at_most(0.9, 0.1, 0.5)
    with pytest.raises(ValueError, match="compare_intervals: a: inverted interval"):
        stats.compare_intervals((0.9, 0.1), (0.3, 0.4))  # was "higher"
    assert at_least(0.1, 0.9, 0.5) is None and at_least(0.6, 0.9, 0.5) is True and at_least(0.1, 0.4, 0.5) is False


def test_rules_are_three_valued_for_numpy_booleans():
    assert grade(np.False_, np.False_) is Outcome.NOT_REPRODUCED  # was inconclusive
    assert grade(np.True_, None) is Outcome.REPRODUCED and grade(np.bool_(False), np.True_) is Outcome.PARTLY
    assert all_of(np.True_, True) is True  # was None
    assert any_of(np.False_, False) is False and any_of(np.False_, np.True_) is True
    assert all_of(np.array(True), np.True_) is True  # a 0-d boolean array is a decision too
    mean = np.float64(0.4)  # a numpy mean compared with a threshold is a numpy boolean
    assert grade(at_least(0.3, 0.5, 0.6), mean >= 0.6) is Outcome.NOT_REPRODUCED
    for bad in (1, 0.0, NAN, "yes", [True, True]):
        with pytest.raises(ValueError, match="expected a decision True, False or None"):
            grade(bad, None)
        with pytest.raises(ValueError, match="all_of: argument 0: expected a decision"):
            all_of(bad)


def test_an_empty_conjunction_is_undecided():
    assert all_of() is None and any_of() is None
    assert grade(all_of(), None) is Outcome.INCONCLUSIVE  # was "reproduced"


def test_bootstrap_medians_give_no_interval_from_one_value_and_refuse_one_resample():
    assert stats.bootstrap_median([3.0])[0] == 3.0 and all(math.isnan(v) for v in stats.bootstrap_median([3.0])[1:])
    m, lo, hi = median_interval([3.0])  # the same behaviour as the analysis side's median
    assert m == 3.0 and math.isnan(lo) and math.isnan(hi)
    r = stats.bootstrap_median_ratio([3.0], [1.0, 2.0])
    assert r[0] == 2.0 and math.isnan(r[1]) and math.isnan(r[2])
    for fn in (lambda n: stats.bootstrap_median([1.0, 2.0], n=n), lambda n: stats.bootstrap_median_ratio([1.0, 2.0], [1.0, 2.0], n=n)):
        with pytest.raises(ValueError, match="n: expected an int >= 2"):
            fn(1)
    # one computation: median_interval is bootstrap_median with infinite entries allowed
    x = [0.1, 0.2, 0.35, INF, 0.05]
    assert median_interval(x, n_boot=500, seed=3) == stats.bootstrap_median(x, n=500, seed=3, inf=True)
    with pytest.raises(ValueError, match="bootstrap_median: x: expected finite values"):
        stats.bootstrap_median(x)


def test_counts_are_checked_against_their_trials():
    with pytest.raises(ValueError, match="proportion_interval: correct and counts must pair one to one"):
        stats.proportion_interval([1, 0, 1], [1, 1])  # was summed
    with pytest.raises(ValueError, match="proportion_interval: correct: expected 0 <= correct <= counts"):
        stats.proportion_interval([2, 2], [1, 1])  # was a proportion of 2.0
    with pytest.raises(ValueError, match="wilson_interval: k: 15.0 successes exceed n = 10.0 trials"):
        stats.wilson_interval(15, 10)  # was (1.08, 1.0)
    with pytest.raises(ValueError, match="wilson_interval: k"):
        stats.wilson_interval(-1, 10)
    assert stats.wilson_interval(10, 10)[1] == 1.0 and stats.proportion_interval([1, 1], [1, 1])["value"] == 1.0


def test_satterthwaite_refuses_degrees_of_freedom_at_or_below_zero():
    for args in ((1.0, 0.0, 0, 0.0, 0.0, 0), (1.0, 0.1, 0, 0.0, 0.0, 2)):  # was ZeroDivisionError
        with pytest.raises(ValueError, match="satterthwaite_interval: df_a: expected degrees of freedom > 0"):
            stats.satterthwaite_interval(*args)
    with pytest.raises(ValueError, match="df_a: expected degrees of freedom > 0"):
        stats.satterthwaite_interval(1.0, 0.1, -3, 0.0, 0.1, 5)  # was a finite interval
    with pytest.raises(ValueError, match="se_b: expected a value in \\[0.0, inf\\]"):
        stats.satterthwaite_interval(1.0, 0.1, 3, 0.0, -0.1, 5)
    zero = stats.satterthwaite_interval(1.0, 0.0, 2, 0.0, 0.0, 2)  # zero variance: a zero-width interval, df 4
    assert (zero.lo, zero.hi, zero.df) == (1.0, 1.0, 4.0)


def test_low_severity_items():
    # t_quantile at a huge df is the normal quantile (was OverflowError)
    assert stats.t_quantile(0.975, 1e300) == pytest.approx(stats.z_value(0.95), rel=1e-15)
    assert stats.t_cdf(1.0, 1e300) == pytest.approx(0.8413447460685429, rel=1e-15)
    # numpy integers are counts (sign_test refused them)
    assert stats.sign_test(np.int64(9), np.int64(10)) == pytest.approx(11 / 1024)
    # None is an undecided end in both directions (at_least raised)
    assert at_least(None, 0.5, 0.3) is None and at_most(None, 0.5, 0.3) is None
    # strings are not values (t_interval converted them)
    with pytest.raises(ValueError, match="t_interval: values: expected a sequence of numbers"):
        stats.t_interval(["0.7", "0.8", "0.9"])
    # a 2x2 array does not pair with a flat list of four (paired_t_interval flattened both)
    with pytest.raises(ValueError, match="paired_t_interval: a: expected 1-d values, got shape \\(2, 2\\)"):
        stats.paired_t_interval(np.array([[1.0, 2.0], [3.0, 4.0]]), [1.0, 2.0, 3.0, 4.0])


def test_a_declaration_cannot_change_after_it_is_hashed():
    data = {"seeds": [0, 1, 2], "claims": {"c": {"min": 0.6, "ps": [0.2, 0.5]}}, "pair": (1, 2)}
    d = Declaration("study", 1, data)
    h = d.sha256()
    data["seeds"].append(3)  # the dict it was built from: no effect (was: the hash changed)
    data["claims"]["c"]["min"] = 0.9
    assert d.sha256() == h and d.data["seeds"] == [0, 1, 2] and d.data["claims"]["c"]["min"] == 0.6
    for change in (lambda: d.data["seeds"].append(3), lambda: d.data["claims"]["c"].update(min=0.1),
                   lambda: d.data.__setitem__("x", 1), lambda: d.data["claims"]["c"]["ps"].__setitem__(0, 0.3),
                   lambda: d.data.pop("seeds"), lambda: d.data["seeds"].sort()):
        with pytest.raises(TypeError, match="cannot change; declare a new version"):
            change()
    assert d.sha256() == h
    # reads, copies and the canonical JSON are those of plain data
    assert d.payload() == {"name": "study", "version": 1, "data": {"seeds": [0, 1, 2], "pair": (1, 2),
                                                                  "claims": {"c": {"min": 0.6, "ps": [0.2, 0.5]}}}}
    assert Declaration("study", 1, {**d.data}).sha256() == h and dict(d.data["claims"]["c"], min=0.7)["min"] == 0.7
    for twin in (copy.deepcopy(d), copy.copy(d), pickle.loads(pickle.dumps(d))):  # declared again: frozen too
        assert twin == d and twin.sha256() == h
        with pytest.raises(TypeError, match="cannot change"):
            twin.data["seeds"].append(3)
    mine = copy.deepcopy(d.data["claims"])  # a copy of part of the data is plain data, free to edit
    mine["c"]["ps"].append(0.8)
    assert type(mine) is dict and d.data["claims"]["c"]["ps"] == [0.2, 0.5]
    assert type(pickle.loads(pickle.dumps(d.data["seeds"]))) is list  # loadable without circuitfade
    plain = d.payload()
    plain["data"]["seeds"].append(9)  # the payload is a copy
    assert d.sha256() == h


# ------------------------------------------------------------------------------ the property table
RAISES = "raises"


def _nan(*xs) -> bool:
    return all(isinstance(x, (float, np.floating)) and math.isnan(x) for x in xs)


def _ordered(lo, hi) -> bool:
    return _nan(lo) or _nan(hi) or lo <= hi


def _honest(name: str, result) -> bool:
    """No inverted interval anywhere in ``result`` (tuples, dicts with lo/hi, Differences)."""
    if name == S + "mean_se":  # (mean, se): not an interval
        return _nan(result[1]) or result[1] >= 0
    if isinstance(result, stats.Difference):
        return _ordered(result.lo, result.hi)
    if isinstance(result, dict) and "lo" in result:
        return _ordered(result["lo"], result["hi"])
    if isinstance(result, tuple) and len(result) in (2, 3) and all(isinstance(v, (float, np.floating)) for v in result):
        return _ordered(*result[-2:])
    return True


W = stats.bootstrap_weights(3, 4)
F64 = np.float64
SQ = lambda x: float(((np.asarray(x) - 1.0) ** 2).sum())  # noqa: E731
S = "stats."
C = "claims."

# name -> [(kind, call, expectation)]: expectation RAISES (a ValueError) or a predicate on the result
CASES: dict[str, list[tuple[str, object, object]]] = {
    S + "DEFAULT_LEVEL": [("value", lambda: stats.check_level(stats.DEFAULT_LEVEL), lambda r: r == 0.95)],
    S + "DEFAULT_RESAMPLES": [("value", lambda: stats.check_count(stats.DEFAULT_RESAMPLES, "r", low=2), lambda r: r == 200)],
    S + "z_value": [
        ("nan", lambda: stats.z_value(NAN), RAISES), ("inf", lambda: stats.z_value(INF), RAISES),
        ("inverted", lambda: stats.z_value(-0.5), RAISES), ("empty", lambda: stats.z_value(0), RAISES),
        ("string", lambda: stats.z_value("0.95"), RAISES),
        ("numpy", lambda: stats.z_value(np.float32(0.95)), lambda r: abs(r - 1.959964) < 1e-5)],
    S + "binomial_se": [
        ("nan", lambda: stats.binomial_se(NAN, 10), _nan), ("inf", lambda: stats.binomial_se(INF, 10), RAISES),
        ("inverted", lambda: stats.binomial_se(1.5, 10), RAISES), ("empty", lambda: stats.binomial_se(0.5, 0), _nan),
        ("mismatched", lambda: stats.binomial_se(0.5, -3), RAISES), ("nan", lambda: stats.binomial_se(0.5, NAN), RAISES),
        ("string", lambda: stats.binomial_se("0.5", 10), RAISES),
        ("numpy", lambda: stats.binomial_se(np.float32(0.5), np.int64(100)), lambda r: r == pytest.approx(0.05))],
    S + "wilson_interval": [
        ("nan", lambda: stats.wilson_interval(NAN, 10), lambda r: _nan(*r)),
        ("nan", lambda: stats.wilson_interval(3, NAN), RAISES), ("inf", lambda: stats.wilson_interval(3, INF), RAISES),
        ("inverted", lambda: stats.wilson_interval(15, 10), RAISES), ("empty", lambda: stats.wilson_interval(0, 0), lambda r: _nan(*r)),
        ("one", lambda: stats.wilson_interval(1, 1), lambda r: 0 < r[0] < r[1] == 1.0),
        ("mismatched", lambda: stats.wilson_interval(-1, 10), RAISES), ("string", lambda: stats.wilson_interval("3", 10), RAISES),
        ("numpy", lambda: stats.wilson_interval(np.int64(5), np.int64(10)), lambda r: r[0] < 0.5 < r[1])],
    S + "binomial_exact_interval": [
        ("nan", lambda: stats.binomial_exact_interval(NAN, 6), RAISES), ("inf", lambda: stats.binomial_exact_interval(0, INF), RAISES),
        ("inverted", lambda: stats.binomial_exact_interval(7, 6), RAISES), ("empty", lambda: stats.binomial_exact_interval(0, 0), RAISES),
        ("one", lambda: stats.binomial_exact_interval(1, 1, 0.95), lambda r: r[1] == 1.0 and 0 < r[0] < 1),
        ("string", lambda: stats.binomial_exact_interval("0", 6), RAISES),
        ("numpy", lambda: stats.binomial_exact_interval(np.int64(0), np.int64(6)), lambda r: r == pytest.approx((0.0, 0.4593), abs=1e-4))],
    S + "mean_se": [
        ("nan", lambda: stats.mean_se([1.0, NAN, 3.0]), lambda r: r[0] == 2.0), ("inf", lambda: stats.mean_se([1.0, INF]), RAISES),
        ("empty", lambda: stats.mean_se([]), lambda r: _nan(*r)), ("one", lambda: stats.mean_se([2.0]), lambda r: r[0] == 2.0 and _nan(r[1])),
        ("mismatched", lambda: stats.mean_se([[1.0, 2.0], [3.0, 4.0]]), RAISES), ("string", lambda: stats.mean_se(["1", "2"]), RAISES),
        ("numpy", lambda: stats.mean_se(np.array([1.0, 3.0], dtype=np.float32)), lambda r: r == pytest.approx((2.0, 1.0)))],
    S + "ratio_se": [
        ("nan", lambda: stats.ratio_se([1.0, NAN], [1, 1]), _nan), ("inf", lambda: stats.ratio_se([1.0, INF], [1, 1]), RAISES),
        ("empty", lambda: stats.ratio_se([], []), _nan), ("one", lambda: stats.ratio_se([1.0], [2]), _nan),
        ("mismatched", lambda: stats.ratio_se([1.0, 0.0, 1.0], [1, 1]), RAISES),
        ("inverted", lambda: stats.ratio_se([1.0, 0.0], [1, -1]), RAISES), ("string", lambda: stats.ratio_se("10", [1, 1]), RAISES),
        ("numpy", lambda: stats.ratio_se(np.array([2, 0]), np.array([2, 2])), lambda r: r > 0)],
    S + "proportion_interval": [
        ("nan", lambda: stats.proportion_interval([1, NAN], [1, 1]), lambda r: r["method"] == "none" and _nan(r["value"])),
        ("nan", lambda: stats.proportion_interval([1, 0], [1, NAN]), RAISES),
        ("inf", lambda: stats.proportion_interval([1, 0], [1, INF]), RAISES),
        ("empty", lambda: stats.proportion_interval([], []), lambda r: r["method"] == "none" and r["n"] == 0),
        ("one", lambda: stats.proportion_interval([1], [1]), lambda r: r["value"] == 1.0 and r["hi"] == 1.0),
        ("mismatched", lambda: stats.proportion_interval([1, 0, 1], [1, 1]), RAISES),
        ("inverted", lambda: stats.proportion_interval([2, 0], [1, 1]), RAISES),
        ("level", lambda: stats.proportion_interval([1, 0], [1, 1], level=0), RAISES),
        ("numpy", lambda: stats.proportion_interval(np.array([1, 0, 1]), np.array([1, 1, 1])), lambda r: r["method"] == "binomial")],
    S + "normal_interval": [
        ("nan", lambda: stats.normal_interval(NAN, 0.1), lambda r: _nan(*r)), ("inf", lambda: stats.normal_interval(0.5, INF), RAISES),
        ("inverted", lambda: stats.normal_interval(0.5, -0.1), RAISES), ("level", lambda: stats.normal_interval(0.5, 0.1, 1.0), RAISES),
        ("string", lambda: stats.normal_interval("0.5", 0.1), RAISES),
        ("numpy", lambda: stats.normal_interval(F64(0.5), np.float32(0.1)), lambda r: r[0] < 0.5 < r[1])],
    S + "bootstrap_weights": [
        ("nan", lambda: stats.bootstrap_weights(NAN), RAISES), ("inf", lambda: stats.bootstrap_weights(INF), RAISES),
        ("one", lambda: stats.bootstrap_weights(1), RAISES), ("one", lambda: stats.bootstrap_weights(5, 1), RAISES),
        ("empty", lambda: stats.bootstrap_weights(0), RAISES), ("string", lambda: stats.bootstrap_weights("5"), RAISES),
        ("numpy", lambda: stats.bootstrap_weights(np.int64(5), np.int64(3)), lambda r: r.shape == (3, 5) and (r.sum(1) == 5).all())],
    S + "bootstrap_ratio": [
        ("nan", lambda: stats.bootstrap_ratio([1.0, NAN, 0.0], [1, 1, 1], W), lambda r: np.isnan(r).all()),
        ("inf", lambda: stats.bootstrap_ratio([1.0, INF, 0.0], [1, 1, 1], W), RAISES),
        ("empty", lambda: stats.bootstrap_ratio([], [], np.zeros((2, 0))), RAISES),
        ("mismatched", lambda: stats.bootstrap_ratio([1.0, 0.0], [1, 1, 1], W), RAISES),
        ("inverted", lambda: stats.bootstrap_ratio([1.0, 0.0, 1.0], [1, 1, 1], -W), RAISES),
        ("string", lambda: stats.bootstrap_ratio(["1", "0", "1"], [1, 1, 1], W), RAISES),
        ("numpy", lambda: stats.bootstrap_ratio(np.array([1, 1, 1]), np.array([1, 1, 1]), W), lambda r: (r == 1.0).all())],
    S + "percentile_interval": [
        ("nan", lambda: stats.percentile_interval([0.0, NAN, 1.0], 0.5), lambda r: (r[0], r[1]) == (0.25, 0.75)),
        ("inf", lambda: stats.percentile_interval([0.0, INF, 1.0]), RAISES),
        ("empty", lambda: stats.percentile_interval([]), RAISES), ("one", lambda: stats.percentile_interval([0.3]), RAISES),
        ("mismatched", lambda: stats.percentile_interval([0.0, 1.0], axis=1), RAISES),
        ("level", lambda: stats.percentile_interval([0.0, 1.0], level=-0.5), RAISES),
        ("string", lambda: stats.percentile_interval(["0", "1"]), RAISES),
        ("numpy", lambda: stats.percentile_interval(np.array([0.0, 1.0], dtype=np.float32), np.float64(0.5)), lambda r: r[0] < r[1])],
    S + "t_cdf": [
        ("nan", lambda: stats.t_cdf(NAN, 3), _nan), ("inf", lambda: stats.t_cdf(INF, 3), lambda r: r == 1.0),
        ("nan", lambda: stats.t_cdf(1.0, NAN), RAISES), ("inverted", lambda: stats.t_cdf(1.0, -3), RAISES),
        ("string", lambda: stats.t_cdf("1.0", 3), RAISES), ("inf", lambda: stats.t_cdf(1.0, 1e300), lambda r: 0.84 < r < 0.85),
        ("numpy", lambda: stats.t_cdf(np.float32(0.0), np.int64(3)), lambda r: r == 0.5)],
    S + "t_quantile": [
        ("nan", lambda: stats.t_quantile(NAN, 3), RAISES), ("inf", lambda: stats.t_quantile(0.975, INF), lambda r: abs(r - 1.96) < 1e-3),
        ("inf", lambda: stats.t_quantile(0.975, 1e300), lambda r: abs(r - 1.96) < 1e-3),
        ("inverted", lambda: stats.t_quantile(1.5, 3), RAISES), ("empty", lambda: stats.t_quantile(0.975, 0), RAISES),
        ("string", lambda: stats.t_quantile("0.975", 3), RAISES),
        ("numpy", lambda: stats.t_quantile(np.float32(0.5), np.int64(3)), lambda r: r == 0.0)],
    S + "chance_overlap": [
        ("nan", lambda: stats.chance_overlap(NAN, 3), RAISES), ("string", lambda: stats.chance_overlap("89", 10), RAISES),
        ("mismatched", lambda: stats.chance_overlap(5, 6), RAISES), ("negative", lambda: stats.chance_overlap(10, -1), RAISES),
        ("numpy", lambda: stats.chance_overlap(np.int64(89), np.int64(10)),
         lambda r: abs(r["shared"] - 100 / 89) < 1e-12 and 0 < r["jaccard"] < 1)],
    S + "spearman": [
        ("nan", lambda: stats.spearman([1, 2, NAN, 4], [1, 2, 3, 4]), lambda r: math.isnan(r)),
        ("string", lambda: stats.spearman(["1", "2", "3"], [1, 2, 3]), RAISES),
        ("mismatched", lambda: stats.spearman([1, 2, 3], [1, 2]), RAISES),
        ("numpy", lambda: stats.spearman(np.arange(5.0), np.arange(5.0) ** 2), lambda r: abs(r - 1.0) < 1e-12)],
    S + "spearman_bootstrap": [
        ("nan", lambda: stats.spearman_bootstrap([1, 2, NAN, 4, 5], [1, 2, 3, 4, 5], n_boot=50),
         lambda r: r["n"] == 4 and abs(r["rho"] - 1.0) < 1e-12),
        ("string", lambda: stats.spearman_bootstrap("abc", [1, 2, 3], n_boot=50), RAISES),
        ("mismatched", lambda: stats.spearman_bootstrap([1, 2, 3], [1, 2], n_boot=50), RAISES),
        ("numpy", lambda: stats.spearman_bootstrap(np.arange(6.0), -np.arange(6.0), n_boot=50),
         lambda r: abs(r["rho"] + 1.0) < 1e-12)],
    S + "t_interval": [
        ("nan", lambda: stats.t_interval([1.0, NAN, 3.0]), lambda r: r[0] == 2.0 and r[1] < 2.0 < r[2]),
        ("inf", lambda: stats.t_interval([0.7, 0.7, INF]), RAISES), ("empty", lambda: stats.t_interval([]), lambda r: _nan(*r)),
        ("one", lambda: stats.t_interval([0.7]), lambda r: r[0] == 0.7 and _nan(r[1], r[2])),
        ("mismatched", lambda: stats.t_interval([[0.7, 0.8]]), RAISES), ("inverted", lambda: stats.t_interval([0.7, 0.8], -0.5), RAISES),
        ("string", lambda: stats.t_interval(["0.7", "0.8"]), RAISES), ("string", lambda: stats.t_interval("0.78"), RAISES),
        ("numpy", lambda: stats.t_interval(np.array([1, 2, 3]), np.float32(0.9)), lambda r: r[1] < 2.0 < r[2])],
    S + "seed_summary": [
        ("nan", lambda: stats.seed_summary([1.0, None, NAN, 3.0]), lambda r: r["n"] == 2 and r["mean"] == 2.0),
        ("inf", lambda: stats.seed_summary([1.0, INF]), RAISES), ("empty", lambda: stats.seed_summary([]), lambda r: r["n"] == 0),
        ("one", lambda: stats.seed_summary([1.0]), lambda r: r["n"] == 1 and _nan(r["lo"], r["sd"])),
        ("string", lambda: stats.seed_summary(["1", "2"]), RAISES), ("level", lambda: stats.seed_summary([1.0, 2.0], 0), RAISES),
        ("numpy", lambda: stats.seed_summary(np.array([1.0, 3.0])), lambda r: r["sd"] == pytest.approx(math.sqrt(2)))],
    S + "compare_intervals": [
        ("nan", lambda: stats.compare_intervals((NAN, 0.5), (0.4, 0.6)), lambda r: r == "unknown"),
        ("inf", lambda: stats.compare_intervals((0.7, INF), (0.4, 0.6)), lambda r: r == "higher"),
        ("inverted", lambda: stats.compare_intervals((0.9, 0.1), (0.3, 0.4)), RAISES),
        ("inverted", lambda: stats.compare_intervals((0.1, 0.2), (0.4, 0.3)), RAISES),
        ("one", lambda: stats.compare_intervals((0.1,), (0.3, 0.4)), RAISES), ("empty", lambda: stats.compare_intervals((), (0.3, 0.4)), RAISES),
        ("string", lambda: stats.compare_intervals(("0.1", "0.2"), (0.3, 0.4)), RAISES),
        ("numpy", lambda: stats.compare_intervals(np.array([0.1, 0.2]), (F64(0.3), F64(0.4))), lambda r: r == "lower")],
    S + "Difference": [
        ("nan", lambda: stats.Difference(NAN, NAN, NAN, NAN, NAN, "paired t", 0, 0), lambda r: _nan(r.lo)),
        ("inverted", lambda: stats.Difference(0.5, 0.9, 0.1, 0.1, 2.0, "paired t", 3, 3), RAISES),
        ("inf", lambda: stats.Difference(INF, 0.1, 0.9, 0.1, 2.0, "paired t", 3, 3), RAISES),
        ("inverted", lambda: stats.Difference(0.5, 0.1, 0.9, -0.1, 2.0, "paired t", 3, 3), RAISES),
        ("numpy", lambda: stats.Difference(F64(0.5), F64(0.1), F64(0.9), F64(0.1), F64(2.0), "paired t", 3, 3), lambda r: str(r).startswith("+0.500"))],
    S + "paired_t_interval": [
        ("nan", lambda: stats.paired_t_interval([1.0, NAN, 3.0, 5.0], [0.0, 1.0, 1.0, 2.0]), lambda r: r.n_a == 3),
        ("inf", lambda: stats.paired_t_interval([1.0, INF], [0.0, 1.0]), RAISES),
        ("empty", lambda: stats.paired_t_interval([], []), lambda r: _nan(r.estimate, r.lo)),
        ("one", lambda: stats.paired_t_interval([1.0], [0.5]), lambda r: r.estimate == 0.5 and _nan(r.lo, r.hi)),
        ("mismatched", lambda: stats.paired_t_interval([1.0, 2.0], [1.0]), RAISES),
        ("mismatched", lambda: stats.paired_t_interval(np.ones((2, 2)), [1.0, 1.0, 1.0, 1.0]), RAISES),
        ("inverted", lambda: stats.paired_t_interval([1.0, 2.0], [0.0, 0.5], level=-0.5), RAISES),
        ("string", lambda: stats.paired_t_interval(["1", "2"], [1.0, 2.0]), RAISES),
        ("nan", lambda: stats.paired_t_interval([1.0, 2.0], [0.0, 0.5], scale=NAN), RAISES),
        ("numpy", lambda: stats.paired_t_interval(np.array([1, 2, 4]), np.array([0, 0, 1]), scale=np.float32(1)), lambda r: r.lo < r.estimate < r.hi)],
    S + "welch_t_interval": [
        ("nan", lambda: stats.welch_t_interval([1.0, NAN, 2.0], [3.0, 4.0, 6.0]), lambda r: r.n_a == 2),
        ("inf", lambda: stats.welch_t_interval([1.0, INF], [3.0, 4.0]), RAISES),
        ("empty", lambda: stats.welch_t_interval([], [3.0, 4.0]), lambda r: _nan(r.estimate, r.lo)),
        ("one", lambda: stats.welch_t_interval([1.0], [3.0, 4.0]), lambda r: r.estimate == -2.5 and _nan(r.lo)),
        ("mismatched", lambda: stats.welch_t_interval([[1.0, 2.0]], [3.0, 4.0]), RAISES),
        ("inverted", lambda: stats.welch_t_interval([1.0, 2.0], [3.0, 4.0], 0), RAISES),
        ("string", lambda: stats.welch_t_interval("12", [3.0, 4.0]), RAISES),
        ("numpy", lambda: stats.welch_t_interval(np.array([1, 2, 3]), np.array([4.0, 6.0])), lambda r: r.lo < r.estimate < r.hi)],
    S + "satterthwaite_interval": [
        ("nan", lambda: stats.satterthwaite_interval(0.7, NAN, 2, 0.5, 0.01, 4), lambda r: _nan(r.lo, r.hi)),
        ("inf", lambda: stats.satterthwaite_interval(INF, 0.1, 2, 0.5, 0.01, 4), RAISES),
        ("inf", lambda: stats.satterthwaite_interval(0.7, 0.1, INF, 0.5, 0.1, INF), lambda r: r.method == "normal"),
        ("empty", lambda: stats.satterthwaite_interval(1.0, 0.0, 0, 0.0, 0.0, 0), RAISES),
        ("inverted", lambda: stats.satterthwaite_interval(1.0, 0.1, -3, 0.0, 0.1, 5), RAISES),
        ("inverted", lambda: stats.satterthwaite_interval(1.0, -0.1, 3, 0.0, 0.1, 5), RAISES),
        ("string", lambda: stats.satterthwaite_interval("1.0", 0.1, 3, 0.0, 0.1, 5), RAISES),
        ("numpy", lambda: stats.satterthwaite_interval(F64(0.7), np.float32(0.05), np.int64(2), F64(0.5), F64(0.001), INF),
         lambda r: r.method == "Welch t" and r.lo < 0.2 < r.hi)],
    S + "sign_test": [
        ("nan", lambda: stats.sign_test(NAN, 10), RAISES), ("inf", lambda: stats.sign_test(3, INF), RAISES),
        ("inverted", lambda: stats.sign_test(5, 3), RAISES), ("empty", lambda: stats.sign_test(0, 0), _nan),
        ("string", lambda: stats.sign_test("3", 10), RAISES),
        ("numpy", lambda: stats.sign_test(np.int64(32), np.int32(32)), lambda r: r == pytest.approx(2 ** -32))],
    S + "batch_means_interval": [
        ("nan", lambda: stats.batch_means_interval([1.0, NAN] * 10, 2), RAISES),
        ("inf", lambda: stats.batch_means_interval([1.0, INF] * 10, 2), RAISES),
        ("empty", lambda: stats.batch_means_interval([], 2), RAISES), ("one", lambda: stats.batch_means_interval([1.0], 2), RAISES),
        ("mismatched", lambda: stats.batch_means_interval(np.ones((4, 4)), 2), RAISES),
        ("level", lambda: stats.batch_means_interval(np.arange(8.0), 2, level=1), RAISES),
        ("string", lambda: stats.batch_means_interval(["1"] * 8, 2), RAISES),
        ("numpy", lambda: stats.batch_means_interval(np.arange(8, dtype=np.float32), np.int64(2)), lambda r: r["mean"] == 3.5)],
    S + "bootstrap_median": [
        ("nan", lambda: stats.bootstrap_median([1.0, NAN]), RAISES), ("inf", lambda: stats.bootstrap_median([1.0, INF]), RAISES),
        ("inf", lambda: stats.bootstrap_median([1.0, 2.0, INF], inf=True), lambda r: r[0] == 2.0 and r[2] == INF),
        ("empty", lambda: stats.bootstrap_median([]), lambda r: _nan(*r)),
        ("one", lambda: stats.bootstrap_median([3.0]), lambda r: r[0] == 3.0 and _nan(r[1], r[2])),
        ("one", lambda: stats.bootstrap_median([1.0, 2.0], n=1), RAISES),
        ("mismatched", lambda: stats.bootstrap_median([[1.0, 2.0]]), RAISES),
        ("level", lambda: stats.bootstrap_median([1.0, 2.0], level=0), RAISES),
        ("string", lambda: stats.bootstrap_median(["1", "2"]), RAISES),
        ("numpy", lambda: stats.bootstrap_median(np.array([1, 2, 3]), n=np.int64(50)), lambda r: r[0] == 2.0 and r[1] <= 2.0 <= r[2])],
    S + "bootstrap_median_ratio": [
        ("nan", lambda: stats.bootstrap_median_ratio([1.0, NAN], [1.0, 2.0]), RAISES),
        ("inf", lambda: stats.bootstrap_median_ratio([1.0, 2.0], [1.0, INF]), RAISES),
        ("empty", lambda: stats.bootstrap_median_ratio([], [1.0, 2.0]), lambda r: _nan(*r)),
        ("one", lambda: stats.bootstrap_median_ratio([3.0], [1.0, 2.0]), lambda r: r[0] == 2.0 and _nan(r[1], r[2])),
        ("one", lambda: stats.bootstrap_median_ratio([1.0, 2.0], [1.0, 2.0], n=1), RAISES),
        ("mismatched", lambda: stats.bootstrap_median_ratio([[1.0, 2.0]], [1.0, 2.0]), RAISES),
        ("inverted", lambda: stats.bootstrap_median_ratio([1.0, 2.0], [0.0, 0.0]), lambda r: _nan(*r)),
        ("string", lambda: stats.bootstrap_median_ratio(["1", "2"], [1.0, 2.0]), RAISES),
        ("numpy", lambda: stats.bootstrap_median_ratio(np.array([2, 4, 6]), np.array([1.0, 2.0, 3.0]), n=100),
         lambda r: r[0] == 2.0 and r[1] <= r[2])],
    S + "nelder_mead": [
        ("nan", lambda: stats.nelder_mead(SQ, [NAN, 0.0]), RAISES), ("inf", lambda: stats.nelder_mead(SQ, [INF, 0.0]), RAISES),
        ("empty", lambda: stats.nelder_mead(SQ, []), RAISES),
        ("mismatched", lambda: stats.nelder_mead(SQ, [0.0] * 4), RAISES),
        ("string", lambda: stats.nelder_mead("f", [0.0, 0.0]), RAISES),
        ("one", lambda: stats.nelder_mead(SQ, [0.0]), lambda r: abs(r[0][0] - 1.0) < 1e-3),
        ("numpy", lambda: stats.nelder_mead(SQ, np.zeros(2, dtype=np.float32), iters=np.int64(500)), lambda r: np.allclose(r[0], 1.0, atol=1e-3))],
    S + "check_number": [
        ("nan", lambda: stats.check_number(NAN, "x", nan=False), RAISES), ("nan", lambda: stats.check_number(NAN, "x"), _nan),
        ("inf", lambda: stats.check_number(INF, "x"), RAISES), ("inverted", lambda: stats.check_number(2.0, "x", high=1.0), RAISES),
        ("string", lambda: stats.check_number("1", "x"), RAISES), ("string", lambda: stats.check_number(True, "x"), RAISES),
        ("empty", lambda: stats.check_number(None, "x"), RAISES),
        ("numpy", lambda: stats.check_number(np.array(2.5, dtype=np.float32), "x"), lambda r: r == 2.5)],
    S + "check_count": [
        ("nan", lambda: stats.check_count(NAN, "x"), RAISES), ("inf", lambda: stats.check_count(INF, "x"), RAISES),
        ("inverted", lambda: stats.check_count(-1, "x"), RAISES), ("string", lambda: stats.check_count(True, "x"), RAISES),
        ("numpy", lambda: stats.check_count(np.int64(3), "x"), lambda r: r == 3 and type(r) is int)],
    S + "check_level": [
        ("nan", lambda: stats.check_level(NAN), RAISES), ("inf", lambda: stats.check_level(INF), RAISES),
        ("inverted", lambda: stats.check_level(-0.5), RAISES), ("empty", lambda: stats.check_level(0), RAISES),
        ("string", lambda: stats.check_level("0.9"), RAISES),
        ("numpy", lambda: stats.check_level(np.float32(0.5)), lambda r: r == 0.5)],
    S + "check_values": [
        ("nan", lambda: stats.check_values([1.0, NAN], "x"), lambda r: np.isnan(r[1])),
        ("inf", lambda: stats.check_values([1.0, INF], "x"), RAISES),
        ("inf", lambda: stats.check_values([1.0, INF], "x", inf=True), lambda r: r[1] == INF),
        ("empty", lambda: stats.check_values([], "x"), lambda r: r.shape == (0,)),
        ("one", lambda: stats.check_values(0.5, "x"), RAISES), ("mismatched", lambda: stats.check_values([[1.0], [2.0, 3.0]], "x"), RAISES),
        ("mismatched", lambda: stats.check_values([[1.0, 2.0]], "x"), RAISES), ("string", lambda: stats.check_values(["1"], "x"), RAISES),
        ("string", lambda: stats.check_values([1.0, None], "x"), RAISES),
        ("numpy", lambda: stats.check_values(np.array([1, 2], dtype=np.int8), "x"), lambda r: r.dtype == np.float64)],
    S + "check_interval": [
        ("nan", lambda: stats.check_interval(NAN, 0.5), lambda r: _nan(r[0]) and r[1] == 0.5),
        ("inf", lambda: stats.check_interval(-INF, INF), lambda r: r == (-INF, INF)),
        ("inverted", lambda: stats.check_interval(0.9, 0.1), RAISES), ("empty", lambda: stats.check_interval(None, None), lambda r: _nan(*r)),
        ("string", lambda: stats.check_interval("0.1", 0.9), RAISES),
        ("numpy", lambda: stats.check_interval(np.float32(0.25), F64(0.5)), lambda r: r == (0.25, 0.5))],
    # ------------------------------------------------------------------------------------ claims
    C + "Outcome": [
        ("nan", lambda: Outcome.parse(NAN), RAISES), ("empty", lambda: Outcome.parse(""), RAISES),
        ("string", lambda: Outcome.parse("reproduce"), RAISES),
        ("numpy", lambda: Outcome.parse(np.str_("partly (full rule undecided)")), lambda r: r is Outcome.PARTLY)],
    C + "Claim": [
        ("nan", lambda: Claim(NAN, "rule"), RAISES), ("empty", lambda: Claim("", "rule"), RAISES),
        ("string", lambda: Claim("c", "rule", study=0.734), RAISES),
        ("numpy", lambda: Claim(str(np.str_("c")), "r"), lambda r: r.name == "c")],
    C + "Verdict": [  # the outcome's type is checked (TypeError, as for any wrong type); the rest is Claim's contract
        ("nan", lambda: Verdict(Claim("c", "r"), "—", Outcome.NOT_RUN), lambda r: r.word == "not run")],
    C + "VERDICT_COLUMNS": [("value", lambda: claims.VERDICT_COLUMNS, lambda r: r == ("claim", "ours", "study", "rule", "verdict"))],
    C + "verdict_table": [
        ("empty", lambda: claims.verdict_table([]), lambda r: len(r) == 0 and list(r.columns) == list(claims.VERDICT_COLUMNS)),
        ("mismatched", lambda: claims.verdict_table([Verdict.not_run(Claim("c", "r"))], extra={"x": [1, 2]}), RAISES)],
    C + "Provenance": [
        ("nan", lambda: claims.Provenance.parse(NAN), RAISES), ("empty", lambda: claims.Provenance.parse(""), RAISES),
        ("string", lambda: claims.Provenance.parse("declared"), RAISES),
        ("numpy", lambda: claims.Provenance.parse(np.str_("not declared")), lambda r: r is claims.Provenance.NOT_DECLARED)],
    C + "PROVENANCE_COLUMNS": [("value", lambda: claims.PROVENANCE_COLUMNS, lambda r: r == ("seeds run", "provenance"))],
    C + "seeds_cell": [
        ("nan", lambda: claims.seeds_cell(NAN, 3), RAISES), ("inf", lambda: claims.seeds_cell(1, INF), RAISES),
        ("inverted", lambda: claims.seeds_cell(-1, 3), RAISES), ("empty", lambda: claims.seeds_cell(None, 3), lambda r: r == "—"),
        ("string", lambda: claims.seeds_cell("1", 3), RAISES),
        ("numpy", lambda: claims.seeds_cell(np.int64(1), np.int32(3)), lambda r: r == "1 of 3")],
    C + "at_least": [
        ("nan", lambda: at_least(NAN, 0.9, 0.5), lambda r: r is None), ("nan", lambda: at_least(0.6, 0.9, NAN), lambda r: r is None),
        ("empty", lambda: at_least(None, 0.9, 0.5), lambda r: r is None),
        ("inf", lambda: at_least(0.6, INF, 0.5), lambda r: r is True), ("inf", lambda: at_least(0.6, 0.9, INF), RAISES),
        ("inverted", lambda: at_least(0.9, 0.1, 0.5), RAISES), ("string", lambda: at_least("0.6", 0.9, 0.5), RAISES),
        ("numpy", lambda: at_least(F64(0.1), np.float32(0.4), np.int64(0)), lambda r: r is True)],
    C + "at_most": [
        ("nan", lambda: at_most(0.1, NAN, 0.5), lambda r: r is None), ("empty", lambda: at_most(0.1, None, 0.5), lambda r: r is None),
        ("inf", lambda: at_most(-INF, 0.4, 0.5), lambda r: r is True), ("inf", lambda: at_most(0.1, 0.4, -INF), RAISES),
        ("inverted", lambda: at_most(0.9, 0.1, 0.5), RAISES), ("string", lambda: at_most(0.1, 0.4, "0.5"), RAISES),
        ("numpy", lambda: at_most(F64(0.6), np.float32(0.9), np.int64(0)), lambda r: r is False)],
    C + "all_of": [
        ("nan", lambda: all_of(True, NAN), RAISES), ("empty", lambda: all_of(), lambda r: r is None),
        ("one", lambda: all_of(np.False_), lambda r: r is False), ("string", lambda: all_of("True"), RAISES),
        ("mismatched", lambda: all_of([True, True]), RAISES), ("numpy", lambda: all_of(np.True_, True), lambda r: r is True)],
    C + "any_of": [
        ("nan", lambda: any_of(False, NAN), RAISES), ("empty", lambda: any_of(), lambda r: r is None),
        ("one", lambda: any_of(None), lambda r: r is None), ("string", lambda: any_of(1), RAISES),
        ("numpy", lambda: any_of(np.False_, False), lambda r: r is False)],
    C + "grade": [
        ("nan", lambda: grade(NAN, None), RAISES), ("empty", lambda: grade(all_of(), None), lambda r: r is Outcome.INCONCLUSIVE),
        ("string", lambda: grade("True", None), RAISES), ("mismatched", lambda: grade(True, None, have=None), RAISES),
        ("numpy", lambda: grade(np.False_, np.False_), lambda r: r is Outcome.NOT_REPRODUCED),
        ("numpy", lambda: grade(None, None, testable=np.False_), lambda r: r is Outcome.NOT_TESTABLE)],
    C + "Declaration": [
        ("nan", lambda: Declaration("d", NAN), RAISES), ("empty", lambda: Declaration("", 1), RAISES),
        ("string", lambda: Declaration("d", 1, "seeds=3"), RAISES), ("numpy", lambda: Declaration("d", 1, {"n": np.int64(3)}), RAISES),
        ("inf", lambda: Declaration("d", 1, {"x": (1, 2)}), lambda r: r.payload()["data"] == {"x": (1, 2)})],
}


def test_every_public_name_has_contract_cases():
    public = {S + n for n in stats.__all__} | {C + n for n in claims.__all__}
    assert set(CASES) == public, f"missing: {sorted(public - set(CASES))}, stale: {sorted(set(CASES) - public)}"
    # every function that takes numbers is fed a NaN, a non-number and a numpy input at least
    for name, cases in CASES.items():
        obj = eval(name, {"stats": stats, "claims": claims})  # noqa: S307 - the table's own names
        if callable(obj) and name not in (C + "Verdict", C + "verdict_table"):
            kinds = {k for k, _, _ in cases}
            assert {"nan", "numpy"} <= kinds and kinds & {"string", "inf"}, (name, kinds)


@pytest.mark.parametrize("name,kind,call,expect", [(n, k, c, e) for n, cases in CASES.items() for k, c, e in cases],
                         ids=[f"{n}-{k}-{i}" for n, cases in CASES.items() for i, (k, _, _) in enumerate(cases)])
def test_bad_input_raises_a_clear_value_error_or_gives_an_honest_value(name, kind, call, expect):
    if expect == RAISES:
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert msg and "\n" not in msg and len(msg) < 400, msg  # one clear line
        return
    result = call()
    assert expect(result), (name, kind, result)
    assert _honest(name, result), (name, kind, result)
