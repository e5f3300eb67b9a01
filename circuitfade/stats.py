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
* Counts: :func:`binomial_exact_interval` (Clopper-Pearson), :func:`sign_test` (exact, one-sided),
  :func:`chance_overlap` (expected overlap of two random subsets: hypergeometric).
* Fits: :func:`nelder_mead` (derivative-free minimiser).
* Comparing intervals: :func:`compare_intervals` (``"higher"``, ``"lower"`` or
  ``"overlap"``).
* Differences of means (one interval per comparison, a :class:`Difference`):
  :func:`paired_t_interval` where the two arms pair (same seeds), :func:`welch_t_interval`
  for independent samples, :func:`satterthwaite_interval` for two summarised estimates
  (standard error and its degrees of freedom; ``df = inf`` on both sides is the normal
  interval, used only when both errors come from large samples).

Input contract: every public function checks its input at the door with the shared checks
(:func:`check_level`, :func:`check_number`, :func:`check_count`, :func:`check_values`,
:func:`check_interval`, also used by :mod:`circuitfade.claims`) and refuses bad input with one
``ValueError`` naming the function and the argument: a ``level`` outside (0, 1), ±inf, strings,
shapes that do not pair, counts above their trials, fewer than 2 resamples, inverted interval
ends. NaN means a missing value: a sample's NaN entries are dropped where a function says so,
and a NaN scalar gives a NaN result. One value gives no interval (NaN ends), never a zero-width one.

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
    "chance_overlap",
    "check_count",
    "check_interval",
    "check_level",
    "check_number",
    "check_values",
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
    "sign_test",
    "spearman",
    "spearman_bootstrap",
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


# ------------------------------------------------------------------- the input contract
# Every public function below checks its input here, at the door, and refuses bad input with
# one ValueError naming the argument. NaN means "missing": a sample's NaN entries are dropped
# where a function says so, and a NaN scalar gives a NaN result (an undecided rule). Infinities,
# strings, shapes that do not pair, counts above their trials, a level outside (0, 1) and an
# interval whose ends are inverted are refused.
def _is_real(x) -> bool:
    """A real scalar: Python or numpy int/float (0-d arrays included), never a bool or a string."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    return not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, float, np.integer, np.floating))


def check_number(x, name: str, *, nan: bool = True, inf: bool = False, low: float | None = None,
                 high: float | None = None) -> float:
    """``x`` as a float, or ``ValueError`` naming ``name``.

    ``x`` must be a real number (Python or numpy; not a bool, a string or ``None``). ``nan``: NaN is
    allowed (a missing value; the caller returns NaN); ``inf``: ±inf is allowed; ``low``/``high``:
    inclusive bounds checked on non-NaN values.
    """
    if not _is_real(x):
        raise ValueError(f"{name}: expected a real number, got {x!r}")
    v = float(x.item() if isinstance(x, np.ndarray) else x)
    if math.isnan(v):
        if not nan:
            raise ValueError(f"{name}: expected a number, got NaN")
        return v
    if math.isinf(v) and not inf:
        raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name}: expected a value in [{low if low is not None else '-inf'}, "
                         f"{high if high is not None else 'inf'}], got {v!r}")
    return v


def check_count(x, name: str, *, low: int = 0) -> int:
    """``x`` as an ``int`` (Python or numpy integer, not a bool) ``>= low``, or ``ValueError`` naming ``name``."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {x!r}")
    return int(x)


def check_level(level, name: str = "level") -> float:
    """A coverage ``0 < level < 1`` as a float, or ``ValueError`` (``level=0`` would give a zero-width
    interval, a negative level an inverted one)."""
    if not _is_real(level) or not 0 < float(level) < 1:
        raise ValueError(f"{name}: expected a coverage in (0, 1), got {level!r}")
    return float(level)


def check_values(values, name: str, *, inf: bool = False, ndim: int = 1) -> np.ndarray:
    """``values`` as a float array of ``ndim`` dimensions (default: a 1-d sample), or ``ValueError``
    naming ``name``.

    Accepts lists, tuples, numpy arrays and pandas Series of real numbers (booleans count as 0/1);
    refuses strings, ``None`` entries, ragged or nested input of the wrong depth, and ±inf unless
    ``inf``. NaN entries are kept: each caller says whether it drops or refuses them.
    """
    if isinstance(values, (str, bytes)) or values is None:
        raise ValueError(f"{name}: expected a sequence of numbers, got {values!r}")
    try:
        raw = np.asarray(values)
    except ValueError:
        raise ValueError(f"{name}: expected a sequence of numbers, got a ragged sequence") from None
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"{name}: expected a sequence of numbers, got {_short(values)}")
    x = raw.astype(np.float64)
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim}-d values, got shape {x.shape}")
    if not inf and np.isinf(x).any():
        raise ValueError(f"{name}: expected finite values, got {_short(values)}")
    return x


