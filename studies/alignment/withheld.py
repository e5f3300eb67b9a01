"""``python -m studies.alignment withheld``: withheld capabilities and the cure on the unpinned apparatus.

Protocol: the pilot :data:`~studies.alignment.protocol.CURE_PILOT_V2` (``alignment.cure-pilot`` v2, declared
before it ran) and the confirmatory :data:`~studies.alignment.protocol.CURE_V2` (``alignment.cure`` v2,
declared after the pilot and before the confirmatory runs; it records the pilot's hash).

* **withheld run** (:func:`withheld_job`): K = 3 on the unpinned preset; base-only training for ``W``
  steps (``mix = switch0->0.5@W``), the validation loss (cross-entropy on 512 fixed base sequences) recorded
  every 25 steps as a curve; a checkpoint at ``W``; then training continues (the *untreated* arm) until
  ignition + margin or ``budget`` steps after the switch (censored: not ignited).
* **pilot**: untreated arm only, W in the declared grid, 4 seeds (100-103); the confirmatory W is chosen
  from it by the declared rule (:func:`choose_w`).
* **confirmatory**: at that one W, seeds 0-9 (the power target), three arms from the same checkpoint and
  data: untreated, QK re-init (``W_Q, b_Q, W_K, b_K`` of every head re-drawn), value re-init (``W_V, b_V,
  W_O`` of every head); optimizer state kept (:func:`cure_job`). Each arm is compared with the untreated arm
  at the same W by an exact test (:func:`~studies.alignment.power.fisher_greater`).
* **smoothness** of the validation loss (:func:`smoothness`): ``R = TV(log10 max(L, floor)) / net fall``
  over the withholding; ``R = 1`` for a monotone curve.

Rules (declared; applied by :func:`cure_verdicts_v2` and :func:`pilot_verdicts`): see the declarations.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from circuitfade.claims import Claim, Outcome, Verdict
from circuitfade.stats import binomial_exact_interval
from circuitfade.train import RunConfig, new_run, save_checkpoint, train
from circuitfade.tasks import EVAL_SEED
from circuitfade.train.surgery import reinit_slices
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from circuitfade.train.rundir import RunDir
from studies.alignment.apparatus import (base_config, cure_row, first_acc, from_source, job_key, run_cached_jobs,
                                         until_ignition)
from studies.alignment.power import fisher_greater
from studies.alignment.protocol import CURE_PILOT_V2, FORCED_V3, declared, rules_of, stamp, verdict_frame

__all__ = ["K", "smoothness", "choose_w", "withheld_config", "withheld_job", "cure_job", "pilot_verdicts",
           "cure_verdicts_v2", "count_row", "cure_verdicts_v3", "count_rows_v3", "run"]

_P = CURE_PILOT_V2.data
K = int(_P["k"])
SHARE, BUDGET = float(_P["share"]), int(_P["budget"])
FLOOR, SMOOTH_IF = float(_P["val_loss"]["floor"]), float(_P["val_loss"]["smooth_if"])
VAL_EVERY = 25


def smoothness(losses: Sequence[float], floor: float = FLOOR) -> float:
    """``R = sum_t |d log10 max(L_t, floor)| / (log10 max(L_0, floor) - log10 max(L_end, floor))``: 1 for a curve
    that only falls, ``1 + 2 x (total rise) / (net fall)`` otherwise, ``inf`` if it does not fall at all."""
    y = np.log10(np.maximum(np.asarray(losses, dtype=float), floor))
    if len(y) < 2 or not np.all(np.isfinite(y)):
        raise ValueError("smoothness: expected at least two finite losses")
    fall = y[0] - y[-1]
    return float(np.abs(np.diff(y)).sum() / fall) if fall > 0 else math.inf


def choose_w(pilot: pd.DataFrame) -> int | None:
    """The confirmatory W from the pilot (columns ``w, seeds, ignited``) by the declared rule (``choose_w`` of
    ``alignment.cure-pilot`` v2); ``None`` when every W ignites in every seed (nothing to cure)."""
    t = pilot.sort_values("w")
    frac = (t.ignited / t.seeds).to_numpy(float)
    ws = t.w.to_numpy(int)
    inner = [(abs(f - 0.5), int(w)) for f, w in zip(frac, ws) if 0 < f < 1]
    if inner:
        return min(inner)[1]
    if np.all(frac == 1):
        return None
    lo = max((int(w) for f, w in zip(frac, ws) if f == 1), default=None)
    hi = min(int(w) for f, w in zip(frac, ws) if f == 0)
    if lo is None or lo > hi:
        return hi
    return int(round(math.sqrt(lo * hi) / 100.0) * 100)


def withheld_config(seed: int, w: int, steps: int, *, pinned: bool = False) -> RunConfig:
    """The K = 3 config with the capability withheld for ``w`` steps (share :data:`SHARE` after)."""
    cfg = base_config(K, seed, steps, pinned=pinned)
    return replace(cfg, mix={"p_capability": f"switch0->{SHARE}@{int(w)}"})


def _base_batch(task):
    return task.sample(512, torch.Generator().manual_seed(EVAL_SEED + 7), p_capability=0.0)


def _loss(model, batch, q: int) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(batch.tokens)[:, q], batch.targets[:, q]))


def withheld_job(spec: Mapping, out: str) -> dict:
    """Base-only for ``W`` steps (validation-loss curve, checkpoint at ``W``), then the untreated arm."""
    torch.set_num_threads(1)
    seed, w = int(spec["seed"]), int(spec["w"])
    pinned = spec.get("apparatus", "pinned") == "pinned"
    run_dir = Path(out) / "runs" / job_key(spec)
    t0 = time.process_time()
    cfg_at = lambda s: withheld_config(seed, w, s, pinned=pinned)  # noqa: E731
    run = new_run(cfg_at(max(w, 1)))
    task = run.config.make_task()
    vb, curve = _base_batch(task), [[], []]

    def log(step, metrics) -> None:
        curve[0].append(int(step))
        curve[1].append(_loss(run.model, vb, task.query_pos))

    if w > 0:
        train(cfg_at(w), None, run=run, progress=False, logger=log)
    run_dir.mkdir(parents=True, exist_ok=True)
    RunDir(run_dir).write_config(run.config)
    save_checkpoint(run, run_dir)  # the switch point: every arm starts here
    first = first_acc(run)
    ig, steps, accs = until_ignition(run, cfg_at, start=w, first=first, cap=int(spec["budget"]), chance=task.chance)
    return {**spec, "status": "ignited" if ig is not None else "censored", "ignition": ig,
            "delay": None if ig is None else ig - w, "run_dir": str(run_dir), "acc_at_switch": first,
            "val_curve": curve, "smoothness": smoothness(curve[1]) if len(curve[1]) >= 2 else None,
            "final_step": run.step, "curve": [steps, accs], "cpu_s": time.process_time() - t0}


def cure_job(spec: Mapping, out: str) -> dict:
    """From a withheld run's checkpoint at ``W``: re-draw the ``which`` slices of every head, continue."""
    seed, w, which = int(spec["seed"]), int(spec["w"]), str(spec["which"])
    run, t0 = from_source(spec, out)
    heads = [(0, h) for h in range(run.model.cfg.n_heads)]
    reinit_slices(run.model, heads, which=which,
                  generator=torch.Generator().manual_seed(3_000_017 + 7919 * seed + (1 if which == "qk" else 2)))
    first = first_acc(run)
    pinned = spec.get("apparatus", "pinned") == "pinned"
    ig, steps, accs = until_ignition(run, lambda s: withheld_config(seed, w, s, pinned=pinned), start=w,
                                      first=first, cap=int(spec["budget"]), chance=run.config.make_task().chance)
    return cure_row(spec, run, ig, (steps, accs), first, t0)


