"""A fluctuation-dissipation statistic for SGD training at stationarity (Yaida 2018).

Which relation, for which optimiser:

* **Plain SGD** (no momentum), ``theta' = theta - lr * g`` with ``g`` the mini-batch gradient the step applied
  (after clipping; SGD's coupled weight decay included in ``g``, i.e. in ``L``). If ``|theta|^2`` is
  stationary, expanding ``|theta'|^2 = |theta|^2 - 2 lr theta.g + lr^2 |g|^2`` gives Yaida's first relation
  ``<theta . g> = (lr / 2) <|g|^2>``, and since ``E[g | theta] = grad L(theta)``, ``<theta . grad L>`` on the
  left is the same number.
* **SGD with Langevin noise** (:class:`~circuitfade.train.langevin.LangevinNoise`, variance ``2 lr T`` per
  coordinate, ``d`` noised coordinates): ``<theta . g> = (lr / 2) <|g|^2> + d T``.
* **Momentum, Adam, AdamW**: no relation of this form in terms of the gradient. We do not claim one;
  :func:`fdt_statistic` is for plain SGD (with or without Langevin noise) only. For any optimiser what does
  hold at stationarity is ``<theta . delta> = -<|delta|^2> / 2`` for the step ``delta = theta' - theta``
  (stationarity of ``|theta|^2``), which tests only stationarity, not a temperature:
  :func:`displacement_statistic`.

The statistic is ``O = <o_t>`` over the steps of a window, ``o_t = theta_t . g_t - (lr_t / 2) |g_t|^2 - d T_t``,
with a batch-means interval (:func:`circuitfade.stats.batch_means_interval`). At stationarity ``O = 0``
in expectation; a run still descending has ``O > 0`` (``theta . g`` large, ``|theta|^2`` shrinking).

Caveat, stated because it matters for the interval: for plain SGD with ``g`` exactly the applied step,
``o_t = (|theta_t|^2 - |theta_{t+1}|^2) / (2 lr)`` per step, so the window mean telescopes to
``(|theta_a|^2 - |theta_b|^2) / (2 lr n)``; its long-run variance is zero and the batch-means interval is
conservative (wider than needed). With gradient noise measured separately, or Langevin noise, it is not.
Scale the value by ``rhs`` (returned) to read it as a relative violation.
"""

from __future__ import annotations

import numpy as np
import torch

from circuitfade.stats import DEFAULT_LEVEL, batch_means_interval

__all__ = ["FDTRecorder", "displacement_statistic", "fdt_observation", "fdt_statistic"]


