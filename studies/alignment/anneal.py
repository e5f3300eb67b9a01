"""``python -m studies.alignment anneal``: melt, pin and anneal a K-part circuit with Langevin noise.

Apparatus: the K-part task of :mod:`studies.alignment` (V = 3, one distractor, the pinned
one-layer preset) with **K = 2**, trained by **plain SGD** (no momentum, no weight decay; lr :data:`LR_SGD`,
batch 128, gradient norm clipped at 1: see below) wrapped by :class:`~circuitfade.train.langevin.LangevinNoise`, so that the
temperature ``T`` is the one of the Langevin relation (stationary density ``exp(-L / T)``, ``L`` the batch
cross-entropy; see that module for the finite-lr correction). Why these choices:

* SGD rather than the base runs' AdamW: with AdamW the injected isotropic noise is not a temperature of
  ``exp(-L / T)``. Plain SGD learns the K = 2 circuit from scratch in a few hundred steps, so the circuit is
  formed here by the same optimizer at ``T = 0`` (ignition + the alignment margin, the base jobs' stopping
  rule), not loaded from an AdamW run. Probes (formation only, before any noisy run): lr 0.5 diverged on
  seed 0 (no clipping); lr 0.3 and 0.2 formed all 5 seeds (ignition at 125-175 and 125-300 steps); 0.2 is
  used for a margin against divergence under noise. K = 3 at lr 0.5 ignited only after 500-900 steps with
  dips (one probe seed), so K = 2.
* Gradient norm clipped at :data:`CLIP` = 1 (as the project's trainer does). Without it the noisy runs
  diverged (seed 0 probe: lr 0.2 at T >= 3e-4, lr 0.05 at T >= 3e-3: noise carries the weights where the
  step is unstable). Near the formed circuit the gradient is far below 1, so the relation holds there; each
  job reports the fraction of its steps that were clipped (where the drift, not the noise, was altered).
  That fraction is large in the melting range (noise of norm ``sqrt(2 lr T n_params)`` per step pushes the
  weights where the gradient norm exceeds 1), so there the chain is clipped SGD plus Langevin noise and its
  stationary density is not ``exp(-L / T)``: the melting point is a property of (lr, clip, steps), in units of
  the injected noise's temperature. A probe with clip 10 (seed 0) lost the capability already at T = 1e-3
  (kept up to 3e-3 with clip 1): larger unclipped steps overshoot and heat the chain.
* T grid: log-spaced, half-decade, chosen from one probe (seed 0, 1000 steps: kept at T <= 3e-3, lost at
  1e-2 and 3e-2) so that the transition lies inside it; fixed before the 5-seed runs.
* K = 2 has exactly as many part heads (0, 1) as spare heads (2, 3), so the pin control "a non-part head
  set of the same size" is the spare pair (with K = 2 there is one such set, not a random draw).
* HookedTransformer keeps all heads of a layer in one tensor (``W_Q[h]`` ...), so a head cannot be a param
  group of its own. Pinning (:func:`pin_param_groups`) therefore puts every *fully* pinned tensor in a
  param group with ``lr = 0, noise_scale = 0`` and, for tensors pinned only in some head slices, writes the
  pinned slices back after every step. For stateless SGD both are the same as ``lr = 0`` and no noise on
  exactly those entries (tested bit for bit).

Rules, fixed here before any run (``verdicts`` applies them; seeds ``0 .. SEEDS-1``):

* **capability kept / lost**: accuracy on 512 fresh sequences (``EVAL_SEED + 1``) at the end of a
  continuation is above / at or below the ignition level (half way from chance 1/3 to 1, i.e. 2/3).
* **melt**: from each seed's formed circuit continue ``MELT_STEPS`` steps at constant ``T`` for every ``T``
  in :data:`T_GRID` (same data and noise streams at every ``T``). Melting point (:func:`melting_point`) =
  the smallest grid ``T`` at which the capability is lost in a majority of seeds; its interval is
  ``(previous grid T, that T]``; per-seed melting points (smallest lost ``T``) are reported too. Verdict:
  *reproduced* if a melting point exists, at ``T = 0`` at least ``n - 1`` seeds keep the capability and at
  every grid ``T`` above the melting point a majority lose it; *partly* if a melting point exists but one
  of the other two fails; else *not reproduced*.
* **hot temperature** ``T_hot`` (used by pin and anneal, :func:`hot_temperature`): the smallest grid ``T``
  at which *every* seed lost the capability in the melt (else the largest grid ``T``, reported as such).
* **pin**: from the formed circuit, ``PIN_STEPS`` at ``T_hot`` with one set of parameters pinned. Arms
  (:data:`PIN_ARMS`): ``none``; ``part heads`` (all slices of heads 0, 1); ``spare heads`` (2, 3: the
  control); ``circuit`` = part heads + the read-out they feed (embeddings, MLP, attention output bias,
  unembedding), i.e. everything but the spare heads; ``control circuit`` = spare heads + the same read-out,
  everything but the part heads. Displacement of the free entries: ``|theta - theta_0| / |theta_0|``.
  Follow-up added after the first result (the circuit arm lost the capability at ``T_hot`` in 5/5
  seeds), used by no verdict: the arms :data:`MID_PIN_ARMS` at the geometric middle of the melting interval
  ``sqrt(lo * hi)`` (a value the rule gives, not a pick), where a pin has a window to matter.
  Verdict (on the circuit pair at ``T_hot``): *reproduced* if ``circuit`` keeps the capability in ``>= n - 1`` seeds,
  ``control circuit`` loses it in ``>= n - 1`` seeds, the pinned entries are bit-identical and the free
  entries' median relative displacement is at least 10 x that of the same entries in a ``T = 0``
  continuation; *partly* if the circuit arm keeps it in more seeds than the control arm; else *not
  reproduced*.
* **anneal**: from scratch, ``T_hot`` for ``HOLD`` steps, then linear to 0 over ``RAMP`` steps
  (``linear{T_hot}->0@HOLD:HOLD+RAMP``), then 0 until ``ANNEAL_STEPS``; control: constant ``T_hot`` for
  ``ANNEAL_STEPS``. Ignition: :func:`~circuitfade.analysis.ignition.ignition_step` (alignment's threshold
  and patience) on the accuracy curve (every 25 steps, 256 sequences). Verdict: *reproduced* if
  ``>= n - 1`` annealed runs ignite, ``<= 1`` control runs ignite and no annealed run ignites before the ramp
  starts (flat while hot); *partly* if annealed ignitions exceed control ignitions by at least 2; else
  *not reproduced*.

Counts carry exact binomial 95% intervals. Jobs are cached as ``OUT/jobs/<job_key>.json``
(:func:`~studies.alignment.job_key`), run one at a time in this process (one torch thread).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis.ignition import ignition_step
from circuitfade.claims import Outcome
from circuitfade.gating.evaluation import evaluate_batch
from circuitfade.gating.schedules import as_schedule
from circuitfade.io import read_json, write_json
from circuitfade.stats import binomial_exact_interval
from circuitfade.tasks import eval_set
from circuitfade.train import Run, TrainingDiverged, fit, new_run
from circuitfade.tasks import EVAL_SEED
from circuitfade.train.callbacks import Callback, L2Penalty
from circuitfade.train.langevin import LangevinNoise
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment.apparatus import BATCH, MARGIN, PATIENCE, THRESHOLD, base_config, job_key
from studies.alignment.protocol import ANNEAL_V1, stamp, stamped

__all__ = ["K", "LR_SGD", "T_GRID", "PIN_ARMS", "anneal_schedule", "pin_param_groups", "melting_point",
           "hot_temperature", "melt_job", "pin_job", "anneal_job", "verdicts", "run", "setup", "formed", "train_sgd",
           "sgd_config", "StudyCallbacks",
           "sgd", "accuracy"]

_D = ANNEAL_V1.data
K = int(_D["k"])
LR_SGD = 0.2
SEEDS = len(_D["seeds"])
EVAL_EVERY = 25
CLIP = 1.0
FORM_CAP = int(_D["form_cap"])
MELT_STEPS, PIN_STEPS = int(_D["melt_steps"]), int(_D["pin_steps"])
T_GRID = tuple(float(t) for t in _D["t_grid"])
HOLD, RAMP, ANNEAL_STEPS = int(_D["hold"]), int(_D["ramp"]), int(_D["anneal_steps"])
READOUT = ("embed.", "pos_embed.", "blocks.0.mlp.", "blocks.0.attn.b_O", "unembed.")
PIN_ARMS = {"none": ((), ()), "part heads": ("parts", ()), "spare heads": ("spares", ()),
            "circuit": ("parts", READOUT), "control circuit": ("spares", READOUT)}
MID_PIN_ARMS = ("none", "circuit", "control circuit")
HEAD_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")  # per-head tensors (head index first)


def anneal_schedule(t_hot: float, hold: int = HOLD, ramp: int = RAMP) -> str:
    """The anneal's temperature spec: ``t_hot`` until ``hold``, linear to 0 at ``hold + ramp``, then 0."""
    return f"linear{t_hot!r}->0@{int(hold)}:{int(hold + ramp)}"