# ------------------------------------------------------------------ verdicts
def _claim(name: str, experiment: str, study: str, fails_if: str) -> Claim:
    """The claim ``name`` with its rule as declared in ``alignment.<experiment>`` v2."""
    return Claim(name, rule=rules_of(experiment, 2)[name], study=study, fails_if=fails_if)


def pilot_verdicts(pilot: pd.DataFrame | None, smooth: Sequence[float]) -> list[Verdict]:
    """Critical W on the declared pilot grid (``pilot``: ``w, seeds, ignited``) and the smoothness claim over
    the withheld runs' ``R`` values."""
    crit = _claim("withheld capability: past a critical step it never ignites within the budget (declared grid)",
                  "cure-pilot", "a critical step exists", "every grid W has an igniting seed")
    smo = _claim("validation loss falls smoothly through the withholding (no warning)", "cure-pilot",
                 "validation loss falls smoothly", "more than half the runs have R > 1.5")
    out = []
    if pilot is None or not len(pilot):
        out.append(Verdict.not_run(crit))
    else:
        zero = [int(w) for w, i in zip(pilot.w, pilot.ignited) if int(i) == 0]
        ours = ", ".join(f"W={int(w)}: {int(i)}/{int(n)}" for w, i, n in zip(pilot.w, pilot.ignited, pilot.seeds))
        out.append(Verdict(crit, ours, Outcome.REPRODUCED if zero else Outcome.NOT_REPRODUCED))
    r = np.asarray([x for x in smooth if x is not None], dtype=float)
    if not len(r):
        out.append(Verdict.not_run(smo))
    else:
        n, ok = len(r), int((r <= SMOOTH_IF).sum())
        verdict = Outcome.REPRODUCED if ok >= n - 1 else (Outcome.NOT_REPRODUCED if n - ok > n / 2 else Outcome.PARTLY)
        out.append(Verdict(smo, f"{ok}/{n} runs smooth (R <= {SMOOTH_IF:g}); R median {np.median(r):.2f} "
                                f"(range {r.min():.2f}–{r.max():.2f})", verdict))
    return out


