"""Noise measurements: the FDT statistic on our own SGD training, and a
small annealing demo of :class:`~circuitfade.train.langevin.LangevinNoise`.

* :func:`sgd_fdt_run`: plain SGD (no momentum, no weight decay, no clipping: the relation needs the update to
  be exactly ``-lr * g``) on the base soft-prior model on a task; records ``theta . g`` and ``|g|^2`` every
  step and reports :func:`~circuitfade.analysis.fdt.fdt_statistic` over an early window (still descending)
  and over the last part of the run.
* :func:`anneal_demo`: ``n`` independent particles in a tilted double well ``L(x) = (x^2 - 1)^2 + tilt x``,
  all started in the shallow well at ``x = +1``; plain SGD keeps them there, Langevin noise at a temperature
  annealed to 0 on a schedule carries most into the deep well at ``x ~ -1``. Fractions with Wilson intervals.

``python -m studies.alignment.fdt fdt`` / ``... anneal`` print the numbers as JSON.

* :func:`run` (``python -m studies.alignment fdt``): the fluctuation-dissipation test at
  stationarity, on the SGD chain the melt/pin/anneal experiments use (:mod:`studies.alignment.anneal`:
  the K = 2 apparatus, plain SGD lr 0.2, gradient norm clipped at 1). Why there and not on the base model:
  on the base model plain SGD is not stationary (without weight decay it learns the task and then grows the
  weights for good; with ``(0.01 / 2)|theta|^2`` it had not learned the task in 6,000 steps and was still
  shrinking; with 0.05 every weight decays to 0 and the loss sits at chance, a trivial stationary state with
  no gradient noise). On the K-part apparatus a probe (seed 0, 4,000 steps from the formed circuit, wd in
  {0.01, 0.03}, T in {0, 1e-4, 1e-3}; the only runs before this protocol was fixed) found wd 0.01 still
  drifting at T = 0 (``|O| / rhs`` 0.43 over the second half) and wd 0.03 stationary (0.01) with the
  circuit kept (accuracy 1.0).

Protocol, fixed before the seeded runs: for each seed the circuit is formed by SGD at T = 0 (as in
:func:`~studies.alignment.anneal.melt_job`), then continued :data:`FDT_STEPS` steps with
``(FDT_WD / 2)|theta|^2`` in the loss at T = 0 (arm ``sgd``) and at T = :data:`FDT_T` (arm ``langevin``:
well below the melting point, clipping inactive). The recorder reads ``theta . g`` and ``|g|^2`` of the
applied (clipped) gradient per parameter family (:func:`param_family`) over the second half.

* **stationary**: ``|O| / rhs <= 0.05`` for Yaida's relation on all parameters over the window (for plain
  SGD ``O`` telescopes to the change of ``|theta|^2``, so this says ``|theta|^2`` moved by less than 5% of
  the step noise's contribution).
* **Yaida** (plain SGD, T = 0): ``<theta . g> = (lr / 2) <|g|^2>``; holds if ``0`` is in the batch-means
  interval. This is what stationarity of SGD implies whatever the noise; it is the relation the study's
  "FDT" cannot mean if SGD is to fail it.
* **thermal (equipartition) test**: a Gibbs stationary law ``exp(-L / T)`` has ``<theta_G . grad_G L> / d_G
  = T`` in every group (:func:`~circuitfade.analysis.fdt.equipartition`). Per seed over the groups with
  ``>= MIN_COORDS`` coordinates: the run *fails* if the hottest group's lower bound exceeds
  :data:`SPREAD_TOL` x the coldest group's upper bound, *passes* if the hottest group's upper bound is below
  ``SPREAD_TOL`` x the coldest group's lower bound (which must be > 0), else is inconclusive.
* Verdicts: "SGD's noise fails the test" *reproduced* if every seed of the ``sgd`` arm is stationary and
  ``>= n - 1`` fail; *not reproduced* if ``>= n - 1`` pass; else *inconclusive* (*not tested* if a seed is
  not stationary). "Installed Langevin noise passes": the same with pass and fail swapped.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from circuitfade.analysis.fdt import FDTRecorder, equipartition
from circuitfade.claims import Claim, Outcome, Verdict
from circuitfade.model import SoftPriorTransformer
from circuitfade.stats import wilson_interval
from circuitfade.tasks import EVAL_SEED, eval_set, make_task
from circuitfade.train import Run, RunConfig, TrainConfig, TrainingDiverged, fit
from circuitfade.train.callbacks import Callback, L2Penalty
from circuitfade.train.langevin import LangevinNoise
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment import anneal as A
from studies.alignment.anneal import CLIP, LR_SGD
from studies.alignment.apparatus import cached_job, is_pinned
from studies.alignment.protocol import FDT_V1, declared, forced_v1, rules_of, stamp, stamped, verdict_frame

__all__ = ["FDT_STEPS", "FDT_T", "FDT_WD", "SPREAD_TOL", "anneal_demo", "fdt_job", "fdt_verdicts", "param_family",
           "run", "sgd_fdt_run", "thermal_call", "ZERO_GRADIENT", "family_without", "fdt_verdicts_v2", "run_unpinned"]

_D = FDT_V1.data
FDT_SEEDS, FDT_STEPS, FDT_WD, FDT_T = len(_D["seeds"]), int(_D["steps"]), float(_D["wd"]), float(_D["T"])
SPREAD_TOL, MIN_COORDS, STATIONARY_TOL = float(_D["spread_tol"]), int(_D["min_coords"]), float(_D["stationary_tol"])
ARMS = {"sgd": 0.0, "langevin": FDT_T}


class _FullLogitsLoss(Callback):
    """The task loss on the model's logits at every position (``model(tokens)``), as this measurement has
    always trained (the trainer's loss reads the last block at the answer positions only)."""

    def __init__(self, task):
        self.task = task

    def on_loss(self, run, batch, loss):
        return self.task.loss(run.model(batch.model_input), batch)


class _FDTSeries(Callback):
    """Per step: the task loss, the temperature of the step and the FDT recorder on the applied gradient."""

    def __init__(self, rec: FDTRecorder, opt: LangevinNoise, progress: bool):
        self.rec, self.opt, self.progress = rec, opt, progress
        self.losses: list[float] = []
        self.temps: list[float] = []
        self._loss = math.nan

    def on_loss(self, run, batch, loss):
        self._loss = float(loss.detach())
        return loss

    def before_update(self, run, grad_norm) -> None:
        self.rec.record(run.model)
        self.temps.append(self.opt.temperature_now)

    def after_update(self, run) -> None:
        self.losses.append(self._loss)
        if self.progress and (run.step - 1) % 500 == 0:
            print(f"step {run.step - 1} loss {self._loss:.4f}", file=sys.stderr)


def sgd_fdt_run(steps: int = 3000, lr: float = 0.1, batch_size: int = 64, seed: int = 0, task: str = "assoc",
                temperature: float | str = 0.0, last: float = 0.5, early: tuple[int, int] = (0, 200),
                n_batches: int = 20, weight_decay: float = 0.0, progress: bool = False, model_kw: dict | None = None,
                groups: bool = True) -> dict:
    """Train the base model with SGD (optionally Langevin noise) and measure the FDT statistic.

    ``weight_decay`` is added to the loss as ``(wd / 2) |theta|^2`` (so the recorded gradient is the one the
    step applies); the reported losses are the task loss without it."""
    torch.manual_seed(seed)
    model = SoftPriorTransformer(seed=seed, **(model_kw or {}))
    t = make_task(task)
    opt = LangevinNoise(torch.optim.SGD(model.parameters(), lr=lr), temperature, seed=seed, total_steps=steps)
    gen = torch.Generator().manual_seed(10_000 + seed)
    rec = FDTRecorder(param_family if groups else None)
    book = _FDTSeries(rec, opt, progress)
    cfg = RunConfig(path="unforced", task={"name": task}, model=dict(model_kw or {}), seed=seed,
                    train=TrainConfig(steps=steps, batch_size=batch_size, lr=lr, weight_decay=0.0,
                                      grad_clip=float("inf"), eval_every=steps, checkpoint_every=steps,
                                      eval_conditions=("normal",)))
    run = Run(cfg, model, opt, gen, torch.Generator().manual_seed(0))
    try:  # evaluation rows are not used: one tiny evaluation at the start and the end
        fit(run, task=t, eval_batch=eval_set(t, n=8, seed=EVAL_SEED), progress=False,
            callbacks=[_FullLogitsLoss(t), book, L2Penalty(weight_decay)])
    except TrainingDiverged as e:
        raise RuntimeError(f"sgd_fdt_run: non-finite loss at step {e.step} (lr {lr} too large?)") from None
    losses, temps = book.losses, book.temps
    start = int(steps * (1 - last))
    tail = rec.statistic(lr, np.asarray(temps), start=start, n_batches=n_batches)
    e0, e1 = early
    head = FDTRecorder()
    head.theta_dot_grad, head.grad_sq, head.n_params = rec.theta_dot_grad[e0:e1], rec.grad_sq[e0:e1], rec.n_params
    early_stat = head.statistic(lr, np.asarray(temps[e0:e1]), n_batches=10)
    w = max(1, steps // 10)
    return {"task": task, "steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed,
            "temperature": str(temperature), "weight_decay": weight_decay, "n_params": rec.n_params,
            "loss_first_decile": float(np.mean(losses[:w])), "loss_last_decile": float(np.mean(losses[-w:])),
            "window_last": [start, steps], "fdt_last": tail, "window_early": [e0, e1], "fdt_early": early_stat,
            **({"equipartition": equipartition(rec, lr, np.asarray(temps), start=start, n_batches=n_batches)}
               if groups else {})}


def param_family(name: str) -> str:
    """The parameter family of a :class:`~circuitfade.model.SoftPriorTransformer` parameter (or any
    TransformerLens model's): ``embed``, ``unembed``, ``QK``, ``OV``, ``MLP``, ``prior`` (the soft-prior
    biases and their gates) or ``norm`` (layer norms)."""
    leaf = name.rsplit(".", 1)[-1]
    if ".priors." in name or leaf.startswith("gate_"):
        return "prior"
    if name.startswith("embed.") or name.startswith("pos_embed."):
        return "embed"
    if name.startswith("unembed."):
        return "unembed"
    if ".attn." in name:
        return "QK" if leaf in ("W_Q", "W_K", "b_Q", "b_K") else "OV"
    if ".mlp." in name:
        return "MLP"
    return "norm"


ZERO_GRADIENT = {"unpinned": ("b_K",), "pinned": ("W_Q", "b_Q", "W_K", "b_K")}
"""Attention parameters whose data gradient is zero by construction, per apparatus: ``b_K`` always (adding
``q . b_K`` to every key of a query row leaves the softmax unchanged); with the pin also the query-key
weights (the pinned query row gets gradient <= ``exp(-30)``; no other row reaches the loss in one layer)."""


def family_without(excluded=()):
    """:func:`param_family`, but ``None`` (in no group) for ``blocks.*.attn.<leaf>`` with ``leaf`` in ``excluded``."""
    excluded = tuple(excluded)

    def group(name: str) -> str | None:
        if ".attn." in name and name.rsplit(".", 1)[-1] in excluded:
            return None
        return param_family(name)

    return group


def anneal_demo(n: int = 2000, steps: int = 3000, lr: float = 0.01, tilt: float = 0.3, t_start: float = 0.3,
                seed: int = 0) -> dict:
    """Fraction of particles in the deep well (``x < 0``) after plain SGD vs Langevin annealing
    (``T`` linear from ``t_start`` to 0 over the first 80% of the steps, then 0)."""
    out = {"n": n, "steps": steps, "lr": lr, "tilt": tilt}
    schedule = f"linear{t_start}->0@0:{int(0.8 * steps)}"
    for name, temp in (("sgd", 0.0), ("anneal", schedule)):
        x = torch.nn.Parameter(torch.ones(n, dtype=torch.float64))
        opt = LangevinNoise(torch.optim.SGD([x], lr=lr), temp, seed=seed, total_steps=steps)
        for _ in range(steps):
            opt.zero_grad()
            ((x * x - 1) ** 2 + tilt * x).sum().backward()
            opt.step()
        k = int((x.detach() < 0).sum())
        lo, hi = wilson_interval(k, n)
        out[name] = {"temperature": str(temp), "deep_well_fraction": k / n, "lo": lo, "hi": hi,
                     "mean_loss": float(((x.detach() ** 2 - 1) ** 2 + tilt * x.detach()).mean())}
    return out


# ------------------------------------------------------------------ python -m studies.alignment fdt
def thermal_call(groups: list[dict], tol: float = SPREAD_TOL, min_coords: int = MIN_COORDS) -> str:
    """``"fails"`` / ``"passes"`` / ``"inconclusive"`` for one run's :func:`equipartition` groups (rule in the
    module docstring)."""
    big = [g for g in groups if g["d"] >= min_coords]
    hot, cold = max(big, key=lambda g: g["T_kin"]), min(big, key=lambda g: g["T_kin"])
    if hot["lo"] > tol * cold["hi"]:
        return "fails"
    if cold["lo"] > 0 and hot["hi"] < tol * cold["lo"]:
        return "passes"
    return str(Outcome.INCONCLUSIVE)


def fdt_job(spec: dict, out: str | None = None) -> dict:
    """Form the K = 2 circuit of ``spec["seed"]`` by SGD (``spec["apparatus"]``: pinned, the default, or
    unpinned), continue ``spec["steps"]`` at ``spec["T"]`` with ``spec["wd"]`` in the loss and record the FDT
    series per parameter family, leaving out the attention parameters named in ``spec["exclude"]`` (zero
    gradient by construction); statistics over the second half."""

    torch.set_num_threads(1)
    seed, t0, steps, T = int(spec["seed"]), time.process_time(), int(spec["steps"]), float(spec["T"])
    f = A.formed(seed, pinned=is_pinned(spec))
    if f["ignition"] is None:
        return {**spec, "status": "no circuit", "form_steps": f["form_steps"]}
    m, rec = copy.deepcopy(f["model"]), FDTRecorder(family_without(spec.get("exclude", ())))
    xs, ys, clip = A.train_sgd(m, f["task"], A.sgd(m.parameters(), T, 70_000 + seed, steps),
                            torch.Generator().manual_seed(60_000 + seed), steps, f["ev"], record=rec.record,
                            weight_decay=float(spec["wd"]))
    start = steps // 2
    tot = rec.statistic(A.LR_SGD, T, start=start)
    eq = equipartition(rec, A.LR_SGD, T, start=start, min_coords=MIN_COORDS)
    noisy = [g for g in eq["groups"] if g["d"] >= MIN_COORDS and g["group"] != "QK"]
    return {**spec, "status": "done", "ignition": f["ignition"], "form_steps": f["form_steps"],
            "acc_final": A.accuracy(m, f["task"], f["ev_final"]), "clipped_frac": clip, "n_params": rec.n_params,
            "yaida": tot, "stationary": bool(abs(tot["relative"]) <= STATIONARY_TOL), "groups": eq["groups"],
            "spread": eq["spread"], "hottest": eq["hottest"], "coldest": eq["coldest"],
            "spread_without_qk": max(g["T_kin"] for g in noisy) / min(g["T_kin"] for g in noisy),
            "thermal": thermal_call(eq["groups"]), "cpu_s": time.process_time() - t0}


def fdt_verdicts(runs: list[dict]) -> pd.DataFrame:
    """The three claim rows (module docstring) from the jobs of both arms."""
    rows = []
    for arm, claim, want, other, study in (
            ("sgd", "FDT: SGD's noise fails the fluctuation-dissipation test (equipartition at stationarity)",
             "fails", "passes", "fails"),
            ("langevin", f"FDT: installed Langevin noise (T = {FDT_T:g}) passes it", "passes", "fails",
             "passes (installed so that it holds)")):
        r = [x for x in runs if x["arm"] == arm and x["status"] == "done"]
        n = len(r)
        calls = [x["thermal"] for x in r]
        st = sum(x["stationary"] for x in r)
        sp = [x["spread"] for x in r]
        med = float(np.median(sp)) if sp else float("nan")
        ours = (f"{calls.count(want)}/{n} seeds {want}, {calls.count(other)} {other}; spread T_max/T_min median "
                f"{med:.3g} (range {min(sp):.3g}–{max(sp):.3g}); without QK {np.median([x['spread_without_qk'] for x in r]):.3g}; "
                f"stationary {st}/{n}" if n else "no runs")
        if n == 0 or st < n:
            verdict = Outcome.NOT_TESTABLE
        elif calls.count(want) >= n - 1:
            verdict = Outcome.REPRODUCED
        elif calls.count(other) >= n - 1:
            verdict = Outcome.NOT_REPRODUCED
        else:
            verdict = Outcome.INCONCLUSIVE
        rows.append({"claim": claim, "ours": ours, "study": study,
                     "rule": f"every seed stationary (|O|/rhs <= {STATIONARY_TOL}) and >= n-1 seeds {want} "
                             f"(hottest group's 95% bound beyond {SPREAD_TOL}x the coldest's, groups >= {MIN_COORDS} "
                             f"coordinates); not reproduced if >= n-1 {other}", "verdict": verdict})
    r = [x for x in runs if x["arm"] == "sgd" and x["status"] == "done"]
    ok = sum(x["yaida"]["verdict"] == "consistent" for x in r)
    rel = [x["yaida"]["relative"] for x in r]
    rows.append({"claim": "FDT: plain SGD obeys Yaida's relation <theta.g> = (lr/2)<|g|^2> at stationarity",
                 "ours": (f"consistent in {ok}/{len(r)} seeds; O/rhs median {np.median(rel):+.3f} "
                          f"(range {min(rel):+.3f} to {max(rel):+.3f})" if r else "no runs"),
                 "study": "— (Yaida 2018: holds for any stationary SGD)",
                 "rule": "0 in the batch-means 95% interval of O in every seed",
                 "verdict": Outcome.NOT_RUN if not r else (Outcome.REPRODUCED if ok == len(r) else Outcome.NOT_REPRODUCED)})
    return pd.DataFrame(rows)


def fdt_verdicts_v2(runs: list[dict], *, apparatus: str, exclude_groups=()) -> pd.DataFrame:
    """The two claim rows of ``alignment.fdt`` v2 from both arms' jobs: :func:`thermal_call` on each run's groups
    without ``exclude_groups`` (whole families left out, e.g. ``QK`` on the pinned control); not testable
    unless every seed of the arm is stationary. Yaida's relation is not a row (a check: see the declaration)."""

    rules = rules_of("fdt", 2)
    verdicts = []
    for arm, want, other, study in (("sgd", "fails", "passes", "fails"),
                                    ("langevin", "passes", "fails", "passes (installed so that it holds)")):
        name = next(c for c in rules if (arm == "sgd") == c.startswith("FDT: SGD"))
        claim = Claim(name, rule=rules[name], study=study, fails_if=f">= n-1 seeds {other}")
        r = [x for x in runs if x["arm"] == arm and x["status"] == "done"]
        if not r:
            verdicts.append(Verdict.not_run(claim))
            continue
        groups = [[g for g in x["groups"] if g["group"] not in exclude_groups] for x in r]
        calls = [thermal_call(g) for g in groups]
        big = [[g for g in gs if g["d"] >= MIN_COORDS] for gs in groups]
        spread = [max(g["T_kin"] for g in b) / min(g["T_kin"] for g in b) for b in big]
        n, st = len(r), sum(bool(x["stationary"]) for x in r)
        ours = (f"{calls.count(want)}/{n} seeds {want}, {calls.count(other)} {other}; spread T_max/T_min median "
                f"{np.median(spread):.3g} (range {min(spread):.3g}–{max(spread):.3g}); stationary {st}/{n}")
        if st < n:
            outcome = Outcome.NOT_TESTABLE
        else:
            outcome = (Outcome.REPRODUCED if calls.count(want) >= n - 1 else
                       Outcome.NOT_REPRODUCED if calls.count(other) >= n - 1 else Outcome.INCONCLUSIVE)
        verdicts.append(Verdict(claim, ours, outcome))
    return verdict_frame(verdicts, "fdt", 2, apparatus)


def fdt_figure(runs: list[dict], qk_note: str = "QK: no data gradient in the pinned preset"):
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = {"sgd": "#d62728", "langevin": "#1f77b4"}
    order = ["embed", "unembed", "QK", "OV", "MLP", "prior", "norm"]
    for arm in ARMS:
        pts = [(g["group"], max(g["T_kin"], 1e-18), x["seed"]) for x in runs if x["arm"] == arm and x["status"] == "done"
               for g in x["groups"]]
        pts.sort(key=lambda p: order.index(p[0]) if p[0] in order else 99)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name=arm,
                                 marker=dict(color=colors[arm], size=8, opacity=0.7),
                                 text=[f"seed {p[2]}" for p in pts],
                                 hovertemplate="%{x}: T_G = %{y:.3g} (%{text})<extra>" + arm + "</extra>"))
    fig.add_hline(y=FDT_T, line_dash="dash", line_color=colors["langevin"])
    fig.add_annotation(x=1, xref="paper", xanchor="right", y=math.log10(FDT_T), yanchor="bottom",  # log axis: log10
                       text=f"installed T = {FDT_T:g}", showarrow=False, font=dict(color=colors["langevin"]))
    fig.update_yaxes(type="log", exponentformat="power", title="T_G = <θ_G·g_G> / d_G (second half)")
    fig.update_xaxes(title=f"parameter family ({qk_note})")
    fig.update_layout(title=f"Equipartition at stationarity: plain SGD (wd {FDT_WD:g}) vs SGD + Langevin noise<br>"
                            f"<sup>K = 2 apparatus, one dot per seed; a Gibbs law has every T_G equal</sup>",
                      template="plotly_white", width=900, height=520)
    return fig


