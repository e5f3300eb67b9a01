"""``python -m studies.alignment ignition``: ignition at a step of our choosing.

The claim (the no-partial-credit study's forward reading of the rate equation): a
capability held flat at baseline ignites after the data mix passes a concentration
floor, and never below it (the study: 10/10 runs above the floor ignite, 0/12 below).

**Apparatus.** The K-part task of :mod:`studies.alignment` (K = 3,
V = 3, the pinned one-layer preset, AdamW lr 3e-3, weight decay 0.01, batch 128). For
the first :data:`SWITCH` steps every training sequence is a base sequence
(``p_capability = 0``: the capability's query token never appears, so the capability
is flat at chance by construction; the job records the largest capability accuracy
seen before the switch to show it); from step :data:`SWITCH` on a share ``p`` of the
sequences are capability sequences (``mix = {"p_capability": "switch0->p@SWITCH"}``).
A run is *ignited* if the capability ignites (the part-1 rule: half way from chance to
1 for two evaluations in a row and for good) within :data:`BUDGET` steps of the switch;
otherwise it is censored (counted as not ignited, never given a delay).

**From share to drive (stated before any run).** The frozen constants
(``results/alignment/rate_constants.json``, fitted in part 1 and not refitted here)
describe ``rate = A * drive * exp(-beta * m) - delta`` with ``A = c * sites * attempts``,
``attempts = 128`` = the capability examples per step of the fit runs, which trained on
capability sequences only (share 1), and ``drive`` = learning-rate multiplier. A share
``p`` supplies ``p * 128`` capability examples per step (in expectation), i.e.
``attempts * p``; equivalently the capability's part of the batch-mean loss gradient is
``p`` times what it is at share 1, the role the lr multiplier played in the fit. Both
readings give ``drive = p / SHARE_IN_FIT`` with ``SHARE_IN_FIT = 1`` (:func:`share_to_drive`).
Caveat stated in advance: under Adam a gradient scaled by ``p`` is not an lr scaled by
``p`` (the second-moment normalisation partly undoes it, the more so once the base loss
is near zero), so the mapping may overstate how much a small share slows learning.
``m`` = K = 3: after base-only training none of the parts reads the capability (the fit
cells re-initialised m parts of a *trained* circuit whose MLP read-out was intact; here
the read-out must form too, so the frozen constants are expected to under-predict the
delay: the part-2 withheld scan already measured a median delay of 525 steps at share
0.5 after 1,000 base-only steps, where they predict 258; we do not correct for it).

**The floor, computed from the frozen constants before the runs** (:func:`floor_share`,
:func:`budget_share`): the rate is zero at ``drive* = delta * exp(beta m) / A``. With
``delta = 6.8e-13`` that is ``p* = 8.7e-11``: the frozen fit predicts *no practical
floor* (every share we can run eventually ignites). What it does predict is a
budget threshold: the share at which the predicted wait equals the budget,
``p_B = (1/B + delta) * exp(beta m) / A = 0.043`` for ``B = 3000`` steps, and a
predicted delay ``predict_wait(K, p)`` for every share (258 steps at 0.5; 2,576 at 0.05;
12,878 at 0.01; 25,755 at 0.005). "Above the floor" and "below the floor" are therefore
read against ``p_B``: the above arm is share :data:`ABOVE_SHARE` = 0.5 (predicted delay
258 steps, 10 seeds), the below arm share :data:`BELOW_SHARE` = 0.005 (predicted delay
8.6 budgets, 12 seeds). To find the empirical threshold beside the prediction the shares
:data:`SCAN_SHARES` (0.002 .. 0.2) run with 5 seeds each (all fixed here before any run;
about 8 core-min of training). A floor in the study's sense (rate <= 0) cannot be told
apart from a very slow rate within a finite budget; the scan measures the budget threshold.

**Verdicts** (:func:`ignition_verdicts`, rules fixed here): counts above / below with exact
binomial intervals; the ignition step relative to the switch (median, bootstrap 95%
interval) against the predicted delay; the predicted threshold against the empirical
bracket (:func:`empirical_floor`). Jobs go through part 1's runner
(``alignment._run_jobs``: finished jobs are reused).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.claims import Claim, Outcome, Verdict
from circuitfade.io import read_json
from circuitfade.stats import binomial_exact_interval, bootstrap_median
from circuitfade.train import new_run, train
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment.apparatus import THRESHOLD, base_config, check_finite, first_acc, run_cached_jobs, until_ignition
from studies.alignment.parts import load_constants, predict_wait
from studies.alignment.protocol import IGNITION_V1, declared, forced_v1, rules_of, stamp, stamped, verdict_frame

__all__ = ["K", "SWITCH", "BUDGET", "SHARE_IN_FIT", "ABOVE_SHARE", "BELOW_SHARE", "SCAN_SHARES", "STUDY_IGNITION",
           "share_to_drive", "floor_share", "budget_share", "predictions", "ignition_config", "ignition_specs",
           "long_specs", "ignition_job", "share_table", "empirical_floor", "ignition_verdicts", "ignition_figure", "run",
           "dose_specs", "dose_verdicts", "dose_figure", "run_dose"]

_D = IGNITION_V1.data
K = int(_D["k"])
SWITCH = int(_D["switch"])
"""Base-only steps before the capability is switched on (the withheld scan: W = 1000 is far from its
critical W; 6 of 6 seeds ignited there at share 0.5)."""
BUDGET = int(_D["budget"])
"""Steps after the switch within which a run must ignite to count."""
SHARE_IN_FIT = float(_D["share_in_fit"])
"""Capability share of the training data in the rate-equation fit runs (capability sequences only)."""
ABOVE_SHARE, ABOVE_SEEDS = float(_D["above"]["share"]), int(_D["above"]["seeds"])
BELOW_SHARE, BELOW_SEEDS = float(_D["below"]["share"]), int(_D["below"]["seeds"])
SCAN_SHARES, SCAN_SEEDS = tuple(_D["scan"]["shares"]), int(_D["scan"]["seeds"])
STUDY_IGNITION = {"above": (10, 10), "below": (0, 12)}
LONG_SHARES, LONG_BUDGET, LONG_SEEDS = tuple(_D["long"]["shares"]), int(_D["long"]["budget"]), int(_D["long"]["seeds"])
"""Follow-up added after the first scan (whose arms, budget and rules are unchanged): no seed ignited
within 3,000 steps at shares <= 0.05, although the frozen constants predict a 2,576-step delay at 0.05.
A floor (no ignition at all) and a slow rate look the same within a finite budget, so these shares run
again with a 4x longer budget (12,000 steps, 4.7x the predicted delay at 0.05); rule in
:func:`ignition_verdicts` (``long``), fixed before these runs."""


# ------------------------------------------------------------------ the prediction (frozen constants)
def share_to_drive(share: float) -> float:
    """``drive = share / SHARE_IN_FIT``: the drive of the rate equation supplied by capability share ``share``."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"share: expected a number in [0, 1], got {share!r}")
    return float(share) / SHARE_IN_FIT


