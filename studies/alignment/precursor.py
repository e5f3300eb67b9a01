"""``python -m studies.alignment precursor``: dating an arrival before it happens.

The no-partial-credit study claims that while a capability is still flat its arrival can be dated
from a precursor, to 5% median error on six held-out models. Protocol, fixed here before
any run (the split, the candidate levels, the predictor's form and the verdict rule):

* **Runs** - the K-part circuit (:mod:`studies.alignment`, K = 4, V = 3, one
  distractor, the pinned one-layer preset) trained from scratch at learning rate
  ``LR * drive`` for drive in :data:`DRIVES` and seeds 0-11; evaluation every
  :data:`EVERY` steps (accuracy on the usual 256 sequences: ignition as in part 1); each
  run stops :data:`~studies.alignment.MARGIN` steps after ignition or at
  :data:`CAP` (then *censored*: no ignition step, left out of fit and test).
* **Precursors** - logged at every evaluation on the fixed probe set of *every* input
  (``V^(K+1) = 243`` sequences, each once, so the measures are exact: no sampling noise):

  - ``hidden_target`` (**the precursor used**): :func:`~circuitfade.analysis.precursor.label_alignment`
    of the MLP hidden units at the query (``blocks.0.mlp.hook_post``) with the capability's
    target ``y``: the fraction of the hidden layer's variance that is already a function of
    the K-part sum. It is not what the loss or the accuracy reads (they read the logits),
    and while the capability is flat both are at chance to three digits.
  - ``hidden_partial_min``: the weakest part's (K-1)-part alignment, ``min_i`` of the
    alignment of the hidden units with the sum of the other K-1 parts (a partial circuit
    the loss cannot reward: the task is shortcut-free). Logged, not used.
  - ``logit_target``: the same alignment of the answer logits (what the loss rewards). Logged, not used.
  - ``loss_gap``: ``ln V`` minus the capability cross-entropy on the probe set (is the loss flat?).
  - ``source_attention_min``: the weakest part's attention at the query on its own input
    (:func:`~circuitfade.analysis.precursor.source_attention`). The preset *pins* it
    (``PinnedReadout``), so it is ~1 from step 0 and carries no timing; logged to show that.

  ``hidden_target`` was chosen on probe runs of seeds 0-3 (fit-split seeds) before the
  held-out seeds were run.
* **Split** - by seed: seeds :data:`FIT_SEEDS` fit, :data:`HELD_SEEDS` held out (every drive).
* **Predictor** - :func:`~circuitfade.analysis.precursor.fit_crossing` on the fit runs:
  ``predicted ignition = t_c + lead / drive``, ``t_c`` the first step at which the running
  median (5 evaluations) of the precursor reaches the level, the level chosen from
  :data:`LEVELS` on the fit runs (only levels every fit run crosses before it ignites),
  frozen with a content hash to ``OUT/precursor_constants.json``, read back and applied to
  the held-out runs. A held-out run whose precursor does not cross before it ignites gets
  no prediction (an infinite error).
* **Baselines** - ``median``: the fit runs' median ignition step (ignores the precursor
  and the drive); ``drive``: ``median(ignition * drive) / drive`` over the fit runs (knows
  the learning rate, ignores the precursor).
* **Verdict rule** (:func:`precursor_verdicts`) - reproduced if the held-out median
  relative error is <= 10% and below the ``median`` baseline's; partly if below that
  baseline's but > 10%; otherwise not reproduced. Whether it also beats the ``drive``
  baseline is reported beside it.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from circuitfade.analysis.ignition import ignition_step
from circuitfade.analysis.precursor import (
    combine_parts,
    fit_crossing,
    label_alignment,
    median_interval,
    predict_crossing,
    relative_errors,
    source_attention,
)
from circuitfade.claims import Claim, Outcome, Verdict
from circuitfade.io import freeze_payload, load_frozen, read_json
from circuitfade.train import new_run, train
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment.apparatus import (
    CHUNK,
    LR,
    MARGIN,
    PATIENCE,
    THRESHOLD,
    base_config,
    check_finite,
    is_pinned,
    job_key,
    run_cached_jobs,
)
from studies.alignment.protocol import PRECURSOR_V1, stamp, stamped, declared, rules_of, verdict_frame

__all__ = ["K", "DRIVES", "FIT_SEEDS", "HELD_SEEDS", "EVERY", "CAP", "LEVELS", "PRECURSOR", "STUDY_PRECURSOR",
           "probe_set", "precursor_config", "precursor_job", "freeze_predictor", "load_predictor",
           "precursor_verdicts", "precursor_figure", "run", "remaining_errors", "precursor_verdicts_v2",
           "run_unpinned"]

_D = PRECURSOR_V1.data
K = int(_D["k"])
DRIVES = tuple(_D["drives"])
"""Learning-rate multipliers (K = 4 at drive 1 ignited from scratch at 275-975 steps in part 1)."""
FIT_SEEDS = tuple(_D["fit_seeds"])
HELD_SEEDS = tuple(_D["held_seeds"])
EVERY = int(_D["every"])
CAP = int(_D["cap"])
LEVELS = tuple(_D["levels"])
WINDOW = int(_D["window"])
PRECURSOR = "hidden_target"
MEASURES = ("hidden_target", "hidden_partial_min", "logit_target", "loss_gap", "source_attention_min")
STUDY_PRECURSOR = {"median_rel_error": 0.05, "held_out": 6}
RULE_MAX_ERROR = float(_D["max_error"])


def precursor_config(seed: int, drive: float, steps: int, *, k: int = K, pinned: bool = True):
    """The K-part base config (v1: K = 4, pinned) at learning rate ``LR * drive``, evaluated every :data:`EVERY` steps."""

    cfg = base_config(k, seed, steps, pinned=pinned)
    return replace(cfg, train=replace(cfg.train, lr=LR * float(drive), eval_every=EVERY))


def probe_set(task) -> dict:
    """Every input of the K-part task once: tokens, the target, and the K leave-one-out partial sums."""
    import torch

    n = task.n_values
    grid = torch.tensor(list(itertools.product(range(task.v), repeat=n)), dtype=torch.long)
    tokens = torch.cat([grid, torch.full((len(grid), 1), task.query_token, dtype=torch.long)], dim=1)
    mapped = torch.stack([task.perms[i][grid[:, task.positions[i]]] for i in range(task.k)], dim=-1)
    y = mapped.sum(-1) % task.v
    partial = [(y - mapped[:, i]) % task.v for i in range(task.k)]  # the sum of the other K-1 parts
    return {"tokens": tokens, "target": y, "partial": partial}


def measure(model, task, probe: Mapping) -> dict:
    """The logged precursors (see the module docstring) on the probe set."""
    import torch
    import torch.nn.functional as F

    q, v = task.query_pos, task.v
    with torch.no_grad():
        logits, cache = model.run_with_cache(probe["tokens"], names_filter=lambda nm: nm == "blocks.0.mlp.hook_post")
    hidden = cache["blocks.0.mlp.hook_post"][:, q]
    lg = logits[:, q]
    att = source_attention(model, probe["tokens"][:64], {(0, i): task.positions[i] for i in range(task.k)}, q)
    return {"hidden_target": label_alignment(hidden, probe["target"]),
            "hidden_partial_min": combine_parts([label_alignment(hidden, p) for p in probe["partial"]], "min"),
            "logit_target": label_alignment(lg[:, :v], probe["target"]),
            "loss_gap": math.log(v) - float(F.cross_entropy(lg, probe["target"])),
            "source_attention_min": combine_parts(att, "min")}


def precursor_job(spec: Mapping, out: str) -> dict:
    """Train one run from scratch, measuring the precursors at every evaluation, until ignition + margin."""
    import torch

    torch.set_num_threads(1)
    seed, drive, cap = int(spec["seed"]), float(spec["drive"]), int(spec["cap"])
    cfg_at = lambda s: precursor_config(seed, drive, s, k=int(spec["k"]), pinned=is_pinned(spec))  # noqa: E731
    t0 = time.process_time()
    run = new_run(cfg_at(CHUNK))
    task = run.config.make_task()
    probe = probe_set(task)
    rows: list[dict] = []

    def log(step, metrics) -> None:
        rows.append({"step": int(step), "acc": float(metrics["acc_normal"]), **measure(run.model, task, probe)})

    ig = None
    while True:
        steps = [r["step"] for r in rows]
        accs = [r["acc"] for r in rows]
        if steps:
            ig = ignition_step(accs, steps=steps, baseline=task.chance, threshold=THRESHOLD, patience=PATIENCE)
        if (ig is not None and steps[-1] - ig >= MARGIN) or run.step >= cap:
            break
        train(cfg_at(min(run.step + CHUNK, cap)), None, run=run, progress=False, logger=log)
        check_finite(run)
    curves = {c: [r[c] for r in rows] for c in ("step", "acc") + MEASURES}
    return {**spec, "status": "ignited" if ig is not None else "censored", "ignition": ig,
            "final_step": run.step, "curves": curves, "cpu_s": time.process_time() - t0}


# ------------------------------------------------------------------ the frozen predictor
def freeze_predictor(path: Path, constants: Mapping, *, fit_runs: pd.DataFrame) -> dict:
    """Write the fitted constants with a content hash; refuses to overwrite different ones."""

    payload = {"formula": "ignition = t_c + lead / drive; t_c = first step the running median of the precursor "
                          "reaches level", "precursor": PRECURSOR,
               "constants": {k: v for k, v in constants.items() if k != "scan"}, "scan": constants.get("scan", []),
               "fit_runs": fit_runs.to_dict("records")}
    return freeze_payload(path, payload, what="frozen predictor constants")


def load_predictor(path: Path) -> dict:
    """Read the frozen constants back, checking the content hash (:func:`circuitfade.io.load_frozen`)."""

    return load_frozen(path, what="frozen predictor constants")["constants"]


# ------------------------------------------------------------------ verdict and figure
def precursor_verdicts(err: tuple[float, float, float] | None, baseline: float | None,
                       drive_baseline: float | None, n_held: int) -> pd.DataFrame:
    """The verdict row (rule in the module docstring); ``err`` = (median, lo, hi) on the held-out runs."""
    claim = "dating an arrival: a precursor read while flat predicts the ignition step of held-out runs"
    study = f"5% median relative error on {STUDY_PRECURSOR['held_out']} held-out models"
    rule = (f"reproduced if the held-out median relative error is <= {RULE_MAX_ERROR:.0%} and below the fit-median "
            f"baseline's; partly if below that baseline's but > {RULE_MAX_ERROR:.0%}")
    if err is None or n_held == 0:
        return pd.DataFrame([{"claim": claim, "ours": "—", "study": study, "rule": rule, "verdict": Outcome.NOT_RUN}])
    m, lo, hi = err
    better = baseline is not None and m < baseline
    verdict = (Outcome.REPRODUCED if (better and m <= RULE_MAX_ERROR) else Outcome.PARTLY if better else Outcome.NOT_REPRODUCED)
    ours = (f"median relative error {m:.1%} [{lo:.1%}, {hi:.1%}] on {n_held} held-out runs; baselines: fit median "
            f"{baseline:.1%}, drive-only {drive_baseline:.1%}")
    return pd.DataFrame([{"claim": claim, "ours": ours, "study": study, "rule": rule, "verdict": verdict}])


def precursor_figure(runs: pd.DataFrame, curves: Mapping, level: float) -> go.Figure:
    """Left: the precursor against steps to ignition (fit and held-out runs, the frozen level);
    right: predicted against actual ignition on the held-out runs (precursor and both baselines)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"precursor ({PRECURSOR}) vs steps to ignition",
                                                        "held-out runs: predicted vs actual ignition"))
    colors = {"fit": "#1f77b4", "held-out": "#ff7f0e"}
    shown = set()
    for r in runs[runs.status == "ignited"].itertuples():
        c = curves[r.key]
        s = np.asarray(c["step"], dtype=float)
        y = np.clip(np.asarray(c[PRECURSOR], dtype=float), 1e-8, None)
        first = r.split not in shown
        shown.add(r.split)
        fig.add_trace(go.Scatter(x=s - r.ignition, y=y, mode="lines", line=dict(color=colors[r.split], width=1),
                                 opacity=0.6, name=f"{r.split} runs", legendgroup=r.split, showlegend=first),
                      row=1, col=1)
    fig.add_hline(y=level, line_dash="dash", line_color="black", row=1, col=1)
    fig.add_vline(x=0, line_dash="dot", line_color="grey", row=1, col=1)
    held = runs[(runs.split == "held-out") & (runs.status == "ignited")]
    for col, name, sym, color in (("pred", "precursor", "circle", "#2ca02c"), ("pred_median", "fit-median baseline",
                                  "x", "#7f7f7f"), ("pred_drive", "drive-only baseline", "diamond-open", "#9467bd")):
        fig.add_trace(go.Scatter(x=held.ignition, y=held[col], mode="markers", marker=dict(symbol=sym, size=9,
                                 color=color), name=name, text=[f"seed {s} drive {d}" for s, d in
                                                                 zip(held.seed, held.drive)]), row=1, col=2)
    hi = float(np.nanmax(np.r_[held.ignition.to_numpy(float), held[["pred", "pred_median", "pred_drive"]]
                               .to_numpy(float).ravel(), 1.0])) * 1.1
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line=dict(color="black", dash="dot"),
                             name="predicted = actual"), row=1, col=2)
    fig.update_yaxes(type="log", title_text="eta² of MLP hidden units with the target", row=1, col=1)
    fig.update_xaxes(title_text="step − ignition step", row=1, col=1)
    fig.update_xaxes(title_text="actual ignition step", range=[0, hi], row=1, col=2)
    fig.update_yaxes(title_text="predicted ignition step", range=[0, hi], row=1, col=2)
    fig.update_layout(width=1150, height=480, template="plotly_white", legend=dict(x=1.02, y=1))
    return fig


