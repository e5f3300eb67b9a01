"""History dependence between in-context and in-weights learning (balanced mix schedules).

Protocol (the study summarised in ``shared/seeds/004``), per seed:

1. **Anchor.** Train the study's small model (2 layers, 4 heads, ``d_model`` 64, GELU
   MLPs of width 128, learned absolute positions, no soft priors: 73,248 parameters)
   on ambiguous recall (:mod:`circuitfade.tasks.ambiguous`, 8 pairs) at a constant mix
   ``p_ICL = p0`` for ``anchor_steps`` updates (AdamW 1e-3, wd 0.01, clip 1, batch 64).
2. **Balanced branches.** Clone model *and* optimizer state (:func:`clone_run`) twice
   and train two branches for ``period`` updates on triangular mix schedules
   (:func:`circuitfade.gating.schedules.triangular`):

   * ``from_below``: ``p0 -> p0+δ -> p0-δ -> p0`` (``up_first``; the last leg comes up
     to ``p0`` from the IWL-favouring side ``p0-δ``);
   * ``from_above``: ``p0 -> p0-δ -> p0+δ -> p0`` (``down_first``; last leg comes down
     from the ICL-favouring side).

   Both branches see the **same multiset of examples**: :func:`balanced_plan` draws one
   batch per update ``k`` of the ``from_below`` schedule at its mix ``p_up(k)``; the
   triangle wave satisfies ``p_down(k) = 2 p0 - p_up(k) = p_up((k + period/2) mod
   period)``, so ``from_above`` replays the same batches cyclically shifted by half a
   period, each at exactly its own schedule's mix. Same number of updates, same
   examples, same total count of context-rule targets; only the order differs.
3. **Measures** at the end of the branches (on a fixed evaluation set; conflict
   trials = the two rules disagree):

   * behaviour: mean logit margin ``logit[context answer] - logit[fixed answer]`` at the
     query, per branch; **gap = margin(from_below) - margin(from_above)**; accuracy
     under each rule;
   * residual-stream patching in both directions (:func:`patch_resid`), the fraction
     of the margin gap restored at every (layer, position), and the correlation of
     the two maps;
   * mean replacement (:func:`mean_replacement`) of every head's ``hook_z`` / MLP
     output at the query by its checkpoint-specific batch mean: the fraction of the
     gap removed when all heads are replaced, and each history's dominant head
     (largest ``|Δ margin|`` when replaced alone);
   * relaxation: both branches continue at constant ``p0`` on the *same* fresh
     batches; the gap after ``relax_steps`` (0, 25, 100) further updates.
4. **Statistics over seeds**: mean, 95 % Student-t interval (``mean ± t_{0.975, n-1}
   · sd / √n``) and the exact two-sided sign-flip p-value (:func:`sign_flip_pvalue`).

The study does not give δ or the schedule length; we use δ = 0.3 and a period of 400
updates (100 up, 200 down, 100 back), after a 3,000-update anchor (enough for the
context circuit to form at ``p0 = 0.5``; the anchor's convergence is reported).

    python -m circuitfade.experiments.history --seeds 5 --out results/history [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuitfade.analysis.patching import mean_replacement, patch_resid
from circuitfade.gating.schedules import Piecewise, triangular
from circuitfade.tasks.ambiguous import AmbiguousBatch, AmbiguousRecall
from circuitfade.train.loop import Run, RunConfig, TrainConfig, clone_run, train
from circuitfade.viz.html import Section, write_page

__all__ = [
    "BRANCHES",
    "DIRECTIONS",
    "MODEL",
    "STUDY",
    "HistoryConfig",
    "BranchPlan",
    "balanced_plan",
    "example_hashes",
    "behaviour",
    "sign_flip_pvalue",
    "t_interval",
    "summarize",
    "run_seed",
    "run",
    "to_markdown",
    "figures",
    "main",
]

BRANCHES: tuple[str, ...] = ("from_below", "from_above")
"""The two histories: ``from_below`` arrives at p0 from p0-δ (IWL side), ``from_above`` from p0+δ."""
DIRECTIONS: dict[str, str] = {"from_below": "up_first", "from_above": "down_first"}
""":func:`triangular` direction of each branch."""

MODEL: dict = {
    "n_layers": 2, "n_heads": 4, "d_model": 64, "d_head": 16, "d_mlp": 128, "attn_only": False,
    "act_fn": "gelu", "positional_embedding_type": "standard", "priors": [], "d_vocab": 32, "n_ctx": 32,
}
"""The study's model: 2 layers, 4 heads, MLPs, ~72K parameters (73,248 here); no soft priors."""