# ------------------------------------------------------------------ pinning
def pin_param_groups(model, heads: Sequence[int] = (), prefixes: Sequence[str] = (), layer: int = 0):
    """Param groups that pin the slices of ``heads`` (layer ``layer``) and every parameter whose name starts
    with one of ``prefixes``; returns ``(groups, restore, masks)``.

    ``groups``: ``[{"params": free}, {"params": pinned, "lr": 0.0, "noise_scale": 0.0}]`` (empty groups left
    out); tensors pinned only in some head slices stay in the free group and ``restore()`` (call it after
    every optimizer step) writes their pinned slices back. ``masks``: name -> bool tensor of pinned entries
    (only trainable parameters)."""
    import torch

    heads = sorted({int(h) for h in heads})
    free, pinned, partial, masks = [], [], [], {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        mask = torch.zeros(p.shape, dtype=torch.bool)
        if any(name.startswith(pre) for pre in prefixes):
            mask[...] = True
        elif heads and name.startswith(f"blocks.{layer}.attn.") and name.rsplit(".", 1)[-1] in HEAD_PARAMS:
            if max(heads) >= p.shape[0]:
                raise ValueError(f"head {max(heads)} out of range for {name} with {p.shape[0]} heads")
            mask[heads] = True
        masks[name] = mask
        if bool(mask.all()):
            pinned.append(p)
        else:
            free.append(p)
            if bool(mask.any()):
                partial.append((p, mask, p.detach().clone()))

    def restore() -> None:
        with torch.no_grad():
            for p, mask, saved in partial:
                p[mask] = saved[mask]

    groups = [g for g in ({"params": free}, {"params": pinned, "lr": 0.0, "noise_scale": 0.0}) if g["params"]]
    return groups, restore, masks


def _flat(model, masks: Mapping, pinned: bool):
    import torch

    return torch.cat([p.detach()[masks[n] if pinned else ~masks[n]].flatten().double()
                      for n, p in model.named_parameters() if n in masks])


# ------------------------------------------------------------------ rules
def _level(chance: float) -> float:

    return chance + THRESHOLD * (1.0 - chance)


def melting_point(table: pd.DataFrame) -> dict:
    """``table``: one row per (seed, T) with columns ``seed, T, lost`` (bool). Returns ``{"T_m", "lo", "hi",
    "per_seed", "counts"}``: ``T_m`` the smallest ``T`` lost in a majority of seeds (``None`` if none),
    ``(lo, hi] = (previous grid T, T_m]``, ``per_seed`` the smallest lost ``T`` of each seed (``None`` if
    never), ``counts`` ``{T: (lost, n)}``."""
    grid = sorted(float(t) for t in table["T"].unique())
    counts = {t: (int(table[table["T"] == t].lost.sum()), int((table["T"] == t).sum())) for t in grid}
    t_m = next((t for t in grid if counts[t][0] > counts[t][1] / 2), None)
    lo = None if t_m is None else ([None] + grid)[grid.index(t_m)]
    per_seed = {}
    for s, g in table.groupby("seed"):
        lost = sorted(float(t) for t in g[g.lost]["T"])
        per_seed[int(s)] = lost[0] if lost else None
    return {"T_m": t_m, "lo": lo, "hi": t_m, "per_seed": per_seed, "counts": counts}


def hot_temperature(counts: Mapping[float, tuple[int, int]]) -> tuple[float, bool]:
    """``(T_hot, found)``: the smallest ``T`` with every seed lost, else ``(max T, False)``."""
    grid = sorted(counts)
    t = next((t for t in grid if counts[t][0] == counts[t][1] and counts[t][1] > 0), None)
    return (float(t), True) if t is not None else (float(grid[-1]), False)


def verdicts(melt: pd.DataFrame | None, pin: pd.DataFrame | None, anneal: pd.DataFrame | None,
             t_hot: float | None = None) -> pd.DataFrame:
    """Verdict rows by the rules of the module docstring. ``melt``: ``seed, T, lost``; ``pin``: ``arm,
    seed, lost, pinned_max_change, free_disp, free_disp_t0``; ``anneal``: ``arm, seed, ignition``."""
    rows = []
    add = lambda c, o, s, r, v: rows.append({"claim": c, "ours": o, "study": s, "rule": r, "verdict": v})  # noqa: E731
    study = "done (qualitative, no counts)"
    if melt is None or not len(melt):
        add("melt: a formed circuit is destroyed above a temperature", "—", study, "—", Outcome.NOT_RUN)
    else:
        mp = melting_point(melt)
        c = mp["counts"]
        if mp["T_m"] is None:
            ours, v = "no grid T loses it in a majority of seeds", Outcome.NOT_REPRODUCED
        else:
            low_ok = c[min(c)][1] - c[min(c)][0] >= c[min(c)][1] - 1
            above_ok = all(c[t][0] > c[t][1] / 2 for t in c if t >= mp["T_m"])
            ps = [t for t in mp["per_seed"].values() if t is not None]
            ours = (f"T_m in ({mp['lo']:g}, {mp['hi']:g}] (lost {c[mp['T_m']][0]}/{c[mp['T_m']][1]}); per-seed "
                    f"melting T {min(ps):g}–{max(ps):g}; kept at T=0 in {c[min(c)][1] - c[min(c)][0]}/{c[min(c)][1]}")
            v = Outcome.REPRODUCED if (low_ok and above_ok) else Outcome.PARTLY
        add("melt: a formed circuit is destroyed above a temperature (melting point)", ours, study,
            "reproduced if some grid T loses it in a majority of seeds, T=0 keeps it in >= n-1 and every higher "
            "T loses it in a majority; partly if only the first holds", v)
    if pin is None or not len(pin):
        add("pin: a pinned circuit survives while the other parameters move", "—", study, "—", Outcome.NOT_RUN)
    else:
        def kept(arm):
            g = pin[pin.arm == arm]
            return int((~g.lost.astype(bool)).sum()), int(len(g))
        (kc, nc), (kk, nk) = kept("circuit"), kept("control circuit")
        g = pin[pin.arm == "circuit"]
        ident = bool((pin.pinned_max_change.fillna(0) == 0).all())
        disp, disp0 = float(g.free_disp.median()), float(g.free_disp_t0.median())
        moved = disp >= 10 * disp0
        lo, hi = binomial_exact_interval(kc, nc)
        lo2, hi2 = binomial_exact_interval(kk, nk)
        ours = (f"circuit pinned: kept {kc}/{nc} [{lo:.2f}, {hi:.2f}]; control (spare heads + read-out pinned): "
                f"kept {kk}/{nk} [{lo2:.2f}, {hi2:.2f}]; free entries moved {disp:.3f} (rel. L2, median) vs "
                f"{disp0:.4f} at T=0; pinned entries {'bit-identical' if ident else 'CHANGED'}"
                + ("" if t_hot is None else f"; T = {t_hot:g}"))
        ok = nc >= 5 and kc >= nc - 1 and nk - kk >= nk - 1 and ident and moved
        add("pin: a pinned circuit survives while the other parameters move", ours, study,
            "reproduced if the circuit arm keeps it in >= n-1 seeds, the control arm loses it in >= n-1, pinned "
            "entries are bit-identical and free entries move >= 10x their T=0 displacement; partly if the "
            "circuit arm keeps it in more seeds than the control", Outcome.REPRODUCED if ok else
            (Outcome.PARTLY if kc > kk else Outcome.NOT_REPRODUCED))
    if anneal is None or not len(anneal):
        add("anneal: a flat capability ignites when T is lowered on schedule", "—", study, "—", Outcome.NOT_RUN)
    else:
        a, h = anneal[anneal.arm == "anneal"], anneal[anneal.arm == "constant"]
        ka, na = int(a.ignition.notna().sum()), int(len(a))
        kh, nh = int(h.ignition.notna().sum()), int(len(h))
        early = int((a.ignition.dropna() < HOLD).sum())
        lo, hi = binomial_exact_interval(ka, na)
        lo2, hi2 = binomial_exact_interval(kh, nh)
        rel = (a.ignition.dropna() - HOLD).to_numpy()
        ours = (f"annealed: {ka}/{na} ignite [{lo:.2f}, {hi:.2f}]; constant T: {kh}/{nh} [{lo2:.2f}, {hi2:.2f}]; "
                f"{early} ignite before the ramp"
                + (f"; ignition {np.median(rel):.0f} steps after the ramp starts (median; range "
                   f"{rel.min():.0f}–{rel.max():.0f}, ramp {RAMP} steps)" if len(rel) else ""))
        ok = na >= 5 and ka >= na - 1 and kh <= 1 and early == 0
        add("anneal: a flat capability ignites when T is lowered on schedule", ours, study,
            "reproduced if >= n-1 annealed runs ignite, <= 1 constant-T runs ignite and none ignites before the "
            "ramp; partly if annealed ignitions exceed constant-T ones by >= 2",
            Outcome.REPRODUCED if ok else (Outcome.PARTLY if ka - kh >= 2 else Outcome.NOT_REPRODUCED))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ training
def setup(seed: int, *, pinned: bool = True):
    """``(model, task, ev, ev_final)``: a fresh K-part model of ``seed`` (pinned or unpinned preset), its task,
    the 256-sequence evaluation set and the 512-sequence final one (``EVAL_SEED + 1``)."""
    run = new_run(base_config(K, seed, 100, pinned=pinned))
    task = run.config.make_task()
    return run.model, task, eval_set(task, n=256, seed=EVAL_SEED), eval_set(task, n=512, seed=EVAL_SEED + 1)


def accuracy(model, task, ev) -> float:
    """Capability accuracy of ``model`` on the batch ``ev``."""
    return float(evaluate_batch(model, task, ev)["accuracy"])


def sgd_config(steps: int, *, clip: float | None = CLIP, batch_size: int = BATCH, eval_every: int = EVAL_EVERY):
    """The run config :func:`train_sgd` trains under: the K-part task and evaluation rule (accuracy every
    ``eval_every`` steps), ``steps`` steps of ``batch_size``, gradient norm clipped at ``clip`` (``None``: no
    clipping) and no prior dropout; the gates stay as the model has them (learned)."""
    import dataclasses

    cfg = base_config(K, 0, steps)
    return dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, batch_size=batch_size, eval_every=eval_every,
        grad_clip=float("inf") if clip is None else float(clip)))


