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

* **The thermal test** (:func:`equipartition`, any optimiser): a Gibbs stationary law ``exp(-L / T)`` has
  ``<theta_i dL/dtheta_i> = T`` for every coordinate, so the per-group kinetic temperature
  ``<theta_G . g_G> / d_G`` is the same in every parameter group; SGD's anisotropic gradient noise breaks it,
  dominant Langevin noise restores it.

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

from collections.abc import Callable

import numpy as np
import torch

from circuitfade.stats import DEFAULT_LEVEL, batch_means_interval

__all__ = ["FDTRecorder", "displacement_statistic", "equipartition", "fdt_observation", "fdt_statistic",
           "grouped_observation"]


def fdt_observation(params) -> tuple[float, float, int]:
    """``(theta . g, |g|^2, d)`` over the parameters (a module or an iterable) that have a gradient now:
    call after ``backward()`` (and after any clipping), before ``optimizer.step()``. Float64 sums."""
    named = params.named_parameters() if isinstance(params, torch.nn.Module) else ((None, p) for p in params)
    return grouped_observation(named, lambda name: "all").get("all", (0.0, 0.0, 0))


def grouped_observation(named_params, group_of: Callable[[str], str | None]) -> dict[str, tuple[float, float, int]]:
    """:func:`fdt_observation` per group: ``{label: (theta_G . g_G, |g_G|^2, d_G)}`` over ``(name, param)``
    pairs, ``group_of(name)`` the label of a parameter (``None``: in no group). Parameters without a gradient
    or with ``requires_grad=False`` are skipped."""
    out: dict[str, list] = {}
    with torch.no_grad():
        for name, p in named_params:
            if not p.requires_grad or p.grad is None:
                continue
            label = group_of(name)
            if label is None:
                continue
            g, t = p.grad.detach().double(), p.detach().double()
            acc = out.setdefault(label, [0.0, 0.0, 0])
            acc[0] += float((t * g).sum())
            acc[1] += float((g * g).sum())
            acc[2] += p.numel()
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


class FDTRecorder:
    """Collects :func:`fdt_observation` each step: ``rec.record(model)`` between ``backward`` and ``step``;
    then ``rec.statistic(lr, temperature=0.0, start=...)``.

    ``group_of`` (optional, a function of the parameter name returning a label or ``None``) also records the
    per-group series (``rec.groups[label] = (dots, sqs)``, ``rec.group_sizes[label] = d_G``; ``record`` then
    needs a module, for the names) that :func:`equipartition` reads."""

    def __init__(self, group_of: Callable[[str], str | None] | None = None):
        self.theta_dot_grad: list[float] = []
        self.grad_sq: list[float] = []
        self.n_params = 0
        self.group_of = group_of
        self.groups: dict[str, tuple[list[float], list[float]]] = {}
        self.group_sizes: dict[str, int] = {}

    def record(self, params) -> None:
        if self.group_of is None:
            dot, sq, d = fdt_observation(params)
        else:
            if not isinstance(params, torch.nn.Module):
                raise TypeError("FDTRecorder(group_of=...) needs a module (the groups are read from parameter names)")
            named = list(params.named_parameters())
            per = grouped_observation(named, self.group_of)
            dot, sq, d = fdt_observation(p for _, p in named)
            if self.groups and set(per) != set(self.groups):
                raise ValueError(f"FDTRecorder: groups {sorted(per)} have a gradient now, {sorted(self.groups)} before")
            for label, (gd, gs, gn) in per.items():
                if self.group_sizes.get(label, gn) != gn:
                    raise ValueError(f"FDTRecorder: group {label!r} has {gn} coordinates now, "
                                     f"{self.group_sizes[label]} before")
                self.group_sizes[label] = gn
                dots, sqs = self.groups.setdefault(label, ([], []))
                dots.append(gd)
                sqs.append(gs)
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


def equipartition(rec: FDTRecorder, lr, temperature=0.0, *, start: int = 0, n_batches: int = 20,
                  min_coords: int = 500, level: float = DEFAULT_LEVEL) -> dict:
    """The thermal test (equipartition): per group ``G`` the kinetic temperature ``T_G = <theta_G . g_G> / d_G``.

    If the stationary density is Gibbs, ``p ~ exp(-L / T)`` (weight decay inside ``L``), integrating by parts
    gives ``E[theta_i dL/dtheta_i] = T`` for *every* coordinate (the virial theorem), so ``T_G`` is the same
    ``T`` in every group; since ``E[g | theta] = grad L`` the mini-batch gradient may stand in for ``grad L``.
    This is a property of the stationary law, not of the optimiser: it can be asked of any run at
    stationarity. For plain SGD at stationarity Yaida's relation holds per group as well, so there
    ``T_G = (lr / 2) <|g_G|^2> / d_G (+ T)``: the test asks whether SGD's gradient noise is isotropic enough to
    be a temperature. Returns ``{"groups": [{"group", "d", "T_kin", "lo", "hi", "T_sgd", "fdt_relative",
    "fdt_verdict"}], "spread": max T_kin / min T_kin over groups with >= min_coords coordinates, "hottest",
    "coldest"}`` (intervals: batch means over the window ``start:``)."""
    if not rec.groups:
        raise ValueError("equipartition: the recorder has no groups (FDTRecorder(group_of=...))")
    rows = []
    for label in sorted(rec.groups):
        dots, sqs = (np.asarray(x, dtype=float)[start:] for x in rec.groups[label])
        d = rec.group_sizes[label]
        lr_a = np.broadcast_to(np.asarray(lr, dtype=float), (len(rec),))[start:]
        t_a = np.broadcast_to(np.asarray(temperature, dtype=float), (len(rec),))[start:]
        bm = batch_means_interval(dots / d, n_batches=n_batches, level=level)
        f = fdt_statistic(dots, sqs, lr_a, t_a, n_params=d, n_batches=n_batches, level=level)
        rows.append({"group": label, "d": d, "T_kin": bm["mean"], "lo": bm["lo"], "hi": bm["hi"],
                     "T_sgd": float((0.5 * lr_a * sqs).mean() / d), "fdt_relative": f["relative"],
                     "fdt_verdict": f["verdict"]})
    big = [r for r in rows if r["d"] >= min_coords]
    if len(big) < 2:
        raise ValueError(f"equipartition: fewer than 2 groups with >= {min_coords} coordinates")
    hot, cold = max(big, key=lambda r: r["T_kin"]), min(big, key=lambda r: r["T_kin"])
    spread = hot["T_kin"] / cold["T_kin"] if cold["T_kin"] > 0 else float("inf")
    return {"groups": rows, "spread": float(spread), "hottest": hot["group"], "coldest": cold["group"]}
