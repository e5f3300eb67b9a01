"""Precursors: progress measures that move while a capability is still flat, and dating its arrival.

The no-partial-credit study claims that while a capability is still flat its arrival can be dated
from a *precursor*: a measure of partial alignment that the loss does not show yet. This
module holds the measures (any TransformerLens model with the standard hooks) and the
predictor (plain arrays: any precursor, any run).

Measures
--------
* :func:`source_attention` - per part head, the attention probability at the query row on
  the part's source position (``blocks.{l}.attn.hook_pattern``), averaged over a batch.
* :func:`label_alignment` - the *correlation ratio* (eta squared) of activations with a
  labelling of the inputs: the fraction of the activations' total variance (summed over
  features) that is a function of the label::

      eta2 = sum_c n_c |mean_c - mean|^2 / sum_i |x_i - mean|^2

  0: the activations carry nothing of the label; 1: they are a function of it. On an
  *enumerated* input set (every input once) it is exact: no sampling noise, so a change of
  1e-5 is a change of the model, not of the batch.
* :func:`activation_alignment` - :func:`label_alignment` of one hook's activations at one
  position, read from a forward pass (e.g. the MLP hidden units at the query, labelled by
  the capability's target).
* :func:`combine_parts` - a K-part summary of per-part values: ``min``, ``product`` or ``mean``.

Dating an arrival
-----------------
:func:`crossing_step` - the first step at which a precursor curve (its trailing running
median over ``window`` evaluations, so one noisy evaluation does not count) reaches a level.
:func:`fit_crossing` - the *crossing predictor*: ``ignition = t_c + lead / drive``, with
``t_c`` the crossing step of a level and ``lead`` the median of ``(ignition - t_c) * drive``
over the fit runs (``drive``: a learning-rate multiplier, 1 if the runs share one); the level
is chosen from a fixed grid on the fit runs alone (smallest median relative error among the
levels that every fit run crosses *before* it ignites). :func:`predict_crossing` applies
frozen constants; a run whose precursor does not cross while flat gets no prediction (NaN),
which :func:`relative_errors` scores as an infinite error, never as a number.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from circuitfade import stats
from circuitfade.analysis.gates import tokens_renamed
from circuitfade.tasks import Batch

__all__ = ["source_attention", "label_alignment", "activation_alignment", "combine_parts", "crossing_step",
           "fit_crossing", "predict_crossing", "relative_errors", "median_interval", "SUMMARIES"]

SUMMARIES = ("min", "product", "mean")


def _check_model(model) -> None:
    if not hasattr(model, "run_with_cache") or not hasattr(model, "cfg"):
        raise ValueError(f"model: expected a TransformerLens HookedTransformer, got {type(model).__name__}")


def _tokens(model, batch) -> Tensor:
    """The token ids of ``batch`` (a :class:`~circuitfade.tasks.Batch` or ids ``[batch, pos]``), checked."""
    t = torch.as_tensor(batch.tokens if isinstance(batch, Batch) else batch)
    if t.ndim != 2 or t.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens: expected an integer tensor [batch, pos], got {tuple(t.shape)} {t.dtype}")
    if t.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"tokens: {t.shape[1]} positions exceed the model's n_ctx = {model.cfg.n_ctx}")
    return t.long().to(model.cfg.device)


def _position(pos: int, n: int, name: str) -> int:
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or not -n <= pos < n:
        raise ValueError(f"{name}: expected a position in [-{n}, {n}), got {pos!r}")
    return int(pos) % n


@tokens_renamed
def source_attention(model, batch, parts: Mapping[tuple[int, int], int], query_pos: int) -> np.ndarray:
    """Mean attention probability of each part head at ``query_pos`` on its source position, over
    ``batch`` (a :class:`~circuitfade.tasks.Batch` or token ids ``[batch, pos]``).

    ``parts``: ``{(layer, head): source_position}``. Returns a float array in the order of
    ``parts`` (reads ``blocks.{l}.attn.hook_pattern``; the model's gates and priors as set)."""
    _check_model(model)
    t = _tokens(model, batch)
    n = t.shape[1]
    q = _position(query_pos, n, "query_pos")
    if not parts:
        raise ValueError("parts: expected at least one (layer, head) -> source position")
    items = []
    for (layer, head), src in parts.items():
        if not (0 <= int(layer) < model.cfg.n_layers and 0 <= int(head) < model.cfg.n_heads):
            raise ValueError(f"parts: no head ({layer}, {head}) in a model with {model.cfg.n_layers} layers "
                             f"x {model.cfg.n_heads} heads")
        s = _position(src, n, f"source of ({layer}, {head})")
        if s > q:
            raise ValueError(f"source {s} of ({layer}, {head}) is after the query position {q} (causal attention)")
        items.append((int(layer), int(head), s))
    layers = {li for li, _, _ in items}
    names = {f"blocks.{li}.attn.hook_pattern" for li in layers}
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda nm: nm in names)
    return np.array([float(cache[f"blocks.{li}.attn.hook_pattern"][:, h, q, s].mean()) for li, h, s in items])