class StudyCallbacks(Callback):
    """The study's per-step bookkeeping on :func:`~circuitfade.train.loop.fit`: the accuracy curve (from each
    evaluation row), the count of steps whose gradient norm exceeded ``clip``, ``record(model)`` on the
    applied gradient, ``restore()`` after each update and the stop rule ``stop(xs, ys)`` after each
    evaluation (``True`` ends the run there)."""

    def __init__(self, clip: float | None = CLIP, record=None, restore=None, stop=None):
        self.clip, self.record, self.restore, self.stop = clip, record, restore, stop
        self.xs, self.ys, self.clipped = [], [], 0

    def before_update(self, run, grad_norm) -> None:
        if self.clip is not None:
            self.clipped += float(grad_norm) > self.clip
        if self.record is not None:
            self.record(run.model)

    def after_update(self, run) -> None:
        if self.restore is not None:
            self.restore()

    def on_record(self, run, row) -> bool:
        self.xs.append(run.step)
        self.ys.append(float(row["acc_normal"]))
        return run.step > 0 and self.stop is not None and bool(self.stop(self.xs, self.ys))


def train_sgd(model, task, opt, gen, steps: int, ev, restore=None, stop=None, record=None,
           weight_decay: float = 0.0) -> tuple[list[int], list[float], float]:
    """``steps`` SGD(+noise) steps (gradient norm clipped at CLIP); accuracy on ``ev`` every EVAL_EVERY steps
    (and at step 0). Returns the curve and the fraction of steps whose gradient was clipped. ``record(model)``
    (optional) is called after clipping, before the step (the gradient the step applies);
    ``weight_decay`` adds ``(wd / 2) |theta|^2`` to the loss, so that it is inside that gradient
    (:class:`~circuitfade.train.callbacks.L2Penalty`). The loop is :func:`~circuitfade.train.loop.fit` on a
    :class:`~circuitfade.train.state.Run` holding ``model``, ``opt`` and ``gen``, with
    :class:`StudyCallbacks`."""

    import torch

    book = StudyCallbacks(CLIP, record=record, restore=restore, stop=stop)
    run = Run(sgd_config(steps), model, opt, gen, torch.Generator().manual_seed(0))
    try:
        fit(run, task=task, eval_batch=ev, progress=False, sampler=lambda step, g: task.sample(BATCH, g),
            callbacks=[L2Penalty(weight_decay), book])
    except TrainingDiverged as e:
        raise FloatingPointError(f"non-finite loss at step {e.step + 1} ({e.error})") from None
    return book.xs, book.ys, book.clipped / max(1, book.xs[-1])


