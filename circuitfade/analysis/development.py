"""Developmental screens: head classes, their emergence and PR leads over a revision series.

The developmental-trajectory paper ("When Do Attention Circuits Form?") screens every head of a model at a
handful of log-spaced training revisions and asks *when* circuits form.
:func:`screen_series` runs the all-head screen of
:mod:`~circuitfade.analysis.screens` (induction, previous-token and BOS-attractor
classes) and the head-output participation ratio of
:mod:`~circuitfade.analysis.spectra` on every revision, into one table with one
row per ``(step, layer, head)``. The series-level findings are functions of that
table, each returning a table:

* :func:`class_fractions`: the whole-model fraction of heads in each class, per
  revision (paper F2);
* :func:`emergence_shape`: is the rise of a fraction a gradual ramp or a sharp
  transition (F2);
* :func:`layer_counts` / :func:`zero_layers`: heads of each class per layer, and the
  layers that never have one (F1: "no BOS heads in layers 0 and 1");
* :func:`set_convergence` / :func:`convergence_summary`: how soon the screened
  induction set equals the final one (F4);
* :func:`pr_lead_test`: is each final induction head's PR elevated at or before the
  revision at which it first crosses the selectivity threshold (F5).

Screen tables
-------------
The series functions accept the table of :func:`screen_series` ("wide": one row
per ``step, layer, head`` with metric columns such as ``induction_selectivity`` and
boolean class columns ``induction, previous_token, bos``), or a long frame with
``step, layer, head, metric, value`` (as from :func:`~circuitfade.store.trace` of
``capability_selectivity``), which is classified with
:func:`~circuitfade.analysis.screens.classify_heads` first. Class membership: the
boolean column if present and ``thresholds`` is None; otherwise recomputed as
``CLASS_METRICS[c] >= thresholds[c]`` (``thresholds`` overrides
``DEFAULT_THRESHOLDS`` key by key).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from circuitfade.analysis.screens import (
    CLASS_METRICS,
    DEFAULT_SEQ_LEN,
    DEFAULT_THRESHOLDS,
    METRICS,
    SCORES,
    capability_selectivity,
    classify_heads,
    repeated_tokens,
)
from circuitfade.analysis.spectra import elevated_pr, head_output_pr
from circuitfade.store import CheckpointSeries
from circuitfade.model.devices import resolve_device, to_device

__all__ = [
    "PR_METRIC",
    "SHARP_SHARE",
    "screen_model",
    "SeriesScreen",
    "screen_series",
    "per_head",
    "class_fractions",
    "emergence_shape",
    "layer_counts",
    "zero_layers",
    "set_convergence",
    "convergence_summary",
    "pr_lead_test",
]

PR_METRIC = "head_output_pr"
"""Column of :func:`screen_series` tables holding each head's output participation ratio."""

SHARP_SHARE = 0.5
"""Default :func:`emergence_shape` rule: "sharp" iff the largest adjacent jump is >= 50% of the total change."""

_KEYS = ["step", "layer", "head"]