STUDY: dict[str, object] = {
    "gap_r0": "+0.0976 (5/5 seeds > 0, p = 0.0625)",
    "gap_r25": "reverses slightly",
    "gap_r100": "≈ 0 (vanished)",
    "frac_removed_all_heads": "86.8 %",
    "patch_corr": "> 0.999",
    "same_dominant_head": "same head in both histories",
}
"""The study's numbers (p0 = 0.5, five seeds) put beside ours in the report."""

EVAL_SEED = 4_242_007


@dataclass(frozen=True)
class HistoryConfig:
    """Every setting of the experiment (defaults: the full run)."""

    p0: float = 0.5
    delta: float = 0.3
    period: int = 400  # updates per triangular excursion; must be even
    anchor_steps: int = 3000
    relax_steps: tuple = (0, 25, 100)
    relax_every: int = 5  # resolution of the relaxation curve
    trace_every: int = 20  # resolution of the margin trajectory over the schedule
    batch_size: int = 64
    lr: float = 1e-3
    n_pairs: int = 8
    table_seed: int = 0
    eval_size: int = 2048
    patch_size: int = 512  # evaluation examples used for patching / mean replacement
    model: Mapping = field(default_factory=lambda: dict(MODEL))

    def __post_init__(self):
        object.__setattr__(self, "relax_steps", tuple(sorted({int(s) for s in self.relax_steps})))
        object.__setattr__(self, "model", dict(self.model))
        if not 0 <= self.p0 - self.delta or not self.p0 + self.delta <= 1 or self.delta < 0:
            raise ValueError(f"p0 ± delta must stay in [0, 1], got p0={self.p0}, delta={self.delta}")
        if self.period < 2 or self.period % 2:
            raise ValueError(f"period: expected an even number of updates >= 2, got {self.period}")
        if self.anchor_steps < 1 or not self.relax_steps or self.relax_steps[0] < 0:
            raise ValueError("anchor_steps must be >= 1 and relax_steps non-empty and >= 0")
        if 0 not in self.relax_steps:
            object.__setattr__(self, "relax_steps", (0, *self.relax_steps))

    @property
    def relax_max(self) -> int:
        return max(self.relax_steps)

    def task(self) -> AmbiguousRecall:
        from circuitfade.tasks.ambiguous import AmbiguousRecallConfig

        return AmbiguousRecall(AmbiguousRecallConfig(n_pairs=self.n_pairs, p_icl=self.p0, table_seed=self.table_seed))

    def _train(self, steps: int) -> TrainConfig:
        return TrainConfig(steps=steps, batch_size=self.batch_size, lr=self.lr, eval_every=max(steps, 1),
                           eval_size=64, eval_conditions=("normal",))

    def anchor_config(self, seed: int) -> RunConfig:
        """The anchor run: constant ``p_ICL = p0`` for ``anchor_steps`` updates."""
        task = {"name": "ambiguous", "n_pairs": self.n_pairs, "p_icl": self.p0, "table_seed": self.table_seed}
        return RunConfig(path="unforced", task=task, model=self.model, train=self._train(self.anchor_steps),
                         seed=int(seed))

    def schedule(self, branch: str) -> Piecewise:
        """The branch's mix ``p_ICL(step)`` in global steps (``p0`` outside the excursion)."""
        if branch not in DIRECTIONS:
            raise ValueError(f"branch: expected one of {BRANCHES}, got {branch!r}")
        return triangular(self.p0, self.delta, self.period, DIRECTIONS[branch], start=self.anchor_steps)

    def branch_config(self, seed: int, branch: str) -> RunConfig:
        """The branch run (through the relaxation phase); ``mix`` logs ``p_icl`` per step."""
        end = self.anchor_steps + self.period + self.relax_max
        return replace(self.anchor_config(seed), mix={"p_icl": self.schedule(branch).spec}, train=self._train(end))