def _params(params) -> list[torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return [p for p in params if p.requires_grad]


def fdt_observation(params) -> tuple[float, float, int]:
    """``(theta . g, |g|^2, d)`` over the parameters (a module or an iterable) that have a gradient now:
    call after ``backward()`` (and after any clipping), before ``optimizer.step()``. Float64 sums."""
    dot, sq, d = 0.0, 0.0, 0
    with torch.no_grad():
        for p in _params(params):
            if p.grad is None:
                continue
            g, t = p.grad.detach().double(), p.detach().double()
            dot += float((t * g).sum())
            sq += float((g * g).sum())
            d += p.numel()
    return dot, sq, d


class FDTRecorder:
    """Collects :func:`fdt_observation` each step: ``rec.record(model)`` between ``backward`` and ``step``;
    then ``rec.statistic(lr, temperature=0.0, start=...)``."""

    def __init__(self):
        self.theta_dot_grad: list[float] = []
        self.grad_sq: list[float] = []
        self.n_params = 0

    def record(self, params) -> None:
        dot, sq, d = fdt_observation(params)
        if self.n_params and d != self.n_params:
            raise ValueError(f"FDTRecorder: {d} coordinates have a gradient now, {self.n_params} before")
        self.theta_dot_grad.append(dot)
        self.grad_sq.append(sq)
        self.n_params = d

    def __len__(self) -> int:
        return len(self.grad_sq)

    def statistic(self, lr, temperature=0.0, *, start: int = 0, n_batches: int = 20,
                  level: float = DEFAULT_LEVEL) -> dict[str, float | str]:
        """:func:`fdt_statistic` over the recorded steps ``start:`` (``lr``/``temperature`` per step or scalars)."""
        sl = slice(start, None)
        lr_a = np.broadcast_to(np.asarray(lr, dtype=float), (len(self),))[sl]
        t_a = np.broadcast_to(np.asarray(temperature, dtype=float), (len(self),))[sl]
        return fdt_statistic(self.theta_dot_grad[sl], self.grad_sq[sl], lr_a, t_a, n_params=self.n_params,
                             n_batches=n_batches, level=level)


def fdt_statistic(theta_dot_grad, grad_sq, lr, temperature=0.0, *, n_params: int = 0, n_batches: int = 20,
                  level: float = DEFAULT_LEVEL) -> dict[str, float | str]:
    """``O = <theta . g> - (lr / 2) <|g|^2> - d T`` over a window of steps, with a batch-means interval.

    ``theta_dot_grad``, ``grad_sq``: per-step series (``theta_t . g_t``, ``|g_t|^2``); ``lr``, ``temperature``:
    scalars or per-step series; ``n_params``: ``d``, the number of noised coordinates (needed when any
    ``T > 0``). Returns ``{"value", "se", "lo", "hi", "lhs": <theta . g>, "rhs": <(lr/2)|g|^2 + d T>,
    "relative": value / rhs, "n", "n_batches", "verdict"}`` with ``verdict`` ``"consistent"`` (0 in the
    interval) or ``"violated"``."""
    dot = np.asarray(theta_dot_grad, dtype=float).reshape(-1)
    sq = np.asarray(grad_sq, dtype=float).reshape(-1)
    if dot.shape != sq.shape:
        raise ValueError(f"fdt_statistic: series lengths differ ({dot.size} vs {sq.size})")
    lr_a = np.broadcast_to(np.asarray(lr, dtype=float), dot.shape)
    t_a = np.broadcast_to(np.asarray(temperature, dtype=float), dot.shape)
    if (lr_a <= 0).any() or (t_a < 0).any() or not (np.isfinite(lr_a).all() and np.isfinite(t_a).all()):
        raise ValueError("fdt_statistic: lr must be > 0 and temperature >= 0 (finite) at every step")
    if (t_a > 0).any() and (isinstance(n_params, bool) or int(n_params) < 1):
        raise ValueError("fdt_statistic: a temperature > 0 needs n_params (the number of noised coordinates)")
    rhs_t = 0.5 * lr_a * sq + float(n_params) * t_a
    bm = batch_means_interval(dot - rhs_t, n_batches=n_batches, level=level)
    tail = slice(dot.size - bm["n"], None)  # the values batch_means_interval used
    lhs, rhs = float(dot[tail].mean()), float(rhs_t[tail].mean())
    return {"value": bm["mean"], "se": bm["se"], "lo": bm["lo"], "hi": bm["hi"], "lhs": lhs, "rhs": rhs,
            "relative": bm["mean"] / rhs if rhs else float("nan"), "n": bm["n"], "n_batches": bm["n_batches"],
            "verdict": "consistent" if bm["lo"] <= 0.0 <= bm["hi"] else "violated"}


def displacement_statistic(theta_dot_delta, delta_sq, *, n_batches: int = 20,
                           level: float = DEFAULT_LEVEL) -> dict[str, float | str]:
    """For any optimiser: ``<theta . delta> + <|delta|^2> / 2`` (``delta = theta' - theta``), zero when
    ``|theta|^2`` is stationary; same keys as :func:`fdt_statistic` (``rhs`` = ``<|delta|^2> / 2``)."""
    dot = np.asarray(theta_dot_delta, dtype=float).reshape(-1)
    sq = np.asarray(delta_sq, dtype=float).reshape(-1)
    if dot.shape != sq.shape:
        raise ValueError(f"displacement_statistic: series lengths differ ({dot.size} vs {sq.size})")
    bm = batch_means_interval(dot + 0.5 * sq, n_batches=n_batches, level=level)
    rhs = float(0.5 * sq[sq.size - bm["n"]:].mean())
    return {"value": bm["mean"], "se": bm["se"], "lo": bm["lo"], "hi": bm["hi"],
            "lhs": float(dot[dot.size - bm["n"]:].mean()), "rhs": rhs,
            "relative": bm["mean"] / rhs if rhs else float("nan"), "n": bm["n"], "n_batches": bm["n_batches"],
            "verdict": "consistent" if bm["lo"] <= 0.0 <= bm["hi"] else "violated"}
