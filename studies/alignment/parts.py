"""``python -m studies.alignment``: no-partial-credit circuit formation.

The no-partial-credit study claims a capability appears when the last
missing parts of its circuit align in one stochastic attempt, and that all-but-one
is worth nothing. Three measurements on the shortcut-free K-part apparatus
(:mod:`circuitfade.tasks.kpart`, V = 3, one distractor, the pinned one-layer preset):

* ``ablation`` - train the K-part circuit from scratch (K = 2..5, seeds 0..N-1),
  ablate each part alone and random non-part heads (:func:`~circuitfade.analysis.parts.part_ablation`,
  mean ablation; zero and resample too), pool the cells (K x seed) and compare with
  partial credit ``(K-1)/K``; also on the locally trained developing series
  (previous-token + induction heads found by the screens) when ``--with-series``.
* ``waiting`` - re-initialise ``m`` of the K parts of each trained circuit
  (:func:`~circuitfade.train.surgery.reinit_heads`, a seeded random choice of parts),
  keep training, and measure the waiting time to re-ignition
  (:func:`~circuitfade.analysis.ignition.ignition_step`) for every (K, m); the ratio
  wait(5,3) / wait(3,3) against the study's 1.19-1.37.
* ``rate`` - the rate equation ``rate = sites x attempts x drive x exp(-beta m) - destruction``
  (``m`` missing parts; one pinned site per part, attempts = capability examples per
  step, drive = learning rate / base learning rate), fitted on the fit cells, frozen
  to ``OUT/rate_constants.json`` with a content hash, then read back and used to
  predict the held-out cells (median relative error).

Every training job stops at ignition plus a margin (or at a cap, then it is
*censored*: reported, never given a number). Jobs are pure functions of their spec
(one torch thread); a finished job's result (``OUT/jobs/<key>.json``) and base run
directory (``OUT/runs/<key>/``, a normal run directory: ``attach`` opens it) are
reused. Waits are in training steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from circuitfade.analysis.ignition import ignition_step
from circuitfade.analysis.parts import part_ablation, pool_cells, trace_part_ablation
from circuitfade.analysis.screens import capability_selectivity
from circuitfade.claims import Claim, Outcome, Verdict, verdict_table
from circuitfade.gating.evaluation import evaluate_batch
from circuitfade.io import freeze_payload, load_frozen, read_json
from circuitfade.stats import bootstrap_median, bootstrap_median_ratio, nelder_mead
from circuitfade.store import attach
from circuitfade.tasks import eval_set, make_task
from circuitfade.train import RunConfig, load_checkpoint, new_run, train
from circuitfade.train.checkpoints import complete_checkpoints
from circuitfade.tasks import EVAL_SEED
from circuitfade.train.recipes import LOCAL_TASK, build_local_series
from circuitfade.train.surgery import reinit_heads
from circuitfade.viz.tables import markdown_table
from circuitfade.train.rundir import RunDir
from studies.alignment.apparatus import (
    BASE_CAP,
    BATCH,
    CHUNK,
    EVAL_SIZE,
    LR,
    MARGIN,
    PATIENCE,
    REINIT_EVAL_EVERY,
    THRESHOLD,
    WAIT_CAP,
    base_config,
    check_finite,
    job_key,
    persist,
    run_cached_jobs,
    until_ignition,
)
from studies.alignment.protocol import PARTS_V1

__all__ = ["STUDY", "KS", "PARTS", "CLAIMS", "base_job", "reinit_job", "fit_rate", "predict_wait", "freeze_constants",
           "load_constants", "wait_table", "series_ablation", "verdicts", "run_parts", "PartsResult"]

PARTS = ("ablation", "waiting", "rate")
"""The experiments of this module (the others have modules of their own)."""

KS = tuple(PARTS_V1.data["ks"])
DRIVES = tuple(PARTS_V1.data["drives"])  # learning-rate multipliers of the drive cells
DRIVE_CELLS = tuple(tuple(c) for c in PARTS_V1.data["drive_cells"])
HELD_OUT = lambda k, m, drive: k == 5 or (k == 4 and drive != 1.0)  # noqa: E731 - the rule, stated once
"""Rate-equation split, fixed before any run: every K = 5 cell and the K = 4 drive cells are held out."""

STUDY = {
    "ratio_53_33": (1.19, 1.37),
    "median_retained": 0.17,
    "cells_below": "32 of 32",
    "p": 2e-10,
    "random_head": 1.0,
}


def base_job(spec: Mapping, out: str) -> dict:
    """Train the K-part circuit from scratch until ignition + margin; persist it; ablate its parts."""
    torch.set_num_threads(1)
    k, seed = int(spec["k"]), int(spec["seed"])
    out = Path(out)
    run_dir = out / "runs" / job_key(spec)
    t0 = time.process_time()
    run = new_run(base_config(k, seed, CHUNK))
    task = run.config.make_task()
    while True:  # from scratch the step-0 evaluation is in the metrics: the curve is as recorded
        steps = [int(m["step"]) for m in run.metrics]
        accs = [float(m["acc_normal"]) for m in run.metrics]
        ig = ignition_step(accs, steps=steps, baseline=task.chance, threshold=THRESHOLD, patience=PATIENCE)
        if (ig is not None and steps[-1] - ig >= MARGIN) or run.step >= BASE_CAP[k]:
            break
        train(base_config(k, seed, min(run.step + CHUNK, BASE_CAP[k])), None, run=run, progress=False)
        check_finite(run)
    persist(run, run_dir)
    res = {**spec, "run_dir": str(run_dir), "ignition": ig, "final_step": run.step, "final_acc": accs[-1],
           "cpu_s": time.process_time() - t0}
    if ig is not None:
        ev = eval_set(task, n=512, seed=EVAL_SEED + 1)  # an evaluation batch the stopping rule never saw
        parts = [(0, i) for i in range(k)]
        frames = [part_ablation(run.model, ev, task, parts=parts, method=mth, n_random=run.model.cfg.n_heads - k,
                                seed=seed).assign(k=k, seed=seed) for mth in ("mean", "zero", "resample")]
        res["ablation"] = pd.concat(frames, ignore_index=True).to_dict("records")
    return res


def reinit_job(spec: Mapping, out: str) -> dict:
    """Re-initialise ``m`` of the K parts of a finished base run and train until re-ignition + margin."""
    torch.set_num_threads(1)
    k, m, seed, drive = int(spec["k"]), int(spec["m"]), int(spec["seed"]), float(spec.get("drive", 1.0))
    base = read_json(Path(out) / "jobs" / f"{job_key(spec['base'])}.json")
    if base.get("ignition") is None:
        return {**spec, "status": "no base", "wait": None}
    run_dir = Path(base["run_dir"])
    cfg = RunDir(run_dir).read_config()
    t0 = time.process_time()
    run = new_run(cfg)
    load_checkpoint(run, run_dir, complete_checkpoints(run_dir)[-1])
    start = run.step
    chosen = sorted(torch.randperm(k, generator=torch.Generator().manual_seed(10_007 * seed + 101 * m + k))[:m].tolist())
    reinit_heads(run, [(0, i) for i in chosen], seed=1_000_003 + 7919 * seed + m)
    task = cfg.make_task()
    first = evaluate_batch(run.model, task, eval_set(task, n=EVAL_SIZE, seed=EVAL_SEED))["accuracy"]

    def cfg_at(s: int) -> RunConfig:
        return replace(cfg, train=replace(cfg.train, steps=s, lr=LR * drive, eval_every=REINIT_EVAL_EVERY))

    def set_lr(r) -> None:  # the optimizer keeps its own lr (restored from the checkpoint)
        for g in r.optimizer.param_groups:
            g["lr"] = LR * drive

    ig, steps, accs = until_ignition(run, cfg_at, start=start, first=first, cap=WAIT_CAP, chance=task.chance,
                                      before=set_lr)
    return {**spec, "status": "ignited" if ig is not None else "censored", "parts": chosen, "start": start,
            "acc_after_reinit": first, "ignition": ig, "wait": None if ig is None else ig - start,
            "final_step": run.step, "curve": [steps, accs], "cpu_s": time.process_time() - t0}


# ------------------------------------------------------------------ the rate equation
def predict_wait(m, drive, constants: Mapping) -> np.ndarray:
    """``1 / (A * drive * exp(-beta * m) - delta)`` steps (``inf`` where the rate is <= 0), with
    ``A = c * sites * attempts`` (``constants``: ``c, beta, delta, sites, attempts``)."""
    m, drive = np.asarray(m, dtype=float), np.asarray(drive, dtype=float)
    a = constants["c"] * constants["sites"] * constants["attempts"]
    rate = a * drive * np.exp(-constants["beta"] * m) - constants["delta"]
    with np.errstate(divide="ignore"):
        return np.where(rate > 0, 1.0 / np.where(rate > 0, rate, 1.0), np.inf)


def fit_rate(cells: pd.DataFrame, *, sites: float = 1.0, attempts: float = float(BATCH)) -> dict:
    """Fit ``c, beta, delta >= 0`` of the rate equation to measured waits.

    ``cells``: columns ``m, drive, wait`` (one row per cell: a typical wait, e.g. the
    median over seeds, all finite). Least squares on ``log(wait)``; ``delta = exp(u)``
    (so it stays positive; a fit that wants none drives ``u`` far below ``log A``).
    Several starts of a Nelder-Mead search; returns the constants and the fit's RMS
    log error.
    """
    need = {"m", "drive", "wait"}
    if not need <= set(cells.columns) or len(cells) < 3:
        raise ValueError(f"fit_rate: expected >= 3 rows with columns {sorted(need)}")
    m, d, w = (cells[c].to_numpy(dtype=float) for c in ("m", "drive", "wait"))
    if not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError("fit_rate: every wait must be finite and positive (drop censored cells first)")
    logw = np.log(w)

    def loss(x):
        log_a, beta, u = x
        rate = np.exp(log_a) * d * np.exp(-beta * m) - np.exp(u)
        if np.any(rate <= 0):
            return 1e6 + float(np.sum(np.clip(-rate, 0, None)))
        return float(np.mean((-np.log(rate) - logw) ** 2))

    best = None
    for beta0 in (0.2, 1.0, 2.0):
        for gap in (2.0, 6.0):
            log_a0 = float(np.median(beta0 * m - logw - np.log(d)))
            x, v = nelder_mead(loss, [log_a0, beta0, log_a0 - beta0 * m.max() - gap])
            if best is None or v < best[1]:
                best = (x, v)
    (log_a, beta, u), v = best
    return {"c": float(np.exp(log_a) / (sites * attempts)), "beta": float(beta), "delta": float(np.exp(u)),
            "sites": float(sites), "attempts": float(attempts), "rms_log_error": float(math.sqrt(v)),
            "n_cells": int(len(cells))}


def freeze_constants(path: str | Path, constants: Mapping, *, fit_cells: pd.DataFrame, note: str = "") -> dict:
    """Write ``{"payload": {...}, "sha256": ...}``; refuses to overwrite different frozen constants."""
    payload = {"formula": "wait = 1 / (c * sites * attempts * drive * exp(-beta * m) - delta)",
               "constants": dict(constants), "fit_cells": fit_cells.to_dict("records"), "note": note}
    return freeze_payload(path, payload, what="frozen constants")


def load_constants(path: str | Path) -> dict:
    """Read frozen constants, checking the content hash (:func:`circuitfade.io.load_frozen`)."""
    return load_frozen(path, what="frozen constants")["constants"]


def wait_table(reinit: pd.DataFrame) -> pd.DataFrame:
    """Per (K, m, drive): seeds (with a base circuit to re-ignite), ignited, median wait with a bootstrap 95% interval, mean acc after re-init."""
    rows = []
    for (k, m, d), g in reinit.groupby(["k", "m", "drive"]):
        g = g[g["status"] != "no base"]  # a seed whose base circuit never formed has nothing to re-ignite
        w = g["wait"].dropna().to_numpy(dtype=float)
        med, lo, hi = bootstrap_median(w)
        rows.append({"k": k, "m": m, "drive": d, "seeds": len(g), "ignited": len(w),
                     "wait_median": med, "wait_lo": lo, "wait_hi": hi,
                     "acc_after_reinit": float(g["acc_after_reinit"].mean())})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ figures
def wait_figure(table: pd.DataFrame) -> go.Figure:
    """Median waiting time (95% bootstrap interval over seeds) vs missing parts m, one line per K."""
    fig = go.Figure()
    t = table[(table.drive == 1.0) & np.isfinite(table.wait_median)]
    for k, g in t.groupby("k"):
        g = g.sort_values("m")
        fig.add_scatter(x=g.m, y=g.wait_median, mode="lines+markers", name=f"K = {k}",
                        error_y={"type": "data", "symmetric": False, "array": g.wait_hi - g.wait_median,
                                 "arrayminus": g.wait_median - g.wait_lo})
    fig.update_layout(title="Waiting time to re-ignition vs missing parts (median over seeds, 95% bootstrap interval)",
                      xaxis_title="missing parts m (re-initialised heads)",
                      yaxis_title="waiting time (training steps, log scale)", yaxis_type="log", height=480,
                      xaxis={"dtick": 1})
    return fig


def retained_figure(ablation: pd.DataFrame, series: pd.DataFrame | None = None) -> go.Figure:
    """Retained fraction per cell (mean over its parts) and random non-part heads, with the partial-credit line."""
    fig = go.Figure()
    a = ablation[ablation.method == "mean"]
    rng = np.random.default_rng(0)
    for kind, color in (("part", "#d62728"), ("random", "#7f7f7f")):
        cells = a[a.kind == kind].groupby(["k", "seed"]).retained.mean().reset_index().dropna()
        x = cells.k + rng.uniform(-0.12, 0.12, len(cells)) + (0.25 if kind == "random" else 0)
        fig.add_scatter(x=x, y=cells.retained, mode="markers", marker={"color": color, "size": 8},
                        name="one part ablated (cell = K x seed)" if kind == "part" else "one random non-part head")
    ks = sorted(a.k.unique())
    fig.add_scatter(x=[None if dx is None else k + dx for k in ks for dx in (-0.3, 0.45, None)],
                    y=[v for k in ks for v in ((k - 1) / k, (k - 1) / k, None)], mode="lines",
                    line={"dash": "dash", "color": "black"}, name="partial credit (K-1)/K")
    series = None if series is None else series[np.isfinite(series.retained)]
    if series is not None and len(series):
        fig.add_scatter(x=[1.0] * len(series), y=series.retained, mode="markers",
                        marker={"color": "#1f77b4", "size": 8, "symbol": "diamond"},
                        name="developing series (prev-token + induction, K=2)")
    fig.update_layout(title="Capability retained when one part is ablated (mean ablation)",
                      xaxis_title="parts K (developing series at 1)",
                      yaxis_title="retained fraction (0 = chance, 1 = intact)", height=480,
                      xaxis={"dtick": 1}, yaxis={"range": [-0.2, 1.15]})
    return fig


# ------------------------------------------------------------------ the developing series
SERIES_STEPS = 1000
"""Length of the local developing series used here (the induction circuit is in place by step 633 of
the 3,000-step series; 1,000 steps keep the build to a few CPU seconds per hundred steps)."""


def series_ablation(out: Path, *, progress: bool = False) -> pd.DataFrame:
    """Part ablation over the local developing series (:data:`SERIES_STEPS` steps): parts = the
    previous-token and the induction head the screens rank first at the final checkpoint."""
    run_dir = build_local_series(out / "runs" / "development-series", steps=SERIES_STEPS, progress=progress)
    series = attach(run_dir)
    final = series[series.steps[-1]]
    scores = capability_selectivity(final)
    pick: dict[str, tuple[int, int]] = {}
    for cls in ("induction", "previous_token"):  # the top head of each class; one head is never both parts
        ranked = scores[scores.metric == f"{cls}_selectivity"].sort_values("value", ascending=False)
        head = next((int(r.layer), int(r.head)) for r in ranked.itertuples()
                    if (int(r.layer), int(r.head)) not in pick.values())
        pick[cls] = head
    task = make_task(**{**LOCAL_TASK, "score": "repeat"})
    df = trace_part_ablation(series, pick, task, method="mean", n_random=4, n=256)
    return df


# ------------------------------------------------------------------ verdicts
CLAIM_RATIO = Claim("wait counts missing parts, not size: wait(5,3)/wait(3,3)",
                    rule="reproduced if our 95% interval meets [1.19, 1.37]; partly if the ratio is in [0.5, 2]",
                    study="1.19–1.37", statistic="ratio of seed-median waits, bootstrap 95% interval",
                    fails_if="the interval misses [1.19, 1.37] and the ratio is outside [0.5, 2]")
CLAIM_NO_PARTIAL = Claim("no partial credit: one part ablated leaves little",
                         rule="reproduced if every discriminating cell is below (K-1)/K and sign-test p < 0.01; "
                              "partly if the median is below 0.5",
                         study="median 17%, 32/32 below 50–83%, p = 2e-10",
                         statistic="retained fraction per cell (K x seed), median with bootstrap interval",
                         fails_if="some discriminating cell at or above (K-1)/K and the median at or above 0.5")
CLAIM_RANDOM = Claim("a random non-part head leaves ~100%",
                     rule="reproduced if the median retained is >= 95%; partly if >= 80%", study="100%",
                     statistic="median retained fraction, one random non-part head ablated",
                     fails_if="median retained below 80%")
CLAIM_RATE = Claim("rate equation with frozen constants predicts held-out waits",
                   rule="reproduced if the median relative error is <= 25%; partly if <= 50%",
                   study="frozen constants, preregistered (5% median error reported for arrival dating, a "
                         "different test)",
                   statistic="median relative error of predicted vs measured seed-median waits, held-out cells",
                   fails_if="median relative error above 50%")
CLAIMS = (CLAIM_RATIO, CLAIM_NO_PARTIAL, CLAIM_RANDOM, CLAIM_RATE)


def _three_way(full: bool, part: bool) -> Outcome:
    return Outcome.REPRODUCED if full else (Outcome.PARTLY if part else Outcome.NOT_REPRODUCED)


def verdicts(summary: Mapping) -> pd.DataFrame:
    """Claim-by-claim verdicts of :data:`CLAIMS` by the rules fixed in them (printed beside each)."""
    out = []
    r = summary.get("ratio")
    if r is None or not np.isfinite(r[0]):
        out.append(Verdict.not_run(CLAIM_RATIO))
    else:
        lo, hi = STUDY["ratio_53_33"]
        out.append(Verdict(CLAIM_RATIO, f"{r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}]",
                           _three_way(r[1] <= hi and r[2] >= lo, 0.5 <= r[0] <= 2.0)))
    p = summary.get("pooled")
    if p is None:
        out.append(Verdict.not_run(CLAIM_NO_PARTIAL))
    else:
        n, nb = p["n_discriminating"], p["n_below"]
        full = n > 0 and nb == n and p["p_sign"] < 0.01
        out.append(Verdict(CLAIM_NO_PARTIAL, f"median {p['median']:.1%} [{p['median_lo']:.1%}, {p['median_hi']:.1%}], "
                                             f"{nb}/{n} cells below (K-1)/K, p = {p['p_sign']:.1e}",
                           _three_way(full, p["median"] < 0.5)))
    rnd = summary.get("random_median")
    if rnd is None or not np.isfinite(rnd):
        out.append(Verdict.not_run(CLAIM_RANDOM))
    else:
        out.append(Verdict(CLAIM_RANDOM, f"median {rnd:.1%}", _three_way(rnd >= 0.95, rnd >= 0.8)))
    e = summary.get("rate_error")
    if e is None or not np.isfinite(e):
        out.append(Verdict.not_run(CLAIM_RATE))
    else:
        out.append(Verdict(CLAIM_RATE, f"median relative error {e:.0%} over {summary['rate_n']} held-out cells",
                           _three_way(e <= 0.25, e <= 0.5)))
    return verdict_table(out)


# ------------------------------------------------------------------ the protocol
@dataclass
class PartsResult:
    """What :func:`run_parts` measured: the summary the verdicts read, markdown sections, figures,
    the job tables and the failed jobs."""

    summary: dict = field(default_factory=dict)
    sections: list = field(default_factory=list)
    figures: list = field(default_factory=list)
    base: pd.DataFrame | None = None
    reinit: pd.DataFrame | None = None
    failed: list = field(default_factory=list)
    cpu_s: float = 0.0


def _ablation(base: list[dict], out: Path, with_series: bool, res: PartsResult) -> None:
    abl = pd.DataFrame([r for b in base for r in b.get("ablation", [])])
    abl.to_csv(out / "part_ablation.csv", index=False)
    series_df = None
    if with_series:
        persisted = out / "part_ablation_series.csv"
        if persisted.is_file() and not (out / "runs" / "development-series").exists():
            # the series' checkpoints are not committed; its ablation table is (retraining it under a
            # later trainer would pick other heads and silently replace the reported numbers)
            series_df = pd.read_csv(persisted)
        else:
            series_df = series_ablation(out)
            series_df.drop(columns=["note"], errors="ignore").to_csv(persisted, index=False)
    if not len(abl):
        return
    mean_rows = abl[abl.method == "mean"]
    pooled = pool_cells(mean_rows, ["k", "seed"])
    res.summary["pooled"] = pooled
    res.summary["random_median"] = float(mean_rows[mean_rows.kind == "random"].retained.median())
    by = abl.groupby(["method", "kind", "k"]).retained.agg(["median", "min", "max", "count"]).reset_index()
    text = [f"Cells: K x seed ({pooled['n_discriminating']} discriminating of {pooled['n_cells']}); "
            f"a cell's value is the mean retained fraction over its K single-part ablations "
            f"(evaluated on 512 fresh sequences, seed EVAL_SEED+1).", "", markdown_table(by.round(3)), ""]
    if series_df is not None and len(series_df):
        text += _series_text(series_df, res)
    res.sections.append("## Part ablation\n\n" + "\n".join(text))
    series_parts = None if series_df is None else \
        series_df[series_df.kind == "part"].groupby("step").retained.mean().reset_index()
    res.figures.append(("retained", retained_figure(abl, series_parts)))


def _series_text(series_df: pd.DataFrame, res: PartsResult) -> list[str]:
    ps = pool_cells(series_df.assign(cell=series_df.step), ["cell"])
    res.summary["series"] = ps
    parts_txt = ", ".join(f"{r.part} = {r.heads}" for r in
                          series_df[series_df.kind == "part"].drop_duplicates("part").itertuples())
    shown = series_df[np.isfinite(series_df.retained)]
    return [f"Developing series ({SERIES_STEPS} steps, seed 0; parts: {parts_txt}, the top head of "
            f"each screen at the last checkpoint; partial credit 0.5): "
            f"{ps['n_discriminating']} discriminating checkpoints, median retained "
            f"{ps['median']:.1%} [{ps['median_lo']:.1%}, {ps['median_hi']:.1%}], "
            f"{ps['n_below']} below 0.5, sign test p = {ps['p_sign']:.2g}.", "",
            "Discriminating checkpoints (intact induction accuracy >= chance + 0.1):", "",
            markdown_table(shown[["step", "kind", "part", "heads", "acc_intact", "acc_ablated", "retained"]].round(3)),
            ""]


def _reinit_specs(base_specs: list[dict], seeds: list[int], with_drives: bool) -> list[dict]:
    specs = [{"kind": "reinit", "k": b["k"], "m": m, "seed": b["seed"], "drive": 1.0, "base": b}
             for b in base_specs for m in range(1, b["k"] + 1)]
    if with_drives:
        specs += [{"kind": "reinit", "k": k, "m": m, "seed": s, "drive": d, "base": {"kind": "base", "k": k, "seed": s}}
                  for k, m in DRIVE_CELLS for d in DRIVES for s in seeds]
    return specs


def _waiting(reinit: pd.DataFrame, table: pd.DataFrame, res: PartsResult) -> None:
    w = lambda k, m: reinit[(reinit.k == k) & (reinit.m == m) & (reinit.drive == 1.0)]["wait"].dropna().to_numpy(float)  # noqa: E731
    r = res.summary["ratio"] = bootstrap_median_ratio(w(5, 3), w(3, 3))
    res.sections.append("## Waiting time to re-ignition\n\n"
                        f"wait(5,3)/wait(3,3) = {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}] (ratio of seed medians, "
                        f"bootstrap 95% interval); study: 1.19–1.37. Censored runs (no ignition within "
                        f"{WAIT_CAP} steps) count as not ignited and are excluded from the medians.\n\n"
                        + markdown_table(table.round(3)) + "\n")
    res.figures.append(("waiting", wait_figure(table)))


def _rate(table: pd.DataFrame, out: Path, res: PartsResult) -> None:
    t = table[table.ignited == table.seeds].copy()
    t["held_out"] = [HELD_OUT(k, m, d) for k, m, d in zip(t.k, t.m, t.drive)]
    fit_cells = t[~t.held_out][["k", "m", "drive", "wait_median"]].rename(columns={"wait_median": "wait"})
    if len(fit_cells) < 3:
        return
    frozen = out / "rate_constants.json"
    freeze_constants(frozen, fit_rate(fit_cells), fit_cells=fit_cells,
                     note="fit cells: K in 2..4 at drive 1 and K=3 drive cells; held out: K=5, K=4 drive cells")
    c = load_constants(frozen)
    t["predicted"] = predict_wait(t.m, t.drive, c)
    t["rel_error"] = (t.predicted - t.wait_median).abs() / t.wait_median
    held = t[t.held_out]
    res.summary["rate_error"] = float(held.rel_error.median()) if len(held) else float("nan")
    res.summary["rate_n"] = len(held)
    t.to_csv(out / "rate_predictions.csv", index=False)
    res.sections.append("## Rate equation\n\n"
                        f"Fitted on {len(fit_cells)} cells (seed-median waits), frozen to "
                        f"`rate_constants.json` (sha256 `{read_json(frozen)['sha256'][:16]}…`): "
                        f"c = {c['c']:.3g}, beta = {c['beta']:.3f}, delta = {c['delta']:.3g}, "
                        f"sites = {c['sites']:g}, attempts = {c['attempts']:g} (RMS log error of the fit "
                        f"{c['rms_log_error']:.2f}). Held-out cells: median relative error "
                        f"{res.summary['rate_error']:.0%} (n = {len(held)}). Cells with a censored seed are "
                        f"left out of fit and test.\n\n"
                        + markdown_table(t[["k", "m", "drive", "held_out", "wait_median", "predicted",
                                            "rel_error"]].round(3)) + "\n")


def run_parts(names: Sequence[str], *, seeds: int, out: Path, workers: int, with_series: bool,
              progress: bool) -> PartsResult:
    """Train the base circuits (always) and run the named experiments of :data:`PARTS`; write their CSVs."""
    res = PartsResult()
    seed_list = list(range(seeds))
    base_specs = [{"kind": "base", "k": k, "seed": s} for k in KS for s in seed_list]
    base = run_cached_jobs(base_job, base_specs, out, workers=workers, progress=progress, desc="base jobs")
    res.base = pd.DataFrame([{k: v for k, v in b.items() if k != "ablation"} for b in base])
    res.base.to_csv(out / "base_runs.csv", index=False)
    res.failed = [b for b in base if b.get("status") == "failed"]
    res.cpu_s = sum(float(b.get("cpu_s", 0)) for b in base)
    if "ablation" in names:
        _ablation(base, out, with_series, res)
    if "waiting" in names or "rate" in names:
        specs = _reinit_specs(base_specs, seed_list, "rate" in names)
        done = run_cached_jobs(reinit_job, specs, out, workers=workers, progress=progress, desc="reinit jobs")
        res.failed += [r for r in done if r.get("status") == "failed"]
        res.reinit = pd.DataFrame([{k: v for k, v in r.items() if k not in ("curve", "base")} for r in done])
        res.reinit.to_csv(out / "reinit_runs.csv", index=False)
        res.cpu_s += float(res.reinit.cpu_s.fillna(0).sum())
        table = wait_table(res.reinit)
        table.to_csv(out / "waiting_times.csv", index=False)
        if "waiting" in names:
            _waiting(res.reinit, table, res)
        else:
            w = lambda k, m: res.reinit[(res.reinit.k == k) & (res.reinit.m == m) & (res.reinit.drive == 1.0)]["wait"].dropna().to_numpy(float)  # noqa: E731
            res.summary["ratio"] = bootstrap_median_ratio(w(5, 3), w(3, 3))
        if "rate" in names:
            _rate(table, out, res)
    return res