# --------------------------------------------------------------------------------------
# balanced branches
# --------------------------------------------------------------------------------------
@dataclass
class BranchPlan:
    """Pre-drawn batches of the two branches.

    ``batches[i]`` was drawn at mix ``p_icl[i]``; branch ``b`` trains at its update
    ``k`` (``0 <= k < period``) on ``batches[order[b][k]]``. ``order["from_below"]`` is
    the identity and ``order["from_above"][k] = (k + period/2) mod period``.
    """

    batches: list[AmbiguousBatch]
    p_icl: list[float]
    order: dict[str, list[int]]
    start: int = 0

    @property
    def period(self) -> int:
        return len(self.batches)

    def batch(self, branch: str, k: int) -> AmbiguousBatch:
        return self.batches[self.order[branch][k]]

    def sampler(self, branch: str, after: Sequence[AmbiguousBatch] = ()):
        """``sampler(step, generator)`` for :func:`train`: the plan's batches for global steps
        ``start .. start+period-1``, then ``after[j]`` at step ``start + period + j``."""
        if branch not in self.order:
            raise ValueError(f"branch: expected one of {tuple(self.order)}, got {branch!r}")

        def sample(step: int, generator: torch.Generator) -> AmbiguousBatch:
            k = step - self.start
            if 0 <= k < self.period:
                return self.batch(branch, k)
            if self.period <= k < self.period + len(after):
                return after[k - self.period]
            raise ValueError(f"step {step} is outside this plan (start {self.start}, period {self.period}, "
                             f"{len(after)} batches after)")

        return sample