# --------------------------------------------------------------------------------------
# screening
# --------------------------------------------------------------------------------------
def screen_model(
    model,
    *,
    n: int = 32,
    seq_len: int | None = None,
    bos: int | None = None,
    seed: int = 0,
    thresholds: Mapping[str, float] | None = None,
    pr_positions: str = "copy",
) -> pd.DataFrame:
    """Classify every head of one model and measure its output PR: one row per head.

    Columns ``layer, head``, the nine ``METRICS`` of
    :func:`~circuitfade.analysis.screens.capability_selectivity` (``n`` sequences,
    half-length ``seq_len``, ``bos``, ``seed``), :data:`PR_METRIC`, the booleans
    ``induction, previous_token, bos`` and ``label`` (as
    :func:`~circuitfade.analysis.screens.classify_heads`).

    ``head_output_pr`` is :func:`~circuitfade.analysis.spectra.head_output_pr` (the PR
    of the head's write to the residual stream, ``z @ W_O``) on the screen's own
    repeated input ``[BOS] s s`` (the same tokens: the first draw of a generator
    seeded with ``seed``), over the ``n x L`` samples at the second-copy positions
    (``pr_positions="copy"``, where an induction head acts) or at all positions
    (``"all"``).
    """
    if pr_positions not in ("copy", "all"):
        raise ValueError(f"pr_positions must be 'copy' or 'all', got {pr_positions!r}")
    scores = capability_selectivity(model, n=n, seq_len=seq_len, seed=seed, bos=bos)
    wide = classify_heads(scores, thresholds)
    d_vocab = model.cfg.d_vocab
    prefix = 0 if bos is None else 1
    if seq_len is None:
        usable = d_vocab - (0 if bos is None else 1)  # capability_selectivity's default, same inputs
        seq_len = min(DEFAULT_SEQ_LEN, (model.cfg.n_ctx - prefix) // 2, usable)
    rep = repeated_tokens(d_vocab, n, seq_len, torch.Generator().manual_seed(seed), bos)
    positions = slice(prefix + seq_len, prefix + 2 * seq_len) if pr_positions == "copy" else "all"
    pr = head_output_pr(model, rep, positions=positions)  # [layer, head]
    wide[PR_METRIC] = pr[wide["layer"].astype(int).tolist(), wide["head"].astype(int).tolist()].numpy().astype(float)
    cols = ["layer", "head", *[m for m in METRICS if m in wide.columns], PR_METRIC, *SCORES, "label"]
    return wide[cols]


@dataclass(frozen=True)
class SeriesScreen:
    """What :func:`screen_series` returns.

    ``table``: one row per ``(step, layer, head)``: ``step``, then :func:`screen_model`'s
    columns, then ``tokens`` (if given) and the series metadata (constant columns);
    ``skipped``: ``{step: "load_failed:<error>"}`` for each revision that did not load.
    """

    table: pd.DataFrame
    skipped: dict[int, str] = field(default_factory=dict)


def screen_series(
    series: CheckpointSeries,
    *,
    n: int = 32,
    seq_len: int | None = None,
    bos: int | None = None,
    seed: int = 0,
    thresholds: Mapping[str, float] | None = None,
    pr_positions: str = "copy",
    tokens: Mapping[int, float] | None = None,
    progress: bool = True,
    device: str | None = None,
) -> SeriesScreen:
    """:func:`screen_model` on every revision of ``series`` (the same inputs, same ``seed``, for each).

    Screens the revisions it is given: to leave out duplicate or unreadable revisions first,
    pass :func:`~circuitfade.store.revisions.sound_revisions`'s series. A revision that fails to
    load is skipped with a ``UserWarning`` and listed in :attr:`SeriesScreen.skipped`; if none
    can be screened, ``ValueError``. ``bos=None`` uses the series task's ``bos_token`` if it has
    one (e.g. the ``repeats`` task), else no BOS token. ``tokens``: ``{step: tokens seen}``.
    ``device`` (``"cpu"``, ``"cuda"``, ``"mps"``, ``"auto"``) moves each revision's model
    there before screening (default: where the series put it).
    """
    if device is not None:
        resolve_device(device)  # fails before any work if the device is not here
    if not isinstance(series, CheckpointSeries):
        raise ValueError(f"screen_series expects a CheckpointSeries (see store.attach), got {type(series).__name__}")
    if bos is None:
        bos = getattr(series.task, "bos_token", None)
    skipped: dict[int, str] = {}
    todo = list(series.snapshots)
    if progress:
        from circuitfade.store.tracing import progress_bar

        todo = progress_bar(todo, desc=f"screen {series.metadata.get('run', '')}".strip(), leave=False)
    frames = []
    for snap in todo:
        try:
            model = series[snap.step]
        except Exception as e:  # noqa: BLE001 - report and skip a revision that does not load
            skipped[snap.step] = f"load_failed:{type(e).__name__}: {' '.join(str(e).split())}"
            warnings.warn(f"skipping step {snap.step} ({snap.source}): {skipped[snap.step]}", UserWarning,
                          stacklevel=2)
            continue
        model = to_device(model, device)
        df = screen_model(model, n=n, seq_len=seq_len, bos=bos, seed=seed, thresholds=thresholds,
                          pr_positions=pr_positions)
        df.insert(0, "step", snap.step)
        frames.append(df)
        del model
    if not frames:
        raise ValueError(f"no revision of {series.source} could be screened: {skipped}")
    out = pd.concat(frames, ignore_index=True)
    out["step"] = out["step"].astype("int64")
    if tokens is not None:
        out["tokens"] = out["step"].map(lambda s: tokens.get(int(s), np.nan)).astype(float)
    for k, v in series.metadata.items():
        if k not in out.columns:
            out[k] = [v] * len(out)
    return SeriesScreen(out, skipped)


# --------------------------------------------------------------------------------------
# normalising screen tables
# --------------------------------------------------------------------------------------
def per_head(screen: pd.DataFrame, thresholds: Mapping[str, float] | None = None) -> pd.DataFrame:
    """A screen table as one row per ``(step, layer, head)`` with boolean class columns.

    Accepts the wide output of :func:`screen_series` or a long ``step, layer, head,
    metric, value`` frame (classified with ``classify_heads``); see the module
    docstring for how class membership is decided. Returns a copy sorted by
    ``step, layer, head``. Raises ValueError naming what is missing.
    """
    if not isinstance(screen, pd.DataFrame):
        raise ValueError(f"expected a screen DataFrame, got {type(screen).__name__}")
    if {"metric", "value"} <= set(screen.columns):
        keep = [c for c in screen.columns if c in _KEYS or c in ("metric", "value")]
        missing = set(_KEYS) - set(keep)
        if missing:
            raise ValueError(
                f"a long screen frame needs columns {_KEYS + ['metric', 'value']}; missing {sorted(missing)}"
            )
        wide = classify_heads(screen[keep], thresholds)
    else:
        missing = set(_KEYS) - set(screen.columns)
        if missing:
            raise ValueError(f"a screen table needs columns {_KEYS}; missing {sorted(missing)}")
        wide = screen.copy()
        given = set(thresholds or {})
        unknown = given - set(DEFAULT_THRESHOLDS)
        if unknown:
            raise ValueError(f"unknown threshold names {sorted(unknown)}; expected a subset of {list(SCORES)}")
        limits = {**DEFAULT_THRESHOLDS, **{k: float(v) for k, v in (thresholds or {}).items()}}
        for c in SCORES:
            metric = CLASS_METRICS[c]
            if metric in wide.columns and (thresholds is not None or c not in wide.columns):
                wide[c] = wide[metric].astype(float) >= limits[c]
            elif c in given:
                raise ValueError(f"threshold for {c!r} given but the table has no {metric!r} column")
            elif c not in wide.columns:
                raise ValueError(f"the screen table has neither a boolean {c!r} column nor a {metric!r} column")
            wide[c] = wide[c].astype(bool)
    if wide.duplicated(_KEYS).any():
        raise ValueError("several rows per (step, layer, head); screen one series at a time")
    wide["step"] = wide["step"].astype("int64")
    return wide.sort_values(_KEYS, kind="stable").reset_index(drop=True)


def _classes(classes: Sequence[str] | str | None) -> list[str]:
    if classes is None:
        return list(SCORES)
    if isinstance(classes, str):
        classes = [classes]
    bad = [c for c in classes if c not in SCORES]
    if bad:
        raise ValueError(f"unknown head classes {bad}; expected a subset of {list(SCORES)}")
    return list(classes)


# --------------------------------------------------------------------------------------
# series-level findings
# --------------------------------------------------------------------------------------
def class_fractions(
    screen: pd.DataFrame,
    *,
    thresholds: Mapping[str, float] | None = None,
    classes: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Whole-model fraction of heads in each class, per revision.

    Returns one row per ``(step, class)``: ``count`` (heads in the class),
    ``n_heads`` (heads screened at that step) and ``fraction = count / n_heads``,
    plus ``tokens`` if the screen table has that column. Sorted by class (in
    ``SCORES`` order) then step.
    """
    wide = per_head(screen, thresholds)
    rows = []
    for c in _classes(classes):
        g = wide.groupby("step", sort=True)[c]
        for step, col in g:
            row = {"step": int(step), "class": c, "count": int(col.sum()), "n_heads": int(len(col))}
            row["fraction"] = row["count"] / row["n_heads"]
            rows.append(row)
    out = pd.DataFrame(rows, columns=["step", "class", "count", "n_heads", "fraction"])
    if "tokens" in wide.columns:
        out = out.merge(wide.groupby("step")["tokens"].first().reset_index(), on="step", how="left")
    return out


def emergence_shape(
    fractions: pd.DataFrame,
    *,
    sharp_share: float = SHARP_SHARE,
    min_change: float = 0.05,
) -> pd.DataFrame:
    """Gradual ramp or sharp transition: the shape of each class fraction's change.

    ``fractions``: :func:`class_fractions` output (``step, class, fraction``; at least
    two revisions per class). For each class, with ``f_0 .. f_K`` the fractions in
    step order:

    * ``total_change = f_K - f_0`` (net change from the first to the last revision);
    * ``largest_jump = max_i sign(total_change) * (f_{i+1} - f_i)``, the largest step
      between adjacent revisions in the direction of the total change, between
      ``jump_from_step`` and ``jump_to_step``;
    * ``jump_share = largest_jump / |total_change|`` (can exceed 1 if the fraction
      overshoots and comes back);
    * ``shape``: ``"flat"`` if ``|total_change| < min_change``; else ``"sharp"`` if
      ``jump_share >= sharp_share`` (default 0.5: one adjacent pair of revisions carries
      at least half of the change, like OLMo 1B's BOS fraction going from 7% to 70%),
      else ``"gradual"``.

    Returns one row per class: ``class, shape, start, end, total_change,
    largest_jump, jump_share, jump_from_step, jump_to_step, n_revisions``
    (``jump_share`` and the jump steps are NaN/NA for ``"flat"``).
    """
    needed = {"step", "class", "fraction"}
    if not isinstance(fractions, pd.DataFrame) or not needed <= set(fractions.columns):
        raise ValueError(f"fractions must be a DataFrame with columns {sorted(needed)} (see class_fractions)")
    if not 0 < sharp_share <= 1:
        raise ValueError(f"sharp_share must be in (0, 1], got {sharp_share}")
    if min_change < 0:
        raise ValueError(f"min_change must be >= 0, got {min_change}")
    rows = []
    order = {c: i for i, c in enumerate(SCORES)}
    for c, g in sorted(fractions.groupby("class", sort=False), key=lambda kv: order.get(kv[0], len(order))):
        g = g.sort_values("step")
        if g["step"].duplicated().any():
            raise ValueError(f"class {c!r} has several fractions per step")
        f = g["fraction"].to_numpy(dtype=float)
        steps = g["step"].to_numpy()
        if len(f) < 2:
            raise ValueError(f"class {c!r}: need at least 2 revisions to judge a shape, got {len(f)}")
        total = float(f[-1] - f[0])
        row = {"class": c, "start": float(f[0]), "end": float(f[-1]), "total_change": total,
               "n_revisions": len(f)}
        if abs(total) < min_change:
            jumps = np.abs(np.diff(f))
            i = int(np.argmax(jumps))
            row.update(shape="flat", largest_jump=float(jumps[i]), jump_share=np.nan,
                       jump_from_step=pd.NA, jump_to_step=pd.NA)
        else:
            jumps = np.sign(total) * np.diff(f)
            i = int(np.argmax(jumps))
            share = float(jumps[i]) / abs(total)
            row.update(shape="sharp" if share >= sharp_share else "gradual", largest_jump=float(jumps[i]),
                       jump_share=share, jump_from_step=int(steps[i]), jump_to_step=int(steps[i + 1]))
        rows.append(row)
    cols = ["class", "shape", "start", "end", "total_change", "largest_jump", "jump_share",
            "jump_from_step", "jump_to_step", "n_revisions"]
    out = pd.DataFrame(rows, columns=cols)
    for col in ("jump_from_step", "jump_to_step"):
        out[col] = out[col].astype("Int64")
    return out


def layer_counts(
    screen: pd.DataFrame,
    *,
    thresholds: Mapping[str, float] | None = None,
    classes: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Heads of each class per layer and revision.

    One row per ``(step, layer, class)``: ``count``, ``n_heads`` (heads of that layer)
    and ``fraction``. Sorted by class, step, layer.
    """
    wide = per_head(screen, thresholds)
    rows = []
    for c in _classes(classes):
        for (step, layer), col in wide.groupby(["step", "layer"], sort=True)[c]:
            rows.append({"step": int(step), "layer": int(layer), "class": c, "count": int(col.sum()),
                         "n_heads": int(len(col)), "fraction": float(col.mean())})
    return pd.DataFrame(rows, columns=["step", "layer", "class", "count", "n_heads", "fraction"])


def zero_layers(counts: pd.DataFrame) -> pd.DataFrame:
    """For each ``(class, layer)`` of :func:`layer_counts`: is the count 0 at every revision?

    Columns ``class, layer, max_count, n_revisions, zero_at_every_revision``; e.g. the
    paper's F1 is ``zero_at_every_revision`` for class ``"bos"`` in layers 0 and 1.
    """
    needed = {"step", "layer", "class", "count"}
    if not isinstance(counts, pd.DataFrame) or not needed <= set(counts.columns):
        raise ValueError(f"counts must be a DataFrame with columns {sorted(needed)} (see layer_counts)")
    g = counts.groupby(["class", "layer"], sort=False)
    out = g.agg(max_count=("count", "max"), n_revisions=("step", "nunique")).reset_index()
    out["zero_at_every_revision"] = out["max_count"] == 0
    order = {c: i for i, c in enumerate(SCORES)}
    out = out.sort_values(["class", "layer"], key=lambda s: s.map(order) if s.name == "class" else s)
    return out.reset_index(drop=True)


def _head_sets(wide: pd.DataFrame, cls: str) -> dict[int, frozenset]:
    return {int(step): frozenset(zip(g.loc[g[cls], "layer"].astype(int), g.loc[g[cls], "head"].astype(int)))
            for step, g in wide.groupby("step", sort=True)}


def set_convergence(
    screen: pd.DataFrame,
    *,
    cls: str = "induction",
    thresholds: Mapping[str, float] | None = None,
    jaccard_threshold: float = 0.8,
) -> pd.DataFrame:
    """How close each revision's set of ``cls`` heads is to the final revision's.

    With ``S_t`` the set of ``(layer, head)`` in class ``cls`` at step ``t`` and ``F``
    the set at the last step: one row per step with ``n_set = |S_t|``,
    ``n_final = |F|``, ``n_common = |S_t & F|``, ``jaccard = |S_t & F| / |S_t | F|``
    (1 when both are empty), ``exact`` (``S_t == F``) and ``close``
    (``jaccard >= jaccard_threshold``, the threshold in column ``jaccard_threshold``), and
    ``fraction_of_training = step / final step``.
    See :func:`convergence_summary` for the earliest matching revisions.
    """
    cls = _classes(cls)[0]
    if not 0 < jaccard_threshold <= 1:
        raise ValueError(f"jaccard_threshold must be in (0, 1], got {jaccard_threshold}")
    sets = _head_sets(per_head(screen, thresholds), cls)
    final_step = max(sets)
    final = sets[final_step]
    rows = []
    for step, s in sets.items():
        union = s | final
        jac = 1.0 if not union else len(s & final) / len(union)
        rows.append({"step": step, "class": cls, "n_set": len(s), "n_final": len(final),
                     "n_common": len(s & final), "jaccard": jac, "exact": s == final,
                     "close": jac >= jaccard_threshold, "jaccard_threshold": float(jaccard_threshold),
                     "fraction_of_training": step / final_step if final_step else np.nan})
    return pd.DataFrame(rows)


def convergence_summary(convergence: pd.DataFrame, *, jaccard_threshold: float | None = None) -> pd.DataFrame:
    """The earliest revisions at which the screened set matches the final set.

    From :func:`set_convergence` output: one row with ``class, final_step, n_final``,

    * ``first_exact_step``: the earliest step whose set equals the final set;
    * ``stable_exact_step``: the earliest step from which every later set equals it
      (the screen has converged and stays converged);
    * ``first_close_step`` / ``stable_close_step``: the same with Jaccard >= the
      threshold (``jaccard_threshold``, default the one ``set_convergence`` used);
    * ``*_fraction``: each step divided by the final step (the share of training
      needed before the final circuit can be read off an intermediate revision).
    """
    needed = {"step", "jaccard", "exact", "n_final"}
    if not isinstance(convergence, pd.DataFrame) or not needed <= set(convergence.columns):
        raise ValueError(f"convergence must be a DataFrame with columns {sorted(needed)} (see set_convergence)")
    if jaccard_threshold is not None:
        thr = float(jaccard_threshold)
    else:  # the one set_convergence used
        thr = float(convergence["jaccard_threshold"].iloc[0]) if "jaccard_threshold" in convergence else 0.8
    c = convergence.sort_values("step")
    steps = c["step"].to_numpy()
    final_step = int(steps[-1])

    def first(mask: np.ndarray) -> int:
        return int(steps[np.argmax(mask)])

    def stable(mask: np.ndarray) -> int:
        # earliest i with mask[i:] all True (the last revision always matches itself)
        tail = np.logical_and.accumulate(mask[::-1])[::-1]
        return int(steps[np.argmax(tail)])

    exact = c["exact"].to_numpy(dtype=bool)
    close = c["jaccard"].to_numpy(dtype=float) >= thr
    row = {"class": c["class"].iloc[0] if "class" in c.columns else "induction", "final_step": final_step,
           "n_final": int(c["n_final"].iloc[-1]), "jaccard_threshold": thr,
           "first_exact_step": first(exact), "stable_exact_step": stable(exact),
           "first_close_step": first(close), "stable_close_step": stable(close)}
    for k in ("first_exact_step", "stable_exact_step", "first_close_step", "stable_close_step"):
        row[k.replace("_step", "_fraction")] = row[k] / final_step if final_step else np.nan
    return pd.DataFrame([row])


def pr_lead_test(
    screen: pd.DataFrame,
    *,
    cls: str = "induction",
    thresholds: Mapping[str, float] | None = None,
    pr_metric: str = PR_METRIC,
    z: float = 2.0,
    rel_tol: float = 0.05,
    ratio: float | None = None,
    window: int | None = None,
    min_history: int = 1,
    lookback: int | None = None,
) -> pd.DataFrame:
    """For each final ``cls`` head: is its PR elevated at or before it first crosses the threshold?

    The final heads are those in class ``cls`` at the last revision. For each:

    * ``cross_step``: the first revision at which it is in the class (its
      ``CLASS_METRICS[cls]`` value >= the threshold), and ``selectivity_at_cross``;
    * PR elevation per revision from :func:`~circuitfade.analysis.spectra.elevated_pr`
      on the head's ``pr_metric`` series (arguments ``z, rel_tol, ratio, window,
      min_history`` are passed on: by default, elevated iff
      ``PR - mean(earlier PRs) > max(2 * std(earlier PRs), 0.05 * |mean|)``; the first
      revision is never elevated);
    * ``first_elevated_step``: the first elevated revision (any time; NA if never);
    * ``elevated_by_cross``: PR is elevated at some revision ``<= cross_step`` (with
      ``lookback=k``: at the crossing or one of the ``k`` revisions before it; default
      any earlier revision). False when the head is already in the class at the first
      revision: there is no earlier PR to compare with;
    * ``lead_revisions``: how many revisions the first elevation at or before the
      crossing precedes it (0 = at the crossing; NA if not ``elevated_by_cross``);
    * ``pr_at_cross``, ``baseline_at_cross`` (``elevated_pr``'s baseline there).

    Returns one row per final head (``layer, head`` order); empty (same columns) if the
    final revision has no ``cls`` head. Raises ValueError if ``pr_metric`` is missing.
    """
    cls = _classes(cls)[0]
    if lookback is not None and (isinstance(lookback, bool) or not isinstance(lookback, int) or lookback < 0):
        raise ValueError(f"lookback must be None or an int >= 0, got {lookback!r}")
    wide = per_head(screen, thresholds)
    if pr_metric not in wide.columns:
        raise ValueError(f"the screen table has no {pr_metric!r} column (see screen_series)")
    metric = CLASS_METRICS[cls]
    cols = ["layer", "head", "class", "cross_step", "selectivity_at_cross", "first_elevated_step",
            "elevated_by_cross", "lead_revisions", "pr_at_cross", "baseline_at_cross"]
    final_step = wide["step"].max()
    final = wide[(wide["step"] == final_step) & wide[cls]]
    flagged = elevated_pr(
        wide[["step", "layer", "head"]].assign(value=wide[pr_metric].astype(float)),
        z=z, rel_tol=rel_tol, ratio=ratio, window=window, min_history=min_history,
    )
    wide = wide.assign(elevated=flagged["elevated"].to_numpy(), baseline=flagged["baseline"].to_numpy())
    steps = sorted(wide["step"].unique())
    index = {s: i for i, s in enumerate(steps)}
    rows = []
    for layer, head in zip(final["layer"], final["head"]):
        h = wide[(wide["layer"] == layer) & (wide["head"] == head)].sort_values("step")
        cross = int(h.loc[h[cls], "step"].iloc[0])
        at = h[h["step"] == cross].iloc[0]
        elevated_steps = [int(s) for s in h.loc[h["elevated"], "step"]]
        earliest = steps[max(0, index[cross] - lookback)] if lookback is not None else steps[0]
        before = [s for s in elevated_steps if earliest <= s <= cross]
        rows.append({
            "layer": int(layer), "head": int(head), "class": cls, "cross_step": cross,
            "selectivity_at_cross": float(at[metric]) if metric in h.columns else np.nan,
            "first_elevated_step": elevated_steps[0] if elevated_steps else pd.NA,
            "elevated_by_cross": bool(before),
            "lead_revisions": index[cross] - index[before[0]] if before else pd.NA,
            "pr_at_cross": float(at[pr_metric]), "baseline_at_cross": float(at["baseline"]),
        })
    out = pd.DataFrame(rows, columns=cols)
    for col in ("first_elevated_step", "lead_revisions", "cross_step"):
        out[col] = out[col].astype("Int64")
    out["elevated_by_cross"] = out["elevated_by_cross"].astype(bool)
    return out
