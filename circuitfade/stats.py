"""Statistics shared by every measurement and experiment: one copy of each.

* Proportions (accuracy pooled over answer positions): :func:`binomial_se`,
  :func:`wilson_interval`.
* Means of per-item values: :func:`mean_se`; pooled ratios with examples as clusters
  (loss over answer positions, accuracy of multi-answer sequences): :func:`ratio_se`,
  :func:`proportion_interval`.
* Bootstrap over evaluation examples: :func:`bootstrap_weights` draws ``R``
  resamples of ``n`` examples with replacement once (as count weights ``[R, n]``),
  :func:`bootstrap_ratio` turns per-example sums into ``R`` resampled ratio
  estimates with one matrix product (so every head, every step and every metric can
  share the same resamples), :func:`percentile_interval` reads an interval off them.
* Across seeds: :func:`seed_summary` (mean, sd, sem, Student-t interval), with the
  Student-t CDF/quantile (:func:`t_cdf`, :func:`t_quantile`: the regularized incomplete
  beta function by continued fraction, any real ``df``) and :func:`t_interval`.
* Means of a correlated time series (e.g. a per-step observable of a training run at
  stationarity): :func:`batch_means_interval` (non-overlapping batch means, Student-t).
* Medians over seeds: :func:`bootstrap_median`, :func:`bootstrap_median_ratio` (percentile bootstrap).
* Fits: :func:`nelder_mead` (derivative-free minimiser).
* Comparing intervals: :func:`compare_intervals` (``"higher"``, ``"lower"`` or
  ``"overlap"``).
* Differences of means (one interval per comparison, a :class:`Difference`):
  :func:`paired_t_interval` where the two arms pair (same seeds), :func:`welch_t_interval`
  for independent samples, :func:`satterthwaite_interval` for two summarised estimates
  (standard error and its degrees of freedom; ``df = inf`` on both sides is the normal
  interval, used only when both errors come from large samples).

Everything is plain ``numpy`` (no torch, no scipy) and sits at the bottom of the
package's layers.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

__all__ = [
    "binomial_exact_interval",
    "DEFAULT_LEVEL",
    "DEFAULT_RESAMPLES",
    "batch_means_interval",
    "binomial_se",
    "bootstrap_median",
    "bootstrap_median_ratio",
    "bootstrap_ratio",
    "bootstrap_weights",
    "compare_intervals",
    "Difference",
    "mean_se",
    "nelder_mead",
    "normal_interval",
    "paired_t_interval",
    "percentile_interval",
    "proportion_interval",
    "ratio_se",
    "satterthwaite_interval",
    "seed_summary",
    "t_cdf",
    "t_interval",
    "t_quantile",
    "welch_t_interval",
    "wilson_interval",
    "z_value",
]

DEFAULT_LEVEL = 0.95
"""Coverage of every interval unless told otherwise."""

DEFAULT_RESAMPLES = 200
"""Bootstrap resamples used by the per-head diagnostics unless told otherwise."""


def _check_level(level: float) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a coverage in (0, 1), got {level!r}")
    return float(level)


def z_value(level: float = DEFAULT_LEVEL) -> float:
    """The standard normal quantile ``z`` with ``P(|Z| <= z) = level`` (1.96 for 0.95)."""
    return NormalDist().inv_cdf((1 + _check_level(level)) / 2)


# ------------------------------------------------------------------------- proportions
def binomial_se(p: float, n: int) -> float:
    """Standard error ``sqrt(p (1 - p) / n)`` of a proportion ``p`` measured on ``n`` trials.

    NaN for ``n <= 0`` or a non-finite ``p``.
    """
    p, n = float(p), float(n)
    if n <= 0 or not math.isfinite(p):
        return math.nan
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def wilson_interval(k: float, n: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Wilson score interval ``(lo, hi)`` of a proportion with ``k`` successes in ``n`` trials.

    Unlike ``p ± z·se`` it stays inside [0, 1] and is not degenerate at ``p = 0`` or 1.
    ``(NaN, NaN)`` for ``n <= 0``.
    """
    n = float(n)
    if n <= 0 or not math.isfinite(float(k)):
        return (math.nan, math.nan)
    z = z_value(level)
    p = float(k) / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if float(k) <= 0 else min(lo, p), 1.0 if float(k) >= n else max(hi, p))