def balanced_plan(task: AmbiguousRecall, p0: float, delta: float, period: int, batch_size: int,
                  generator: torch.Generator, *, start: int = 0) -> BranchPlan:
    """Draw the balanced branches' batches (see :class:`BranchPlan`).

    For ``k = 0 .. period-1``: ``batches[k] = task.sample(batch_size, generator,
    p_icl=p_up(k))`` with ``p_up`` the ``up_first`` (``from_below``) schedule. Checks
    that every update of both branches uses a batch drawn at exactly that branch's
    mix (to 1e-9); raises ``ValueError`` for an odd ``period``.
    """
    if period < 2 or period % 2:
        raise ValueError(f"period: expected an even number of updates >= 2, got {period}")
    up = triangular(p0, delta, period, "up_first", start=start)
    down = triangular(p0, delta, period, "down_first", start=start)
    p = [up(start + k) for k in range(period)]
    batches = [task.sample(batch_size, generator, p_icl=pk) for pk in p]
    order = {"from_below": list(range(period)), "from_above": [(k + period // 2) % period for k in range(period)]}
    for k in range(period):
        if abs(p[order["from_above"][k]] - down(start + k)) > 1e-9:
            raise ValueError(f"triangular schedules are not half-period shifts at update {k}")
    return BranchPlan(batches, p, order, start)


def example_hashes(batches: Sequence[AmbiguousBatch]) -> list[str]:
    """One hash per training example, ``sha1(tokens bytes | target bytes)``, in order."""
    import hashlib

    out = []
    for b in batches:
        for tok, tgt in zip(b.tokens, b.targets[:, -1]):
            out.append(hashlib.sha1(tok.numpy().tobytes() + b"|" + tgt.numpy().tobytes()).hexdigest())
    return out


# --------------------------------------------------------------------------------------
# measures
# --------------------------------------------------------------------------------------
@torch.no_grad()
def behaviour(model, task: AmbiguousRecall, batch: AmbiguousBatch) -> dict[str, float]:
    """``{"margin", "acc_context", "acc_fixed", "acc_either", "loss"}`` of ``model`` on ``batch``.

    ``margin``: mean over conflict trials of ``logit[context answer] - logit[fixed answer]``
    at the query; accuracies: argmax at the query on conflict trials; ``loss``: the task's
    cross-entropy against the batch targets (all trials).
    """
    was = model.training
    model.eval()
    try:
        logits = model(batch.tokens)
    finally:
        model.train(was)
    m = batch.conflict
    return {"margin": float(task.margin(logits, batch)[m].mean()), **task.rule_accuracy(logits, batch),
            "loss": float(task.loss(logits, batch))}


def _margin_fn(task: AmbiguousRecall, batch: AmbiguousBatch):
    mask = batch.conflict

    def metric(logits: Tensor) -> Tensor:
        return task.margin(logits, batch)[mask].mean()

    return metric


def sign_flip_pvalue(values: Sequence[float]) -> float:
    """Exact two-sided sign-flip (randomisation) p-value of ``mean(values) = 0``.

    Enumerates all ``2^n`` sign assignments ``s`` and returns the fraction with
    ``|mean(s * values)| >= |mean(values)|`` (ties counted, with a 1e-12 relative
    tolerance). Five values of one sign give ``2/32 = 0.0625``, the smallest possible
    for ``n = 5``. NaNs are dropped; raises ``ValueError`` for no values or ``n > 20``.
    """
    x = np.asarray([float(v) for v in values if not math.isnan(float(v))])
    if x.size == 0:
        raise ValueError("sign_flip_pvalue: expected at least one finite value")
    if x.size > 20:
        raise ValueError(f"sign_flip_pvalue: exact enumeration of 2^{x.size} assignments is too large (n <= 20)")
    obs = abs(x.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=x.size)))
    stats = np.abs(signs @ x) / x.size
    return float(np.mean(stats >= obs - 1e-12 * max(obs, 1e-300)))


def _t_cdf(t: float, df: int) -> float:
    # Student-t CDF by Simpson integration of the density on [0, |t|] (accurate to ~1e-10 here)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    n = 4000
    a, h = abs(t), abs(t) / n
    f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
    area = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    return 0.5 + math.copysign(area, t)


def _t_quantile(q: float, df: int) -> float:
    lo, hi = 0.0, 1000.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: Student-t interval ``mean ± t_{(1+level)/2, n-1} · sd / √n``
    (``sd`` with ``n-1``); ``lo = hi = NaN`` for fewer than two finite values."""
    x = np.asarray([float(v) for v in values if not math.isnan(float(v))])
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    m = float(x.mean())
    if x.size < 2:
        return (m, math.nan, math.nan)
    half = _t_quantile((1 + level) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return (m, m - half, m + half)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "ci_lo", "ci_hi", "n", "n_positive", "p_signflip"}`` over seeds."""
    x = [float(v) for v in values if not math.isnan(float(v))]
    m, lo, hi = t_interval(x)
    return {"mean": m, "ci_lo": lo, "ci_hi": hi, "n": len(x), "n_positive": sum(v > 0 for v in x),
            "p_signflip": sign_flip_pvalue(x) if x else math.nan}


# --------------------------------------------------------------------------------------
# one seed
# --------------------------------------------------------------------------------------
def _advance(run: Run, to_step: int, sampler) -> None:
    """Train ``run`` (in memory) up to global step ``to_step`` with ``sampler``."""
    if to_step <= run.step:
        return
    cfg = run.config
    run.config = replace(cfg, train=replace(cfg.train, steps=to_step, eval_every=to_step))
    train(run.config, None, progress=False, sampler=sampler, run=run)
    run.config = cfg


def run_seed(seed: int, hc: HistoryConfig = HistoryConfig(), *, progress: bool = False) -> dict[str, pd.DataFrame]:
    """The whole protocol for one seed. Returns frames:

    * ``scalars``: one row (``seed`` + every per-seed number);
    * ``trace``: ``seed, branch, phase, k, p_icl, margin, acc_context, acc_fixed, loss``
      (``k`` = updates since the branch point; ``phase`` "anchor"/"schedule"/"relax");
    * ``patching``: ``seed, direction, layer, hook, pos, value, restored``;
    * ``replacement``: ``seed, branch, component, kind, layer, head, value, delta``.
    """
    task = hc.task()
    ev = task.sample(hc.eval_size, torch.Generator().manual_seed(EVAL_SEED))
    sub = ev[: hc.patch_size]
    metric = _margin_fn(task, sub)

    anchor = train(hc.anchor_config(seed), None, progress=progress)
    a = behaviour(anchor.model, task, ev)
    conflict_rate = float(ev.conflict.float().mean())
    scal: dict = {"seed": seed, "anchor_margin": a["margin"], "anchor_acc_context": a["acc_context"],
                  "anchor_acc_fixed": a["acc_fixed"], "anchor_acc_either": a["acc_either"],
                  "anchor_loss": a["loss"], "anchor_loss_excess": a["loss"] - task.bayes_loss(hc.p0, conflict_rate)}

    g = torch.Generator().manual_seed(1_000 * seed + 17)
    plan = balanced_plan(task, hc.p0, hc.delta, hc.period, hc.batch_size, g, start=hc.anchor_steps)
    relax = [task.sample(hc.batch_size, g, p_icl=hc.p0) for _ in range(hc.relax_max)]
    runs = {b: clone_run(anchor, hc.branch_config(seed, b)) for b in BRANCHES}
    samplers = {b: plan.sampler(b, relax) for b in BRANCHES}
    scal["ctx_targets_from_below"] = int(sum(plan.batch("from_below", k).uses_context.sum() for k in range(hc.period)))
    scal["ctx_targets_from_above"] = int(sum(plan.batch("from_above", k).uses_context.sum() for k in range(hc.period)))

    trace = [{"seed": seed, "branch": b, "phase": "anchor", "k": 0, "p_icl": hc.p0, **a} for b in BRANCHES]
    checkpoints = sorted(set(range(hc.trace_every, hc.period, hc.trace_every)) | {hc.period})
    for b in BRANCHES:
        for k in checkpoints:
            _advance(runs[b], hc.anchor_steps + k, samplers[b])
            trace.append({"seed": seed, "branch": b, "phase": "schedule", "k": k,
                          "p_icl": hc.schedule(b)(hc.anchor_steps + k), **behaviour(runs[b].model, task, ev)})

    # ---- immediate measures (relax step 0)
    A, B = runs["from_below"].model, runs["from_above"].model
    beh = {b: behaviour(runs[b].model, task, ev) for b in BRANCHES}
    for b in BRANCHES:
        for k, v in beh[b].items():
            scal[f"{k}_{b}"] = v
    maps = {"below->above": patch_resid(A, B, sub.tokens, metric), "above->below": patch_resid(B, A, sub.tokens, metric)}
    patching = pd.concat([df.assign(seed=seed, direction=d) for d, df in maps.items()], ignore_index=True)
    r1, r2 = maps["below->above"]["restored"].to_numpy(), maps["above->below"]["restored"].to_numpy()
    ok = np.isfinite(r1) & np.isfinite(r2)
    scal["patch_corr"] = float(np.corrcoef(r1[ok], r2[ok])[0, 1]) if ok.sum() > 2 else math.nan
    rep = {b: mean_replacement(runs[b].model, sub.tokens, metric) for b in BRANCHES}
    replacement = pd.concat([df.assign(seed=seed, branch=b) for b, df in rep.items()], ignore_index=True)
    val = {b: rep[b].set_index("component")["value"] for b in BRANCHES}
    gap_sub = val["from_below"]["none"] - val["from_above"]["none"]
    scal["gap_sub"] = gap_sub
    for comp, name in (("all_heads", "heads"), ("all_mlps", "mlps")):
        if comp in val["from_below"]:
            g_after = val["from_below"][comp] - val["from_above"][comp]
            scal[f"gap_sub_all_{name}"] = g_after
            scal[f"frac_removed_all_{name}"] = 1 - g_after / gap_sub if gap_sub != 0 else math.nan
    for b in BRANCHES:
        heads = rep[b][rep[b]["kind"] == "head"]
        top = heads.loc[heads["delta"].abs().idxmax()]
        scal[f"dominant_head_{b}"] = top["component"]
        scal[f"dominant_delta_{b}"] = float(top["delta"])
    scal["same_dominant_head"] = float(scal["dominant_head_from_below"] == scal["dominant_head_from_above"])

    # ---- relaxation at constant p0 on the same fresh batches
    start = hc.anchor_steps + hc.period
    relax_points = sorted(set(range(0, hc.relax_max + 1, hc.relax_every)) | set(hc.relax_steps))
    for b in BRANCHES:
        for j in relax_points:
            _advance(runs[b], start + j, samplers[b])
            r = beh[b] if j == 0 else behaviour(runs[b].model, task, ev)
            trace.append({"seed": seed, "branch": b, "phase": "relax", "k": hc.period + j, "p_icl": hc.p0, **r})
    tr = pd.DataFrame(trace)
    rel = tr[tr.phase == "relax"].pivot_table(index="k", columns="branch", values="margin")
    for j in hc.relax_steps:
        scal[f"gap_r{j}"] = float(rel.loc[hc.period + j, "from_below"] - rel.loc[hc.period + j, "from_above"])
    return {"scalars": pd.DataFrame([scal]), "trace": tr, "patching": patching, "replacement": replacement}


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------
def _fmt(v, digits: int = 4) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:+.{digits}f}" if isinstance(v, float) else str(v)