def check_interval(lo, hi, name: str = "interval") -> tuple[float, float]:
    """The ends ``(lo, hi)`` of an interval as floats, or ``ValueError`` naming ``name``.

    Each end is a real number; NaN (or ``None``) is an unknown end, ±inf an unbounded one.
    Ordered ends are required: ``lo > hi`` (an inverted interval) is refused.
    """
    ends = tuple(math.nan if v is None else check_number(v, f"{name} {side}", inf=True)
                 for v, side in ((lo, "lo"), (hi, "hi")))
    if ends[0] > ends[1]:
        raise ValueError(f"{name}: inverted interval, lo {ends[0]!r} > hi {ends[1]!r}")
    return ends


def _at_least_two(n, name: str) -> int:
    """A count of examples, resamples or batches: an int >= 2 (one gives an interval of zero width)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"{name}: expected an int >= 2, got {n!r} (one example, one resample or one batch "
                         "gives an interval of zero width)")
    return int(n)


def _short(values) -> str:
    text = repr(values)
    return text if len(text) <= 80 else text[:77] + "..."


def z_value(level: float = DEFAULT_LEVEL) -> float:
    """The standard normal quantile ``z`` with ``P(|Z| <= z) = level`` (1.96 for 0.95)."""
    return NormalDist().inv_cdf((1 + check_level(level)) / 2)


# ------------------------------------------------------------------------- proportions
def binomial_se(p: float, n: int) -> float:
    """Standard error ``sqrt(p (1 - p) / n)`` of a proportion ``p`` measured on ``n`` trials.

    NaN for ``n = 0`` (no trials) or a NaN ``p`` (a missing value). ``ValueError`` for ``p``
    outside [0, 1] or infinite, and for a negative or non-finite ``n``.
    """
    p = check_number(p, "binomial_se: p", low=0.0, high=1.0)
    n = check_number(n, "binomial_se: n", nan=False, low=0.0)
    if n == 0 or math.isnan(p):
        return math.nan
    return math.sqrt(p * (1 - p) / n)


def _successes(k, n, fn: str) -> tuple[float, float]:
    """``(k, n)`` checked as a success count (NaN allowed: missing) within ``n >= 0`` trials."""
    n = check_number(n, f"{fn}: n", nan=False, low=0.0)
    k = check_number(k, f"{fn}: k", low=0.0)
    if k > n:
        raise ValueError(f"{fn}: k: {k!r} successes exceed n = {n!r} trials")
    return k, n


def wilson_interval(k: float, n: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Wilson score interval ``(lo, hi)`` of a proportion with ``k`` successes in ``n`` trials.

    Unlike ``p ± z·se`` it stays inside [0, 1] and is not degenerate at ``p = 0`` or 1.
    ``(NaN, NaN)`` for ``n = 0`` or a NaN ``k``; ``ValueError`` for ``k`` outside [0, n], a negative
    or non-finite ``n`` or a ``level`` outside (0, 1). ``k`` need not be an integer (a proportion
    times its trials).
    """
    z = z_value(level)
    k, n = _successes(k, n, "wilson_interval")
    if n == 0 or math.isnan(k):
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if k <= 0 else min(lo, p), 1.0 if k >= n else max(hi, p))


