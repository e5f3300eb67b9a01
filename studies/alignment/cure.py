"""``python -m studies.alignment cure``: withheld capabilities and the query-key cure.

Protocol (on the K-part apparatus of :mod:`studies.alignment`, K = 3):

* **withheld** - the K-part task's own base/capability mix (:meth:`KPart.sample`,
  ``p_capability``): for the first ``W`` steps every training sequence is a *base*
  sequence (query token ``V + 1``, target = copy of the last value position, a
  distractor: read by a spare head, not by a part); from step ``W`` on half the
  sequences are capability sequences (``mix = {"p_capability": "switch0->0.5@W"}``).
  The run continues until the capability ignites (+ margin) or ``BUDGET`` steps
  after the switch (then *censored*: not ignited). ``W`` in :data:`WS`.
* **critical W** - the smallest scanned ``W`` at which no seed ignites within the
  budget (:func:`critical_w`; ``None`` when every ``W`` has an igniting seed).
* **cure** - from each withheld run's checkpoint at the switch step ``W_cure``
  (the critical ``W``; without one, the largest scanned ``W``, reported as such),
  re-initialise only the QK slices (``W_Q, b_Q, W_K, b_K``) or only the OV slices
  (``W_V, b_V, W_O``) of the K candidate heads (the pinned parts ``(0, 0..K-1)``,
  :func:`~circuitfade.train.surgery.reinit_slices`), keep every other parameter and
  the optimizer state as they are, and continue under the same mix; count the runs
  that ignite within the budget (exact binomial intervals).

A property of this apparatus to keep in mind when reading the counts: the pinned
read-out prior puts ``-30`` on every key but the part's own input at the query row,
so a part head's QK slices hardly move its attention at the query (they only shape
the other rows). A QK cure that works through re-opening attention has little to
act on here; the measurement says what it does.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.claims import Outcome
from circuitfade.stats import binomial_exact_interval, bootstrap_median
from circuitfade.train import load_checkpoint, new_run, save_checkpoint, train
from circuitfade.tasks import EVAL_SEED
from circuitfade.train.surgery import reinit_slices
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from circuitfade.train.rundir import RunDir
from studies.alignment.apparatus import (base_config, cure_row, first_acc, from_source, job_key,
                                         run_cached_jobs, until_ignition)
from studies.alignment.protocol import CURE_V1, forced_v1, stamp, stamped

__all__ = ["K", "WS", "BUDGET", "CURE_SEEDS", "STUDY_CURE", "withheld_config", "withheld_job", "cure_job",
           "scan_table", "critical_w", "cure_verdicts", "cure_figure", "run"]

K = int(CURE_V1.data["k"])
WS = tuple(CURE_V1.data["ws"])
"""Withholding lengths scanned (steps of base-only training before the capability is added). The
first run scanned 0-3000 and found no critical W (5-6 of 6 seeds ignited at every W); 10000 was then
added to look further (budget and rules unchanged); at 10000 2 of 6 ignited, so 30000 was added too."""
BUDGET = int(CURE_V1.data["budget"])
"""Steps after the switch within which the capability must ignite (K = 3 from scratch: 150-225 steps)."""
EXTRA_CURE_WS = tuple(CURE_V1.data["extra_cure_ws"])
"""W at which the cure arms are also run (as a control when they are not the critical W): the largest W
of the earlier scan, where 2 of 6 seeds ignited."""
CAP_SHARE = float(CURE_V1.data["share"])
CURE_SEEDS = len(CURE_V1.data["seeds"])
STUDY_CURE = {"qk": (6, 6), "ov": (0, 6)}


def withheld_config(seed: int, w: int, steps: int):
    """The K = 3 base config with the capability withheld for ``w`` steps (share ``CAP_SHARE`` after)."""

    cfg = base_config(K, seed, steps)
    return replace(cfg, mix={"p_capability": f"switch0->{CAP_SHARE}@{int(w)}"})


def _base_loss(run) -> float:
    """Loss on base sequences only (the monitor a base-data validation set would show)."""
    import torch

    task = run.config.make_task()
    b = task.sample(512, torch.Generator().manual_seed(EVAL_SEED + 7), p_capability=0.0)
    with torch.no_grad():
        logits = run.model(b.tokens)
    q = task.query_pos
    return float(torch.nn.functional.cross_entropy(logits[:, q], b.targets[:, q]))


def uniform_causal_entropy(n: int) -> float:
    """Mean entropy (nats) of uniform causal attention over query rows ``0..n-1``: ``mean_i ln(i + 1)``."""
    import math

    return float(np.mean([math.log(i + 1) for i in range(int(n))]))


def damage(run) -> dict:
    """Where the withholding left its mark, at the switch (item 3's "locate the damage").

    On 512 base sequences: the base loss intact, with the K parts mean-ablated at the query
    (``hook_z`` replaced by its batch mean) and with the spare heads mean-ablated (is a part
    committed to the base data? then ablating it costs base loss); the parts' and spares'
    attention entropy on the rows before the query (the only rows their QK slices shape: the
    query row is pinned) minus the uniform-causal value (0 = the QK slices are inert)."""
    import torch
    import torch.nn.functional as F

    model, task = run.model, run.config.make_task()
    q, nh = task.query_pos, model.cfg.n_heads
    b = task.sample(512, torch.Generator().manual_seed(EVAL_SEED + 7), p_capability=0.0)

    def loss(heads: list[int]) -> float:
        def hook(z, hook):
            z = z.clone()
            z[:, q, heads] = z[:, q, heads].mean(0, keepdim=True)
            return z

        with torch.no_grad():
            lg = model.run_with_hooks(b.tokens, fwd_hooks=[("blocks.0.attn.hook_z", hook)] if heads else [])
        return float(F.cross_entropy(lg[:, q], b.targets[:, q]))

    with torch.no_grad():
        _, cache = model.run_with_cache(b.tokens, names_filter="blocks.0.attn.hook_pattern")
    pat = cache["blocks.0.attn.hook_pattern"][:, :, :q, :]
    ent = -(pat.clamp_min(1e-30).log() * pat).sum(-1).mean((0, 2)) - uniform_causal_entropy(q)
    parts, spares = list(range(K)), list(range(K, nh))
    return {"base_loss": loss([]), "base_loss_parts_ablated": loss(parts),
            "base_loss_spares_ablated": loss(spares), "entropy_gap_parts": float(ent[:K].mean()),
            "entropy_gap_spares": float(ent[K:].mean())}


def _damage_at_switch(res: Mapping) -> dict:
    """:func:`damage` of a withheld run at its switch checkpoint (re-read from its run directory)."""
    import torch

    torch.set_num_threads(1)
    run_dir = Path(res["run_dir"])
    run = new_run(RunDir(run_dir).read_config())
    load_checkpoint(run, run_dir, int(res["w"]))
    run.model.eval()
    return {"w": int(res["w"]), "seed": int(res["seed"]), "ignited": res["status"] == "ignited", **damage(run)}


def _damage_rows(results: Sequence[Mapping], persisted: Path) -> list[dict]:
    """:func:`_damage_at_switch` per withheld run; a run whose directory is gone (run folders are not
    committed, the finished jobs and ``cure_damage.csv`` are) takes its row from ``persisted``."""
    old = pd.read_csv(persisted) if persisted.is_file() else None
    rows = []
    for r in results:
        if RunDir(r["run_dir"]).has_config():
            rows.append(_damage_at_switch(r))
            continue
        hit = None if old is None else old[(old.w == int(r["w"])) & (old.seed == int(r["seed"]))]
        if hit is None or len(hit) != 1:
            raise FileNotFoundError(f"withheld run w={r['w']} seed={r['seed']}: its run folder {r['run_dir']} is "
                                    f"gone and {persisted} has no row for it (rerun the job with its folder present)")
        rows.append({k: (v.item() if hasattr(v, "item") else v) for k, v in hit.iloc[0].to_dict().items()})
    return rows


def withheld_job(spec: Mapping, out: str) -> dict:
    """Train base-only for ``W`` steps (checkpoint at ``W``), add the capability, run until ignition or budget."""
    import torch

    torch.set_num_threads(1)
    seed, w = int(spec["seed"]), int(spec["w"])
    run_dir = Path(out) / "runs" / job_key(spec)
    t0 = time.process_time()
    run = new_run(withheld_config(seed, w, max(w, 1)))
    if w > 0:
        train(withheld_config(seed, w, w), None, run=run, progress=False)
    base_loss_at_switch = _base_loss(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    RunDir(run_dir).write_config(run.config)
    save_checkpoint(run, run_dir)  # the switch point: the cure starts here
    first = first_acc(run)
    ig, steps, accs = until_ignition(run, lambda s: withheld_config(seed, w, s), start=w, first=first,
                                      cap=BUDGET, chance=run.config.make_task().chance)
    return {**spec, "status": "ignited" if ig is not None else "censored", "ignition": ig,
            "delay": None if ig is None else ig - w, "run_dir": str(run_dir), "acc_at_switch": first,
            "base_loss_at_switch": base_loss_at_switch, "final_step": run.step, "curve": [steps, accs],
            "cpu_s": time.process_time() - t0}


def cure_job(spec: Mapping, out: str) -> dict:
    """From a withheld run's switch checkpoint: re-initialise the ``which`` slices of the parts, continue."""
    import torch

    seed, w, which = int(spec["seed"]), int(spec["w"]), str(spec["which"])
    run, t0 = from_source(spec, out)
    if which != "none":
        reinit_slices(run.model, [(0, i) for i in range(K)], which=which,
                      generator=torch.Generator().manual_seed(2_000_003 + 7919 * seed + (1 if which == "qk" else 2)))
    first = first_acc(run)
    ig, steps, accs = until_ignition(run, lambda s: withheld_config(seed, w, s), start=w, first=first,
                                      cap=BUDGET, chance=run.config.make_task().chance)
    return cure_row(spec, run, ig, (steps, accs), first, t0)


DAMAGE_COLUMNS = {"base_loss": "base_loss", "base_loss_parts_ablated": "loss_parts_abl",
                  "base_loss_spares_ablated": "loss_spares_abl", "entropy_gap_parts": "H_gap_parts",
                  "entropy_gap_spares": "H_gap_spares"}
"""Damage measures of :func:`damage` shown in the scan table (column -> short name)."""


def scan_table(withheld: pd.DataFrame, dmg: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ``w``: seeds, ignited, median delay of the igniting seeds with a bootstrap 95% interval
    (``alignment._boot_median``; NaN where none ignited), and the median over seeds of each
    :data:`DAMAGE_COLUMNS` measure at the switch (``dmg``: rows of :func:`_damage_at_switch`)."""

    rows = []
    for w, g in withheld[withheld.status != "failed"].groupby("w"):
        med, lo, hi = bootstrap_median(g.delay.dropna().to_numpy(float))
        rows.append({"w": int(w), "seeds": int(len(g)), "ignited": int((g.status == "ignited").sum()),
                     "delay_median": med, "delay_lo": lo, "delay_hi": hi})
    t = pd.DataFrame(rows)
    if dmg is not None and len(dmg):
        d = dmg.groupby("w")[list(DAMAGE_COLUMNS)].median().reset_index()
        t = t.merge(d, on="w", how="left")
    return t


def _scan_markdown(scan: pd.DataFrame) -> pd.DataFrame:
    t = scan.rename(columns=DAMAGE_COLUMNS).copy()
    for c in ("delay_median", "delay_lo", "delay_hi"):
        t[c] = t[c].round(0)
    for c in ("base_loss", "loss_parts_abl", "loss_spares_abl"):
        if c in t:
            t[c] = [f"{x:.2e}" for x in t[c]]
    for c in ("H_gap_parts", "H_gap_spares"):
        if c in t:
            t[c] = [f"{x:.4f}" for x in t[c]]
    return t


def critical_w(table: pd.DataFrame) -> int | None:
    """Smallest ``w`` (columns ``w, ignited``) at which no seed ignited; ``None`` if every ``w`` has one."""
    none = sorted(int(w) for w, ig in zip(table.w, table.ignited) if int(ig) == 0)
    return none[0] if none else None


def cure_verdicts(counts: Mapping[str, tuple[int, int]], w_crit: int | None) -> pd.DataFrame:
    """Verdict rows, rules fixed here before any run.

    ``counts``: ``{"qk": (ignited, n), "ov": (ignited, n)}``. The critical-step claim is
    reproduced if a critical ``W`` exists. QK is reproduced if at least ``n - 1`` of ``n >= 5``
    runs ignite, partly if more than half; OV is reproduced if at most one of ``n >= 5``
    ignites, partly if at most half. Without a critical ``W`` the cure rows are *not
    testable* (nothing to cure; the runs are a control)."""
    rows = []
    add = lambda c, o, s, r, v: rows.append({"claim": c, "ours": o, "study": s, "rule": r, "verdict": v})  # noqa: E731
    add("withheld capability: past a critical step it never ignites within the budget",
        "none found (every scanned W has an igniting seed)" if w_crit is None else f"critical W = {w_crit} steps",
        "a critical step exists", "reproduced if some scanned W has 0 seeds igniting within the budget",
        Outcome.NOT_REPRODUCED if w_crit is None else Outcome.REPRODUCED)
    for which, study_txt in (("qk", "6/6"), ("ov", "0/6")):
        if which not in counts:
            add(f"cure: re-initialising the {which.upper()} slices", "—", study_txt, "—", Outcome.NOT_RUN)
            continue
        k, n = counts[which]
        lo, hi = binomial_exact_interval(k, n)
        ours = f"{k}/{n} [{lo:.2f}, {hi:.2f}]"
        if which == "qk":
            rule = "reproduced if >= n-1 of n >= 5 runs ignite; partly if more than half"
            v = Outcome.REPRODUCED if (n >= 5 and k >= n - 1) else (Outcome.PARTLY if k > n / 2 else Outcome.NOT_REPRODUCED)
            claim = "cure: re-initialising only the QK slices of the parts restores learnability"
        else:
            rule = "reproduced if <= 1 of n >= 5 runs ignites; partly if at most half"
            v = Outcome.REPRODUCED if (n >= 5 and k <= 1) else (Outcome.PARTLY if k <= n / 2 else Outcome.NOT_REPRODUCED)
            claim = "cure: re-initialising only the OV slices does nothing"
        if w_crit is None:
            v, rule = Outcome.NOT_TESTABLE, rule + " (needs a critical W: here none, so the runs are a control)"
        add(claim, ours, study_txt, rule, v)
    return pd.DataFrame(rows)


def cure_figure(scan: pd.DataFrame, cure: pd.DataFrame) -> go.Figure:
    """Left: runs igniting within the budget per withholding length, then per cure arm (columns ``w, arm``).
    Middle (when ``scan`` has ``delay_lo``): median delay with its 95% interval per W. Right (when ``scan``
    has the damage columns): base loss at the switch intact and with the parts / the spares mean-ablated."""
    from plotly.subplots import make_subplots

    cure = cure[cure.arm != "no re-init"]  # that bar is the scan's own bar at the same W
    labels = [f"W={int(w)}" for w in scan.w] + [f"W={int(w)} + {a}" for w, a in zip(cure.w, cure.arm)]
    ig = list(scan.ignited) + list(cure.ignited)
    n = list(scan.seeds) + list(cure.seeds)
    colors = ["#888"] * len(scan) + ["#1f77b4" if a == "QK re-init" else "#d62728" if a == "OV re-init" else "#555"
                                     for a in cure.arm]
    has_delay, has_dmg = "delay_lo" in scan, "base_loss_parts_ablated" in scan
    cols = 1 + has_delay + has_dmg
    titles = [f"ignited within {BUDGET} steps"] + (["delay after the switch"] if has_delay else []) \
        + (["base loss at the switch"] if has_dmg else [])
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles, horizontal_spacing=0.08,
                        column_widths=[0.44] + [0.56 / max(cols - 1, 1)] * (cols - 1))
    fig.add_bar(x=labels, y=ig, marker_color=colors, text=[f"{a}/{b}" for a, b in zip(ig, n)],
                textposition="outside", showlegend=False, row=1, col=1)
    fig.update_yaxes(title_text="runs ignited", range=[0, max(n) + 1], row=1, col=1)
    wl = [f"W={int(w)}" for w in scan.w]
    col = 2
    if has_delay:
        med = scan.delay_median.to_numpy(float)
        fig.add_scatter(x=wl, y=med, mode="markers", marker={"size": 9, "color": "#555"}, showlegend=False,
                        text=[f"{a}/{b}" for a, b in zip(scan.ignited, scan.seeds)],
                        error_y={"type": "data", "symmetric": False, "array": scan.delay_hi - med,
                                 "arrayminus": med - scan.delay_lo}, row=1, col=col)
        fig.update_yaxes(title_text="steps, median of igniting seeds (95%)", range=[0, BUDGET], row=1, col=col)
        col += 1
    if has_dmg:
        for c, name, color in (("base_loss", "intact", "#555"), ("base_loss_parts_ablated", "parts mean-ablated",
                                                                  "#d62728"),
                               ("base_loss_spares_ablated", "spares mean-ablated", "#1f77b4")):
            fig.add_scatter(x=wl, y=scan[c].clip(lower=1e-12), mode="lines+markers", name=name,
                            line={"color": color}, row=1, col=col)
        fig.update_yaxes(title_text="base cross-entropy (log; 0 at 1e-12)", type="log", row=1,
                         col=col)
    fig.update_layout(title=f"Withheld capability (K={K}): ignition, delay and damage at the switch",
                      width=560 + 420 * (cols - 1), height=480, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25, "x": 0.6})
    return fig


def run(*, out: str | Path, workers: int = 2, progress: bool = True, png: bool = True,
        ws: Sequence[int] = WS, seeds: int = CURE_SEEDS) -> dict:
    """The withheld scan, the critical W and the cure; writes ``OUT/cure.md``, CSVs, ``fig_cure``."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    S = list(range(seeds))
    wspecs = [{"kind": "withheld", "k": K, "seed": s, "w": int(w), "budget": BUDGET} for w in ws for s in S]
    wres = run_cached_jobs(withheld_job, wspecs, out, workers=workers, progress=progress, desc="withheld jobs")
    wdf = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in wres])
    wdf.to_csv(out / "cure_withheld_runs.csv", index=False)
    failed = [r for r in wres if r.get("status") == "failed"]
    dmg = pd.DataFrame(_damage_rows([r for r in wres if r.get("status") != "failed"], out / "cure_damage.csv"))
    dmg.to_csv(out / "cure_damage.csv", index=False)
    scan = scan_table(wdf, dmg)
    w_crit = critical_w(scan)
    w_cure = w_crit if w_crit is not None else int(max(ws))
    cure_ws = sorted({w_cure} | {int(w) for w in EXTRA_CURE_WS if w in ws})
    cspecs = [{"kind": "cure", "k": K, "seed": s, "w": wc, "which": which, "budget": BUDGET,
               "source": {"kind": "withheld", "k": K, "seed": s, "w": wc, "budget": BUDGET}}
              for wc in cure_ws for which in ("qk", "ov") for s in S]
    cres = run_cached_jobs(cure_job, cspecs, out, workers=workers, progress=progress, desc="cure jobs")
    failed += [r for r in cres if r.get("status") == "failed"]
    cdf = pd.DataFrame([{k: v for k, v in r.items() if k not in ("curve", "source")} for r in cres])
    cdf.to_csv(out / "cure_runs.csv", index=False)
    counts, arms = {}, []
    for wc in cure_ws:
        base_row = scan[scan.w == wc].iloc[0]
        arms.append({"w": wc, "arm": "no re-init", "seeds": int(base_row.seeds), "ignited": int(base_row.ignited),
                     "delay_median": float(base_row.delay_median)})
        for which in ("qk", "ov"):
            g = cdf[(cdf.w == wc) & (cdf.which == which) & (cdf.status != "failed")]
            c = (int((g.status == "ignited").sum()), int(len(g)))
            if wc == w_cure:
                counts[which] = c
            arms.append({"w": wc, "arm": f"{which.upper()} re-init", "seeds": c[1], "ignited": c[0],
                         "delay_median": float(g.delay.median()) if g.delay.notna().any() else float("nan")})
    arms = pd.DataFrame(arms)
    arms[["lo", "hi"]] = [binomial_exact_interval(int(i), int(n)) for i, n in zip(arms.ignited, arms.seeds)]
    v = cure_verdicts(counts, w_crit)
    zero = w_crit is not None and all(counts.get(a, (1, 1))[0] == 0 for a in ("qk", "ov"))
    v = stamped(forced_v1(v, "cure", every_arm_zero=zero), "cure", 1, "pinned")
    v.to_csv(out / "cure_verdicts.csv", index=False)
    save_figure(cure_figure(scan, arms), out / "fig_cure", png=png)
    cpu = float(wdf.cpu_s.fillna(0).sum()) + float(cdf.cpu_s.fillna(0).sum()) if "cpu_s" in cdf else 0.0
    text = "\n".join([
        "## Withheld capability and the query-key cure (version 1, pinned)", "", f"Protocol: {stamp('cure', 1)}.",
        f"K = {K}; base-only training for W steps, then capability share {CAP_SHARE} "
        f"(`switch0->{CAP_SHARE}@W`); ignited = ignition within {BUDGET} steps of the switch. Seeds {S}. "
        f"Critical W (smallest W with no seed igniting): {w_crit}. Cure at W = {w_cure}: the QK or OV slices of "
        f"the parts (0,0..{K - 1}) re-initialised, optimizer state kept. Exact 95% binomial intervals. "
        f"Training CPU {cpu / 60:.1f} core-min (finished jobs reused); "
        f"{len(failed)} failed jobs.", "",
        "Withholding scan (delay = ignition step - W over the igniting seeds, median with bootstrap 95% interval "
        "[delay_lo, delay_hi]; damage at the switch, `cure.damage()`, median over the seeds, on 512 base "
        "sequences: base_loss = cross-entropy intact, loss_parts_abl / loss_spares_abl = with the K parts / the "
        "spare heads mean-ablated at the query, H_gap_parts / H_gap_spares = attention entropy on the rows "
        "before the query minus the uniform-causal value, nats; per-seed values in `cure_damage.csv`):", "",
        markdown_table(_scan_markdown(scan)), "", f"Cure arms (verdicts use W = {w_cure}; other W: {[w for w in cure_ws if w != w_cure] or 'none'}, "
        f"run as a control):", "", markdown_table(arms.round(3)), "",
        markdown_table(v), ""])
    (out / "cure.md").write_text(text)
    return {"scan": scan, "arms": arms, "verdicts": v, "w_crit": w_crit, "markdown": text, "failed": failed}