def _a(constants: Mapping) -> float:
    return float(constants["c"] * constants["sites"] * constants["attempts"])


def floor_share(constants: Mapping, m: int = K) -> float:
    """The share at which the rate is zero: drive* = ``delta * exp(beta m) / A``, as a share."""
    return float(constants["delta"] * math.exp(constants["beta"] * m) / _a(constants)) * SHARE_IN_FIT


def budget_share(constants: Mapping, budget: int = BUDGET, m: int = K) -> float:
    """The share at which the predicted wait equals ``budget``: ``(1/B + delta) * exp(beta m) / A``."""
    return float((1.0 / budget + constants["delta"]) * math.exp(constants["beta"] * m) / _a(constants)) * SHARE_IN_FIT


def predictions(constants: Mapping, shares, *, budget: int = BUDGET, m: int = K) -> pd.DataFrame:
    """Per share: drive, predicted delay (``alignment.predict_wait``; ``inf`` at or below the floor),
    predicted to ignite within the budget (delay <= budget), and, for reading only, the chance of
    igniting within the budget if the waiting time were exponential with that mean."""

    rows = []
    for p in shares:
        d = share_to_drive(p)
        w = float(predict_wait(m, d, constants))
        rows.append({"share": float(p), "drive": d, "predicted_delay": w, "predicted_ignites": bool(w <= budget),
                     "p_ignite_if_exponential": 0.0 if not np.isfinite(w) else float(1 - math.exp(-budget / w))})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ the runs
def ignition_config(seed: int, share: float, steps: int, switch: int = SWITCH):
    """The K = 3 base config: share 0 until ``switch``, then ``share`` (``switch0->share@switch``)."""

    share_to_drive(share)  # validates
    return replace(base_config(K, seed, steps), mix={"p_capability": f"switch0->{float(share)}@{int(switch)}"})


def ignition_specs() -> list[dict]:
    """Every job of the study (one per share x seed, duplicates removed), fixed here."""
    arms = [(ABOVE_SHARE, ABOVE_SEEDS), (BELOW_SHARE, BELOW_SEEDS)] + [(p, SCAN_SEEDS) for p in SCAN_SHARES]
    seen, specs = set(), []
    for p, n in arms:
        for s in range(n):
            if (p, s) not in seen:
                seen.add((p, s))
                specs.append({"kind": "ignition", "k": K, "seed": s, "share": float(p), "switch": SWITCH,
                              "budget": BUDGET})
    return sorted(specs, key=lambda d: (-d["share"], d["seed"]))