def binomial_exact_interval(k: int, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval ``(lo, hi)`` of a proportion: ``k`` successes in ``n`` trials.

    ``lo`` solves ``P(X >= k | lo) = a/2`` and ``hi`` solves ``P(X <= k | hi) = a/2``
    (``a = 1 - level``; ``lo = 0`` at ``k = 0``, ``hi = 1`` at ``k = n``), by bisection on the
    exact binomial tail. E.g. ``0/6`` at 95%: ``(0, 0.4593)``. Bad counts raise ``ValueError``.
    """
    k = check_count(k, "binomial_exact_interval: k")
    n = check_count(n, "binomial_exact_interval: n", low=1)
    if k > n:
        raise ValueError(f"binomial_exact_interval: expected integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    a = 1.0 - check_level(level)
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
    """``(mean, sd / sqrt(n))`` of a 1-d sample (sd with ``n - 1``); NaN entries are missing values
    and dropped; se NaN for n < 2, both NaN for an empty sample. ``ValueError`` for ±inf entries."""
    x = check_values(values, "mean_se: values")
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size < 2:
        return (float(x.mean()), math.nan)
    return (float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size)))


def _per_example(numerators, denominators, fn: str, num_name: str, den_name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-example sums and counts that pair one to one; counts finite and >= 0."""
    num = check_values(numerators, f"{fn}: {num_name}")
    den = check_values(denominators, f"{fn}: {den_name}")
    if num.shape != den.shape:
        raise ValueError(f"{fn}: {num_name} and {den_name} must pair one to one, got lengths {num.size} and {den.size}")
    if np.isnan(den).any() or (den < 0).any():
        raise ValueError(f"{fn}: {den_name}: expected counts >= 0 without NaN")
    return num, den


def ratio_se(numerators, denominators) -> float:
    """Standard error of the pooled ratio ``Σ num / Σ den`` with examples as clusters.

    ``numerators``: per-example sums (correct answers, summed loss); ``denominators``:
    per-example counts (answer positions). The usual linearised (cluster-robust)
    estimate ``sqrt(n/(n-1) · Σ_b (num_b - r·den_b)²) / Σ den``, right when an example's
    answer positions are correlated. NaN for fewer than two examples with answers or a NaN
    numerator; ``ValueError`` for lengths that do not pair, negative or NaN counts, ±inf.
    """
    num, den = _per_example(numerators, denominators, "ratio_se", "numerators", "denominators")
    keep = den > 0
    num, den = num[keep], den[keep]
    if num.size < 2 or np.isnan(num).any():
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

    Returns ``{"value", "se", "lo", "hi", "n", "method"}`` (``n``: answer positions); NaN
    numbers and ``method="none"`` when there are no answer positions or a ``correct`` entry is
    NaN. ``ValueError`` for lengths that do not pair, negative or NaN counts, an example with more
    correct answers than answer positions, ±inf, or a ``level`` outside (0, 1).
    """
    level = check_level(level)
    c, k = _per_example(correct, counts, "proportion_interval", "correct", "counts")
    if ((c < 0) | (c > k)).any():
        raise ValueError("proportion_interval: correct: expected 0 <= correct <= counts for every example")
    n = float(k.sum())
    if n <= 0 or np.isnan(c).any():
        return {"value": math.nan, "se": math.nan, "lo": math.nan, "hi": math.nan, "n": n, "method": "none"}
    p = float(c.sum()) / n
    if float(k.max()) <= 1:
        lo, hi = wilson_interval(float(c.sum()), n, level)
        return {"value": p, "se": binomial_se(p, n), "lo": lo, "hi": hi, "n": n, "method": "binomial"}
    se = ratio_se(c, k)
    lo, hi = normal_interval(p, se, level)
    return {"value": p, "se": se, "lo": max(0.0, lo), "hi": min(1.0, hi), "n": n, "method": "cluster"}


def normal_interval(value: float, se: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """``value ± z·se``; NaN ends for a NaN ``value`` or ``se``. ``ValueError`` for ±inf, a negative
    ``se`` (it would invert the interval) or a ``level`` outside (0, 1)."""
    z = z_value(level)
    value = check_number(value, "normal_interval: value")
    se = check_number(se, "normal_interval: se", low=0.0)
    half = z * se
    return (value - half, value + half)


# --------------------------------------------------------------------------- bootstrap
def bootstrap_weights(n: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """Count weights ``[resamples, n]`` of a nonparametric bootstrap over ``n`` examples
    (``n >= 2`` and ``resamples >= 2``; fewer give a zero-width interval, so ``ValueError``).

    Row ``r`` says how often each example occurs in resample ``r`` (``n`` draws with
    replacement, so every row sums to ``n``). Deterministic in ``(n, resamples, seed)``,
    so the same resamples can be applied to every head, step and metric measured on
    the same evaluation set (resample ``r`` is then one coherent alternative eval set).
    """
    n, resamples = _at_least_two(n, "n"), _at_least_two(resamples, "resamples")
    check_count(seed, "bootstrap_weights: seed")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(int(resamples), int(n)))
    flat = (idx + int(n) * np.arange(int(resamples))[:, None]).reshape(-1)  # resample r's draws -> row r
    return np.bincount(flat, minlength=int(resamples) * int(n)).reshape(int(resamples), int(n)).astype(np.float64)


def bootstrap_ratio(numerators, denominators, weights: np.ndarray) -> np.ndarray:
    """Resampled ratio estimates ``(w @ num) / (w @ den)``.

    ``numerators``: per-example sums ``[n, ...]`` (e.g. successor mass summed over an
    example's answer positions, or its number of correct answers); ``denominators``:
    per-example counts ``[n]`` (answer positions). With the weights of
    :func:`bootstrap_weights` this is the pooled estimate recomputed on each resample,
    shape ``[R, ...]`` (NaN where a resample has no answer positions). ``ValueError`` for
    shapes that do not share the example dimension, ±inf, negative or NaN counts or weights.
    """
    num = np.asarray(numerators)
    num = check_values(num, "bootstrap_ratio: numerators", ndim=max(num.ndim, 1))
    den = check_values(denominators, "bootstrap_ratio: denominators")
    w = check_values(weights, "bootstrap_ratio: weights", ndim=2)
    if num.shape[0] != den.shape[0] or w.shape[1] != den.shape[0]:
        raise ValueError(
            f"bootstrap_ratio: numerators {num.shape}, denominators {den.shape} and weights {w.shape} "
            "must share the example dimension"
        )
    if den.size == 0:
        raise ValueError("bootstrap_ratio: expected at least one example, got none")
    for name, v in (("denominators", den), ("weights", w)):
        if np.isnan(v).any() or (v < 0).any():
            raise ValueError(f"bootstrap_ratio: {name}: expected counts >= 0 without NaN")
    top = (w @ num.reshape(num.shape[0], -1)).reshape((w.shape[0],) + num.shape[1:])
    bottom = w @ den
    with np.errstate(invalid="ignore", divide="ignore"):
        return top / bottom.reshape((-1,) + (1,) * (num.ndim - 1))


def percentile_interval(boot, level: float = DEFAULT_LEVEL, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval ``(lo, hi)`` of resampled estimates along ``axis``.

    NaN resamples are ignored; all-NaN slices give NaN. Fewer than 2 resamples:
    ``ValueError`` (one value is no interval); so are ±inf resamples and an ``axis`` the array lacks.
    """
    level = check_level(level)
    b = np.asarray(boot)
    b = check_values(b, "percentile_interval: boot", ndim=max(b.ndim, 1))
    axis = check_count(axis, "percentile_interval: axis", low=-b.ndim)
    if axis >= b.ndim:
        raise ValueError(f"percentile_interval: axis {axis} out of range for shape {b.shape}")
    if b.shape[axis] < 2:
        raise ValueError(f"percentile_interval: expected at least 2 resamples along axis {axis}, got shape {b.shape}")
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices -> NaN
        lo, hi = np.nanpercentile(b, q, axis=axis)
    return lo, hi


# ---------------------------------------------------------------------------- overlaps
def chance_overlap(n: int, k: int, k2: int | None = None) -> dict[str, float]:
    """Expected overlap of two independent uniformly random subsets of ``k`` and ``k2`` (default
    ``k``) of ``n`` items: the chance baseline of a circuit overlap.

    The shared count ``I`` is hypergeometric, ``P(I = i) = C(k, i) C(n - k, k2 - i) / C(n, k2)``.
    Returns ``{"shared"}`` (``E[I]`` = ``k k2 / n``), ``"fraction"`` (``E[I] / k``: the expected
    share of the first subset found in the second) and ``"jaccard"`` (``E[I / (k + k2 - I)]``,
    exact over the distribution; 1 for two empty subsets). ``ValueError`` unless
    ``0 <= k, k2 <= n``.
    """
    n = check_count(n, "chance_overlap: n")
    k = check_count(k, "chance_overlap: k")
    k2 = k if k2 is None else check_count(k2, "chance_overlap: k2")
    if k > n or k2 > n:
        raise ValueError(f"chance_overlap: subset sizes k={k}, k2={k2} must not exceed n={n}")
    total = math.comb(n, k2)
    lo, hi = max(0, k + k2 - n), min(k, k2)
    jac = 0.0
    for i in range(lo, hi + 1):
        p = math.comb(k, i) * math.comb(n - k, k2 - i) / total
        union = k + k2 - i
        jac += p * (i / union if union else 1.0)
    shared = k * k2 / n if n else 0.0
    return {"shared": shared, "fraction": shared / k if k else math.nan, "jaccard": jac}


# ------------------------------------------------------------------------- rank correlation
def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties given their average rank (exact halves)."""
    order = np.argsort(x, kind="mergesort")
    _, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranks


def _paired(x, y, fn: str) -> tuple[np.ndarray, np.ndarray]:
    x = check_values(x, f"{fn}: x", inf=True)
    y = check_values(y, f"{fn}: y", inf=True)
    if x.shape != y.shape:
        raise ValueError(f"{fn}: expected two 1-d sequences of the same length, got {x.size} and {y.size} values")
    return x, y


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of paired values (average ranks for ties).

    NaN when a value on either side is NaN (a missing value: drop the pair first, as
    :func:`spearman_bootstrap` does, to correlate the rest), for fewer than three pairs and
    when either side is constant. ``ValueError`` for sequences of different lengths, strings
    or nested input.
    """
    x, y = _paired(x, y, "spearman")
    if x.size < 3 or np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    rx, ry = _average_ranks(x), _average_ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_bootstrap(x, y, *, n_boot: int = 2000, seed: int = 0, level: float = DEFAULT_LEVEL) -> dict:
    """``{"rho", "lo", "hi", "n", "n_boot_valid"}``: :func:`spearman` of the pairs with no NaN side
    (``n`` of them) and its percentile bootstrap interval (pairs resampled with replacement,
    ``numpy.random.default_rng(seed)``; resamples with a constant side are dropped and
    ``n_boot_valid`` counts the rest). ``lo = hi = NaN`` with no valid resample (fewer than three pairs)."""
    x, y = _paired(x, y, "spearman_bootstrap")
    level = check_level(level)
    n_boot = check_count(n_boot, "spearman_bootstrap: n_boot")
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    rho = spearman(x, y)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot if len(x) >= 3 else 0):
        i = rng.integers(0, len(x), len(x))
        r = spearman(x[i], y[i])
        if not math.isnan(r):
            boots.append(r)
    a = (1 - level) / 2
    lo, hi = (float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))) if boots else (math.nan, math.nan)
    return {"rho": rho, "lo": lo, "hi": hi, "n": int(len(x)), "n_boot_valid": len(boots)}


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