def binomial_exact_interval(k: int, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval ``(lo, hi)`` of a proportion: ``k`` successes in ``n`` trials.

    ``lo`` solves ``P(X >= k | lo) = a/2`` and ``hi`` solves ``P(X <= k | hi) = a/2``
    (``a = 1 - level``; ``lo = 0`` at ``k = 0``, ``hi = 1`` at ``k = n``), by bisection on the
    exact binomial tail. E.g. ``0/6`` at 95%: ``(0, 0.4593)``. Bad counts raise ``ValueError``.
    """
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (k, n)) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"binomial_exact_interval: expected integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    a = 1.0 - _check_level(level)
    k, n = int(k), int(n)

    def cdf(j: int, p: float) -> float:  # P(X <= j)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(j + 1))

    def solve(f) -> float:  # f increasing in p on [0, 1], root by bisection
        lo, hi = 0.0, 1.0
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: (1 - cdf(k - 1, p)) - a / 2)
    upper = 1.0 if k == n else solve(lambda p: a / 2 - cdf(k, p))
    return (lower, upper)


def mean_se(values) -> tuple[float, float]:
    """``(mean, sd / sqrt(n))`` of finite ``values`` (sd with ``n - 1``); se NaN for n < 2."""
    x = np.asarray(values, dtype=float).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size < 2:
        return (float(x.mean()), math.nan)
    return (float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)))


def ratio_se(numerators, denominators) -> float:
    """Standard error of the pooled ratio ``Σ num / Σ den`` with examples as clusters.

    ``numerators``: per-example sums (correct answers, summed loss); ``denominators``:
    per-example counts (answer positions). The usual linearised (cluster-robust)
    estimate ``sqrt(n/(n-1) · Σ_b (num_b - r·den_b)²) / Σ den``, right when an example's
    answer positions are correlated. NaN for fewer than two examples with answers.
    """
    num = np.asarray(numerators, dtype=float).reshape(-1)
    den = np.asarray(denominators, dtype=float).reshape(-1)
    keep = den > 0
    num, den = num[keep], den[keep]
    if num.size < 2 or not np.isfinite(num).all():
        return math.nan
    r = num.sum() / den.sum()
    return float(math.sqrt(num.size / (num.size - 1) * float(((num - r * den) ** 2).sum())) / den.sum())


def proportion_interval(correct, counts, level: float = DEFAULT_LEVEL) -> dict[str, float | str]:
    """Point value, standard error and interval of an accuracy pooled over answer positions.

    ``correct``/``counts``: per-example correct answers and answer positions. If every
    example has at most one answer position the answers are independent trials:
    binomial ``se`` and the Wilson interval (``method="binomial"``). Otherwise an
    example's answers are correlated: the by-example :func:`ratio_se` and a normal
    interval clipped to [0, 1] (``method="cluster"``).

    Returns ``{"value", "se", "lo", "hi", "n", "method"}`` (``n``: answer positions).
    """
    c = np.asarray(correct, dtype=float).reshape(-1)
    k = np.asarray(counts, dtype=float).reshape(-1)
    n = float(k.sum())
    if n <= 0 or not np.isfinite(c).all():
        return {"value": math.nan, "se": math.nan, "lo": math.nan, "hi": math.nan, "n": n, "method": "none"}
    p = float(c.sum() / n)
    if float(k.max()) <= 1:
        lo, hi = wilson_interval(c.sum(), n, level)
        return {"value": p, "se": binomial_se(p, n), "lo": lo, "hi": hi, "n": n, "method": "binomial"}
    se = ratio_se(c, k)
    lo, hi = normal_interval(p, se, level)
    return {"value": p, "se": se, "lo": max(0.0, lo), "hi": min(1.0, hi), "n": n, "method": "cluster"}


def normal_interval(value: float, se: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """``value ± z·se``."""
    half = z_value(level) * float(se)
    return (float(value) - half, float(value) + half)


# --------------------------------------------------------------------------- bootstrap
def bootstrap_weights(n: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """Count weights ``[resamples, n]`` of a nonparametric bootstrap over ``n`` examples
    (``n >= 2`` and ``resamples >= 2``; fewer give a zero-width interval, so ``ValueError``).

    Row ``r`` says how often each example occurs in resample ``r`` (``n`` draws with
    replacement, so every row sums to ``n``). Deterministic in ``(n, resamples, seed)``,
    so the same resamples can be applied to every head, step and metric measured on
    the same evaluation set (resample ``r`` is then one coherent alternative eval set).
    """
    for name, v in (("n", n), ("resamples", resamples)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
            raise ValueError(f"{name}: expected an int >= 2, got {v!r} (resampling one example, or drawing one "
                             "resample, gives an interval of zero width)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(int(resamples), int(n)))
    w = np.zeros((int(resamples), int(n)), dtype=np.float64)
    np.add.at(w, (np.repeat(np.arange(int(resamples)), int(n)), idx.reshape(-1)), 1.0)
    return w


def bootstrap_ratio(numerators, denominators, weights: np.ndarray) -> np.ndarray:
    """Resampled ratio estimates ``(w @ num) / (w @ den)``.

    ``numerators``: per-example sums ``[n, ...]`` (e.g. successor mass summed over an
    example's answer positions, or its number of correct answers); ``denominators``:
    per-example counts ``[n]`` (answer positions). With the weights of
    :func:`bootstrap_weights` this is the pooled estimate recomputed on each resample,
    shape ``[R, ...]`` (NaN where a resample has no answer positions).
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64).reshape(-1)
    w = np.asarray(weights, dtype=np.float64)
    if num.shape[0] != den.shape[0] or w.shape[1] != den.shape[0]:
        raise ValueError(
            f"bootstrap_ratio: numerators {num.shape}, denominators {den.shape} and weights {w.shape} "
            "must share the example dimension"
        )
    top = (w @ num.reshape(num.shape[0], -1)).reshape((w.shape[0],) + num.shape[1:])
    bottom = w @ den
    with np.errstate(invalid="ignore", divide="ignore"):
        return top / bottom.reshape((-1,) + (1,) * (num.ndim - 1))


def percentile_interval(boot, level: float = DEFAULT_LEVEL, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval ``(lo, hi)`` of resampled estimates along ``axis``.

    NaN resamples are ignored; all-NaN slices give NaN. Fewer than 2 resamples:
    ``ValueError`` (one value is no interval).
    """
    level = _check_level(level)
    b = np.asarray(boot, dtype=np.float64)
    if b.ndim == 0 or b.shape[axis] < 2:
        raise ValueError(f"percentile_interval: expected at least 2 resamples along axis {axis}, got shape {b.shape}")
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices -> NaN
        lo, hi = np.nanpercentile(b, q, axis=axis)
    return lo, hi


# ------------------------------------------------------------------------- Student t
_CF_EPS = 1e-16
_CF_TINY = 1e-300
_CF_MAXIT = 100_000


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), converging for
    ``x < (a + 1) / (a + b + 2)``."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAXIT + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            h *= d * c
        if abs(d * c - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta: continued fraction did not converge (a={a}, b={b}, x={x})")


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``; ``y = 1 - x`` passed separately so that
    neither side loses digits to cancellation."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log(y) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, y) / b


def _check_df(df: float) -> float:
    if isinstance(df, bool) or not isinstance(df, (int, float, np.integer, np.floating)) or not df > 0:
        raise ValueError(f"df: expected degrees of freedom > 0 (inf allowed), got {df!r}")
    return float(df)


def _t_tail(t: float, df: float) -> float:
    """Upper tail ``P(T > t)`` of Student t for ``t >= 0``: ``½ I_{ν/(ν+t²)}(ν/2, ½)``."""
    if math.isinf(df):
        return NormalDist().cdf(-t)
    t2 = t * t
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def _t_log_pdf(t: float, df: float) -> float:
    return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
            - (df + 1) / 2 * math.log1p(t * t / df))


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF ``P(T <= t)`` with ``df`` degrees of freedom (any real ``df > 0``; ``inf``: normal).

    ``P(T > |t|) = ½ I_{ν/(ν+t²)}(ν/2, ½)`` with the regularized incomplete beta function
    evaluated by its continued fraction (relative accuracy ~1e-14).
    """
    df, t = _check_df(df), float(t)
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = _t_tail(abs(t), df)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile ``t`` of Student t with ``df`` degrees of freedom: ``P(T <= t) = q``.

    ``q`` in (0, 1) (symmetric: ``t_quantile(1 - q) = -t_quantile(q)``), any real ``df > 0``
    (``inf``: the normal quantile). Closed forms for ``df = 1`` (``tan(π(q - ½))``) and
    ``df = 2``; otherwise Newton's method on ``log P(T > t) = log(1 - q)`` in ``log t``,
    kept inside a bracket by bisection, to relative accuracy ~1e-13 (it agrees with
    ``scipy.stats.t.ppf`` to 1e-8 for df 1..100, q up to 0.99995). No scipy needed.
    """
    df = _check_df(df)
    if isinstance(q, bool) or not isinstance(q, (int, float, np.floating)) or not 0 < q < 1:
        raise ValueError(f"q: expected a probability in (0, 1), got {q!r}")
    q = float(q)
    if q == 0.5:
        return 0.0
    sign, p = (1.0, 1.0 - q) if q > 0.5 else (-1.0, q)  # p: the tail beyond |t|
    if math.isinf(df):
        return sign * NormalDist().inv_cdf(1.0 - p) if p > 1e-300 else sign * math.inf
    if df == 1:
        return sign / math.tan(math.pi * p)
    if df == 2:
        return sign * (1.0 - 2.0 * p) / math.sqrt(2.0 * p * (1.0 - p))
    z = NormalDist().inv_cdf(1.0 - p)
    guess = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)  # Cornish-Fisher
    heavy = math.exp((math.log(p * df) + math.lgamma(df / 2) + 0.5 * math.log(df * math.pi)
                      - math.lgamma((df + 1) / 2)) / -df) * math.sqrt(df)  # tail ~ C t^-df
    u = math.log(max(guess, heavy, 1e-8))
    log_p = math.log(p)
    lo, hi = -math.inf, math.inf  # bracket in u = log t: tail(e^lo) > p > tail(e^hi)
    for _ in range(200):
        t = math.exp(u)
        tail = _t_tail(t, df)
        if tail == 0.0:
            hi, g = u, -math.inf
        else:
            g = math.log(tail) - log_p
            if g > 0:
                lo = u
            else:
                hi = u
        if g == 0.0:
            break
        step = g / (t * math.exp(_t_log_pdf(t, df)) / tail) if math.isfinite(g) else math.inf
        new = u + step  # g'(u) = -t pdf(t) / tail(t)
        if not (lo < new < hi):
            new = (lo + hi) / 2 if math.isfinite(lo) and math.isfinite(hi) else (u + 1.0 if g > 0 else u - 1.0)
        if abs(new - u) <= 1e-15 * max(1.0, abs(u)):
            u = new
            break
        u = new
    return sign * math.exp(u)


def t_interval(values: Sequence[float], level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: Student-t interval ``mean ± t_{(1+level)/2, n-1} · sd / √n``
    (``sd`` with ``n-1``); ``lo = hi = NaN`` for fewer than two finite values."""
    x = np.asarray([float(v) for v in values if not math.isnan(float(v))])
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    m = float(x.mean())
    if x.size < 2:
        return (m, math.nan, math.nan)
    half = t_quantile((1 + level) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return (m, m - half, m + half)


def seed_summary(values: Sequence[float], level: float = DEFAULT_LEVEL) -> dict[str, float]:
    """Across-seed summary of finite ``values``: ``{"mean", "sd", "sem", "lo", "hi", "n"}``.

    ``sd`` with ``n - 1``; ``lo, hi`` the Student-t interval of the mean
    (:func:`t_interval`); NaN where undefined (``sd``, ``sem``, ``lo``, ``hi`` for n < 2).
    """
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    m, lo, hi = t_interval(x, level)
    sd = float(np.std(x, ddof=1)) if len(x) >= 2 else math.nan
    return {"mean": m, "sd": sd, "sem": sd / math.sqrt(len(x)) if len(x) >= 2 else math.nan,
            "lo": lo, "hi": hi, "n": len(x)}


# ---------------------------------------------------------------------- comparisons
def compare_intervals(a: tuple[float, float], b: tuple[float, float]) -> str:
    """``"higher"`` if interval ``a`` lies entirely above ``b``, ``"lower"`` if entirely
    below, ``"overlap"`` otherwise, ``"unknown"`` if either bound is NaN."""
    (alo, ahi), (blo, bhi) = a, b
    if any(not math.isfinite(float(v)) for v in (alo, ahi, blo, bhi)):
        return "unknown"
    if alo > bhi:
        return "higher"
    if ahi < blo:
        return "lower"
    return "overlap"


@dataclass(frozen=True)
class Difference:
    """A difference of two means, ``a - scale * b``, with its interval: the one result of every
    two-arm comparison (:func:`paired_t_interval`, :func:`welch_t_interval`,
    :func:`satterthwaite_interval`).

    ``estimate``, ``lo``, ``hi``: the difference and its ``level`` interval
    ``estimate ± t_{(1+level)/2, df} · se`` (NaN ends where it is undefined); ``df`` is ``inf``
    for a normal (z) interval; ``method``: ``"paired t"``, ``"Welch t"`` or ``"normal"``;
    ``n_a``, ``n_b``: values used on each side (pairs: both are the number of pairs).
    Unpacks as ``estimate, lo, hi = difference``.
    """

    estimate: float
    lo: float
    hi: float
    se: float
    df: float
    method: str
    n_a: int
    n_b: int
    level: float = DEFAULT_LEVEL

    def __iter__(self):
        return iter((self.estimate, self.lo, self.hi))

    def __str__(self) -> str:
        if math.isnan(self.estimate):
            return "—"
        if math.isnan(self.lo):
            return f"{self.estimate:+.3f} (no interval)"
        return f"{self.estimate:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


def _floats(values, name: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a sequence of numbers, got {values!r}") from None


def _t_half(se: float, df: float, level: float) -> float:
    if not (math.isfinite(se) and df > 0):
        return math.nan
    return t_quantile((1 + level) / 2, df) * se


def paired_t_interval(a, b, level: float = DEFAULT_LEVEL, *, scale: float = 1.0) -> Difference:
    """Paired Student-t interval of ``mean(a - scale · b)``: ``a[i]`` and ``b[i]`` are one pair
    (e.g. two arms trained from the same seed).

    ``d_i = a_i - scale · b_i``; ``mean(d) ± t_{(1+level)/2, n-1} · sd(d) / √n`` over the ``n``
    pairs where both values are finite (``sd`` with ``n - 1``). ``lo = hi = NaN`` for fewer than
    two pairs. ``ValueError`` if ``a`` and ``b`` differ in length.
    """
    level = _check_level(level)
    x, y = _floats(a, "a"), _floats(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"paired_t_interval: a and b must pair one to one, got lengths {x.size} and {y.size}")
    d = x - float(scale) * y
    d = d[np.isfinite(d)]
    n = int(d.size)
    if n == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, math.nan, "paired t", 0, 0, level)
    m = float(d.mean())
    if n < 2:
        return Difference(m, math.nan, math.nan, math.nan, math.nan, "paired t", n, n, level)
    se = float(d.std(ddof=1)) / math.sqrt(n)
    half = _t_half(se, n - 1, level)
    return Difference(m, m - half, m + half, se, float(n - 1), "paired t", n, n, level)


def satterthwaite_interval(mean_a: float, se_a: float, df_a: float, mean_b: float, se_b: float, df_b: float,
                           level: float = DEFAULT_LEVEL, *, scale: float = 1.0) -> Difference:
    """Interval of ``mean_a - scale · mean_b`` for two independent estimates, each given by its
    standard error and that error's degrees of freedom (Welch-Satterthwaite).

    ``se² = se_a² + scale² se_b²``, ``df = se⁴ / (se_a⁴/df_a + scale⁴ se_b⁴/df_b)``; an
    estimate whose error is known rather than estimated from few values (e.g. a proportion's
    binomial error on hundreds of evaluation examples) has ``df = inf`` and adds nothing to the
    denominator; with both ``inf`` the interval is the normal one (``method="normal"``: z only
    for large n). Both errors zero: ``df = df_a + df_b`` (a zero-width interval). NaN ends
    when an error is NaN. ``n_a``/``n_b`` are reported as ``df + 1`` (0 for ``inf``).
    """
    level = _check_level(level)
    s = float(scale)
    d = float(mean_a) - s * float(mean_b)
    va, vb = float(se_a) ** 2, (s * float(se_b)) ** 2
    fa, fb = float(df_a), float(df_b)
    n_of = lambda f: int(f) + 1 if math.isfinite(f) else 0  # noqa: E731
    if any(math.isnan(v) for v in (va, vb, fa, fb)) or math.isnan(d):
        return Difference(d, math.nan, math.nan, math.nan, math.nan, "Welch t", n_of(fa), n_of(fb), level)
    denom = (va * va / fa if math.isfinite(fa) else 0.0) + (vb * vb / fb if math.isfinite(fb) else 0.0)
    if va + vb == 0:
        df = fa + fb
    else:
        df = (va + vb) ** 2 / denom if denom > 0 else math.inf
    se = math.sqrt(va + vb)
    half = _t_half(se, df, level)
    method = "normal" if math.isinf(df) else "Welch t"
    return Difference(d, d - half, d + half, se, df, method, n_of(fa), n_of(fb), level)


def welch_t_interval(a, b, level: float = DEFAULT_LEVEL, *, scale: float = 1.0) -> Difference:
    """Welch's Student-t interval of ``mean(a) - scale · mean(b)`` for two independent samples
    (unpaired seeds): each side's ``se = sd / √n`` (``sd`` with ``n - 1``, finite values only)
    and the Welch-Satterthwaite degrees of freedom (:func:`satterthwaite_interval`).
    ``lo = hi = NaN`` when a side has fewer than two values.
    """
    level = _check_level(level)
    x, y = _floats(a, "a"), _floats(b, "b")
    x, y = x[np.isfinite(x)], y[np.isfinite(y)]
    ma = float(x.mean()) if x.size else math.nan
    mb = float(y.mean()) if y.size else math.nan
    if x.size < 2 or y.size < 2:
        return Difference(ma - float(scale) * mb, math.nan, math.nan, math.nan, math.nan, "Welch t",
                          int(x.size), int(y.size), level)
    r = satterthwaite_interval(ma, float(x.std(ddof=1)) / math.sqrt(x.size), x.size - 1,
                               mb, float(y.std(ddof=1)) / math.sqrt(y.size), y.size - 1, level, scale=scale)
    return Difference(r.estimate, r.lo, r.hi, r.se, r.df, "Welch t", int(x.size), int(y.size), level)


def sign_test(n_below: int, n: int) -> float:
    """One-sided exact sign test: ``P(X >= n_below)`` for ``X ~ Binomial(n, 1/2)``."""
    if not (isinstance(n, int) and isinstance(n_below, int) and 0 <= n_below <= n):
        raise ValueError(f"sign_test: expected integers 0 <= n_below <= n, got n_below={n_below!r}, n={n!r}")
    if n == 0:
        return float("nan")
    return sum(math.comb(n, k) for k in range(n_below, n + 1)) / 2.0 ** n


# ------------------------------------------------------------------- time series
@functools.lru_cache(maxsize=256)
def _t_half_width_factor(level: float, df: int) -> float:
    return t_quantile((1 + level) / 2, df)


def batch_means_interval(values, n_batches: int = 20, level: float = DEFAULT_LEVEL) -> dict[str, float]:
    """Mean of a (possibly autocorrelated) stationary series with a batch-means interval.

    The series ``x_1..x_n`` is cut into ``n_batches`` contiguous batches of ``m = n // n_batches``
    values (the first ``n - m·n_batches`` values are dropped); the batch means ``y_b`` are treated
    as independent: ``se = sd(y) / sqrt(B)`` and ``mean ± t_{(1+level)/2, B-1} · se``. Valid when
    ``m`` is long compared with the series' autocorrelation time; for a series whose long-run
    variance is zero (a telescoping sum ``x_t = f_t - f_{t+1}``) it is conservative.

    Returns ``{"mean", "se", "lo", "hi", "n", "n_batches", "batch_len"}``; ``ValueError`` for a
    non-finite series or fewer than 2 values per batch.
    """
    x = np.asarray(values, dtype=float).reshape(-1)
    if isinstance(n_batches, bool) or not isinstance(n_batches, (int, np.integer)) or n_batches < 2:
        raise ValueError(f"n_batches must be an integer >= 2, got {n_batches!r}")
    if not np.isfinite(x).all():
        raise ValueError("batch_means_interval: the series has non-finite values")
    m = x.size // n_batches
    if m < 2:
        raise ValueError(f"batch_means_interval: {x.size} values are too few for {n_batches} batches of >= 2")
    used = x[x.size - m * n_batches:]
    y = used.reshape(n_batches, m).mean(axis=1)
    mean, se = float(used.mean()), float(y.std(ddof=1) / math.sqrt(n_batches))
    half = _t_half_width_factor(float(_check_level(level)), int(n_batches) - 1) * se
    return {"mean": mean, "se": se, "lo": mean - half, "hi": mean + half, "n": int(used.size),
            "n_batches": int(n_batches), "batch_len": int(m)}


# --------------------------------------------------------------------------------------
# bootstrap of medians, and a derivative-free minimiser (used by the studies' fits)
# --------------------------------------------------------------------------------------
def bootstrap_median(x, n: int = 2000, seed: int = 0, level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """``(median, lo, hi)``: the sample median with a percentile-bootstrap interval (``n`` resamples
    with replacement, ``numpy.random.default_rng(seed)``). NaNs for an empty sample."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return (float("nan"),) * 3
    a = round((1 - _check_level(level)) / 2, 12)
    b = np.median(np.random.default_rng(seed).choice(x, size=(n, len(x))), axis=1)
    return float(np.median(x)), float(np.quantile(b, a)), float(np.quantile(b, 1 - a))


def bootstrap_median_ratio(a, b, n: int = 4000, seed: int = 0, level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """``median(a) / median(b)`` with a percentile-bootstrap interval (each sample resampled on its own,
    from one generator seeded ``seed``). NaNs when either sample is empty."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0:
        return (float("nan"),) * 3
    q = round((1 - _check_level(level)) / 2, 12)
    rng = np.random.default_rng(seed)
    ra = np.median(rng.choice(a, size=(n, len(a))), axis=1)
    rb = np.median(rng.choice(b, size=(n, len(b))), axis=1)
    r = ra / rb
    return float(np.median(a) / np.median(b)), float(np.quantile(r, q)), float(np.quantile(r, 1 - q))


def nelder_mead(f, x0, steps=(1.0, 0.5, 1.0), iters: int = 2000, tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` by the Nelder-Mead simplex (reflection 1, expansion 2, contraction
    and shrink 1/2; initial simplex ``x0 + steps[i] e_i``); stops when the simplex's values span
    less than ``tol`` or after ``iters`` iterations. Returns ``(x, f(x))`` of the best vertex."""
    x0 = np.asarray(x0, dtype=float)
    simplex = [x0] + [x0 + np.eye(len(x0))[i] * steps[i] for i in range(len(x0))]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                vals = [vals[0]] + [f(x) for x in simplex[1:]]
    i = int(np.argmin(vals))
    return simplex[i], vals[i]