def count_row(claim: Claim, arm: tuple[int, int] | None, untreated: tuple[int, int] | None, *, helps: bool) -> Verdict:
    """A cure arm against the untreated arm at the same W (``(ignited, n)`` each). ``helps=True`` (QK):
    reproduced if one-sided Fisher p(arm > untreated) < 0.05, not reproduced if the arm's count is not above
    the untreated one, inconclusive otherwise. ``helps=False`` (value): not reproduced if either one-sided
    test is significant, reproduced if neither is and the counts differ by at most n/5, inconclusive
    otherwise. Not testable when the untreated arm is at 0/n or n/n."""
    if arm is None or untreated is None or arm[1] == 0 or untreated[1] == 0:
        return Verdict.not_run(claim)
    (a, n_a), (b, n_b) = arm, untreated
    up, down = fisher_greater(a, n_a, b, n_b), fisher_greater(b, n_b, a, n_a)
    lo, hi = binomial_exact_interval(a, n_a)
    ulo, uhi = binomial_exact_interval(b, n_b)
    ours = (f"{a}/{n_a} [{lo:.2f}, {hi:.2f}] vs untreated {b}/{n_b} [{ulo:.2f}, {uhi:.2f}]; one-sided Fisher "
            f"p(arm > untreated) = {up:.3g}, p(arm < untreated) = {down:.3g}")
    if b in (0, n_b):
        return Verdict(claim, ours, Outcome.NOT_TESTABLE, note="(untreated arm at 0 or all)")
    if helps:
        outcome = Outcome.REPRODUCED if up < 0.05 else (Outcome.NOT_REPRODUCED if a / n_a <= b / n_b
                                                         else Outcome.INCONCLUSIVE)
    else:
        sig = up < 0.05 or down < 0.05
        outcome = Outcome.NOT_REPRODUCED if sig else (Outcome.REPRODUCED if abs(a / n_a - b / n_b) <= 0.2
                                                      else Outcome.INCONCLUSIVE)
    return Verdict(claim, ours, outcome)


def cure_claims() -> tuple[Claim, Claim]:
    rules = declared("cure", 2).data["rules"]
    qk = "cure: re-initialising the QK slices restores learnability (vs untreated at the same W)"
    ov = "cure: re-initialising the value slices does nothing (vs untreated at the same W)"
    return (Claim(qk, rule=rules[qk], study="6/6 (untreated 0/6)", fails_if="QK count not above the untreated one"),
            Claim(ov, rule=rules[ov], study="0/6", fails_if="a significant difference from the untreated arm"))