def sgd(params, temperature, seed: int, total: int):
    """Plain SGD at lr ``LR_SGD`` wrapped in ``LangevinNoise`` at ``temperature`` (a number or a schedule)."""
    import torch

    return LangevinNoise(torch.optim.SGD(params, lr=LR_SGD, momentum=0.0, weight_decay=0.0), temperature,
                         seed=seed, total_steps=total)


def formed(seed: int, *, pinned: bool = True) -> dict:
    """Train the K-part circuit (pinned or unpinned preset) from scratch with SGD at T = 0 until ignition +
    MARGIN (cap FORM_CAP): ``{"model", "task", "ev", "ev_final", "ignition", "form_steps"}``."""
    import torch

    model, task, ev, ev_final = setup(seed, pinned=pinned)
    gen = torch.Generator().manual_seed(50_000 + seed)

    def stop(xs, ys):
        ig = ignition_step(ys, steps=xs, baseline=task.chance, threshold=THRESHOLD, patience=PATIENCE)
        return ig is not None and xs[-1] - ig >= MARGIN

    xs, ys, _ = train_sgd(model, task, sgd(model.parameters(), 0.0, seed, FORM_CAP), gen, FORM_CAP, ev, stop=stop)
    ig = ignition_step(ys, steps=xs, baseline=task.chance, threshold=THRESHOLD, patience=PATIENCE)
    return {"model": model, "task": task, "ev": ev, "ev_final": ev_final, "ignition": ig, "form_steps": xs[-1]}


