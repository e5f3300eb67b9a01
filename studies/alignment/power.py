"""Exact tests and power for the alignment study's count comparisons (two arms of runs that ignite or not).

* :func:`fisher_greater` - one-sided Fisher exact test that arm A's rate exceeds arm B's:
  ``p = P(X >= a)`` for ``X`` hypergeometric given the margins (``a`` of ``n_a`` and ``b`` of ``n_b``
  ignited), i.e. the probability, if both arms had the same rate, of arm A getting at least ``a`` of
  the ``a + b`` ignitions.
* :func:`fisher_power` - the exact power of that test at level ``alpha`` for true rates ``p_a, p_b``
  with ``n`` runs per arm (sum over all outcomes).
* :func:`seeds_for_power` - the smallest ``n`` reaching a power target; :func:`any_event_power` -
  ``1 - (1 - p)^n``, the chance that at least one of ``n`` runs ignites at rate ``p``.

These fix the v2 seed counts of :mod:`studies.alignment.protocol` from stated targets.
"""

from __future__ import annotations

import math

__all__ = ["fisher_greater", "fisher_power", "seeds_for_power", "any_event_power"]


def _check_counts(a: int, n_a: int, b: int, n_b: int) -> None:
    for name, x in (("a", a), ("n_a", n_a), ("b", b), ("n_b", n_b)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"fisher_greater: {name} must be an int >= 0, got {x!r}")
    if a > n_a or b > n_b or n_a == 0 or n_b == 0:
        raise ValueError(f"fisher_greater: need 0 <= a <= n_a, 0 <= b <= n_b, n > 0; got {a}/{n_a}, {b}/{n_b}")


def fisher_greater(a: int, n_a: int, b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that arm A (``a`` of ``n_a``) has the higher rate than arm B (``b`` of ``n_b``):
    ``sum_{x >= a} C(n_a, x) C(n_b, t - x) / C(n_a + n_b, t)`` with ``t = a + b``."""
    _check_counts(a, n_a, b, n_b)
    t = a + b
    den = math.comb(n_a + n_b, t)
    return sum(math.comb(n_a, x) * math.comb(n_b, t - x) for x in range(a, min(n_a, t) + 1)) / den


def fisher_power(n: int, p_a: float, p_b: float, alpha: float = 0.05) -> float:
    """Exact power of :func:`fisher_greater` at level ``alpha`` with ``n`` runs per arm and true rates ``p_a, p_b``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or not (0 <= p_a <= 1 and 0 <= p_b <= 1):
        raise ValueError(f"fisher_power: need n >= 1 and rates in [0, 1], got n={n!r}, p_a={p_a!r}, p_b={p_b!r}")
    pmf = lambda k, p: math.comb(n, k) * p ** k * (1 - p) ** (n - k)  # noqa: E731
    return sum(pmf(a, p_a) * pmf(b, p_b) for a in range(n + 1) for b in range(n + 1)
               if fisher_greater(a, n, b, n) < alpha)


def any_event_power(n: int, p: float) -> float:
    """``1 - (1 - p)^n``: the chance that at least one of ``n`` independent runs ignites at rate ``p``."""
    return 1.0 - (1.0 - p) ** n


def seeds_for_power(power_of, target: float = 0.8, n_max: int = 100) -> int:
    """The smallest ``n`` in ``1..n_max`` with ``power_of(n) >= target``."""
    for n in range(1, n_max + 1):
        if power_of(n) >= target:
            return n
    raise ValueError(f"seeds_for_power: target {target} not reached by n = {n_max}")
