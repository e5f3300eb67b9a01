"""Part ablation: how much of a capability survives when one part of its circuit is removed.

The no-partial-credit test. A circuit has ``K`` parts (heads, or groups of
heads). *Partial credit* predicts that removing one part leaves ``(K-1)/K`` of the
capability; *no partial credit* (the conjunction view) predicts ~0. For any
TransformerLens model with the standard ``blocks.{l}.attn.hook_z`` hooks (our
models, a plain ``HookedTransformer``, models from :func:`circuitfade.store.attach`,
Hugging Face checkpoints converted by TransformerLens), :func:`part_ablation`
ablates each part alone and, for comparison, ``n_random`` randomly drawn non-part
heads, and reports the *retained fraction*::

    retained = (acc_ablated - chance) / (acc_intact - chance)

i.e. the fraction of the way from chance to the intact model that is left (1: nothing
lost; 0: at chance; it can leave ``[0, 1]`` by noise or when an ablation helps).
Accuracy is the task's (argmax over the logits equals the target, pooled over the
answer positions of the batch). A cell whose intact accuracy is within
``min_gap`` of chance does not discriminate and gets ``retained = NaN``.

Ablations replace the head's output ``z`` (``[batch, pos, head, d_head]``, before
``W_O``) at every position, everything downstream recomputed:

* ``"mean"``: by its position-wise batch mean from the clean forward;
* ``"zero"``: by 0;
* ``"resample"``: by the same head's ``z`` on another sequence of the batch (a seeded
  random permutation with no fixed points).

:func:`trace_part_ablation` maps it over a checkpoint series (via
:func:`circuitfade.store.trace`). :func:`pool_cells` pools cells (capability x model x
scale, or seeds, or checkpoints) into the study's statistics: median retained, how
many discriminating cells fall below the partial-credit prediction, and a one-sided
exact sign test (under partial credit a cell is as likely above as below its
prediction; ``p = P(Binomial(n, 1/2) >= n_below)``; the study's 32 of 32 gives
``2^-32 = 2.3e-10``, its reported ``p = 2e-10``). The test is
:func:`circuitfade.stats.sign_test`.

:func:`credit_verdict` classifies pooled cells as partial credit, no partial credit or
undecided, by one stated rule (see there): the *credit ratio* of a cell is its retained
fraction over the partial-credit prediction, ``c = retained / ((K-1)/K)`` (0: no partial
credit, 1: exactly partial credit), and the verdict reads the distribution-free 95%
interval of the median ``c`` against :data:`CREDIT_SPLIT` = 0.5, half way between the two
predictions. Unlike "every cell below (K-1)/K", it says "partial credit" for a circuit whose
parts add evidence (tested on planted additive and conjunction circuits).

:func:`routing_parts` finds the parts of a circuit whose heads route their own inputs (no
fixed prior): the distinct heads with the largest attention from the answer position to
each input position.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuitfade.analysis.gates import tokens_renamed
from circuitfade.analysis.heads import check_model, head_label
from circuitfade.store import trace
from circuitfade.tasks import Batch, Task, eval_set
from circuitfade.stats import sign_test

__all__ = ["METHODS", "PART_COLUMNS", "part_ablation", "trace_part_ablation", "pool_cells", "sign_test",
           "normalize_parts", "retained_fraction", "Credit", "CREDIT_SPLIT", "credit_verdict", "median_order_interval",
           "routing_parts"]

METHODS = ("mean", "zero", "resample")
PART_COLUMNS = ("kind", "part", "heads", "method", "n_parts", "acc_intact", "acc_ablated", "chance",
                "retained", "partial_credit")
"""Columns of :func:`part_ablation` (in this order)."""

Head = tuple[int, int]


def normalize_parts(parts) -> dict[str, list[Head]]:
    """``{name: [(layer, head), ..]}`` from a list of heads, a list of head groups, or a mapping
    ``{name: head or [heads]}``. Unnamed parts are named by their heads (``"L0H2"``,
    ``"L1H0+L1H3"``)."""
    def heads_of(x) -> list[Head]:
        if isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(v, (int, np.integer)) for v in x):
            return [(int(x[0]), int(x[1]))]
        if isinstance(x, (tuple, list)) and x and all(isinstance(h, (tuple, list)) and len(h) == 2 for h in x):
            return [(int(h[0]), int(h[1])) for h in x]
        raise ValueError(f"a part must be a (layer, head) pair or a non-empty list of them, got {x!r}")

    if isinstance(parts, Mapping):
        out = {str(k): heads_of(v) for k, v in parts.items()}
    elif isinstance(parts, (list, tuple)):
        groups = [heads_of(p) for p in parts]
        out = {"+".join(head_label(*h) for h in g): g for g in groups}
        if len(out) != len(groups):
            raise ValueError(f"parts: the same part is listed twice in {parts!r}")
    else:
        raise ValueError(f"parts: expected a list of heads / head groups or a mapping, got {type(parts).__name__}")
    if not out:
        raise ValueError("parts: expected at least one part")
    flat = [h for g in out.values() for h in g]
    if len(set(flat)) != len(flat):
        raise ValueError(f"parts: a head belongs to two parts in {out}")
    return out


def retained_fraction(acc_ablated: float, acc_intact: float, chance: float, *, min_gap: float = 0.1) -> float:
    """``(acc_ablated - chance) / (acc_intact - chance)``; NaN unless ``acc_intact >= chance + min_gap``."""
    if not acc_intact >= chance + min_gap:
        return float("nan")
    return (acc_ablated - chance) / (acc_intact - chance)


def _accuracy(logits: Tensor, batch: Batch) -> float:
    correct = (logits.argmax(-1) == batch.targets) & batch.answer_mask
    return float(correct.sum()) / batch.n_answers


def _derangement(n: int, generator: torch.Generator) -> Tensor:
    if n < 2:
        raise ValueError("method='resample' needs a batch of at least 2 sequences")
    perm = torch.randperm(n, generator=generator)
    fixed = perm == torch.arange(n)
    if fixed.any():  # rotate the fixed points among themselves (or swap the only one with a neighbour)
        idx = fixed.nonzero().flatten()
        if len(idx) == 1:
            j = (int(idx[0]) + 1) % n
            perm[idx[0]], perm[j] = perm[j].clone(), perm[idx[0]].clone()
        else:
            perm[idx] = perm[idx.roll(1)]
    return perm


def _resolve(model, batch, task: Task | None, chance: float | None, n: int, seed: int | None):
    if isinstance(batch, Task):
        if task is not None:
            raise ValueError("batch: a Task stands for its evaluation set, so task= must not be given as well; "
                             "pass the Batch to score as batch")
        task = batch
        batch = eval_set(task, n=n) if seed is None else eval_set(task, n=n, seed=seed)
    elif not isinstance(batch, Batch):
        raise ValueError(f"batch: expected a Batch or a Task, got {type(batch).__name__}")
    if batch.n_answers == 0:
        raise ValueError("part_ablation needs a Batch with at least one answer position")
    if chance is None:
        if task is None:
            raise ValueError("part_ablation on a bare Batch needs chance= (or pass the task)")
        chance = float(task.chance)
    if batch.n_pos > model.cfg.n_ctx:
        raise ValueError(f"batch: sequence length {batch.n_pos} exceeds the model's n_ctx={model.cfg.n_ctx}")
    if int(batch.tokens.max()) >= model.cfg.d_vocab:
        raise ValueError(f"batch: token ids up to {int(batch.tokens.max())} but the model's d_vocab={model.cfg.d_vocab}")
    device = next(model.parameters()).device
    return batch.to(device), float(chance)


def _parts_first(fn):
    """``part_ablation(model, batch, task, *, parts=...)`` that also takes the previous release's
    ``part_ablation(model, parts, task_or_batch, task=...)`` (``task_or_batch``: a Task, a Batch or
    ``(task, batch)``) for one release, with a ``DeprecationWarning``."""

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        if "parts" in kwargs or not args:
            return fn(model, *args, **kwargs)
        if isinstance(args[0], (Batch, Task)):
            raise TypeError("part_ablation(model, batch, task, *, parts): parts= is missing")
        parts, rest = args[0], args[1:]
        data, task = (rest[0] if rest else kwargs.pop("task_or_batch", None)), kwargs.pop("task", None)
        if isinstance(data, tuple) and len(data) == 2:
            task, data = data
        warnings.warn("part_ablation(model, parts, task_or_batch): the argument order is now "
                      "part_ablation(model, batch, task, parts=parts); the old order will be refused in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return fn(model, data, task, parts=parts, **kwargs)

    return wrapper


@_parts_first
@torch.no_grad()
def part_ablation(
    model,
    batch: Batch | Task,
    task: Task | None = None,
    *,
    parts,
    method: str = "mean",
    n_random: int = 8,
    seed: int = 0,
    chance: float | None = None,
    n: int = 512,
    eval_seed: int | None = None,
    min_gap: float = 0.1,
) -> pd.DataFrame:
    """Retained fraction of the capability when each part, and each of ``n_random`` random
    non-part heads, is ablated alone (see the module docstring for the definitions).

    The arguments follow the model-level analyses' order ``(model, batch, task, *, options)``:
    ``batch``: a :class:`Batch` (then ``task`` or ``chance=`` gives chance), or a :class:`Task`
    (scored on ``eval_set(task, n, eval_seed)``); ``parts``: see :func:`normalize_parts`.
    ``n_random``: how many distinct non-part heads to draw (fewer if fewer exist), with ``seed``
    (which also seeds ``"resample"``). The previous order ``part_ablation(model, parts,
    task_or_batch)`` still works for one release, with a ``DeprecationWarning``.

    Returns a tidy frame with :data:`PART_COLUMNS` (one row per ablation): ``kind``
    (``"part"`` or ``"random"``), ``part`` (its name, or the head's label), ``heads``
    (labels joined by ``+``), ``method``, ``n_parts`` (K), the two accuracies, ``chance``,
    ``retained`` and ``partial_credit = (K-1)/K``. The model's train/eval mode is restored.
    """
    n_layers, n_heads = check_model(model, "hook_z")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 0:
        raise ValueError(f"n_random: expected an int >= 0, got {n_random!r}")
    named = normalize_parts(parts)
    for name, heads in named.items():
        bad = [h for h in heads if not (0 <= h[0] < n_layers and 0 <= h[1] < n_heads)]
        if bad:
            raise ValueError(f"part {name!r}: heads {bad} not in a model with {n_layers} layers x {n_heads} heads")
    batch, chance = _resolve(model, batch, task, chance, n, eval_seed)
    gen = torch.Generator().manual_seed(int(seed))
    in_parts = {h for g in named.values() for h in g}
    others = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in in_parts]
    pick = torch.randperm(len(others), generator=gen)[: min(n_random, len(others))].tolist()
    randoms = {head_label(*others[i]): [others[i]] for i in sorted(pick)}
    perm = _derangement(len(batch), gen) if method == "resample" else None
    K = len(named)
    names = [f"blocks.{l}.attn.hook_z" for l in range(n_layers)]
    clean: dict[int, Tensor] = {}

    def save(layer: int):
        def hook(z, hook):
            clean[layer] = z.detach()
        return hook

    was_training = model.training
    model.eval()
    try:
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(nm, save(l)) for l, nm in enumerate(names)])
        if len(clean) != n_layers:
            raise ValueError("model: a hook_z hook did not fire during the forward pass")
        acc_intact = _accuracy(logits, batch)

        def ablate(layer: int, heads: list[int]):
            def hook(z, hook):
                z = z.clone()
                for h in heads:
                    if method == "zero":
                        z[:, :, h] = 0.0
                    elif method == "mean":
                        z[:, :, h] = clean[layer][:, :, h].mean(0)
                    else:
                        z[:, :, h] = clean[layer][perm, :, h]
                return z
            return hook

        rows = []
        for kind, group in (("part", named), ("random", randoms)):
            for name, heads in group.items():
                by_layer: dict[int, list[int]] = {}
                for l, h in heads:
                    by_layer.setdefault(l, []).append(h)
                hooks = [(names[l], ablate(l, hs)) for l, hs in by_layer.items()]
                acc = _accuracy(model.run_with_hooks(batch.tokens, fwd_hooks=hooks), batch)
                rows.append({"kind": kind, "part": name, "heads": "+".join(head_label(*h) for h in heads),
                             "method": method, "n_parts": K, "acc_intact": acc_intact, "acc_ablated": acc,
                             "chance": chance, "retained": retained_fraction(acc, acc_intact, chance, min_gap=min_gap),
                             "partial_credit": (K - 1) / K})
    finally:
        model.train(was_training)
    return pd.DataFrame(rows, columns=list(PART_COLUMNS))


def trace_part_ablation(series, parts, task: Task | None = None, *, method: str = "mean", n_random: int = 8,
                        seed: int = 0, batch: Batch | None = None, n: int = 512, progress: bool = False,
                        min_gap: float = 0.1) -> pd.DataFrame:
    """:func:`part_ablation` at every snapshot of a checkpoint series, via :func:`circuitfade.store.trace`.

    ``parts``: fixed parts (as for :func:`part_ablation`), or a callable
    ``parts(model, batch) -> parts`` evaluated at each snapshot (e.g. heads found by a
    screen at that step). Returns the trace frame: ``step``, ``metric = "retained"``,
    ``value`` (the retained fraction), the :data:`PART_COLUMNS` and the series metadata.
    """
    task = task if task is not None else series.task
    if task is None:
        raise ValueError("trace_part_ablation needs a task (the series has none)")

    def metric(model, b, t):
        ps = parts(model, b) if callable(parts) else parts
        df = part_ablation(model, b, t, parts=ps, method=method, n_random=n_random, seed=seed, min_gap=min_gap)
        return df.assign(metric="retained", value=df["retained"])

    kw = {"batch": batch} if batch is not None else {"n": n}
    return trace(series, {"retained": metric}, task, progress=progress, **kw)


def pool_cells(frame: pd.DataFrame, by: Sequence[str], *, kind: str = "part", n_boot: int = 2000,
               seed: int = 0) -> dict:
    """Pool :func:`part_ablation` rows into cells (``by``: e.g. ``["k", "seed"]``) and summarise.

    A cell's value is the mean retained fraction over its ablations of ``kind``; a cell
    discriminates when that value is finite (its intact model is ``min_gap`` above
    chance). Returns ``{"cells": frame (by..., retained, partial_credit, below), "n_cells",
    "n_discriminating", "median", "median_lo", "median_hi" (bootstrap 95% interval over
    cells, ``n_boot`` >= 2 resamples; NaN with fewer than 2 discriminating cells), "n_below" (cells below their partial-credit prediction),
    "p_sign" (:func:`sign_test`), "test"}``.
    """
    missing = [c for c in list(by) + ["kind", "retained", "partial_credit"] if c not in frame.columns]
    if missing:
        raise ValueError(f"pool_cells: frame lacks columns {missing}")
    rows = frame[frame["kind"] == kind]
    cells = rows.groupby(list(by), dropna=False).agg(retained=("retained", "mean"),
                                                     partial_credit=("partial_credit", "first")).reset_index()
    cells["below"] = cells["retained"] < cells["partial_credit"]
    ok = cells[np.isfinite(cells["retained"])]
    vals = ok["retained"].to_numpy()
    n_below = int(ok["below"].sum())
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 2:
        raise ValueError(f"pool_cells: n_boot must be an int >= 2, got {n_boot!r}")
    if len(vals) == 1:  # one cell: a median, but no interval
        med, lo, hi = float(vals[0]), float("nan"), float("nan")
    elif len(vals):
        rng = np.random.default_rng(seed)
        boots = np.median(rng.choice(vals, size=(n_boot, len(vals)), replace=True), axis=1)
        med, lo, hi = float(np.median(vals)), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))
    else:
        med = lo = hi = float("nan")
    return {"cells": cells, "n_cells": len(cells), "n_discriminating": len(ok), "median": med, "median_lo": lo,
            "median_hi": hi, "n_below": n_below, "p_sign": sign_test(n_below, len(ok)),
            "test": "one-sided exact sign test, P(Binomial(n, 1/2) >= n_below)"}


# ----------------------------------------------------------------------------- the verdict rule
class Credit(str, enum.Enum):
    """What pooled part ablations show (:func:`credit_verdict`)."""

    NONE = "no partial credit"
    PARTIAL = "partial credit"
    UNDECIDED = "undecided"

    def __str__(self) -> str:
        return self.value


CREDIT_SPLIT = 0.5
"""Credit ratio half way between no partial credit (0) and partial credit (1)."""


def median_order_interval(values, level: float = 0.95) -> tuple[float, float, float, float]:
    """``(median, lo, hi, coverage)``: the distribution-free interval ``[x_(l), x_(n+1-l)]`` of the
    median of ``values`` (sorted ``x_(1) <= .. <= x_(n)``), ``l`` the largest index whose coverage
    ``1 - 2 P(Binomial(n, 1/2) <= l - 1)`` is at least ``level``. With too few values for ``level``
    (``n <= 5`` at 0.95) it is ``[x_(1), x_(n)]`` and ``coverage = 1 - 2^(1-n)`` is below ``level``.
    NaN values are dropped; no values: all NaN."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return (float("nan"),) * 4
    cover = lambda l: 1.0 - 2.0 * sum(math.comb(n, j) for j in range(l)) / 2.0 ** n  # noqa: E731
    l = 1
    while l + 1 <= (n + 1) // 2 and cover(l + 1) >= level:
        l += 1
    return float(np.median(x)), float(x[l - 1]), float(x[n - l]), float(cover(l))


def credit_verdict(cells, *, split: float = CREDIT_SPLIT, level: float = 0.95) -> dict:
    """Classify pooled part ablations: partial credit, no partial credit, or undecided.

    ``cells``: the ``pool_cells(...)`` dict, or a frame with one row per cell and columns
    ``retained`` (the cell's mean retained fraction) and ``partial_credit`` (``(K-1)/K``).
    Per discriminating cell (finite ``retained``) the credit ratio ``c = retained / partial_credit``;
    over cells the median with its distribution-free interval (:func:`median_order_interval` at ``level``).

    Rule (thresholds as stated): :attr:`Credit.NONE` if the interval lies below ``split`` (0.5),
    :attr:`Credit.PARTIAL` if it lies above, :attr:`Credit.UNDECIDED` if it contains ``split``
    or its coverage is below ``level`` (fewer than 6 cells at 0.95). Returns ``{"verdict",
    "median", "lo", "hi", "coverage", "n", "split", "ratios"}``.
    """
    frame = cells["cells"] if isinstance(cells, Mapping) else cells
    if not isinstance(frame, pd.DataFrame) or not {"retained", "partial_credit"} <= set(frame.columns):
        raise ValueError("credit_verdict: expected pool_cells(...) or a frame with columns retained, partial_credit")
    if not 0 < split < 1:
        raise ValueError(f"credit_verdict: split must be in (0, 1), got {split!r}")
    pc = frame["partial_credit"].to_numpy(float)
    if np.any(pc <= 0):
        raise ValueError("credit_verdict: partial_credit must be > 0 (K >= 2 parts)")
    ratios = frame["retained"].to_numpy(float) / pc
    ratios = ratios[np.isfinite(ratios)]
    med, lo, hi, cov = median_order_interval(ratios, level)
    if len(ratios) == 0 or cov < level or lo <= split <= hi:
        verdict = Credit.UNDECIDED
    else:
        verdict = Credit.NONE if hi < split else Credit.PARTIAL
    return {"verdict": verdict, "median": med, "lo": lo, "hi": hi, "coverage": cov, "n": int(len(ratios)),
            "split": split, "ratios": ratios.tolist()}


# ----------------------------------------------------------------------------- parts of an unpinned circuit
@tokens_renamed
@torch.no_grad()
def routing_parts(model, batch: Batch | Tensor, sources: Sequence[int], query_pos: int, *, layer: int = 0) -> dict:
    """The heads that route each source position to the answer position: one distinct head per source.

    ``A[h, i]``: head ``h``'s attention from ``query_pos`` to ``sources[i]`` (``blocks.{layer}.attn.hook_pattern``,
    mean over ``batch``: a :class:`Batch` or token ids). Part ``i`` is head ``h_i``, the assignment of distinct heads that
    maximises ``sum_i A[h_i, i]`` (exhaustive over ordered head choices; ties: the first in
    lexicographic order). Returns ``{"parts": [(layer, h_i)], "attention": A (heads x sources, list),
    "own": [A[h_i, i]], "shared": [sum_{h != h_i} A[h, i]]}`` (``shared``: how much of input ``i``
    other heads carry too).
    """
    n_layers, n_heads = check_model(model, "hook_pattern")
    tokens = batch.tokens if isinstance(batch, Batch) else batch
    sources = [int(s) for s in sources]
    if not 0 <= layer < n_layers or not sources or len(sources) > n_heads:
        raise ValueError(f"routing_parts: need 1..{n_heads} sources and a layer in [0, {n_layers}), "
                         f"got {len(sources)} sources, layer {layer}")
    if not all(0 <= s <= query_pos < tokens.shape[1] for s in sources):
        raise ValueError(f"routing_parts: sources {sources} and query_pos {query_pos} must be positions "
                         f"of the {tokens.shape[1]}-token batch with sources <= query_pos")
    name = f"blocks.{layer}.attn.hook_pattern"
    was_training = model.training
    model.eval()
    try:
        _, cache = model.run_with_cache(tokens, names_filter=name)
    finally:
        model.train(was_training)
    A = cache[name][:, :, query_pos, sources].mean(0).double()  # [head, source]
    best, best_val = None, -1.0
    for heads in itertools.permutations(range(n_heads), len(sources)):
        val = float(sum(A[h, i] for i, h in enumerate(heads)))
        if val > best_val + 1e-12:
            best, best_val = heads, val
    own = [float(A[h, i]) for i, h in enumerate(best)]
    shared = [float(A[:, i].sum() - A[h, i]) for i, h in enumerate(best)]
    return {"parts": [(layer, int(h)) for h in best], "attention": A.tolist(), "own": own, "shared": shared}