def melt_job(spec: Mapping, out: str | None = None) -> dict:
    """Form the circuit of ``spec["seed"]``, then continue MELT_STEPS at each T of ``spec["grid"]``."""
    import torch

    torch.set_num_threads(1)
    seed, t0 = int(spec["seed"]), time.process_time()
    f = formed(seed)
    if f["ignition"] is None:
        return {**spec, "status": "no circuit", "form_steps": f["form_steps"], "rows": []}
    rows = []
    for T in spec["grid"]:
        m = copy.deepcopy(f["model"])
        xs, ys, clip = train_sgd(m, f["task"], sgd(m.parameters(), float(T), 70_000 + seed, MELT_STEPS),
                              torch.Generator().manual_seed(60_000 + seed), int(spec["steps"]), f["ev"])
        acc = accuracy(m, f["task"], f["ev_final"])
        rows.append({"seed": seed, "T": float(T), "acc_final": acc, "lost": acc <= _level(f["task"].chance),
                     "clipped_frac": clip, "curve": [xs, ys]})
    return {**spec, "status": "done", "ignition": f["ignition"], "form_steps": f["form_steps"], "rows": rows,
            "cpu_s": time.process_time() - t0}


def pin_job(spec: Mapping, out: str | None = None) -> dict:
    """From the formed circuit, PIN_STEPS at ``spec["T"]`` with the arm's parameters pinned; displacement of
    the free entries (and the same entries at T = 0) and the largest change of a pinned entry."""
    import torch

    torch.set_num_threads(1)
    seed, t0 = int(spec["seed"]), time.process_time()
    f = formed(seed)
    if f["ignition"] is None:
        return {**spec, "status": "no circuit"}
    which, prefixes = PIN_ARMS[spec["arm"]]
    heads = {"parts": range(K), "spares": range(K, f["model"].cfg.n_heads), (): ()}[which]
    res = {}
    for name, T in (("hot", float(spec["T"])), ("t0", 0.0)):
        m = copy.deepcopy(f["model"])
        groups, restore, masks = pin_param_groups(m, heads, prefixes)
        free0, pin0 = _flat(m, masks, False), _flat(m, masks, True)
        xs, ys, clip = train_sgd(m, f["task"], sgd(groups, T, 80_000 + seed, PIN_STEPS),
                              torch.Generator().manual_seed(60_000 + seed), int(spec["steps"]), f["ev"],
                              restore=restore)
        free1, pin1 = _flat(m, masks, False), _flat(m, masks, True)
        res[name] = {"acc": accuracy(m, f["task"], f["ev_final"]), "curve": [xs, ys], "clipped_frac": clip,
                     "disp": float((free1 - free0).norm() / free0.norm()),
                     "pinned_max_change": float((pin1 - pin0).abs().max()) if len(pin0) else 0.0,
                     "n_pinned": int(len(pin0)), "n_free": int(len(free0))}
    h = res["hot"]
    return {**spec, "status": "done", "acc_final": h["acc"], "lost": h["acc"] <= _level(f["task"].chance),
            "free_disp": h["disp"], "free_disp_t0": res["t0"]["disp"], "pinned_max_change": max(
                h["pinned_max_change"], res["t0"]["pinned_max_change"]), "n_pinned": h["n_pinned"],
            "n_free": h["n_free"], "acc_t0": res["t0"]["acc"], "clipped_frac": h["clipped_frac"], "curve": h["curve"], "cpu_s": time.process_time() - t0}


