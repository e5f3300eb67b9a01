"""The history study's protocol for one seed (see :mod:`studies.history.study`).

Settings (:class:`HistoryConfig`), the balanced batch plan of the two branches
(:func:`balanced_plan`), the behaviour measure, and :func:`run_seed` as small steps that
return dataclasses: :func:`train_anchor`, :func:`make_branches`, :func:`follow_schedules`,
:func:`compare_mechanisms`, :func:`relax`; everything measured for a seed is a :class:`SeedResult`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuitfade.analysis.patching import mean_replacement, patch_resid
from circuitfade.gating.schedules import Piecewise, triangular
from circuitfade.tasks import EVAL_SEED
from circuitfade.tasks.ambiguous import AmbiguousBatch, AmbiguousRecall, AmbiguousRecallConfig
from circuitfade.train import Run, RunConfig, TrainConfig, clone_run, fit, train

__all__ = ["BRANCHES", "DIRECTIONS", "MODEL", "EVAL_SEED", "HistoryConfig", "BranchPlan", "balanced_plan",
           "example_hashes", "Behaviour", "behaviour", "Setup", "Branches", "Mechanism", "SeedResult",
           "train_anchor", "make_branches", "follow_schedules", "compare_mechanisms", "relax", "run_seed"]

BRANCHES: tuple[str, ...] = ("from_below", "from_above")
"""The two histories: ``from_below`` arrives at p0 from p0-δ (IWL side), ``from_above`` from p0+δ."""
DIRECTIONS: dict[str, str] = {"from_below": "up_first", "from_above": "down_first"}
""":func:`triangular` direction of each branch."""

MODEL: dict = {
    "n_layers": 2, "n_heads": 4, "d_model": 64, "d_head": 16, "d_mlp": 128, "attn_only": False,
    "act_fn": "gelu", "positional_embedding_type": "standard", "priors": [], "d_vocab": 32, "n_ctx": 32,
}
"""The study's model: 2 layers, 4 heads, MLPs, ~72K parameters (73,248 here); no soft priors."""




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
@dataclass(frozen=True)
class Behaviour:
    """Behaviour of a model on a batch: ``margin`` (mean over conflict trials of ``logit[context
    answer] - logit[fixed answer]`` at the query), argmax accuracies under each rule (conflict
    trials) and ``loss`` (the task's cross-entropy, all trials)."""

    margin: float
    acc_context: float
    acc_fixed: float
    acc_either: float
    loss: float


@torch.no_grad()
def behaviour(model, task: AmbiguousRecall, batch: AmbiguousBatch) -> Behaviour:
    """The :class:`Behaviour` of ``model`` on ``batch`` (evaluated in eval mode)."""
    was = model.training
    model.eval()
    try:
        logits = model(batch.tokens)
    finally:
        model.train(was)
    return Behaviour(margin=float(task.margin(logits, batch)[batch.conflict].mean()),
                     **task.rule_accuracy(logits, batch), loss=float(task.loss(logits, batch)))


def _margin_fn(task: AmbiguousRecall, batch: AmbiguousBatch):
    mask = batch.conflict

    def metric(logits: Tensor) -> Tensor:
        return task.margin(logits, batch)[mask].mean()

    return metric


# --------------------------------------------------------------------------------------
# one seed
# --------------------------------------------------------------------------------------
@dataclass
class Setup:
    """One seed's task, fixed evaluation set, patching subset and its margin metric."""

    task: AmbiguousRecall
    ev: AmbiguousBatch
    sub: AmbiguousBatch
    metric: object

    @classmethod
    def of(cls, hc: HistoryConfig) -> "Setup":
        task = hc.task()
        ev = task.sample(hc.eval_size, torch.Generator().manual_seed(EVAL_SEED))
        sub = ev[: hc.patch_size]
        return cls(task, ev, sub, _margin_fn(task, sub))


@dataclass
class Branches:
    """The two branch runs cloned from the anchor, with their balanced batches."""

    runs: dict[str, Run]
    plan: BranchPlan
    samplers: dict
    ctx_targets: dict[str, int]  # context-rule targets seen over the schedule, per branch