def long_specs() -> list[dict]:
    """The follow-up jobs: :data:`LONG_SHARES` x :data:`LONG_SEEDS` seeds with budget :data:`LONG_BUDGET`."""
    return [{"kind": "ignition", "k": K, "seed": s, "share": float(p), "switch": SWITCH, "budget": LONG_BUDGET}
            for p in sorted(LONG_SHARES, reverse=True) for s in range(LONG_SEEDS)]


def ignition_job(spec: Mapping, out: str) -> dict:
    """Base-only for ``switch`` steps, then the capability at ``share``; until ignition (+ margin) or budget."""
    import torch

    torch.set_num_threads(1)
    seed, share, sw, budget = int(spec["seed"]), float(spec["share"]), int(spec["switch"]), int(spec["budget"])
    if int(spec["k"]) != K:
        raise ValueError(f"ignition jobs use K = {K}, got {spec['k']}")
    t0 = time.process_time()
    cfg_at = lambda s: ignition_config(seed, share, s, sw)  # noqa: E731
    run = new_run(cfg_at(sw))
    train(cfg_at(sw), None, run=run, progress=False)
    check_finite(run)
    chance = run.config.make_task().chance
    pre = [float(m["acc_normal"]) for m in run.metrics if int(m["step"]) <= sw]
    first = first_acc(run)
    ig, steps, accs = until_ignition(run, cfg_at, start=sw, first=first, cap=budget, chance=chance)
    level = chance + THRESHOLD * (1 - chance)
    return {**spec, "status": "ignited" if ig is not None else "censored", "ignition": ig,
            "delay": None if ig is None else ig - sw, "acc_at_switch": first, "pre_switch_max_acc": max(pre),
            "flat_before_switch": bool(max(pre) < level), "final_step": run.step, "curve": [steps, accs],
            "cpu_s": time.process_time() - t0}


# ------------------------------------------------------------------ tables and rules
def share_table(runs: pd.DataFrame, constants: Mapping) -> pd.DataFrame:
    """Per share: seeds, ignited (exact 95% interval), delay median over igniting runs (bootstrap 95%),
    beside the prediction from the frozen constants."""

    rows = []
    for p, g in runs[runs.status != "failed"].groupby("share"):
        n, k = len(g), int((g.status == "ignited").sum())
        lo, hi = binomial_exact_interval(k, n)
        med, dlo, dhi = bootstrap_median(g.delay.dropna().to_numpy(float))
        rows.append({"share": float(p), "seeds": n, "ignited": k, "frac_lo": lo, "frac_hi": hi,
                     "delay_median": med, "delay_lo": dlo, "delay_hi": dhi})
    t = pd.DataFrame(rows)
    if not len(t):
        return t
    pred = predictions(constants, t.share, budget=int(runs.budget.iloc[0]))
    return t.merge(pred, on="share").sort_values("share").reset_index(drop=True)


def empirical_floor(table: pd.DataFrame) -> tuple[float | None, float | None]:
    """The bracket ``(s_lo, s_hi]`` of the empirical threshold from columns ``share, seeds, ignited``.

    ``s_hi``: the smallest scanned share at which at least half the seeds ignite, and at every
    larger share too; ``s_lo``: the next smaller scanned share (``None``: the threshold is below
    the scan). ``(largest share, None)`` when the largest share has fewer than half igniting."""
    t = table.sort_values("share")
    ok = (t.ignited.to_numpy() * 2 >= t.seeds.to_numpy())
    shares = t.share.to_numpy(float)
    if len(t) == 0:
        return None, None
    if not ok[-1]:
        return float(shares[-1]), None
    i = len(t) - 1
    while i > 0 and ok[i - 1]:
        i -= 1
    return (None if i == 0 else float(shares[i - 1])), float(shares[i])


def _row(claim: str, ours: str, study: str, rule: str, verdict: Outcome) -> dict:
    return {"claim": claim, "ours": ours, "study": study, "rule": rule, "verdict": verdict}