def label_alignment(acts, labels) -> float:
    """Correlation ratio (eta squared) of ``acts`` ``[n, ...]`` with integer ``labels`` ``[n]``
    (see the module docstring). Raises if the activations do not vary (nothing to explain)."""
    x = torch.as_tensor(acts, dtype=torch.float64)
    lab = torch.as_tensor(labels)
    if x.ndim < 1 or lab.ndim != 1 or x.shape[0] != lab.shape[0] or x.shape[0] < 2:
        raise ValueError(f"label_alignment: expected acts [n, ...] and labels [n] with n >= 2, "
                         f"got {tuple(x.shape)} and {tuple(lab.shape)}")
    if lab.dtype.is_floating_point or lab.dtype == torch.bool:
        raise ValueError(f"label_alignment: labels must be integers, got {lab.dtype}")
    x = x.reshape(x.shape[0], -1)
    if not torch.isfinite(x).all():
        raise ValueError("label_alignment: non-finite activations")
    mu = x.mean(0)
    total = float(((x - mu) ** 2).sum())
    if total <= 0.0:
        raise ValueError("label_alignment: the activations are constant (no variance to explain)")
    classes, inv = torch.unique(lab, return_inverse=True)
    counts = torch.bincount(inv, minlength=len(classes)).to(torch.float64)
    sums = torch.zeros(len(classes), x.shape[1], dtype=torch.float64).index_add_(0, inv, x)
    means = sums / counts[:, None]
    between = float((counts[:, None] * (means - mu) ** 2).sum())
    return between / total


@tokens_renamed
def activation_alignment(model, batch, labels, hook: str, pos: int) -> float:
    """:func:`label_alignment` of ``hook``'s activations at position ``pos`` (a forward pass of
    ``batch``: a :class:`~circuitfade.tasks.Batch` or token ids), e.g. ``hook="blocks.0.mlp.hook_post"`` at the query labelled by the target."""
    _check_model(model)
    t = _tokens(model, batch)
    p = _position(pos, t.shape[1], "pos")
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda nm: nm == hook)
    if hook not in cache:
        raise ValueError(f"hook {hook!r}: not a hook of this model")
    return label_alignment(cache[hook][:, p], labels)


def combine_parts(values: Sequence[float], how: str = "min") -> float:
    """K-part summary of per-part values: ``"min"`` (the weakest part), ``"product"`` or ``"mean"``."""
    v = np.asarray(list(values), dtype=float)
    if v.ndim != 1 or len(v) == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"combine_parts: expected a non-empty list of finite values, got {values!r}")
    if how not in SUMMARIES:
        raise ValueError(f"combine_parts: how must be one of {SUMMARIES}, got {how!r}")
    return float(v.min() if how == "min" else v.prod() if how == "product" else v.mean())


def _running_median(y: np.ndarray, window: int) -> np.ndarray:
    return np.array([np.median(y[max(0, i - window + 1): i + 1]) for i in range(len(y))])


def crossing_step(steps: Sequence[float], values: Sequence[float], level: float, *, window: int = 5,
                  before: float | None = None) -> float | None:
    """First step at which the trailing running median (``window`` evaluations, fewer at the
    start) of ``values`` is ``>= level``; ``None`` if it never is (or not before step ``before``)."""
    s, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if s.ndim != 1 or s.shape != y.shape or len(s) == 0:
        raise ValueError(f"crossing_step: steps and values must be 1-d of equal length, got {s.shape}, {y.shape}")
    if len(s) > 1 and not np.all(np.diff(s) > 0):
        raise ValueError("crossing_step: steps must be strictly increasing")
    if not np.all(np.isfinite(y)):
        raise ValueError("crossing_step: values must be finite")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"crossing_step: window must be a positive int, got {window!r}")
    hit = np.flatnonzero(_running_median(y, window) >= level)
    if len(hit) == 0:
        return None
    t = float(s[hit[0]])
    return None if (before is not None and t >= before) else t