@dataclass(frozen=True)
class Mechanism:
    """Patching and mean replacement between the branches at the end of the schedule."""

    patching: pd.DataFrame  # direction, layer, hook, pos, value, restored (+ seed)
    replacement: pd.DataFrame  # branch, component, kind, layer, head, value, delta (+ seed)
    patch_corr: float  # correlation of the two restored-fraction maps
    gap_sub: float  # margin gap (below - above) on the patching subset
    gap_after: dict[str, float]  # "heads" / "mlps": the gap left with all of them mean-replaced
    dominant: dict[str, tuple[str, float]]  # branch -> (head, its delta when replaced alone)

    def frac_removed(self, part: str) -> float:
        """Fraction of the gap removed by mean-replacing all ``part`` (``heads`` / ``mlps``)."""
        after = self.gap_after.get(part, math.nan)
        return 1 - after / self.gap_sub if self.gap_sub != 0 else math.nan

    @property
    def same_dominant_head(self) -> float:
        return float(self.dominant["from_below"][0] == self.dominant["from_above"][0])


@dataclass(frozen=True)
class SeedResult:
    """Everything measured for one seed."""

    seed: int
    anchor: Behaviour
    anchor_loss_excess: float  # anchor loss above the Bayes optimum at p0 (nats)
    ctx_targets: dict[str, int]
    end: dict[str, Behaviour]  # per branch, at the end of the schedule
    mechanism: Mechanism
    relax_gap: dict[int, float]  # updates at p0 after the schedule -> margin gap (below - above)
    trace: pd.DataFrame  # seed, branch, phase, k, p_icl, margin, acc_context, acc_fixed, acc_either, loss

    def row(self) -> dict:
        """The seed's line of ``per_seed.csv``."""
        m = self.mechanism
        row = {"seed": self.seed, **{f"anchor_{k}": v for k, v in asdict(self.anchor).items()},
               "anchor_loss_excess": self.anchor_loss_excess,
               **{f"ctx_targets_{b}": self.ctx_targets[b] for b in BRANCHES},
               **{f"{k}_{b}": v for b in BRANCHES for k, v in asdict(self.end[b]).items()},
               "patch_corr": m.patch_corr, "gap_sub": m.gap_sub}
        for part, after in m.gap_after.items():
            row.update({f"gap_sub_all_{part}": after, f"frac_removed_all_{part}": m.frac_removed(part)})
        for b in BRANCHES:
            row.update({f"dominant_head_{b}": m.dominant[b][0], f"dominant_delta_{b}": m.dominant[b][1]})
        return {**row, "same_dominant_head": m.same_dominant_head,
                **{f"gap_r{j}": g for j, g in self.relax_gap.items()}}


def _trace_row(seed: int, branch: str, phase: str, k: int, p_icl: float, beh: Behaviour) -> dict:
    return {"seed": seed, "branch": branch, "phase": phase, "k": k, "p_icl": p_icl, **asdict(beh)}


def train_anchor(seed: int, hc: HistoryConfig, setup: Setup, *, progress: bool = False) -> tuple[Run, Behaviour, float]:
    """The anchor run, its behaviour, and its loss above the Bayes optimum at ``p0``."""
    anchor = train(hc.anchor_config(seed), None, progress=progress)
    a = behaviour(anchor.model, setup.task, setup.ev)
    bayes = setup.task.bayes_loss(hc.p0, float(setup.ev.conflict.float().mean()))
    return anchor, a, a.loss - bayes


def make_branches(anchor: Run, seed: int, hc: HistoryConfig, task: AmbiguousRecall) -> Branches:
    """Clone the anchor into both branches and draw their balanced batches and shared relaxation batches."""
    g = torch.Generator().manual_seed(1_000 * seed + 17)
    plan = balanced_plan(task, hc.p0, hc.delta, hc.period, hc.batch_size, g, start=hc.anchor_steps)
    relax = [task.sample(hc.batch_size, g, p_icl=hc.p0) for _ in range(hc.relax_max)]
    ctx = {b: int(sum(plan.batch(b, k).uses_context.sum() for k in range(hc.period))) for b in BRANCHES}
    return Branches({b: clone_run(anchor, hc.branch_config(seed, b)) for b in BRANCHES}, plan,
                    {b: plan.sampler(b, relax) for b in BRANCHES}, ctx)