def run(*, out: str | Path = "results/alignment", seeds: int = FDT_SEEDS, progress: bool = True,
        png: bool = True) -> dict:
    """``python -m studies.alignment fdt``: both arms x ``seeds``; writes ``OUT/fdt.md``, ``fdt_verdicts.csv``,
    ``fdt_runs.csv``, ``fdt_groups.csv`` and ``fig_fdt``."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    runs = []
    for arm, T in ARMS.items():
        for s in range(seeds):
            runs.append({**cached_job(fdt_job, {"kind": "fdt", "k": 2, "seed": s, "arm": arm, "T": T, "wd": FDT_WD,
                                             "steps": FDT_STEPS, "lr": LR_SGD}, out), "arm": arm})
            if progress:
                print(f"fdt {arm} seed {s}: {runs[-1]['status']} {runs[-1].get('thermal', '')}", flush=True)
    done = [r for r in runs if r["status"] == "done"]
    failed = [r for r in runs if r["status"] != "done"]
    v = fdt_verdicts(runs)
    v = stamped(forced_v1(v, "fdt"), "fdt", 1, "pinned")
    v.to_csv(out / "fdt_verdicts.csv", index=False)
    tab = pd.DataFrame([{"arm": r["arm"], "seed": r["seed"], "acc_final": r["acc_final"],
                         "clipped_frac": r["clipped_frac"], "yaida_rel": r["yaida"]["relative"],
                         "yaida": r["yaida"]["verdict"], "stationary": r["stationary"], "spread": r["spread"],
                         "spread_without_qk": r["spread_without_qk"], "hottest": r["hottest"],
                         "coldest": r["coldest"], "thermal": r["thermal"]} for r in done])
    tab.to_csv(out / "fdt_runs.csv", index=False)
    cols = ["arm", "seed", "group", "d", "T_kin", "lo", "hi", "T_sgd", "fdt_relative", "fdt_verdict"]
    groups = pd.DataFrame([{"arm": r["arm"], "seed": r["seed"], **g} for r in done for g in r["groups"]],
                          columns=cols)
    groups.to_csv(out / "fdt_groups.csv", index=False)
    save_figure(fdt_figure(runs), out / "fig_fdt", png=png)
    gmed = (groups.groupby(["arm", "group"], sort=False)
            .agg(d=("d", "first"), T_kin_median=("T_kin", "median"), T_kin_min=("T_kin", "min"),
                 T_kin_max=("T_kin", "max"), T_sgd_median=("T_sgd", "median")).reset_index()) if len(groups) else groups
    cpu = sum(float(r.get("cpu_s", 0) or 0) for r in runs)
    fmt = lambda df: markdown_table(df.assign(**{c: [f"{x:.3g}" for x in df[c]] for c in df.columns  # noqa: E731
                                                 if df[c].dtype.kind == "f"}))
    text = "\n".join([
        "## The fluctuation-dissipation test at stationarity (version 1, pinned)", "", f"Protocol: {stamp('fdt', 1)}.",
        f"Command: `python -m studies.alignment fdt --out {out}`. K = 2 apparatus, plain SGD lr {LR_SGD} (clip "
        f"{CLIP}), circuit formed at T = 0, then {FDT_STEPS} steps with ({FDT_WD:g}/2)|θ|² in the loss at T = 0 "
        f"(sgd) and T = {FDT_T:g} (langevin); statistics over the second half (batch means, 20 batches, 95%). "
        f"Seeds 0–{seeds - 1}. Rules: `studies.alignment.fdt` docstring. Training CPU {cpu / 60:.1f} "
        f"core-min (finished jobs reused); {len(failed)} failed or "
        f"circuit-less jobs.", "", markdown_table(v), "", "Per run:", "", fmt(tab), "",
        "Per parameter family (median over seeds; T_sgd = (lr/2)<|g_G|²>/d_G, SGD's own share):", "",
        fmt(gmed), ""]
        + (["**Failed / circuit-less jobs:** " + "; ".join(f"{r['arm']} seed {r['seed']}: {r['status']} "
                                                           f"{r.get('error', '')}" for r in failed), ""] if failed else []))
    (out / "fdt.md").write_text(text)
    return {"runs": tab, "groups": groups, "verdicts": v, "markdown": text, "failed": failed}


def _jobs(version: int, out: Path, progress: bool) -> list[dict]:
    """Both arms' jobs of ``alignment.fdt`` v``version`` (v1: pinned, every parameter; v2: unpinned, the
    zero-gradient parameters left out), through the job cache."""

    d = declared("fdt", version).data
    runs = []
    for arm, T in (("sgd", 0.0), ("langevin", float(d["T"]))):
        for s in d["seeds"]:
            spec = {"kind": "fdt", "k": int(d["k"]), "seed": int(s), "arm": arm, "T": T, "wd": float(d["wd"]),
                    "steps": int(d["steps"]), "lr": LR_SGD}
            if version == 2:
                spec = {**spec, "apparatus": "unpinned", "exclude": list(ZERO_GRADIENT["unpinned"])}
            runs.append({**cached_job(fdt_job, spec, out), "arm": arm})
            if progress:
                print(f"fdt v{version} {arm} seed {s}: {runs[-1]['status']} {runs[-1].get('thermal', '')}", flush=True)
    return runs


def run_unpinned(*, out: str | Path = "results/alignment", progress: bool = True, png: bool = True) -> dict:
    """``python -m studies.alignment fdt-unpinned``: ``alignment.fdt`` v2 on the unpinned apparatus, and v1's
    pinned jobs re-judged without QK; writes ``OUT/fdt_unpinned.md``, ``fdt_unpinned_verdicts.csv``,
    ``fdt_unpinned_groups.csv`` and ``fig_fdt_unpinned``."""

    out = Path(out)
    runs = _jobs(2, out, progress)
    v = pd.concat([fdt_verdicts_v2(runs, apparatus="unpinned (b_K excluded)"),
                   fdt_verdicts_v2(_jobs(1, out, False), apparatus="pinned (v1 runs, QK excluded)",
                                   exclude_groups=("QK",))], ignore_index=True)
    v.to_csv(out / "fdt_unpinned_verdicts.csv", index=False)
    done = [r for r in runs if r["status"] == "done"]
    groups = pd.DataFrame([{"arm": r["arm"], "seed": r["seed"], **g} for r in done for g in r["groups"]])
    groups.assign(protocol=stamp("fdt", 2)).to_csv(out / "fdt_unpinned_groups.csv", index=False)
    save_figure(fdt_figure(runs, qk_note="QK: learned routing, b_K left out"), out / "fig_fdt_unpinned", png=png)
    tab = pd.DataFrame([{"arm": r["arm"], "seed": r["seed"], "acc_final": r["acc_final"], "form_steps": r["form_steps"],
                         "clipped_frac": r["clipped_frac"], "yaida_rel": r["yaida"]["relative"],
                         "stationary": r["stationary"], "spread": r["spread"], "thermal": r["thermal"]} for r in done])
    gmed = (groups.groupby(["arm", "group"], sort=False).agg(d=("d", "first"), T_kin_median=("T_kin", "median"),
                                                              T_sgd_median=("T_sgd", "median")).reset_index()
            if len(groups) else groups)
    cpu = sum(float(r.get("cpu_s", 0) or 0) for r in runs)
    fmt = lambda df: markdown_table(df.assign(**{c: [f"{x:.3g}" for x in df[c]] for c in df.columns  # noqa: E731
                                                 if df[c].dtype.kind == "f"}))
    text = "\n".join([
        "## The fluctuation-dissipation test on the unpinned apparatus", "",
        f"Protocol: {stamp('fdt', 2)}. Command: `python -m studies.alignment fdt-unpinned --out {out}`. As v1 "
        f"(K = 2, plain SGD lr {LR_SGD}, clip {CLIP}, {FDT_STEPS} steps with ({FDT_WD:g}/2)|θ|² at T = 0 and "
        f"T = {FDT_T:g}) on the unpinned preset, with the parameters whose gradient is zero by construction left "
        f"out of the groups ({', '.join(ZERO_GRADIENT['unpinned'])}); v1's pinned runs re-judged without the QK "
        f"family. Yaida's relation is reported per run (yaida_rel), not as a claim: for plain SGD it telescopes "
        f"to the change of |θ|², so under the stationarity filter it cannot fail. Training CPU {cpu / 60:.1f} "
        f"core-min; {len(runs) - len(done)} failed or circuit-less jobs.", "", markdown_table(v), "", "Per run:", "",
        fmt(tab), "", "Per parameter family (median over seeds):", "", fmt(gmed), ""])
    (out / "fdt_unpinned.md").write_text(text)
    return {"runs": tab, "groups": groups, "verdicts": v, "markdown": text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.alignment.fdt", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fdt", help="FDT statistic on SGD training of the base model")
    f.add_argument("--steps", type=int, default=3000)
    f.add_argument("--lr", type=float, default=0.1)
    f.add_argument("--batch-size", type=int, default=64)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--task", default="assoc")
    f.add_argument("--temperature", default="0")
    f.add_argument("--last", type=float, default=0.5, help="fraction of the run at its end to measure over")
    f.add_argument("--weight-decay", type=float, default=0.0, help="L2 term (wd/2)|theta|^2 added to the loss")
    a = sub.add_parser("anneal", help="annealing demo on a tilted double well")
    a.add_argument("--n", type=int, default=2000)
    a.add_argument("--steps", type=int, default=3000)
    a.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "fdt":
        res = sgd_fdt_run(args.steps, args.lr, args.batch_size, args.seed, args.task, args.temperature,
                          args.last, weight_decay=args.weight_decay, progress=True)
    else:
        res = anneal_demo(args.n, args.steps, seed=args.seed)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