def anneal_job(spec: Mapping, out: str | None = None) -> dict:
    """From scratch: ``spec["temperature"]`` (a spec) for ANNEAL_STEPS; the ignition step."""
    import torch

    torch.set_num_threads(1)
    seed, t0 = int(spec["seed"]), time.process_time()
    model, task, ev, ev_final = setup(seed)
    opt = sgd(model.parameters(), spec["temperature"], 90_000 + seed, int(spec["steps"]))
    xs, ys, clip = train_sgd(model, task, opt, torch.Generator().manual_seed(50_000 + seed), int(spec["steps"]), ev)
    ig = ignition_step(ys, steps=xs, baseline=task.chance, threshold=THRESHOLD, patience=PATIENCE)
    return {**spec, "status": "ignited" if ig is not None else "flat", "ignition": ig,
            "acc_final": accuracy(model, task, ev_final), "clipped_frac": clip, "curve": [xs, ys], "cpu_s": time.process_time() - t0}


def cached_job(fn, spec: dict, out: Path) -> dict:

    f = out / "jobs" / f"{job_key(spec)}.json"
    if f.is_file():
        return read_json(f)
    try:
        res = fn(spec, str(out))
    except Exception as e:  # noqa: BLE001 - reported, never a number
        return {**spec, "status": "failed", "error": f"{type(e).__name__}: {e}"}
    f.parent.mkdir(parents=True, exist_ok=True)
    write_json(f, res)
    return res


# ------------------------------------------------------------------ figures
def melt_figure(melt: pd.DataFrame, mp: Mapping) -> go.Figure:
    fig = go.Figure()
    x = lambda t: np.where(np.asarray(t, float) == 0, T_GRID[1] / 3, t)  # noqa: E731 - T = 0 drawn left of the grid
    for s, g in melt.groupby("seed"):
        fig.add_trace(go.Scatter(x=x(g["T"]), y=g.acc_final, mode="lines+markers", name=f"seed {s}",
                                 line={"width": 1}, opacity=0.7))
    if mp.get("T_m") is not None:
        lo = T_GRID[1] / 6 if mp["lo"] is None else x([mp["lo"]])[0]
        fig.add_vrect(x0=lo, x1=mp["hi"], fillcolor="red", opacity=0.12, line_width=0)
    fig.add_hline(y=2 / 3, line_dash="dot", annotation_text="ignition level")
    fig.update_layout(title=f"Melt: accuracy after {MELT_STEPS} steps at constant T<br><sup>K={K}, SGD lr {LR_SGD}; "
                      f"T=0 drawn at {T_GRID[1] / 3:.1g}; shaded: melting-point interval</sup>",
                      xaxis={"type": "log", "title": "temperature T",
                             "range": [math.log10(T_GRID[1] / 6), math.log10(max(T_GRID) * 2)]},
                      yaxis={"title": "capability accuracy", "range": [0, 1.05]}, width=760, height=440,
                      template="plotly_white")
    return fig


def pin_figure(pin: pd.DataFrame, t_hot: float) -> go.Figure:
    """Seeds keeping the capability per pinned set, one bar group per temperature in ``pin`` (``T_hot`` first)."""
    arms = list(PIN_ARMS)
    fig = go.Figure()
    n_max = 1
    for T in sorted(pin["T"].unique(), key=lambda t: (t != t_hot, t)):
        g = pin[pin["T"] == T].groupby("arm")
        has = [a for a in arms if a in g.groups]
        kept = [int((~g.get_group(a).lost.astype(bool)).sum()) for a in has]
        n = [int(len(g.get_group(a))) for a in has]
        disp = [float(g.get_group(a).free_disp.median()) for a in has]
        n_max = max([n_max] + n)
        label = f"T = {T:.3g}" + (" (T_hot, verdict)" if T == t_hot else " (follow-up)")
        fig.add_trace(go.Bar(x=has, y=kept, name=label, textposition="outside",
                             text=[f"{k}/{m}<br>moved {d:.1f}" for k, m, d in zip(kept, n, disp)]))
    fig.update_layout(title=f"Pin: seeds keeping the capability after {PIN_STEPS} steps with the named set pinned"
                      f"<br><sup>pinned = lr 0, no noise; moved = relative L2 displacement of the free entries "
                      f"(at T = 0: {pin.free_disp_t0.min():.2g}-{pin.free_disp_t0.max():.2g})</sup>", barmode="group",
                      yaxis={"title": "seeds kept", "range": [0, n_max + 1.8]}, xaxis_title="pinned set",
                      width=820, height=460, template="plotly_white", legend={"orientation": "h", "y": -0.25})
    return fig