def _count_rows(above: tuple[int, int] | None, below: tuple[int, int] | None) -> list[dict]:
    rows = []
    add = lambda *r: rows.append(_row(*r))  # noqa: E731
    for name, cnt, study in (("above", above, STUDY_IGNITION["above"]), ("below", below, STUDY_IGNITION["below"])):
        share = ABOVE_SHARE if name == "above" else BELOW_SHARE
        study_txt = f"{study[0]}/{study[1]}"
        if name == "above":
            claim = f"ignition on schedule: above the floor a flat capability ignites after the switch (share {share})"
            rule = "reproduced if >= n-1 of n >= 5 runs ignite within the budget; partly if more than half"
        else:
            claim = (f"ignition on schedule: below the floor it never ignites (share {share}; below the predicted "
                     f"budget threshold, the rate-zero floor is ~0)")
            rule = "reproduced if none of n >= 5 runs ignites within the budget; partly if at most a quarter"
        if cnt is None or cnt[1] == 0:
            add(claim, "—", study_txt, "—", Outcome.NOT_RUN)
            continue
        k, n = cnt
        lo, hi = binomial_exact_interval(k, n)
        if name == "above":
            v = Outcome.REPRODUCED if (n >= 5 and k >= n - 1) else (Outcome.PARTLY if k > n / 2 else Outcome.NOT_REPRODUCED)
        else:
            v = Outcome.REPRODUCED if (n >= 5 and k == 0) else (Outcome.PARTLY if k <= n / 4 else Outcome.NOT_REPRODUCED)
        add(claim, f"{k}/{n} [{lo:.2f}, {hi:.2f}]", study_txt, rule, v)
    return rows


def _floor_row(p_budget: float, p_floor: float, bracket: tuple[float | None, float | None] | None) -> dict:
    claim = "the concentration floor predicted from the frozen constants before the runs"
    rule = ("reproduced if the predicted budget threshold lies in the empirical bracket [s_lo, s_hi]; partly if "
            "within a factor 3 of it")
    pred_txt = f"predicted: rate-zero floor {p_floor:.1e}, budget threshold {p_budget:.3f}"
    if bracket is None:
        return _row(claim, pred_txt, "a floor exists", rule, Outcome.NOT_RUN)
    s_lo, s_hi = bracket
    fmt = lambda x: "—" if x is None else f"{x:g}"  # noqa: E731
    lo_ok = s_lo is None or p_budget >= s_lo
    hi_ok = s_hi is None or p_budget <= s_hi
    lo3 = s_lo is None or p_budget >= s_lo / 3
    hi3 = s_hi is None or p_budget <= 3 * s_hi
    v = Outcome.REPRODUCED if (lo_ok and hi_ok) else (Outcome.PARTLY if (lo3 and hi3) else Outcome.NOT_REPRODUCED)
    if s_hi is None:  # no share ignited in half its seeds: nothing to locate
        v = Outcome.NOT_REPRODUCED
    return _row(claim, f"{pred_txt}; empirical threshold in ({fmt(s_lo)}, {fmt(s_hi)}]", "a floor exists", rule, v)


def _long_row(long: tuple[int, int]) -> dict:
    k, n = long
    claim = (f"below the threshold it is blocked, not slow: share {max(LONG_SHARES)} with a {LONG_BUDGET}-step "
             f"budget (follow-up)")
    rule = "reproduced if none of n >= 5 runs ignites; not reproduced if more than half ignite; partly otherwise"
    if n == 0:
        return _row(claim, "—", "never below the floor", rule, Outcome.NOT_RUN)
    lo, hi = binomial_exact_interval(k, n)
    v = Outcome.REPRODUCED if (n >= 5 and k == 0) else (Outcome.NOT_REPRODUCED if k > n / 2 else Outcome.PARTLY)
    return _row(claim, f"{k}/{n} [{lo:.2f}, {hi:.2f}]", "never below the floor", rule, v)