def cure_verdicts_v2(counts: Mapping[str, tuple[int, int]]) -> list[Verdict]:
    """The two cure rows from ``{"none": .., "qk": .., "ov": ..}`` (``(ignited, n)`` at the same W)."""
    qk, ov = cure_claims()
    none = counts.get("none")
    return [count_row(qk, counts.get("qk"), none, helps=True), count_row(ov, counts.get("ov"), none, helps=False)]


def _counts_text(arm: tuple[int, int], untreated: tuple[int, int]) -> tuple[str, float, float]:
    (a, n_a), (b, n_b) = arm, untreated
    up, down = fisher_greater(a, n_a, b, n_b), fisher_greater(b, n_b, a, n_a)
    lo, hi = binomial_exact_interval(a, n_a)
    ulo, uhi = binomial_exact_interval(b, n_b)
    return (f"{a}/{n_a} [{lo:.2f}, {hi:.2f}] vs untreated {b}/{n_b} [{ulo:.2f}, {uhi:.2f}]; one-sided Fisher "
            f"p(arm > untreated) = {up:.3g}, p(arm < untreated) = {down:.3g}"), up, down


def count_rows_v3(counts: Mapping[str, tuple[int, int]], *, pinned: bool = False) -> list[Verdict]:
    """The two cure rows of ``alignment.cure`` v3 (declared after the v2 results) from ``{"none", "qk", "ov"}``
    (``(ignited, n)`` at the same W). QK: reproduced if one-sided Fisher p(QK > untreated) < 0.05, not
    reproduced if its rate is not above the untreated one, inconclusive otherwise. Value: judged only where
    the QK row is reproduced (the positive control: a cure is possible at that W); then not reproduced if
    either one-sided test is significant, reproduced if neither is and the rates differ by at most 0.2.
    Not testable only where the untreated arm is at n/n (at 0/n the tests apply). ``pinned``: the QK row is
    "forced by the apparatus" (the pin fixes the parts' attention)."""
    rules = declared("cure", 3).data["rules"]
    qk_c, ov_c = cure_claims()
    qk_c, ov_c = replace(qk_c, rule=rules[qk_c.name]), replace(ov_c, rule=rules[ov_c.name])
    none, qk, ov = counts.get("none"), counts.get("qk"), counts.get("ov")
    if none is None or none[1] == 0:
        return [Verdict.not_run(qk_c), Verdict.not_run(ov_c)]
    full = none[0] == none[1]
    out = []
    if qk is None or qk[1] == 0:
        out.append(Verdict.not_run(qk_c))
        qk_ok = False
    else:
        ours, up, _ = _counts_text(qk, none)
        if full:
            out.append(Verdict(qk_c, ours, Outcome.NOT_TESTABLE, note="(untreated arm at n/n: nothing withheld)"))
        else:
            out.append(Verdict(qk_c, ours, Outcome.REPRODUCED if up < 0.05 else (
                Outcome.NOT_REPRODUCED if qk[0] / qk[1] <= none[0] / none[1] else Outcome.INCONCLUSIVE)))
        qk_ok = out[-1].outcome is Outcome.REPRODUCED
    if ov is None or ov[1] == 0:
        out.append(Verdict.not_run(ov_c))
    else:
        ours, up, down = _counts_text(ov, none)
        if full:
            out.append(Verdict(ov_c, ours, Outcome.NOT_TESTABLE, note="(untreated arm at n/n: nothing withheld)"))
        elif not qk_ok:
            out.append(Verdict(ov_c, ours, Outcome.NOT_TESTABLE, note="(no arm shows a cure is possible at this W)"))
        else:
            sig = up < 0.05 or down < 0.05
            out.append(Verdict(ov_c, ours, Outcome.NOT_REPRODUCED if sig else (
                Outcome.REPRODUCED if abs(ov[0] / ov[1] - none[0] / none[1]) <= 0.2 else Outcome.INCONCLUSIVE)))
    if pinned and out[0].outcome is not Outcome.NOT_RUN:
        why = FORCED_V3.data["rows"]["cure v1, pinned: the QK cure"]
        out[0] = Verdict(qk_c, f"{out[0].ours}; the rule's own word: {out[0].word}; forced: {why}", Outcome.FORCED)
    return out