def anneal_figure(curves: Sequence[Mapping], t_hot: float) -> go.Figure:
    fig = go.Figure()
    shown = set()
    for c in curves:
        arm = c["arm"]
        fig.add_trace(go.Scatter(x=c["curve"][0], y=c["curve"][1], mode="lines", name=arm, legendgroup=arm,
                                 showlegend=arm not in shown, line={"color": "#1f77b4" if arm == "anneal" else "#d62728",
                                                                    "width": 1.2}, opacity=0.8))
        shown.add(arm)
    fig.add_vrect(x0=HOLD, x1=HOLD + RAMP, fillcolor="#1f77b4", opacity=0.08, line_width=0,
                  annotation_text=f"T: {t_hot:g} -> 0", annotation_position="top left")
    fig.add_hline(y=2 / 3, line_dash="dot", annotation_text="ignition level")
    fig.update_layout(title=f"Anneal from scratch: T = {t_hot:g} held {HOLD} steps, then lowered to 0"
                      f"<br><sup>blue: annealed; red: constant T = {t_hot:g}; shaded: the ramp</sup>", xaxis_title="step", yaxis={"title": "capability accuracy",
                                                                      "range": [0, 1.05]},
                      width=760, height=440, template="plotly_white")
    return fig


# ------------------------------------------------------------------ the protocol
def _melt(S: list[int], out: Path, say) -> tuple[list[dict], pd.DataFrame, dict]:
    melt_res = []
    for s in S:
        melt_res.append(cached_job(melt_job, {"kind": "melt", "k": K, "seed": s, "grid": list(T_GRID),
                                              "steps": MELT_STEPS, "lr": LR_SGD}, out))
        say(f"melt seed {s}: {melt_res[-1]['status']}")
    melt = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for m in melt_res for r in m.get("rows", [])])
    melt.to_csv(out / "anneal_melt.csv", index=False)
    return melt_res, melt, melting_point(melt)


def _pins(S: list[int], out: Path, t_hot: float, mp: dict, say) -> tuple[list[dict], pd.DataFrame, float | None]:
    pin_res = []
    for arm in PIN_ARMS:
        for s in S:
            pin_res.append(cached_job(pin_job, {"kind": "pin", "k": K, "seed": s, "arm": arm, "T": t_hot,
                                                "steps": PIN_STEPS, "lr": LR_SGD}, out))
        say(f"pin {arm}: {[r['status'] for r in pin_res[-len(S):]]}")
    t_mid = None if mp["lo"] is None else float(math.sqrt(mp["lo"] * mp["hi"]))
    if t_mid is not None:  # follow-up, added after the first result; no verdict uses it (see the docstring)
        for arm in MID_PIN_ARMS:
            for s in S:
                pin_res.append(cached_job(pin_job, {"kind": "pin", "k": K, "seed": s, "arm": arm, "T": t_mid,
                                                    "steps": PIN_STEPS, "lr": LR_SGD}, out))
    pin_all = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in pin_res if r["status"] == "done"])
    pin_all.to_csv(out / "anneal_pin.csv", index=False)
    return pin_res, pin_all, t_mid


def _anneals(S: list[int], out: Path, t_hot: float, say) -> tuple[list[dict], pd.DataFrame]:
    ann_res = []
    for arm, temp in (("anneal", anneal_schedule(t_hot)), ("constant", repr(t_hot))):
        for s in S:
            ann_res.append(cached_job(anneal_job, {"kind": "anneal", "k": K, "seed": s, "arm": arm,
                                                   "temperature": temp, "steps": ANNEAL_STEPS, "lr": LR_SGD}, out))
        say(f"anneal {arm}: {[r.get('ignition') for r in ann_res[-len(S):]]}")
    ann = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in ann_res if r["status"] != "failed"])
    if len(ann):  # the temperature at the ignition step (the schedule's value there)
        ok = [r for r in ann_res if r["status"] != "failed"]
        ann["acc_hold_median"] = [float(np.median([y for x, y in zip(*r["curve"]) if 100 <= x <= HOLD])) for r in ok]
        ann["T_at_ignition"] = [float(as_schedule(t, ANNEAL_STEPS)(int(ig))) if ig == ig and ig is not None
                                else float("nan") for t, ig in zip(ann.temperature, ann.ignition)]
    ann.to_csv(out / "anneal_runs.csv", index=False)
    return ann_res, ann


def _summary_tables(melt: pd.DataFrame, mp: dict, pin_all: pd.DataFrame, ann: pd.DataFrame):
    mtab = pd.DataFrame([{"T": t, "lost": c[0], "seeds": c[1],
                          "acc_median": float(melt[melt["T"] == t].acc_final.median()),
                          "clipped_frac_median": float(melt[melt["T"] == t].clipped_frac.median())}
                         for t, c in mp["counts"].items()])
    ptab = (pin_all.assign(kept=~pin_all.lost.astype(bool)).groupby(["T", "arm"], sort=False)
            .agg(seeds=("seed", "size"), kept=("kept", "sum"), acc_median=("acc_final", "median"),
                 free_disp=("free_disp", "median"), free_disp_t0=("free_disp_t0", "median"),
                 n_pinned=("n_pinned", "first"), n_free=("n_free", "first"),
                 pinned_max_change=("pinned_max_change", "max")).reset_index())
    ptab["T"] = [f"{t:.3g}" for t in ptab["T"]]
    atab = ann.groupby("arm", sort=False).agg(seeds=("seed", "size"), ignited=("ignition", "count"),
                                               ignition_median=("ignition", "median"),
                                               ignition_min=("ignition", "min"), ignition_max=("ignition", "max"),
                                               T_at_ignition_median=("T_at_ignition", "median"),
                                               acc_hold_median=("acc_hold_median", "median"),
                                               acc_final_median=("acc_final", "median")).reset_index()
    return mtab, ptab, atab


