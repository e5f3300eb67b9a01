"""Ignition: the step at which a capability leaves its chance baseline for good.

Definition (:func:`ignition_step`). Given evaluations ``y_0, y_1, ..`` at steps
``s_0 < s_1 < ..`` of a capability metric whose chance value is ``baseline``, the
*level* is ``baseline + threshold * (ceiling - baseline)`` (``threshold`` is the
fraction of the way from chance to the ceiling, 0.5 by default). The ignition step
is the smallest ``s_i`` such that

1. ``y_i, .., y_{i+patience-1}`` are all above the level (``patience`` consecutive
   evaluations: a single lucky evaluation before ignition does not count when
   ``patience >= 2``), and
2. from ``i`` to the end of the curve the metric never stays at or below the level
   for ``patience`` consecutive evaluations (a single noisy evaluation after
   ignition does not undo it when ``patience >= 2``).

If no such ``i`` exists (the curve never ignites, or ends fewer than ``patience``
evaluations after a crossing) the result is ``None``: a run that did not ignite
within its budget is *censored*, never given a number. "For good" means within the
observed curve, so a run that stops early should continue for a margin after
ignition (:func:`ignited_for` tells how many steps have been observed since).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["ignition_step", "ignited_for", "as_curve"]


def as_curve(curve, steps: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` as float arrays from a ``pd.Series`` (index = step), a mapping
    ``{step: value}``, a DataFrame with ``step`` and ``value`` columns, or a sequence of
    values (with ``steps``, or steps ``0, 1, ..``). Steps must be strictly increasing and
    values finite."""
    if isinstance(curve, pd.DataFrame):
        if not {"step", "value"} <= set(curve.columns):
            raise ValueError(f"curve DataFrame: expected columns 'step' and 'value', got {list(curve.columns)}")
        s, y = curve["step"].to_numpy(), curve["value"].to_numpy()
    elif isinstance(curve, pd.Series):
        s, y = curve.index.to_numpy(), curve.to_numpy()
    elif isinstance(curve, Mapping):
        s, y = np.array(list(curve.keys())), np.array(list(curve.values()))
    else:
        y = np.asarray(list(curve), dtype=float)
        s = np.arange(len(y)) if steps is None else np.asarray(list(steps))
    s, y = np.asarray(s, dtype=float), np.asarray(y, dtype=float)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"curve: steps and values must be 1-d of equal length, got {s.shape} and {y.shape}")
    if len(s) > 1 and not np.all(np.diff(s) > 0):
        raise ValueError("curve: steps must be strictly increasing")
    if not np.all(np.isfinite(y)):
        raise ValueError("curve: values must be finite (a diverged run has no ignition step)")
    return s, y


def _check(baseline, threshold, patience, ceiling) -> float:
    for name, v in (("baseline", baseline), ("ceiling", ceiling), ("threshold", threshold)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if not 0 < threshold < 1:
        raise ValueError(f"threshold: expected a fraction in (0, 1) of the way from baseline to ceiling, got {threshold}")
    if not ceiling > baseline:
        raise ValueError(f"ceiling ({ceiling}) must be above baseline ({baseline})")
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience: expected an int >= 1, got {patience!r}")
    return baseline + threshold * (ceiling - baseline)


def ignition_step(curve, *, baseline: float, threshold: float = 0.5, patience: int = 2,
                  ceiling: float = 1.0, steps: Sequence[int] | None = None) -> float | None:
    """The first step at which ``curve`` leaves ``baseline`` for good (see the module docstring).

    ``curve``: see :func:`as_curve`. Returns the step (a float, as the curve's steps) or
    ``None`` if the curve does not ignite.
    """
    level = _check(baseline, threshold, patience, ceiling)
    s, y = as_curve(curve, steps)
    above = y > level
    n = len(y)
    # fail[i]: a run of `patience` evaluations at or below the level starts at i
    fail = np.array([i + patience <= n and not above[i: i + patience].any() for i in range(n)], dtype=bool)
    # no failure run starting at or after i
    clean_after = np.flip(np.cumsum(np.flip(fail)) == 0)
    for i in range(n - patience + 1):
        if above[i: i + patience].all() and clean_after[i]:
            return float(s[i])
    return None


def ignited_for(curve, *, baseline: float, threshold: float = 0.5, patience: int = 2, ceiling: float = 1.0,
                steps: Sequence[int] | None = None) -> float:
    """Steps observed after the ignition step (``-inf`` if not ignited): a stopping rule
    for runs that end at ignition plus a margin."""
    ig = ignition_step(curve, baseline=baseline, threshold=threshold, patience=patience, ceiling=ceiling, steps=steps)
    if ig is None:
        return float("-inf")
    s, _ = as_curve(curve, steps)
    return float(s[-1] - ig)