def _betainc(a: float, b: float, x: float, y: float, log_front: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``; ``y = 1 - x`` passed separately so that
    neither side loses digits to cancellation, and ``log_front = a log x + b log y - log B(a, b)``
    computed by the caller (who can do it without cancellation)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, y) / b


_NORMAL_DF = 1e20
"""Above this many degrees of freedom Student t equals the normal distribution to double precision."""

_EXPANSION_DF = 1e5
"""From this many degrees of freedom on, the continued fraction loses digits (``1 - x`` cancels for
``x = ν/(ν+t²)`` near 1) and the Cornish-Fisher expansion is the more accurate: relative error
~1e-13 for ``|t|`` up to 8, ~1e-9 in the far tails."""


def _t_from_z(z: float, df: float) -> float:
    """Cornish-Fisher expansion of the Student-t quantile in the normal one, four terms in ``1/ν``
    (Abramowitz & Stegun 26.7.5); ``1/ν`` powers by repeated division, so no ``ν²`` overflows."""
    z2 = z * z
    terms = (z * (z2 + 1) / 4, z * (3 + z2 * (16 + 5 * z2)) / 96, z * (-15 + z2 * (17 + z2 * (19 + 3 * z2))) / 384,
             z * (-945 + z2 * (-1920 + z2 * (1482 + z2 * (776 + 79 * z2)))) / 92160)
    t, f = z, 1.0
    for g in terms:
        f /= df
        t += g * f
    return t