def ignition_verdicts(above: tuple[int, int] | None, below: tuple[int, int] | None, *,
                      delay: tuple[float, float, float] | None, predicted_delay: float | None,
                      flat: bool, p_budget: float, p_floor: float,
                      bracket: tuple[float | None, float | None] | None,
                      long: tuple[int, int] | None = None) -> pd.DataFrame:
    """Verdict rows, rules fixed here before any run.

    * above (``(ignited, n)``): reproduced if >= n-1 of n >= 5 ignite within the budget; partly if
      more than half.
    * below: reproduced if none of n >= 5 ignites; partly if at most a quarter.
    * ignition step relative to the switch (``delay`` = median, lo, hi of the above arm; ``flat``:
      every run was at chance before the switch): reproduced if flat and the predicted delay lies in
      the 95% interval; partly if flat and the prediction is within a factor 2 of the median.
    * floor: reproduced if the predicted budget threshold ``p_budget`` lies in the empirical bracket
      ``[s_lo, s_hi]``; partly if within a factor 3 of it (``s_lo / 3 <= p_budget <= 3 s_hi``, a
      missing end counting as unbounded on that side only if the other end is consistent).
    * long (``(ignited, n)`` at share 0.05 within :data:`LONG_BUDGET` steps): the floor (no ignition at
      all below it) is reproduced if none of n >= 5 ignites; not reproduced (a slow rate, not a floor)
      if more than half ignite; partly otherwise. Row only when ``long`` is given.
    """
    rows = _count_rows(above, below)
    add = lambda *r: rows.append(_row(*r))  # noqa: E731
    claim = "ignition step relative to the switch (above arm) vs the frozen rate equation's prediction"
    rule = ("reproduced if every run is at chance before the switch and the predicted delay is inside the 95% "
            "interval of the median delay; partly if flat and within a factor 2 of the median")
    if delay is None or not np.isfinite(delay[0]) or predicted_delay is None:
        add(claim, "—", "ignites at a step of our choosing", rule, Outcome.NOT_RUN)
    else:
        med, lo, hi = delay
        inside = lo <= predicted_delay <= hi
        near = 0.5 <= predicted_delay / med <= 2.0
        add(claim, f"median {med:.0f} [{lo:.0f}, {hi:.0f}] steps after the switch; predicted {predicted_delay:.0f}"
            + ("" if flat else "; NOT flat before the switch"), "ignites at a step of our choosing", rule,
            Outcome.REPRODUCED if (flat and inside) else (Outcome.PARTLY if (flat and near) else Outcome.NOT_REPRODUCED))
    rows.append(_floor_row(p_budget, p_floor, bracket))
    if long is not None:
        rows.append(_long_row(long))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ the figure