def sensitivity(held: pd.DataFrame, curves: Mapping, scan: list) -> pd.DataFrame:
    """Held-out errors at every scanned level with that level's fitted lead (a reading aid, after the verdict)."""
    rows = []
    for sc in scan:
        if sc["lead"] is None:
            rows.append({"level": sc["level"], "n": len(held), "median_rel_error": float("nan"),
                         "median_lead_fraction": float("nan"), "median_rel_error_remaining": float("nan")})
            continue
        c = {"level": sc["level"], "lead": sc["lead"], "window": WINDOW}
        pt = [predict_crossing(curves[k]["step"], curves[k][PRECURSOR], c, drive=d, flat_until=i)
              for k, d, i in zip(held.key, held.drive, held.ignition)]
        pred, tc = np.array([p for p, _ in pt]), np.array([t for _, t in pt])
        ig = held.ignition.to_numpy(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            rem = np.where(np.isnan(pred), np.inf, np.abs(pred - ig) / (ig - tc))
        rows.append({"level": sc["level"], "n": len(held),
                     "median_rel_error": float(np.median(relative_errors(pred, ig))),
                     "median_lead_fraction": float(np.nanmedian((ig - tc) / ig)),
                     "median_rel_error_remaining": float(np.median(rem))})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ the protocol
def _predict(runs: pd.DataFrame, curves: dict, out: Path,
             frozen_name: str = "precursor_constants.json") -> tuple[pd.DataFrame, dict, dict, Path]:
    """Fit the crossing predictor on the fit runs, freeze it, read it back and date every ignited run."""
    ok = runs[runs.status == "ignited"].copy()
    fit = ok[ok.split == "fit"]
    const = fit_crossing([(curves[k]["step"], curves[k][PRECURSOR]) for k in fit.key], fit.ignition.to_numpy(float),
                         fit.drive.to_numpy(float), levels=LEVELS, window=WINDOW)
    frozen = out / frozen_name
    freeze_predictor(frozen, const, fit_runs=fit[["seed", "drive", "ignition"]])
    c = load_predictor(frozen)
    pred, tc = zip(*[predict_crossing(curves[k]["step"], curves[k][PRECURSOR], c, drive=d, flat_until=i)
                     for k, d, i in zip(ok.key, ok.drive, ok.ignition)]) if len(ok) else ((), ())
    ok["t_cross"], ok["pred"] = list(tc), list(pred)
    ok["pred_median"] = float(np.median(fit.ignition))
    ok["pred_drive"] = float(np.median(fit.ignition * fit.drive)) / ok.drive
    for col, name in (("pred", "rel_error"), ("pred_median", "rel_error_median"), ("pred_drive", "rel_error_drive")):
        ok[name] = relative_errors(ok[col].to_numpy(float), ok.ignition.to_numpy(float))
    ok["lead_fraction"] = (ok.ignition - ok.t_cross) / ok.ignition  # how early the date is given
    ok["rel_error_remaining"] = (ok.pred - ok.ignition).abs() / (ok.ignition - ok.t_cross)  # error / time still to go

    def at_cross(key, t, col):
        cv = curves[key]
        return float(np.interp(t, cv["step"], cv[col])) if np.isfinite(t) else float("nan")

    ok["acc_at_cross"] = [at_cross(k, t, "acc") for k, t in zip(ok.key, ok.t_cross)]
    ok["loss_gap_at_cross"] = [at_cross(k, t, "loss_gap") for k, t in zip(ok.key, ok.t_cross)]
    return ok, c, const, frozen


def _markdown(*, runs, ok, curves, const, sens, c, frozen: Path, failed, err, v, wall_s) -> str:
    att0 = [curves[k]["source_attention_min"][0] for k in ok.key]
    cpu = float(runs.cpu_s.fillna(0).sum()) if "cpu_s" in runs else 0.0
    scan = pd.DataFrame(const["scan"])
    fmt = lambda df: df.assign(level=[f"{x:g}" for x in df.level])  # noqa: E731
    cols = ["split", "seed", "drive", "ignition", "t_cross", "pred", "rel_error", "pred_median", "rel_error_median",
            "pred_drive", "rel_error_drive", "lead_fraction", "rel_error_remaining", "acc_at_cross", "loss_gap_at_cross"]
    by_split = ok.groupby("split").agg(runs=("key", "size"), rel_error=("rel_error", "median"),
                                       rel_error_median=("rel_error_median", "median"),
                                       rel_error_drive=("rel_error_drive", "median"),
                                       lead_fraction=("lead_fraction", "median")).reset_index()
    text = "\n".join([
        "## Dating an arrival before it happens (version 1, pinned)", "", f"Protocol: {stamp('precursor', 1)}.",
        f"K = {K}, drives (lr multipliers) {list(DRIVES)}, fit seeds {list(FIT_SEEDS)}, held-out seeds "
        f"{list(HELD_SEEDS)}; evaluation every {EVERY} steps; precursor `{PRECURSOR}` on all "
        f"{3 ** (K + 1)} inputs. Frozen predictor (`precursor_constants.json`, sha256 "
        f"`{read_json(frozen)['sha256'][:16]}…`): level {c['level']:g}, lead {c['lead']:.1f} steps at drive 1 "
        f"(predicted ignition = t_c + lead / drive), fit median relative error {c['fit_median_rel_error']:.1%} "
        f"on {c['n_fit']} fit runs. {len(runs) - len(ok)} censored or failed runs ({len(failed)} failed). "
        f"Part attention on its source at step 0: min {min(att0) if att0 else float('nan'):.4f} (pinned). "
        f"Training CPU {cpu / 60:.1f} core-min (finished jobs reused).", "",
        "Held-out median relative error: " + ("—" if err is None else
                                              f"{err[0]:.1%} [{err[1]:.1%}, {err[2]:.1%}] (bootstrap 95% over runs)"),
        "", markdown_table(by_split.round(3)), "", "Level scan on the fit runs (the level with the smallest fit error is frozen):", "",
        markdown_table(fmt(scan).round(4)), "",
        "After the frozen result, for the reader (not used for the verdict): the held-out runs at every scanned level "
        "with that level's fitted lead; lower levels date the arrival earlier and less precisely "
        "(rel_error_remaining = |pred - actual| / (actual - t_c)).", "", markdown_table(fmt(sens).round(3)), "",
        "Runs:", "", markdown_table(ok[cols].sort_values(["split", "seed", "drive"]).round(3)), "",
        markdown_table(v), ""])
    return text


def run(*, out: str | Path, workers: int = 1, progress: bool = True, png: bool = True) -> dict:
    """All runs (finished jobs reused), the frozen predictor, the held-out errors; writes
    ``OUT/precursor.md``, ``precursor_runs.csv``, ``precursor_curves.csv``, ``precursor_constants.json``,
    ``precursor_verdicts.csv`` and ``fig_precursor``."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    specs = [{"kind": "precursor", "k": K, "seed": s, "drive": float(d), "every": EVERY, "cap": CAP}
             for s in FIT_SEEDS + HELD_SEEDS for d in DRIVES]
    res = run_cached_jobs(precursor_job, specs, out, workers=workers, progress=progress, desc="precursor jobs")
    failed = [r for r in res if r.get("status") == "failed"]
    curves = {job_key(s): r["curves"] for s, r in zip(specs, res) if "curves" in r}
    runs = pd.DataFrame([{**{k: v for k, v in r.items() if k != "curves"}, "key": job_key(s),
                          "split": "fit" if s["seed"] in FIT_SEEDS else "held-out"} for s, r in zip(specs, res)])
    pd.concat([pd.DataFrame(c).assign(key=k) for k, c in curves.items()], ignore_index=True).to_csv(
        out / "precursor_curves.csv", index=False, float_format="%.5g")
    ok, c, const, frozen = _predict(runs, curves, out)
    runs = runs.merge(ok[["key", "t_cross", "pred", "pred_median", "pred_drive", "rel_error", "rel_error_median",
                          "rel_error_drive", "lead_fraction", "rel_error_remaining", "acc_at_cross", "loss_gap_at_cross"]], on="key", how="left")
    runs.to_csv(out / "precursor_runs.csv", index=False)
    held = ok[ok.split == "held-out"]
    err = median_interval(held.rel_error.to_numpy(float)) if len(held) else None
    base_m = float(np.median(held.rel_error_median)) if len(held) else None
    base_d = float(np.median(held.rel_error_drive)) if len(held) else None
    v = precursor_verdicts(err, base_m, base_d, len(held))
    v = stamped(v, "precursor", 1, "pinned")
    v.to_csv(out / "precursor_verdicts.csv", index=False)
    save_figure(precursor_figure(runs, curves, float(c["level"])), out / "fig_precursor", png=png)
    sens = sensitivity(ok[ok.split == "held-out"], curves, const["scan"])
    sens.to_csv(out / "precursor_levels.csv", index=False)
    text = _markdown(runs=runs, ok=ok, curves=curves, const=const, sens=sens, c=c, frozen=frozen, failed=failed, err=err, v=v,
                     wall_s=time.time() - t0)
    (out / "precursor.md").write_text(text)
    return {"runs": runs, "verdicts": v, "constants": c, "markdown": text, "failed": failed}


# ------------------------------------------------------------------ version 2: error against the time still to go
def remaining_errors(ok: pd.DataFrame, col: str = "pred") -> np.ndarray:
    """``|ok[col] - ignition| / (ignition - t_cross)`` per run: the error relative to the time still to go when
    the date is given; ``inf`` where no date was given (no crossing before ignition)."""
    num = (ok[col] - ok.ignition).abs().to_numpy(float)
    den = (ok.ignition - ok.t_cross).to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    r[~np.isfinite(den) | (den <= 0) | np.isnan(num)] = np.inf
    return r


def precursor_verdicts_v2(err: tuple[float, float, float] | None, baseline: float | None, n_held: int,
                          apparatus: str) -> pd.DataFrame:
    """The ``alignment.precursor`` v2 row: ``err`` = (median, lo, hi) of :func:`remaining_errors` on the held-out
    runs, ``baseline`` the fit-median baseline's median on the same denominator."""

    (name, rule), = rules_of("precursor", 2).items()
    claim = Claim(name, rule=rule, study=f"5% median relative error on {STUDY_PRECURSOR['held_out']} held-out models "
                                          "(relative to the whole ignition step)",
                  fails_if="the median error is at or above the fit-median baseline's")
    if err is None or n_held == 0:
        return verdict_frame([Verdict.not_run(claim)], "precursor", 2, apparatus)
    m, lo, hi = err
    outcome = (Outcome.NOT_REPRODUCED if baseline is None or not m < baseline else
               Outcome.REPRODUCED if hi < 0.10 else Outcome.PARTLY)
    ours = (f"median {m:.1%} [{lo:.1%}, {hi:.1%}] of the time still to go, {n_held} held-out runs; fit-median "
            f"baseline {baseline:.1%}")
    return verdict_frame([Verdict(claim, ours, outcome)], "precursor", 2, apparatus)


def _v2_row(held: pd.DataFrame, apparatus: str) -> pd.DataFrame:
    if not len(held):
        return precursor_verdicts_v2(None, None, 0, apparatus)
    err = median_interval(remaining_errors(held))
    return precursor_verdicts_v2(err, float(np.median(remaining_errors(held, "pred_median"))), len(held), apparatus)


def run_unpinned(*, out: str | Path, workers: int = 1, progress: bool = True, png: bool = True) -> dict:
    """``alignment.precursor`` v2: the unpinned runs (finished jobs reused), their own frozen predictor
    (``precursor_unpinned_constants.json``), the error against the time still to go; v1's pinned runs re-scored.
    Writes ``OUT/precursor_unpinned.md``, ``precursor_unpinned_runs.csv``, ``precursor_unpinned_verdicts.csv``
    and ``fig_precursor_unpinned``."""

    out, d = Path(out), declared("precursor", 2).data
    specs = [{"kind": "precursor", "apparatus": "unpinned", "k": int(d["k"]), "seed": s, "drive": float(dr),
              "every": int(d["every"]), "cap": int(d["cap"])} for s in d["fit_seeds"] + d["held_seeds"]
             for dr in d["drives"]]
    res = run_cached_jobs(precursor_job, specs, out, workers=workers, progress=progress, desc="precursor v2 jobs")
    curves = {job_key(s): r["curves"] for s, r in zip(specs, res) if "curves" in r}
    runs = pd.DataFrame([{**{k: v for k, v in r.items() if k != "curves"}, "key": job_key(s),
                          "split": "fit" if s["seed"] in d["fit_seeds"] else "held-out"} for s, r in zip(specs, res)])
    ok, c, const, frozen = _predict(runs, curves, out, "precursor_unpinned_constants.json")
    ok["rel_error_remaining"] = remaining_errors(ok)
    ok["rel_error_remaining_median"] = remaining_errors(ok, "pred_median")
    ok.assign(protocol=stamp("precursor", 2)).to_csv(out / "precursor_unpinned_runs.csv", index=False)
    v1 = pd.read_csv(out / "precursor_runs.csv") if (out / "precursor_runs.csv").is_file() else pd.DataFrame()
    v1_held = v1[(v1.split == "held-out") & (v1.status == "ignited")] if len(v1) else v1
    v = pd.concat([_v2_row(ok[ok.split == "held-out"], "unpinned"),
                   _v2_row(v1_held, "pinned (v1 runs, re-scored)")], ignore_index=True)
    v.to_csv(out / "precursor_unpinned_verdicts.csv", index=False)
    save_figure(precursor_figure(runs.merge(ok[["key", "pred", "pred_median", "pred_drive"]], on="key", how="left"),
                                 curves, float(c["level"])), out / "fig_precursor_unpinned", png=png)
    cols = ["split", "seed", "drive", "ignition", "t_cross", "pred", "rel_error", "lead_fraction", "rel_error_remaining",
            "rel_error_remaining_median"]
    cpu = float(runs.cpu_s.fillna(0).sum()) if "cpu_s" in runs else 0.0
    text = "\n".join([
        "## Dating an arrival on the unpinned apparatus: error against the time still to go", "",
        f"Protocol: {stamp('precursor', 2)}. Command: `python -m studies.alignment precursor-unpinned --out {out}`. "
        f"K = {d['k']} on the unpinned preset, drives {d['drives']}, fit seeds {d['fit_seeds']}, held-out seeds "
        f"{d['held_seeds']}; precursor `{PRECURSOR}`, level and lead fitted on the fit runs and frozen "
        f"(`precursor_unpinned_constants.json`, sha256 `{read_json(frozen)['sha256'][:16]}…`): level "
        f"{c['level']:g}, lead {c['lead']:.1f} steps at drive 1. Primary statistic: |pred - actual| / (actual - "
        f"t_c). {len(runs) - len(ok)} censored or failed runs. Training CPU {cpu / 60:.1f} core-min.", "",
        markdown_table(v), "", "Held-out runs:", "",
        markdown_table(ok[ok.split == "held-out"][cols].sort_values(["seed", "drive"]).round(3)), ""])
    (out / "precursor_unpinned.md").write_text(text)
    return {"runs": ok, "verdicts": v, "constants": c, "markdown": text}