def _z_from_t(t: float, df: float) -> float:
    """The ``z`` with ``_t_from_z(z, df) = t`` (``t >= 0``), by Newton's method from ``z = t``."""
    z = t
    for _ in range(100):
        step = (_t_from_z(z, df) - t) / (1 + (3 * z * z + 1) / (4 * df))
        z -= step
        if abs(step) <= 1e-16 * max(1.0, abs(z)):
            break
    return z


def _lgamma_half(a: float) -> float:
    """``log Γ(a + ½) - log Γ(a)`` without the cancellation of two huge ``lgamma`` values: the
    asymptotic series ``½ log a - 1/(8a) + 1/(192a³) + 1/(640a⁵) - 17/(14336a⁷)`` for ``a >= 50``."""
    if a < 50:
        return math.lgamma(a + 0.5) - math.lgamma(a)
    r = 1.0 / a
    r2 = r * r
    return 0.5 * math.log(a) + r * (-1 / 8 + r2 * (1 / 192 + r2 * (1 / 640 - r2 * 17 / 14336)))


def _check_df(df: float) -> float:
    if not _is_real(df) or not float(df) > 0:
        raise ValueError(f"df: expected degrees of freedom > 0 (inf allowed), got {df!r}")
    return float(df)


def _t_tail(t: float, df: float) -> float:
    """Upper tail ``P(T > t)`` of Student t for ``t >= 0``: ``½ I_{ν/(ν+t²)}(ν/2, ½)``."""
    if df > _NORMAL_DF:
        return 0.5 * math.erfc(t / math.sqrt(2))
    t2 = t * t
    if t2 == 0.0:
        return 0.5
    if df >= _EXPANSION_DF and t2 <= df:
        return 0.5 * math.erfc(_z_from_t(t, df) / math.sqrt(2))
    a = df / 2.0
    log_x, log_y = -math.log1p(t2 / df), -math.log1p(df / t2)  # x = ν/(ν+t²), y = t²/(ν+t²)
    log_front = a * log_x + 0.5 * log_y - (0.5 * math.log(math.pi) - _lgamma_half(a))  # log B(a, ½) = log Γ(½) - (log Γ(a+½) - log Γ(a))
    return 0.5 * _betainc(a, 0.5, df / (df + t2), t2 / (df + t2), log_front)