def follow_schedules(br: Branches, seed: int, hc: HistoryConfig, setup: Setup) -> list[dict]:
    """Train both branches through their schedules; trace rows every ``trace_every`` updates."""
    rows = []
    for b in BRANCHES:
        for k in sorted(set(range(hc.trace_every, hc.period, hc.trace_every)) | {hc.period}):
            fit(br.runs[b], hc.anchor_steps + k, task=setup.task, progress=False, sampler=br.samplers[b])
            p = hc.schedule(b)(hc.anchor_steps + k)
            rows.append(_trace_row(seed, b, "schedule", k, p, behaviour(br.runs[b].model, setup.task, setup.ev)))
    return rows


def compare_mechanisms(br: Branches, seed: int, setup: Setup) -> Mechanism:
    """Residual patching both ways and mean replacement in each branch, on the patching subset."""
    A, B = br.runs["from_below"].model, br.runs["from_above"].model
    toks, metric = setup.sub.tokens, setup.metric
    maps = {"below->above": patch_resid(A, B, toks, metric), "above->below": patch_resid(B, A, toks, metric)}
    r1, r2 = (m["restored"].to_numpy() for m in maps.values())
    ok = np.isfinite(r1) & np.isfinite(r2)
    rep = {b: mean_replacement(br.runs[b].model, toks, metric) for b in BRANCHES}
    val = {b: rep[b].set_index("component")["value"] for b in BRANCHES}
    gap = {c: val["from_below"][c] - val["from_above"][c] for c in ("none", "all_heads", "all_mlps")
           if c in val["from_below"]}
    dominant = {}
    for b in BRANCHES:
        heads = rep[b][rep[b]["kind"] == "head"]
        top = heads.loc[heads["delta"].abs().idxmax()]
        dominant[b] = (top["component"], float(top["delta"]))
    return Mechanism(
        patching=pd.concat([df.assign(seed=seed, direction=d) for d, df in maps.items()], ignore_index=True),
        replacement=pd.concat([df.assign(seed=seed, branch=b) for b, df in rep.items()], ignore_index=True),
        patch_corr=float(np.corrcoef(r1[ok], r2[ok])[0, 1]) if ok.sum() > 2 else math.nan, gap_sub=gap["none"],
        gap_after={c.removeprefix("all_"): v for c, v in gap.items() if c != "none"}, dominant=dominant)


def relax(br: Branches, seed: int, hc: HistoryConfig, setup: Setup, end: dict[str, Behaviour]) -> list[dict]:
    """Continue both branches at constant ``p0`` on the same fresh batches; trace rows every ``relax_every``."""
    rows, start = [], hc.anchor_steps + hc.period
    for b in BRANCHES:
        for j in sorted(set(range(0, hc.relax_max + 1, hc.relax_every)) | set(hc.relax_steps)):
            fit(br.runs[b], start + j, task=setup.task, progress=False, sampler=br.samplers[b])
            r = end[b] if j == 0 else behaviour(br.runs[b].model, setup.task, setup.ev)
            rows.append(_trace_row(seed, b, "relax", hc.period + j, hc.p0, r))
    return rows


def run_seed(seed: int, hc: HistoryConfig = HistoryConfig(), *, progress: bool = False) -> SeedResult:
    """The whole protocol for one seed: anchor, balanced branches, mechanisms, relaxation."""
    setup = Setup.of(hc)
    anchor, a, excess = train_anchor(seed, hc, setup, progress=progress)
    br = make_branches(anchor, seed, hc, setup.task)
    trace = [_trace_row(seed, b, "anchor", 0, hc.p0, a) for b in BRANCHES] + follow_schedules(br, seed, hc, setup)
    end = {b: behaviour(br.runs[b].model, setup.task, setup.ev) for b in BRANCHES}
    mech = compare_mechanisms(br, seed, setup)
    tr = pd.DataFrame(trace + relax(br, seed, hc, setup, end))
    margin = tr[tr.phase == "relax"].set_index(["branch", "k"])["margin"]
    gaps = {j: float(margin["from_below", hc.period + j] - margin["from_above", hc.period + j]) for j in hc.relax_steps}
    return SeedResult(seed, a, excess, br.ctx_targets, end, mech, gaps, tr)