def cure_verdicts_v3(counts: Mapping[str, tuple[int, int]], *, pinned: bool = False) -> pd.DataFrame:
    """:func:`count_rows_v3` as a verdict table stamped ``alignment.cure`` v3 (apparatus ``counts["apparatus"]``
    when given, else unpinned or pinned)."""
    app = counts.get("apparatus", "pinned" if pinned else "unpinned")
    return verdict_frame(count_rows_v3(counts, pinned=pinned), "cure", 3, app)


# ------------------------------------------------------------------ the protocol
def _specs(ws: Sequence[int], seeds: Sequence[int]) -> list[dict]:
    return [{"kind": "withheld", "apparatus": "unpinned", "k": K, "seed": int(s), "w": int(w), "budget": BUDGET,
             "share": SHARE} for w in ws for s in seeds]


def _table(res: Sequence[Mapping]) -> pd.DataFrame:
    """Per W: seeds, ignited (exact 95%), median delay of the igniting seeds, median smoothness R."""
    df = pd.DataFrame([{k: v for k, v in r.items() if k not in ("curve", "val_curve")} for r in res
                       if r.get("status") != "failed"])
    rows = []
    for w, g in df.groupby("w"):
        n, k = int(len(g)), int((g.status == "ignited").sum())
        lo, hi = binomial_exact_interval(k, n)
        rows.append({"w": int(w), "seeds": n, "ignited": k, "lo": lo, "hi": hi,
                     "delay_median": float(g.delay.median()) if g.delay.notna().any() else float("nan"),
                     "R_median": float(g.smoothness.median()), "R_max": float(g.smoothness.max())})
    return pd.DataFrame(rows)


def _pilot(out: Path, workers: int, progress: bool) -> tuple[list[dict], pd.DataFrame]:
    seeds = _P["seeds"]
    res = run_cached_jobs(withheld_job, _specs(_P["ws"], seeds), out, workers=workers, progress=progress,
                          desc="withheld pilot")
    cond = _P["conditional_w"]
    last = [r for r in res if r["w"] == max(_P["ws"])]
    if last and all(r.get("status") == "ignited" for r in last):  # the declared conditional level
        res += run_cached_jobs(withheld_job, _specs([cond["w"]], seeds), out, workers=workers, progress=progress,
                               desc="withheld pilot")
    return res, _table(res)


def _confirmatory(w: int, out: Path, workers: int, progress: bool) -> tuple[list[dict], list[dict]]:
    seeds = declared("cure", 2).data["seeds"]
    wres = run_cached_jobs(withheld_job, _specs([w], seeds), out, workers=workers, progress=progress,
                           desc="withheld confirmatory")
    cspecs = [{"kind": "cure", "apparatus": "unpinned", "k": K, "seed": s["seed"], "w": w, "which": which,
               "budget": BUDGET, "share": SHARE, "source": s} for which in ("qk", "ov") for s in _specs([w], seeds)]
    cres = run_cached_jobs(cure_job, cspecs, out, workers=workers, progress=progress, desc="cure confirmatory")
    return wres, cres


def _counts(wres: Sequence[Mapping], cres: Sequence[Mapping]) -> dict:
    ok = lambda rs: [r for r in rs if r.get("status") in ("ignited", "censored")]  # noqa: E731
    counts = {"none": (sum(r["status"] == "ignited" for r in ok(wres)), len(ok(wres)))}
    for which in ("qk", "ov"):
        rs = ok([r for r in cres if r["which"] == which])
        counts[which] = (sum(r["status"] == "ignited" for r in rs), len(rs))
    return counts


def pinned_counts(out: Path) -> dict[int, dict]:
    """v1's pinned arms per cure W (``cure_withheld_runs.csv``, ``cure_runs.csv``): ``{W: {arm: (ignited, n)}}``."""
    wf, cf = out / "cure_withheld_runs.csv", out / "cure_runs.csv"
    if not (wf.is_file() and cf.is_file()):
        return {}
    w, c = pd.read_csv(wf), pd.read_csv(cf)
    res = {}
    for wc in sorted(c.w.unique()):
        g = w[w.w == wc]
        res[int(wc)] = {"none": (int((g.status == "ignited").sum()), int(len(g)))}
        for which in ("qk", "ov"):
            h = c[(c.w == wc) & (c.which == which)]
            res[int(wc)][which] = (int((h.status == "ignited").sum()), int(len(h)))
    return res