def ignition_figure(table: pd.DataFrame, constants: Mapping, *, budget: int = BUDGET,
                    long_table: pd.DataFrame | None = None) -> go.Figure:
    """Left: fraction igniting within the budget vs share (exact 95%), predicted threshold marked.
    Right: delay after the switch vs share (median of igniting runs, bootstrap 95%), predicted curve."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"runs igniting within {budget} steps of the switch",
                                                         "delay after the switch (igniting runs)"))
    t = table.sort_values("share")
    f = t.ignited / t.seeds
    fig.add_scatter(x=t.share, y=f, mode="lines+markers", name="measured (exact 95%)", marker={"size": 9},
                    text=[f"{a}/{b}" for a, b in zip(t.ignited, t.seeds)], textposition="top center",
                    error_y={"type": "data", "symmetric": False, "array": t.frac_hi - f, "arrayminus": f - t.frac_lo},
                    row=1, col=1)
    pb = budget_share(constants, budget)
    grid = np.logspace(np.log10(t.share.min() / 1.5), np.log10(min(1.0, t.share.max() * 1.5)), 100)
    w = predict_wait(K, grid / SHARE_IN_FIT, constants)
    fig.add_scatter(x=grid, y=(w <= budget).astype(float), mode="lines", line={"dash": "dash", "color": "black"},
                    name=f"predicted (frozen constants): ignites iff delay <= budget; threshold {pb:.3f}", row=1, col=1)
    fig.add_scatter(x=grid, y=1 - np.exp(-budget / w), mode="lines", line={"dash": "dot", "color": "gray"},
                    name="predicted, if the waiting time were exponential", row=1, col=1)
    d = t[np.isfinite(t.delay_median)]
    fig.add_scatter(x=d.share, y=d.delay_median, mode="markers", marker={"size": 9, "color": "#d62728"},
                    name="measured median delay (bootstrap 95%)",
                    error_y={"type": "data", "symmetric": False, "array": d.delay_hi - d.delay_median,
                             "arrayminus": d.delay_median - d.delay_lo}, row=1, col=2)
    fig.add_scatter(x=grid, y=w, mode="lines", line={"dash": "dash", "color": "#444", "width": 1},
                    name="predicted delay (frozen constants)", row=1, col=2)
    if long_table is not None and len(long_table):
        lt = long_table.sort_values("share")
        lf = lt.ignited / lt.seeds
        fig.add_scatter(x=lt.share, y=lf, mode="markers", marker={"size": 11, "symbol": "diamond-open",
                                                                   "color": "#2ca02c"},
                        name=f"follow-up: budget {LONG_BUDGET} (exact 95%)",
                        error_y={"type": "data", "symmetric": False, "array": lt.frac_hi - lf,
                                 "arrayminus": lf - lt.frac_lo}, row=1, col=1)
        ld = lt[np.isfinite(lt.delay_median)]
        if len(ld):
            fig.add_scatter(x=ld.share, y=ld.delay_median, mode="markers", showlegend=False,
                            marker={"size": 11, "symbol": "diamond-open", "color": "#2ca02c"},
                            error_y={"type": "data", "symmetric": False, "array": ld.delay_hi - ld.delay_median,
                                     "arrayminus": ld.delay_median - ld.delay_lo}, row=1, col=2)
    fig.add_scatter(x=[grid[0], grid[-1]], y=[budget, budget], mode="lines", line={"color": "gray"},
                    name=f"budget ({budget} steps)", row=1, col=2)
    fig.update_xaxes(type="log", title_text="capability share after the switch")
    fig.update_yaxes(title_text="fraction of seeds", range=[-0.05, 1.1], row=1, col=1)
    fig.update_yaxes(title_text="steps after the switch (log)", type="log", range=[2, 4.8], row=1, col=2)
    fig.update_layout(title=f"Ignition at a chosen step (K={K}; base only for {SWITCH} steps, then the share; "
                      f"rate-zero floor predicted at {floor_share(constants):.1e})", width=1150, height=480,
                      template="plotly_white", legend={"orientation": "h", "y": -0.2})
    return fig


# ------------------------------------------------------------------ the protocol
def _markdown(*, frozen: Path, runs, ok, table, ltable, bracket, v, failed, agree, twins, p_floor, p_budget,
              wall_s) -> str:
    cpu = float(runs.cpu_s.fillna(0).sum()) if "cpu_s" in runs else 0.0
    shown = table[["share", "drive", "seeds", "ignited", "frac_lo", "frac_hi", "delay_median", "delay_lo",
                   "delay_hi", "predicted_delay", "predicted_ignites", "p_ignite_if_exponential"]] if len(table) else table
    text = "\n".join([
        "## Ignition at a step of our choosing (version 1, pinned)", "", f"Protocol: {stamp('ignition', 1)}.",
        f"K = {K}; base-only training (capability share 0) for {SWITCH} steps, then share p "
        f"(`switch0->p@{SWITCH}`); ignited = ignition within {BUDGET} steps of the switch. Prediction from the "
        f"frozen constants (`rate_constants.json`, sha256 `{read_json(frozen)['sha256'][:16]}…`, not refitted), "
        f"drive = p / {SHARE_IN_FIT:g}, m = K = {K}: rate-zero floor p* = {p_floor:.2e} (no practical floor); "
        f"budget threshold p_B = {p_budget:.4f} (predicted delay = budget). Arms: above p = {ABOVE_SHARE} "
        f"(seeds 0-{ABOVE_SEEDS - 1}), below p = {BELOW_SHARE} (seeds 0-{BELOW_SEEDS - 1}); scan "
        f"{list(SCAN_SHARES)} (seeds 0-{SCAN_SEEDS - 1}). Capability flat at chance before the switch in "
        f"{int(ok.flat_before_switch.sum())}/{len(ok)} runs (largest pre-switch accuracy "
        f"{ok.pre_switch_max_acc.max():.3f}; chance 0.333). Training CPU {cpu / 60:.1f} core-min "
        f"(finished jobs reused); {len(failed)} failed jobs.", "",
        "Per share (ignited with exact 95% interval; delay = ignition step - switch, median over igniting runs "
        "with bootstrap 95% interval; predicted_delay = `predict_wait(K, p)`):", "",
        markdown_table(shown.round(4)) if len(shown) else "(no runs)", "",
        "Empirical threshold bracket (smallest share with >= half the seeds igniting there and above): "
        + ("none" if bracket is None else "(" + ", ".join("—" if x is None else f"{x:g}" for x in bracket) + "]")
        + ".", "",
        f"Follow-up (added after the scan above; see `LONG_SHARES`): shares {list(LONG_SHARES)}, seeds "
        f"0-{LONG_SEEDS - 1}, budget {LONG_BUDGET} steps after the switch. Each is the same run as its "
        f"{BUDGET}-step twin up to the first budget ({agree}/{len(twins)} agree on igniting within {BUDGET}):", "",
        markdown_table(ltable[shown.columns].round(4)) if len(ltable) else "(no runs)", "",
        markdown_table(v), ""]
        + (["**Failed jobs:** " + "; ".join(f"share {f.get('share')} seed {f.get('seed')}: {f.get('error')}"
                                             for f in failed), ""] if failed else []))
    return text


def run(*, out: str | Path, workers: int = 2, progress: bool = True, png: bool = True) -> dict:
    """The ignition study: predictions first (from ``OUT/rate_constants.json``), then the runs;
    writes ``OUT/ignition.md``, ``ignition_runs.csv``, ``ignition_predictions.csv``,
    ``ignition_verdicts.csv`` and ``fig_ignition``."""

    out = Path(out)
    frozen = out / "rate_constants.json"
    if not frozen.is_file():
        raise FileNotFoundError(f"{frozen}: the frozen rate-equation constants are missing; run "
                                f"`python -m studies.alignment rate --out {out}` first (the ignition prediction uses them)")
    c = load_constants(frozen)
    specs = ignition_specs()
    shares = sorted({s["share"] for s in specs})
    pred = predictions(c, shares)
    pred.to_csv(out / "ignition_predictions.csv", index=False, float_format="%.12g")  # before any run of this call
    p_floor, p_budget = floor_share(c), budget_share(c)
    t0 = time.time()
    res = run_cached_jobs(ignition_job, specs, out, workers=workers, progress=progress, desc="ignition jobs")
    failed = [r for r in res if r.get("status") == "failed"]
    runs = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in res])
    runs.to_csv(out / "ignition_runs.csv", index=False)
    ok = runs[runs.status != "failed"]
    table = share_table(runs, c)

    def arm(share, n):
        g = ok[(ok.share == share) & (ok.seed < n)]
        return (int((g.status == "ignited").sum()), int(len(g))), g

    above, ga = arm(ABOVE_SHARE, ABOVE_SEEDS)
    below, _ = arm(BELOW_SHARE, BELOW_SEEDS)
    delay = bootstrap_median(ga.delay.dropna().to_numpy(float))
    flat = bool(ok.flat_before_switch.all()) if len(ok) else False
    bracket = empirical_floor(table) if len(table) else None
    lres = run_cached_jobs(ignition_job, long_specs(), out, workers=workers, progress=progress, desc="ignition jobs")  # the follow-up (LONG_SHARES)
    failed += [r for r in lres if r.get("status") == "failed"]
    lruns = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in lres])
    lok = lruns[lruns.status != "failed"]
    ltable = share_table(lruns, c)
    lg = lok[lok.share == max(LONG_SHARES)]
    long = (int((lg.status == "ignited").sum()), int(len(lg)))
    runs = pd.concat([runs, lruns], ignore_index=True)
    runs.to_csv(out / "ignition_runs.csv", index=False)
    # consistency: a long run is the same run as its short twin for the first BUDGET steps
    twins = ok.merge(lok, on=["share", "seed"], suffixes=("", "_long"))
    agree = int(((twins.status == "ignited") == (twins.delay_long.fillna(np.inf) <= BUDGET)).sum())
    v = ignition_verdicts(above, below, delay=delay, predicted_delay=float(pred.set_index("share")
                                                                           .predicted_delay[ABOVE_SHARE]),
                          flat=flat, p_budget=p_budget, p_floor=p_floor, bracket=bracket, long=long)
    v = stamped(forced_v1(v, "ignition"), "ignition", 1, "pinned")
    v.to_csv(out / "ignition_verdicts.csv", index=False)
    if len(table):
        save_figure(ignition_figure(table, c, long_table=ltable), out / "fig_ignition", png=png)
    text = _markdown(frozen=frozen, runs=runs, ok=ok, table=table, ltable=ltable, bracket=bracket, v=v,
                     failed=failed, agree=agree, twins=twins, p_floor=p_floor, p_budget=p_budget,
                     wall_s=time.time() - t0)
    (out / "ignition.md").write_text(text)
    return {"table": table, "runs": runs, "verdicts": v, "markdown": text, "failed": failed,
            "p_floor": p_floor, "p_budget": p_budget, "bracket": bracket}


# ------------------------------------------------------------------ version 2: a dose-response across our threshold
def dose_specs() -> list[dict]:
    """The jobs of ``alignment.ignition`` v2: every declared share x seed (pinned, v1's job format)."""

    d = declared("ignition", 2).data
    return [{"kind": "ignition", "k": int(d["k"]), "seed": int(s), "share": float(p), "switch": int(d["switch"]),
             "budget": int(d["budget"])} for p in sorted(d["shares"], reverse=True) for s in d["seeds"]]


def dose_verdicts(below: tuple[int, int] | None, above: tuple[int, int] | None) -> pd.DataFrame:
    """The two count rows of ``alignment.ignition`` v2 (rules declared there): ``(ignited, n)`` at the lowest and
    the highest share of the dose-response."""

    rules = rules_of("ignition", 2)
    verdicts = []
    for cnt, want_none in ((below, True), (above, False)):
        name = next(c for c in rules if ("never" in c) == want_none)
        claim = Claim(name, rule=rules[name], study="0/12 below, 10/10 above",
                      fails_if="two or more ignite" if want_none else "at most half ignite")
        if cnt is None or cnt[1] == 0:
            verdicts.append(Verdict.not_run(claim))
            continue
        k, n = cnt
        lo, hi = binomial_exact_interval(k, n)
        if want_none:
            outcome = Outcome.REPRODUCED if k == 0 else (Outcome.PARTLY if k == 1 else Outcome.NOT_REPRODUCED)
        else:
            outcome = Outcome.REPRODUCED if k >= n - 1 else (Outcome.PARTLY if k > n / 2 else Outcome.NOT_REPRODUCED)
        verdicts.append(Verdict(claim, f"{k}/{n} [{lo:.2f}, {hi:.2f}]", outcome))
    return verdict_frame(verdicts, "ignition", 2, "pinned (where the threshold was measured)")


def dose_figure(table: pd.DataFrame, v1: pd.DataFrame | None) -> go.Figure:
    """P(ignite within the budget) vs share, exact 95% intervals: v2's fresh seeds, and v1's seeds 0-4 (grey)."""
    fig = go.Figure()
    for t, name, color in ((v1, "v1 scan (seeds 0-4: located the bracket)", "#aaa"),
                           (table, "v2 dose-response (fresh seeds 5-12)", "#d62728")):
        if t is None or not len(t):
            continue
        f = t.ignited / t.seeds
        fig.add_scatter(x=t.share, y=f, mode="lines+markers", name=name, marker={"size": 10, "color": color},
                        line={"color": color}, text=[f"{a}/{b}" for a, b in zip(t.ignited, t.seeds)],
                        error_y={"type": "data", "symmetric": False, "array": t.frac_hi - f,
                                 "arrayminus": f - t.frac_lo})
    fig.update_layout(title=f"Ignition within {BUDGET} steps of the switch vs capability share (K = {K}, pinned)",
                      xaxis={"title": "capability share after the switch", "type": "log"},
                      yaxis={"title": "fraction of runs igniting (exact 95%)", "range": [-0.05, 1.1]},
                      width=820, height=480, template="plotly_white", legend={"orientation": "h", "y": -0.2})
    return fig


def run_dose(*, out: str | Path, workers: int = 2, progress: bool = True, png: bool = True) -> dict:
    """``python -m studies.alignment ignition-dose``: ``alignment.ignition`` v2; writes ``OUT/ignition_dose.md``,
    ``ignition_dose_runs.csv``, ``ignition_dose_verdicts.csv`` and ``fig_ignition_dose``."""

    out, d = Path(out), declared("ignition", 2).data
    c = load_constants(out / "rate_constants.json")
    res = run_cached_jobs(ignition_job, dose_specs(), out, workers=workers, progress=progress, desc="ignition v2 jobs")
    runs = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in res])
    runs.assign(protocol=stamp("ignition", 2)).to_csv(out / "ignition_dose_runs.csv", index=False)
    table = share_table(runs, c)
    v1 = pd.read_csv(out / "ignition_runs.csv") if (out / "ignition_runs.csv").is_file() else None
    v1t = None
    if v1 is not None:
        v1 = v1[v1.share.isin(d["shares"]) & (v1.budget == d["budget"]) & (v1.seed < min(d["seeds"]))]
        v1t = share_table(v1, c) if len(v1) else None
    cnt = lambda p: None if not len(table[table.share == p]) else (  # noqa: E731
        int(table[table.share == p].ignited.iloc[0]), int(table[table.share == p].seeds.iloc[0]))
    v = dose_verdicts(cnt(min(d["shares"])), cnt(max(d["shares"])))
    v.to_csv(out / "ignition_dose_verdicts.csv", index=False)
    save_figure(dose_figure(table, v1t), out / "fig_ignition_dose", png=png)
    cpu = float(runs.cpu_s.fillna(0).sum()) if "cpu_s" in runs else 0.0
    cols = ["share", "seeds", "ignited", "frac_lo", "frac_hi", "delay_median", "delay_lo", "delay_hi"]
    text = "\n".join([
        "## Ignition: a dose-response across our measured threshold", "",
        f"Protocol: {stamp('ignition', 2)}. Command: `python -m studies.alignment ignition-dose --out {out}`. "
        f"K = {K}, pinned preset (where the threshold bracket {d['measured_threshold']} was measured), base-only "
        f"for {d['switch']} steps then share p; ignited = within {d['budget']} steps. Shares {d['shares']}, fresh "
        f"seeds {d['seeds']} (n = 8: if the rate at 0.1 is the 1/5 we measured, 'never ignites' fails with "
        f"probability 0.83). Not run: {d['not_run']}. Training CPU {cpu / 60:.1f} core-min.", "",
        markdown_table(table[cols].round(3)) if len(table) else "(no runs)", "", markdown_table(v), ""])
    (out / "ignition_dose.md").write_text(text)
    return {"table": table, "verdicts": v, "markdown": text}