def fit_crossing(curves: Sequence[tuple[Sequence[float], Sequence[float]]], ignitions: Sequence[float],
                 drives: Sequence[float] | None = None, *, levels: Sequence[float], window: int = 5) -> dict:
    """Fit the crossing predictor on fit runs (see the module docstring).

    ``curves``: per run ``(steps, precursor values)``; ``ignitions``: the runs' ignition steps
    (finite); ``drives``: learning-rate multipliers (default 1). Returns ``{"level", "lead",
    "window", "fit_median_rel_error", "n_fit", "scan"}``; ``scan`` lists every level tried.
    Raises if no level is crossed before ignition by every fit run."""
    ig = np.asarray(ignitions, dtype=float)
    d = np.ones(len(ig)) if drives is None else np.asarray(drives, dtype=float)
    if len(curves) != len(ig) or len(d) != len(ig) or len(ig) < 2:
        raise ValueError("fit_crossing: expected >= 2 runs with one curve, ignition and drive each")
    if not (np.all(np.isfinite(ig)) and np.all(d > 0)):
        raise ValueError("fit_crossing: ignitions must be finite (censored runs cannot be fitted) and drives > 0")
    scan, best = [], None
    for lv in levels:
        tc = [crossing_step(s, v, float(lv), window=window, before=i) for (s, v), i in zip(curves, ig)]
        if any(t is None for t in tc):
            scan.append({"level": float(lv), "crossed_while_flat": sum(t is not None for t in tc), "lead": None,
                         "median_rel_error": None})
            continue
        tc = np.asarray(tc, dtype=float)
        lead = float(np.median((ig - tc) * d))
        err = float(np.median(np.abs(tc + lead / d - ig) / ig))
        scan.append({"level": float(lv), "crossed_while_flat": len(tc), "lead": lead, "median_rel_error": err})
        if best is None or err < best["fit_median_rel_error"]:
            best = {"level": float(lv), "lead": lead, "fit_median_rel_error": err}
    if best is None:
        raise ValueError(f"fit_crossing: no level of {list(levels)} is crossed before ignition by every fit run")
    return {**best, "window": int(window), "n_fit": int(len(ig)), "scan": scan}


def predict_crossing(steps: Sequence[float], values: Sequence[float], constants: Mapping, *, drive: float = 1.0,
                     flat_until: float | None = None) -> tuple[float, float]:
    """``(predicted ignition, crossing step)`` from frozen :func:`fit_crossing` constants; NaN for
    both when the curve does not cross (before ``flat_until``, e.g. the run's observed ignition:
    a crossing after it is not a prediction made while flat)."""
    t = crossing_step(steps, values, float(constants["level"]), window=int(constants["window"]), before=flat_until)
    if t is None:
        return float("nan"), float("nan")
    return t + float(constants["lead"]) / float(drive), t


def relative_errors(predicted: Sequence[float], actual: Sequence[float]) -> np.ndarray:
    """``|predicted - actual| / actual``; a missing prediction (NaN) is an infinite error."""
    p, a = np.asarray(predicted, dtype=float), np.asarray(actual, dtype=float)
    if p.shape != a.shape or not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError("relative_errors: expected equal shapes and finite positive actual values")
    e = np.abs(p - a) / a
    return np.where(np.isnan(p), np.inf, e)


def median_interval(x: Sequence[float], *, n_boot: int = 4000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """Median with a percentile-bootstrap interval over the entries (infinite entries allowed).

    ``(median, lo, hi)``: :func:`circuitfade.stats.bootstrap_median` with ``inf=True`` (ends read
    without interpolation, so infinite errors stay infinite); one entry gives ``(value, NaN, NaN)``
    (no interval from one value); an empty or NaN-holding ``x`` and ``n_boot < 2`` are refused
    (``ValueError``)."""
    if isinstance(x, (str, bytes)) or np.ndim(x) != 1 or len(x) == 0:
        raise ValueError("median_interval: expected a non-empty 1-d array without NaN")
    if isinstance(n_boot, (bool, np.bool_)) or not isinstance(n_boot, (int, np.integer)) or n_boot < 2:
        raise ValueError(f"median_interval: n_boot must be an int >= 2, got {n_boot!r}")
    return stats.bootstrap_median(x, n=n_boot, seed=seed, level=level, inf=True)