def _markdown(*, seeds, out, form, clipfrac, cpu, wall_s, failed, v, mp, t_hot, found, t_mid, tables) -> str:
    mtab, ptab, atab = tables
    return "\n".join([
        "## Anneal, melt and pin with Langevin noise (version 1, pinned)", "", f"Protocol: {stamp('anneal', 1)}.",
        f"Command: `python -m studies.alignment anneal --seeds {seeds} --out {out}`. K = {K}, plain SGD lr {LR_SGD} "
        f"(no momentum / weight decay, gradient norm clipped at {CLIP}) + `LangevinNoise`; circuits formed by SGD at T = 0 until "
        f"ignition + margin (steps {form}). Fraction of steps with a clipped gradient (median over melt runs "
        f"at T >= T_hot): {clipfrac}. Rules: `studies.alignment.anneal` docstring. Kept = accuracy on "
        f"512 fresh sequences above 2/3 (the ignition level). Exact 95% binomial intervals. Training CPU "
        f"{cpu / 60:.1f} core-min (finished jobs reused); "
        f"{len(failed)} failed or circuit-less jobs.", "",
        markdown_table(v), "",
        f"Melt ({MELT_STEPS} steps at constant T from the formed circuit). Melting point: "
        + ("none on the grid" if mp["T_m"] is None else f"({mp['lo']:g}, {mp['hi']:g}]")
        + f"; per-seed melting T: {mp['per_seed']}. T_hot = {t_hot:g}"
        + ("" if found else " (no grid T lost every seed: the largest grid T)") + ".", "",
        markdown_table(mtab.round(3).assign(T=[f"{t:g}" for t in mtab["T"]])), "",
        f"Pin ({PIN_STEPS} steps at T = {t_hot:g}; free_disp: relative L2 displacement of the free entries, "
        f"free_disp_t0 the same at T = 0). The rows at T = {t_mid if t_mid is None else f'{t_mid:.3g}'} "
        f"(the geometric middle of the melting interval) are the follow-up of the docstring, not used by a "
        f"verdict:", "", markdown_table(ptab.round(4)), "",
        f"Anneal (from scratch; anneal = `{anneal_schedule(t_hot)}`, constant = T {t_hot:g}, {ANNEAL_STEPS} steps; "
        f"the ramp runs over steps {HOLD}–{HOLD + RAMP}):", "", markdown_table(atab.round(4)), ""]
        + (["**Failed / circuit-less jobs:** " + "; ".join(f"{r.get('kind')} seed {r.get('seed')} "
                                                           f"{r.get('arm', '')}: {r.get('status')} {r.get('error', '')}"
                                                           for r in failed), ""] if failed else []))


def run(*, out: str | Path = "results/alignment", seeds: int = SEEDS, progress: bool = True, png: bool = True) -> dict:
    """Melt, then pin and anneal at the melt's ``T_hot``; writes ``OUT/anneal.md``, CSVs and three figures."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    S = list(range(seeds))
    say = (lambda *a: print(*a, flush=True)) if progress else (lambda *a: None)
    melt_res, melt, mp = _melt(S, out, say)
    t_hot, found = hot_temperature(mp["counts"])
    pin_res, pin_all, t_mid = _pins(S, out, t_hot, mp, say)
    pin = pin_all[pin_all["T"] == t_hot]
    ann_res, ann = _anneals(S, out, t_hot, say)
    failed = ([r for r in melt_res if r["status"] not in ("done",)] + [r for r in pin_res if r["status"] != "done"]
              + [r for r in ann_res if r["status"] == "failed"])
    v = verdicts(melt, pin, ann, t_hot)
    v = stamped(v, "anneal", 1, "pinned")
    v.to_csv(out / "anneal_verdicts.csv", index=False)
    save_figure(melt_figure(melt, mp), out / "fig_melt", png=png)
    save_figure(pin_figure(pin_all, t_hot), out / "fig_pin", png=png)
    save_figure(anneal_figure([r for r in ann_res if r["status"] != "failed"], t_hot), out / "fig_anneal", png=png)
    hot = melt[melt["T"] >= t_hot] if len(melt) else melt
    text = _markdown(seeds=seeds, out=out, form=[r.get("form_steps") for r in melt_res],
                     clipfrac=f"{float(hot.clipped_frac.median()):.2f}" if len(hot) else "—",
                     cpu=sum(float(r.get("cpu_s", 0) or 0) for r in melt_res + pin_res + ann_res),
                     wall_s=time.time() - t_start, failed=failed, v=v, mp=mp, t_hot=t_hot, found=found, t_mid=t_mid,
                     tables=_summary_tables(melt, mp, pin_all, ann))
    (out / "anneal.md").write_text(text)
    return {"melt": melt, "pin": pin, "anneal": ann, "verdicts": v, "t_hot": t_hot, "melting_point": mp,
            "markdown": text, "failed": failed}