def _t_log_pdf(t: float, df: float) -> float:
    return _lgamma_half(df / 2) - 0.5 * math.log(df) - 0.5 * math.log(math.pi) - (df + 1) / 2 * math.log1p(t * t / df)


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF ``P(T <= t)`` with ``df`` degrees of freedom (any real ``df > 0``; ``inf``: normal).

    ``P(T > |t|) = ½ I_{ν/(ν+t²)}(ν/2, ½)`` with the regularized incomplete beta function
    evaluated by its continued fraction (relative accuracy ~1e-14; ``log B(ν/2, ½)`` by its
    asymptotic series for large ``ν``, so ``df = 1e12`` keeps its digits). NaN for a NaN ``t``;
    ``ValueError`` for a ``t`` or ``df`` that is not a real number, or ``df <= 0``.
    """
    df, t = _check_df(df), check_number(t, "t_cdf: t", inf=True)
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
    if not _is_real(q) or not 0 < float(q) < 1:
        raise ValueError(f"q: expected a probability in (0, 1), got {q!r}")
    q = float(q)
    if q == 0.5:
        return 0.0
    sign, p = (1.0, 1.0 - q) if q > 0.5 else (-1.0, q)  # p: the tail beyond |t|
    if df > _NORMAL_DF:
        return -sign * NormalDist().inv_cdf(p)
    if df == 1:
        return sign / math.tan(math.pi * p)
    if df == 2:
        return sign * (1.0 - 2.0 * p) / math.sqrt(2.0 * p * (1.0 - p))
    z = -NormalDist().inv_cdf(p)
    if df >= _EXPANSION_DF and _t_from_z(z, df) ** 2 <= df:
        return sign * _t_from_z(z, df)
    guess = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df) / df  # Cornish-Fisher
    heavy = math.exp((math.log(p) + 1.5 * math.log(df) + 0.5 * math.log(math.pi)
                      - _lgamma_half(df / 2)) / -df) * math.sqrt(df)  # tail ~ C t^-df
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


def _sample(values, name: str) -> np.ndarray:
    """A 1-d sample with its NaN entries (missing values) dropped; ±inf, strings, ``None`` entries
    and nested input refused."""
    x = check_values(values, name)
    return x[~np.isnan(x)]


def t_interval(values: Sequence[float], level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: Student-t interval ``mean ± t_{(1+level)/2, n-1} · sd / √n``
    (``sd`` with ``n-1``) over the values that are not NaN (a NaN is a missing value).

    ``lo = hi = NaN`` for fewer than two values (one value is no interval), all three NaN for none.
    ``ValueError`` for ±inf, strings or nested values, and a ``level`` outside (0, 1).
    """
    level = check_level(level)
    x = _sample(values, "t_interval: values")
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    m = float(x.mean())
    if x.size < 2:
        return (m, math.nan, math.nan)
    half = t_quantile((1 + level) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return (m, m - half, m + half)


def seed_summary(values: Sequence[float], level: float = DEFAULT_LEVEL) -> dict[str, float]:
    """Across-seed summary of ``values``: ``{"mean", "sd", "sem", "lo", "hi", "n"}``.

    ``None`` and NaN entries are missing seeds and dropped; ``sd`` with ``n - 1``; ``lo, hi`` the
    Student-t interval of the mean (:func:`t_interval`); NaN where undefined (``sd``, ``sem``,
    ``lo``, ``hi`` for n < 2). ``ValueError`` for ±inf (a diverged run is not a missing seed).
    """
    if isinstance(values, (str, bytes)):
        raise ValueError(f"seed_summary: values: expected a sequence of numbers, got {values!r}")
    if not isinstance(values, np.ndarray):
        values = [math.nan if v is None else v for v in values]
    x = _sample(values, "seed_summary: values")
    m, lo, hi = t_interval(x, level)
    sd = float(np.std(x, ddof=1)) if x.size >= 2 else math.nan
    return {"mean": m, "sd": sd, "sem": sd / math.sqrt(x.size) if x.size >= 2 else math.nan,
            "lo": lo, "hi": hi, "n": int(x.size)}


# ---------------------------------------------------------------------- comparisons
def compare_intervals(a: tuple[float, float], b: tuple[float, float]) -> str:
    """``"higher"`` if interval ``a`` lies entirely above ``b``, ``"lower"`` if entirely
    below, ``"overlap"`` otherwise, ``"unknown"`` if either bound is NaN.

    ``ValueError`` for an interval that is not a pair of numbers or whose ends are inverted.
    """
    ends = []
    for name, v in (("a", a), ("b", b)):
        if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)) or len(v) != 2:
            raise ValueError(f"compare_intervals: {name}: expected an interval (lo, hi), got {v!r}")
        ends.append(check_interval(v[0], v[1], f"compare_intervals: {name}"))
    (alo, ahi), (blo, bhi) = ends
    if any(math.isnan(v) for v in (alo, ahi, blo, bhi)):
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

    def __post_init__(self):
        check_interval(self.lo, self.hi, "Difference")
        check_number(self.estimate, "Difference: estimate")
        check_number(self.se, "Difference: se", inf=True, low=0.0)
        check_number(self.df, "Difference: df", inf=True, low=0.0)
        check_level(self.level, "Difference: level")

    def __iter__(self):
        return iter((self.estimate, self.lo, self.hi))

    def __str__(self) -> str:
        if math.isnan(self.estimate):
            return "—"
        if math.isnan(self.lo):
            return f"{self.estimate:+.3f} (no interval)"
        return f"{self.estimate:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


def _t_half(se: float, df: float, level: float) -> float:
    if not (math.isfinite(se) and df > 0):
        return math.nan
    return t_quantile((1 + level) / 2, df) * se