def _verdict_tables(ptable, smooth, counts, pinned) -> pd.DataFrame:
    rows = [verdict_frame(pilot_verdicts(ptable, smooth), "cure-pilot", 2, "unpinned")]
    if counts is not None:
        rows.append(verdict_frame(cure_verdicts_v2(counts), "cure", 2, f"unpinned, W = {counts['w']}"))
    else:
        rows.append(verdict_frame([Verdict.not_run(c) for c in cure_claims()], "cure", 2, "unpinned"))
    for wc, cts in pinned.items():
        rows.append(verdict_frame(cure_verdicts_v2(cts), "cure", 2, f"pinned (v1 runs), W = {wc}"))
    v3 = []
    if counts is not None:
        v3.append(cure_verdicts_v3({**counts, "apparatus": f"unpinned, W = {counts['w']}"}))
    for wc, cts in pinned.items():
        v3.append(cure_verdicts_v3({**cts, "apparatus": f"pinned (v1 runs), W = {wc}"}, pinned=True))
    return pd.concat(v3 + rows, ignore_index=True)


def withheld_figure(ptable: pd.DataFrame, counts: Mapping | None, curves: Sequence[Mapping]) -> go.Figure:
    """Left: runs igniting within the budget (exact 95%) per pilot W and per confirmatory arm. Right: the
    validation-loss curves of the withholding (log scale, one line per run, coloured by W)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"ignited within {BUDGET} steps of the switch",
                                                        "validation loss on base data during the withholding"))
    labels = [f"pilot W={w}" for w in ptable.w]
    k, n = list(ptable.ignited), list(ptable.seeds)
    if counts is not None:
        for arm in ("none", "qk", "ov"):
            labels.append(f"W={counts['w']} {'untreated' if arm == 'none' else arm.upper() + ' re-init'}")
            k.append(counts[arm][0])
            n.append(counts[arm][1])
    frac = [a / b if b else float("nan") for a, b in zip(k, n)]
    ci = [binomial_exact_interval(a, b) for a, b in zip(k, n)]
    fig.add_bar(x=labels, y=frac, text=[f"{a}/{b}" for a, b in zip(k, n)], textposition="outside",
                error_y={"type": "data", "symmetric": False, "array": [h - f for f, (_, h) in zip(frac, ci)],
                         "arrayminus": [f - lo for f, (lo, _) in zip(frac, ci)]},
                marker_color=["#888"] * len(ptable) + ["#555", "#1f77b4", "#d62728"][: len(labels) - len(ptable)],
                showlegend=False, row=1, col=1)
    palette = {1000: "#2ca02c", 3000: "#ff7f0e", 10000: "#9467bd", 30000: "#8c564b"}
    shown = set()
    for c in curves:
        color = palette.get(c["w"], "#1f77b4")
        fig.add_scatter(x=c["steps"], y=np.maximum(np.asarray(c["loss"], float), FLOOR), mode="lines",
                        line={"width": 1, "color": color}, opacity=0.6, name=f"W = {c['w']}", legendgroup=str(c["w"]),
                        showlegend=c["w"] not in shown, row=1, col=2)
        shown.add(c["w"])
    fig.update_yaxes(title_text="fraction of runs", range=[0, 1.15], row=1, col=1)
    fig.update_yaxes(title_text=f"cross-entropy (log; floor {FLOOR:g})", type="log", row=1, col=2)
    fig.update_xaxes(title_text="training step", row=1, col=2)
    fig.update_layout(title=f"Withheld capability on the unpinned apparatus (K = {K}): ignition and the cure at the "
                            f"same W", width=1200, height=500, template="plotly_white")
    return fig


def _markdown(out: Path, ptable, w_conf, counts, v, smooth, failed, cpu) -> str:
    conf = ("not run: every pilot W ignited in every seed" if w_conf is None else
            f"W = {w_conf} (from the pilot by the declared rule)" + ("" if counts is not None else
                                                                     ": not yet declared, so not run"))
    return "\n".join([
        "## Withheld capability and the cure on the unpinned apparatus", "",
        f"Protocols: {stamp('cure-pilot', 2)} (declared before the pilot), {stamp('cure', 2)} (declared after "
        f"the pilot, before the confirmatory runs). Command: `python -m studies.alignment withheld --out {out}`. "
        f"K = {K}, unpinned preset; base-only training for W steps, then capability share {SHARE}; ignited = "
        f"ignition within {BUDGET} steps of the switch. Confirmatory: {conf}; seeds "
        f"{declared('cure', 2).data['seeds']} (power target: one-sided Fisher exact at 0.05, power >= 0.8 for "
        f"rate 1 vs 1/2); QK / value slices of every head re-drawn, optimizer state kept. Training CPU "
        f"{cpu / 60:.1f} core-min; {len(failed)} failed jobs.", "",
        "Pilot (untreated arm; exact 95% intervals; R = smoothness of the validation loss, 1 = monotone):", "",
        markdown_table(ptable.round(3)), "",
        "" if counts is None else "Confirmatory arms at the same W: " + ", ".join(
            f"{a}: {counts[a][0]}/{counts[a][1]}" for a in ("none", "qk", "ov")) + ".", "",
        f"Validation-loss smoothness over {len(smooth)} withheld runs: R median {np.median(smooth):.2f}, range "
        f"{min(smooth):.2f}–{max(smooth):.2f} (curves in `withheld_val_curves.csv`, right panel of "
        f"`fig_withheld.png`)." if smooth else "", "", markdown_table(v), ""])


def run(*, out: str | Path, workers: int = 2, progress: bool = True, png: bool = True) -> dict:
    """Pilot, then (when the confirmatory W is declared) the confirmatory arms; writes ``OUT/withheld.md``,
    ``withheld_verdicts.csv``, ``withheld_runs.csv``, ``withheld_val_curves.csv`` and ``fig_withheld``."""
    out = Path(out)
    pres, ptable = _pilot(out, workers, progress)
    w_conf, w_decl = choose_w(ptable), declared("cure", 2).data["w"]
    if w_decl is not None and w_decl != w_conf:
        raise ValueError(f"alignment.cure v2 declares W = {w_decl} but the pilot rule gives {w_conf}")
    wres, cres, counts = [], [], None
    if w_decl is not None:
        wres, cres = _confirmatory(int(w_decl), out, workers, progress)
        counts = {**_counts(wres, cres), "w": int(w_decl)}
    allw = [r for r in pres + wres if r.get("status") != "failed"]
    smooth = [float(r["smoothness"]) for r in allw if r.get("smoothness") is not None]
    v = _verdict_tables(ptable, smooth, counts, pinned_counts(out))
    v.to_csv(out / "withheld_verdicts.csv", index=False)
    stage = lambda r: "pilot" if r["seed"] in _P["seeds"] else "confirmatory"  # noqa: E731
    pd.DataFrame([{**{k: x for k, x in r.items() if k not in ("curve", "val_curve", "source")},
                   "stage": stage(r), "arm": r.get("which", "none"),
                   "protocol": stamp("cure-pilot" if stage(r) == "pilot" else "cure", 2)} for r in pres + wres + cres]).to_csv(
        out / "withheld_runs.csv", index=False)
    curves = [{"w": r["w"], "seed": r["seed"], "stage": stage(r), "steps": r["val_curve"][0],
               "loss": r["val_curve"][1]} for r in allw if r.get("val_curve")]
    pd.DataFrame([{"w": c["w"], "seed": c["seed"], "stage": c["stage"], "step": s, "val_loss": x}
                  for c in curves for s, x in zip(c["steps"], c["loss"])]).to_csv(
        out / "withheld_val_curves.csv", index=False, float_format="%.5g")
    save_figure(withheld_figure(ptable, counts, curves), out / "fig_withheld", png=png)
    failed = [r for r in pres + wres + cres if r.get("status") == "failed"]
    cpu = sum(float(r.get("cpu_s", 0) or 0) for r in pres + wres + cres)
    text = _markdown(out, ptable, w_conf, counts, v, smooth, failed, cpu)
    (out / "withheld.md").write_text(text)
    return {"pilot": ptable, "w": w_conf, "counts": counts, "verdicts": v, "markdown": text, "failed": failed}