def summary_table(per_seed: pd.DataFrame, hc: HistoryConfig) -> pd.DataFrame:
    """One row per quantity: ``quantity, mean, ci_lo, ci_hi, n, n_positive, p_signflip, study``."""
    rows = []
    qty = [(f"gap_r{j}", f"margin gap (below − above) after {j} updates at p0") for j in hc.relax_steps]
    qty += [("frac_removed_all_heads", "fraction of gap removed by mean-replacing all query heads"),
            ("frac_removed_all_mlps", "fraction of gap removed by mean-replacing both query MLPs"),
            ("patch_corr", "correlation of patching maps (below→above vs above→below)"),
            ("same_dominant_head", "same dominant head in both histories (fraction of seeds)"),
            ("margin_from_below", "margin, from below (conflict trials)"),
            ("margin_from_above", "margin, from above (conflict trials)"),
            ("acc_context_from_below", "accuracy under the context rule, from below (conflict trials)"),
            ("acc_context_from_above", "accuracy under the context rule, from above (conflict trials)"),
            ("acc_fixed_from_below", "accuracy under the fixed rule, from below (conflict trials)"),
            ("acc_fixed_from_above", "accuracy under the fixed rule, from above (conflict trials)"),
            ("anchor_margin", "anchor: margin at p0 (conflict trials)"),
            ("anchor_acc_either", "anchor: argmax is one of the two rule answers (conflict trials)"),
            ("anchor_loss_excess", "anchor: loss above the Bayes optimum (nats)")]
    for key, label in qty:
        if key not in per_seed:
            continue
        s = summarize(per_seed[key].astype(float))
        if key == "same_dominant_head":
            s.update(ci_lo=math.nan, ci_hi=math.nan, n_positive=math.nan, p_signflip=math.nan)
        elif not key.startswith(("gap_", "frac_")):
            s.update(n_positive=math.nan, p_signflip=math.nan)
        rows.append({"quantity": key, "label": label, **s, "study": STUDY.get(key, "")})
    # pooled fraction (ratio of seed means: robust when a seed's gap is near 0)
    if "gap_sub_all_heads" in per_seed:
        pooled = 1 - per_seed["gap_sub_all_heads"].mean() / per_seed["gap_sub"].mean()
        rows.append({"quantity": "frac_removed_all_heads_pooled",
                     "label": "fraction removed by all heads, 1 − mean(gap after)/mean(gap before)",
                     "mean": pooled, "ci_lo": math.nan, "ci_hi": math.nan, "n": len(per_seed),
                     "n_positive": math.nan, "p_signflip": math.nan, "study": STUDY["frac_removed_all_heads"]})
    return pd.DataFrame(rows)