def paired_t_interval(a, b, level: float = DEFAULT_LEVEL, *, scale: float = 1.0) -> Difference:
    """Paired Student-t interval of ``mean(a - scale · b)``: ``a[i]`` and ``b[i]`` are one pair
    (e.g. two arms trained from the same seed).

    ``d_i = a_i - scale · b_i``; ``mean(d) ± t_{(1+level)/2, n-1} · sd(d) / √n`` over the ``n``
    pairs where both values are not NaN (``sd`` with ``n - 1``). ``lo = hi = NaN`` for fewer than
    two pairs. ``ValueError`` if ``a`` and ``b`` are not 1-d samples of one length, for ±inf, a
    non-finite ``scale`` or a ``level`` outside (0, 1).
    """
    level = check_level(level)
    x, y = check_values(a, "paired_t_interval: a"), check_values(b, "paired_t_interval: b")
    scale = check_number(scale, "paired_t_interval: scale", nan=False)
    if x.shape != y.shape:
        raise ValueError(f"paired_t_interval: a and b must pair one to one, got lengths {x.size} and {y.size}")
    d = x - scale * y
    d = d[~np.isnan(d)]
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
    when a mean, an error or a ``df`` is NaN (a missing value). ``ValueError`` for infinite
    means or errors, a negative error, ``df <= 0`` (an error needs at least one degree of
    freedom), a non-finite ``scale`` or a ``level`` outside (0, 1). ``n_a``/``n_b`` are reported
    as ``df + 1`` (0 for ``inf``).
    """
    level = check_level(level)
    fn = "satterthwaite_interval"
    s = check_number(scale, f"{fn}: scale", nan=False)
    ma, mb = check_number(mean_a, f"{fn}: mean_a"), check_number(mean_b, f"{fn}: mean_b")
    sa, sb = check_number(se_a, f"{fn}: se_a", low=0.0), check_number(se_b, f"{fn}: se_b", low=0.0)
    fa, fb = (check_number(f, f"{fn}: {name}", inf=True) for f, name in ((df_a, "df_a"), (df_b, "df_b")))
    for f, name in ((fa, "df_a"), (fb, "df_b")):
        if f <= 0:
            raise ValueError(f"{fn}: {name}: expected degrees of freedom > 0 (inf allowed), got {f!r}")
    d = ma - s * mb
    va, vb = sa ** 2, (s * sb) ** 2
    n_of = lambda f: int(f) + 1 if math.isfinite(f) else 0  # noqa: E731
    if any(math.isnan(v) for v in (va, vb, fa, fb, d)):
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
    (unpaired seeds): each side's ``se = sd / √n`` (``sd`` with ``n - 1``, NaN entries dropped as
    missing) and the Welch-Satterthwaite degrees of freedom (:func:`satterthwaite_interval`).
    ``lo = hi = NaN`` when a side has fewer than two values. ``ValueError`` for samples that are
    not 1-d, ±inf, a non-finite ``scale`` or a ``level`` outside (0, 1).
    """
    level = check_level(level)
    x, y = _sample(a, "welch_t_interval: a"), _sample(b, "welch_t_interval: b")
    scale = check_number(scale, "welch_t_interval: scale", nan=False)
    ma = float(x.mean()) if x.size else math.nan
    mb = float(y.mean()) if y.size else math.nan
    if x.size < 2 or y.size < 2:
        return Difference(ma - scale * mb, math.nan, math.nan, math.nan, math.nan, "Welch t",
                          int(x.size), int(y.size), level)
    r = satterthwaite_interval(ma, float(x.std(ddof=1)) / math.sqrt(x.size), x.size - 1,
                               mb, float(y.std(ddof=1)) / math.sqrt(y.size), y.size - 1, level, scale=scale)
    return Difference(r.estimate, r.lo, r.hi, r.se, r.df, "Welch t", int(x.size), int(y.size), level)


def sign_test(n_below: int, n: int) -> float:
    """One-sided exact sign test: ``P(X >= n_below)`` for ``X ~ Binomial(n, 1/2)``.

    Integer counts (Python or numpy) ``0 <= n_below <= n``, else ``ValueError``; NaN for ``n = 0``.
    """
    try:
        n_below, n = check_count(n_below, "sign_test: n_below"), check_count(n, "sign_test: n")
    except ValueError as e:
        raise ValueError(f"sign_test: expected integers 0 <= n_below <= n, got n_below={n_below!r}, n={n!r} "
                         f"({e})") from None
    if n_below > n:
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
    level = check_level(level)
    n_batches = _at_least_two(n_batches, "batch_means_interval: n_batches")
    x = check_values(values, "batch_means_interval: values", inf=True)
    if not np.isfinite(x).all():
        raise ValueError("batch_means_interval: the series has non-finite values")
    m = x.size // n_batches
    if m < 2:
        raise ValueError(f"batch_means_interval: {x.size} values are too few for {n_batches} batches of >= 2")
    used = x[x.size - m * n_batches:]
    y = used.reshape(n_batches, m).mean(axis=1)
    mean, se = float(used.mean()), float(y.std(ddof=1) / math.sqrt(n_batches))
    half = _t_half_width_factor(level, int(n_batches) - 1) * se
    return {"mean": mean, "se": se, "lo": mean - half, "hi": mean + half, "n": int(used.size),
            "n_batches": int(n_batches), "batch_len": int(m)}


# --------------------------------------------------------------------------------------
# bootstrap of medians, and a derivative-free minimiser (used by the studies' fits)
# --------------------------------------------------------------------------------------
def _median_sample(x, name: str, inf: bool) -> np.ndarray:
    v = check_values(x, name, inf=inf)
    if np.isnan(v).any():
        raise ValueError(f"{name}: expected values without NaN (drop missing values first)")
    return v


def bootstrap_median(x, n: int = 2000, seed: int = 0, level: float = DEFAULT_LEVEL, *,
                     inf: bool = False) -> tuple[float, float, float]:
    """``(median, lo, hi)``: the sample median with a percentile-bootstrap interval (``n`` resamples
    with replacement, ``numpy.random.default_rng(seed)``).

    All NaN for an empty sample; ``lo = hi = NaN`` for one value (one value is no interval, as in
    :func:`t_interval`). ``ValueError`` for NaN entries, ±inf (unless ``inf``), ``n < 2`` resamples
    or a ``level`` outside (0, 1). ``inf=True`` allows infinite entries (e.g. an event that never
    happened) and reads the ends without interpolation (``"lower"``/``"higher"`` order statistics),
    so an infinite end stays infinite instead of becoming NaN.
    """
    level = check_level(level)
    n = _at_least_two(n, "bootstrap_median: n")
    seed = check_count(seed, "bootstrap_median: seed")
    x = _median_sample(x, "bootstrap_median: x", inf)
    if len(x) == 0:
        return (math.nan,) * 3
    if len(x) == 1:
        return (float(x[0]), math.nan, math.nan)
    a = round((1 - level) / 2, 12)
    b = np.median(np.random.default_rng(seed).choice(x, size=(n, len(x))), axis=1)
    lo_m, hi_m = ("lower", "higher") if inf else ("linear", "linear")
    return float(np.median(x)), float(np.quantile(b, a, method=lo_m)), float(np.quantile(b, 1 - a, method=hi_m))


def bootstrap_median_ratio(a, b, n: int = 4000, seed: int = 0, level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """``median(a) / median(b)`` with a percentile-bootstrap interval (each sample resampled on its own,
    from one generator seeded ``seed``).

    All NaN when either sample is empty; ``lo = hi = NaN`` when either has one value (no interval)
    or some resample's median of ``b`` is 0 (the ratio is undefined there). ``ValueError`` for NaN or
    ±inf entries, ``n < 2`` resamples or a ``level`` outside (0, 1).
    """
    level = check_level(level)
    n = _at_least_two(n, "bootstrap_median_ratio: n")
    seed = check_count(seed, "bootstrap_median_ratio: seed")
    a, b = _median_sample(a, "bootstrap_median_ratio: a", False), _median_sample(b, "bootstrap_median_ratio: b", False)
    if len(a) == 0 or len(b) == 0:
        return (math.nan,) * 3
    mb = float(np.median(b))
    point = float(np.median(a)) / mb if mb != 0 else math.nan
    if len(a) == 1 or len(b) == 1:
        return (point, math.nan, math.nan)
    q = round((1 - level) / 2, 12)
    rng = np.random.default_rng(seed)
    ra = np.median(rng.choice(a, size=(n, len(a))), axis=1)
    rb = np.median(rng.choice(b, size=(n, len(b))), axis=1)
    if (rb == 0).any():
        return (point, math.nan, math.nan)
    r = ra / rb
    return point, float(np.quantile(r, q)), float(np.quantile(r, 1 - q))


def nelder_mead(f, x0, steps=(1.0, 0.5, 1.0), iters: int = 2000, tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` by the Nelder-Mead simplex (reflection 1, expansion 2, contraction
    and shrink 1/2; initial simplex ``x0 + steps[i] e_i``); stops when the simplex's values span
    less than ``tol`` or after ``iters`` iterations. Returns ``(x, f(x))`` of the best vertex.

    ``ValueError`` for a non-callable ``f``, an empty or non-finite ``x0``, fewer ``steps`` than
    coordinates (or non-finite ones), ``iters < 1`` or a negative or non-finite ``tol``."""
    if not callable(f):
        raise ValueError(f"nelder_mead: f: expected a function, got {f!r}")
    x0 = check_values(x0, "nelder_mead: x0")
    steps = check_values(steps, "nelder_mead: steps")
    if x0.size == 0 or np.isnan(x0).any():
        raise ValueError(f"nelder_mead: x0: expected a non-empty point without NaN, got {x0!r}")
    if steps.size < x0.size or np.isnan(steps).any():
        raise ValueError(f"nelder_mead: steps: expected {x0.size} finite steps, got {steps!r}")
    check_count(iters, "nelder_mead: iters", low=1)
    check_number(tol, "nelder_mead: tol", nan=False, low=0.0)
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