def to_markdown(per_seed: pd.DataFrame, summary: pd.DataFrame, hc: HistoryConfig, *, label: str = "",
                wall_s: float | None = None) -> str:
    """The report: settings, summary beside the study's numbers, per-seed table."""
    lines = ["# History dependence at a balanced ICL/IWL mix", ""]
    if label:
        lines += [f"**{label}**", ""]
    lines += [
        f"Model: 2 layers, 4 heads, d_model 64, GELU MLP 128, learned positions, no priors; "
        f"task: ambiguous recall ({hc.n_pairs} pairs, 16 keys, 16 values). Anchor: {hc.anchor_steps} updates at "
        f"p0 = {hc.p0}; branches: triangular δ = {hc.delta}, period {hc.period} updates "
        f"(from below = p0→p0+δ→p0−δ→p0, from above = p0→p0−δ→p0+δ→p0), same multiset of examples; "
        f"relaxation at p0 on shared fresh batches. Batch {hc.batch_size}, AdamW lr {hc.lr}. "
        f"Evaluation: {hc.eval_size} fixed prompts (conflict trials for margins); patching / mean replacement "
        f"on the first {hc.patch_size}. Interval: 95 % Student-t over seeds; p: exact two-sided sign-flip.",
        "",
        "| quantity | ours: mean [95 % CI] | seeds > 0 | sign-flip p | study |",
        "|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        ci = "" if math.isnan(r["ci_lo"]) else f" [{r['ci_lo']:+.4f}, {r['ci_hi']:+.4f}]"
        npos = "" if isinstance(r["n_positive"], float) and math.isnan(r["n_positive"]) else f"{int(r['n_positive'])}/{int(r['n'])}"
        p = "" if isinstance(r["p_signflip"], float) and math.isnan(r["p_signflip"]) else f"{r['p_signflip']:.4f}"
        lines.append(f"| {r['label']} | {r['mean']:+.4f}{ci} | {npos} | {p} | {r['study']} |")
    lines += ["", "Per seed:", "",
              "| seed | anchor acc (either / ctx / fixed) | margin below | margin above | gap r0 | "
              + " | ".join(f"gap r{j}" for j in hc.relax_steps if j) + " | frac removed (heads) | patch corr | dominant head (below / above) |",
              "|---" * (8 + sum(1 for j in hc.relax_steps if j)) + "|"]
    for _, r in per_seed.iterrows():
        rel = " | ".join(_fmt(r[f"gap_r{j}"]) for j in hc.relax_steps if j)
        lines.append(
            f"| {int(r['seed'])} | {r['anchor_acc_either']:.3f} / {r['anchor_acc_context']:.3f} / "
            f"{r['anchor_acc_fixed']:.3f} | {_fmt(r['margin_from_below'])} | {_fmt(r['margin_from_above'])} | "
            f"{_fmt(r['gap_r0'])} | {rel} | {_fmt(r.get('frac_removed_all_heads', math.nan), 3)} | "
            f"{_fmt(r['patch_corr'], 4)} | {r['dominant_head_from_below']} / {r['dominant_head_from_above']} |")
    g = summary.set_index("quantity")
    lines += ["", "What reproduced:", ""]
    if "gap_r0" in g.index:
        r = g.loc["gap_r0"]
        lines.append(f"- Immediate gap: ours {r['mean']:+.4f} ({int(r['n_positive'])}/{int(r['n'])} seeds positive, "
                     f"p = {r['p_signflip']:.4f}); study +0.0976 (5/5, p = 0.0625).")
    for j in hc.relax_steps:
        if j and f"gap_r{j}" in g.index:
            r = g.loc[f"gap_r{j}"]
            ci = "" if math.isnan(r["ci_lo"]) else f" [{r['ci_lo']:+.4f}, {r['ci_hi']:+.4f}]"
            lines.append(f"- Gap after {j} updates at p0: {r['mean']:+.4f}{ci}, {int(r['n_positive'])}/{int(r['n'])} "
                         f"seeds positive (study: {STUDY.get(f'gap_r{j}', '—')}).")
    if "frac_removed_all_heads" in g.index:
        lines.append(f"- All query-position heads mean-replaced: per-seed mean fraction removed "
                     f"{g.loc['frac_removed_all_heads', 'mean']:.3f}; pooled "
                     f"{g.loc['frac_removed_all_heads_pooled', 'mean']:.3f} (study 0.868).")
    if "patch_corr" in g.index:
        lines.append(f"- Patching-map correlation: {g.loc['patch_corr', 'mean']:.4f} (study > 0.999); same dominant "
                     f"head in {g.loc['same_dominant_head', 'mean'] * len(per_seed):.0f}/{len(per_seed)} seeds.")
    if wall_s is not None:
        lines += ["", f"Wall time: {wall_s / 60:.1f} min ({len(per_seed)} seeds, 1 thread)."]
    return "\n".join(lines)


def figures(trace: pd.DataFrame, patching: pd.DataFrame, hc: HistoryConfig) -> dict:
    """Three plotly figures from the finished frames: ``margin`` (margin over the schedule
    and relaxation, both branches, seed mean and per seed, with ``p_ICL`` on a second axis),
    ``patching`` (seed-mean restored-fraction maps, layer × position, both directions side
    by side) and ``relaxation`` (gap below − above after the schedule, per seed and mean)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colors = {"from_below": "#1f77b4", "from_above": "#d62728"}
    t = trace[trace.phase != "anchor"]
    fig1 = make_subplots(specs=[[{"secondary_y": True}]])
    for b in BRANCHES:
        tb = t[t.branch == b]
        for s, ts in tb.groupby("seed"):
            fig1.add_trace(go.Scatter(x=ts.k, y=ts.margin, mode="lines", line=dict(color=colors[b], width=0.7),
                                      opacity=0.35, name=f"{b} seed {s}", showlegend=False))
        mean = tb.groupby("k", as_index=False)[["margin", "p_icl"]].mean()
        fig1.add_trace(go.Scatter(x=mean.k, y=mean.margin, mode="lines", line=dict(color=colors[b], width=2.5),
                                  name=f"{b} (mean margin)"))
        fig1.add_trace(go.Scatter(x=mean.k, y=mean.p_icl, mode="lines", line=dict(color=colors[b], dash="dot"),
                                  name=f"{b} p_ICL"), secondary_y=True)
    fig1.add_vline(x=hc.period, line_dash="dash", line_color="grey")
    fig1.update_xaxes(title_text="updates since the branch point (relaxation at p0 after the dashed line)")
    fig1.update_yaxes(title_text="logit margin context − fixed (conflict trials, nats)", secondary_y=False)
    fig1.update_yaxes(title_text="p_ICL of the training mix", secondary_y=True, range=[0, 1], showgrid=False)
    fig1.update_layout(title="Margin over the balanced schedules", height=450)

    dirs = list(dict.fromkeys(patching.direction))
    fig2 = make_subplots(rows=1, cols=len(dirs), subplot_titles=[f"patch {d}" for d in dirs])
    for i, d in enumerate(dirs):
        m = patching[patching.direction == d].groupby(["layer", "pos"], as_index=False)["restored"].mean()
        z = m.pivot(index="layer", columns="pos", values="restored")
        ylab = [f"resid_pre {l}" if l < z.index.max() else "final resid" for l in z.index]
        fig2.add_trace(go.Heatmap(z=z.to_numpy(), x=list(z.columns), y=ylab, coloraxis="coloraxis"), row=1, col=i + 1)
        fig2.update_xaxes(title_text="position", row=1, col=i + 1)
    fig2.update_layout(title="Fraction of the margin gap restored by single-site residual patching (seed mean)",
                       coloraxis=dict(colorscale="RdBu", cmid=0, colorbar=dict(title="restored")), height=380)

    r = t[t.phase == "relax"].pivot_table(index=["seed", "k"], columns="branch", values="margin").reset_index()
    r["gap"] = r["from_below"] - r["from_above"]
    r["j"] = r["k"] - hc.period
    fig3 = go.Figure()
    for s, rs in r.groupby("seed"):
        fig3.add_trace(go.Scatter(x=rs.j, y=rs.gap, mode="lines+markers", opacity=0.5, name=f"seed {s}"))
    mean = r.groupby("j", as_index=False)["gap"].mean()
    fig3.add_trace(go.Scatter(x=mean.j, y=mean.gap, mode="lines", line=dict(color="black", width=3), name="mean"))
    fig3.add_hline(y=0, line_color="grey")
    fig3.update_layout(title="Relaxation: margin gap (from below − from above) at constant p0",
                       xaxis_title="further updates at p0", yaxis_title="margin gap (nats)", height=400)
    return {"margin": fig1, "patching": fig2, "relaxation": fig3}


def _write_html(figs: dict, path: Path, title: str) -> None:
    write_page(path, title, [Section(name, [fig]) for name, fig in figs.items()])


QUICK = dict(anchor_steps=300, period=40, relax_steps=(0, 5, 20), relax_every=5, trace_every=5, eval_size=512,
             patch_size=128)
"""Settings of ``--quick`` (the code path only: the context circuit has not formed; not comparable)."""


def run(seeds: int | Sequence[int] = 5, out: str | Path | None = "results/history", *,
        anchor_steps: int | None = None, delta: float | None = None, period: int | None = None,
        quick: bool = False, progress: bool = True, config: HistoryConfig | None = None,
        threads: int | None = 1) -> tuple[pd.DataFrame, str]:
    """Run the experiment for ``seeds`` (a count: ``0 .. n-1``, or explicit seeds) and write
    ``out/`` (``per_seed.csv``, ``summary.csv``, ``trace.csv``, ``patching.csv``,
    ``replacement.csv``, ``results.md``, ``figures.html``; nothing if ``out`` is None).

    Returns ``(per_seed, markdown)``: one row per seed with every scalar measure.
    ``config`` gives every setting; ``anchor_steps`` / ``delta`` / ``period`` override
    it; ``quick`` starts from :data:`QUICK`. ``threads``: torch threads while running.
    """
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected a positive count or a non-empty list")
    hc = config or (HistoryConfig(**QUICK) if quick else HistoryConfig())
    over = {k: v for k, v in dict(anchor_steps=anchor_steps, delta=delta, period=period).items() if v is not None}
    hc = replace(hc, **over)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.time()
    try:
        from tqdm import tqdm

        parts = [run_seed(s, hc, progress=progress) for s in tqdm(seeds, disable=not progress, desc="history seeds")]
    finally:
        torch.set_num_threads(old)
    wall = time.time() - t0
    frames = {k: pd.concat([p[k] for p in parts], ignore_index=True) for k in parts[0]}
    per_seed = frames["scalars"]
    summary = summary_table(per_seed, hc)
    label = "QUICK — code path only, not comparable to the study" if quick else ""
    md = to_markdown(per_seed, summary, hc, label=label, wall_s=wall)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        per_seed.to_csv(out / "per_seed.csv", index=False)
        summary.to_csv(out / "summary.csv", index=False)
        for k in ("trace", "patching", "replacement"):
            frames[k].to_csv(out / f"{k}.csv", index=False)
        (out / "config.json").write_text(pd.Series(asdict(hc)).to_json(indent=2))
        (out / "results.md").write_text(md + "\n")
        _write_html(figures(frames["trace"], frames["patching"], hc), out / "figures.html",
                    "History dependence between ICL and IWL")
    return per_seed, md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m circuitfade.experiments.history",
                                 description="Balanced ICL/IWL mix schedules: history dependence, patching, relaxation.")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="results/history")
    ap.add_argument("--quick", action="store_true", help="tiny budget (code path only; not comparable)")
    ap.add_argument("--anchor-steps", type=int, default=None)
    ap.add_argument("--delta", type=float, default=None)
    ap.add_argument("--period", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    _, md = run(args.seeds, args.out, anchor_steps=args.anchor_steps, delta=args.delta, period=args.period,
                quick=args.quick, progress=not args.no_progress, threads=args.threads)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
