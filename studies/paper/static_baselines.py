"""Static baselines (main paper, Section 5) and which published priors are removable.

Two tables, one sweep:

1. **Static table.** Each of the paper's thirteen static methods
   (:data:`circuitfade.model.priors.STATIC_METHODS`: vanilla, NoPE, RoPE, ALiBi,
   learned RPE, DAPE, CoPE, FIRE, Kerple, GPSA, soft_bias, soft_pos_only,
   soft_content_only) is trained with the same backbone (attention-only,
   L=2, d=64, 4 heads), optimizer (AdamW 1e-3, wd 0.01, clip 1, batch 64) and
   budget (3600 steps) on associative recall, Markov induction (p=0.2) and
   linear-regression ICL. The table reports the final held-out accuracy
   (MSE for linreg) as mean ± sd over seeds. The gate path follows each method:

   * a published bias at full strength (gate fixed at 1.0) -> ``forced_const1``;
   * learned-gate methods (GPSA, soft_*) and methods without priors
     (vanilla, NoPE, RoPE) -> ``unforced``.

2. **Removability table** (beyond the paper). A published prior is put in
   the soft-prior slot instead (NoPE backbone, gate starting at 0.5) and
   trained ``unforced`` (gate learned) and along the fade ``fade600->0``
   (0.5 until step 600, linearly to 0 by step 1050, then 0). Its zero-gate
   accuracy (every gate at 0, the prior removed) says whether the model
   still solves the task without it. The published form at gate 1
   (``forced_const1``, from table 1) is listed too.

Runs go through :func:`circuitfade.train.sweep.run_sweep`, so finished runs are
never recomputed and runs whose config coincides with another experiment's
are shared. :func:`step_time_ms` measures the cost of one training step per
prior (``benchmarks/priors.py`` prints it).

    python -m studies.paper static --seeds 3 --out results/static [--quick]   (or: python -m studies.paper.static_baselines ...)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from circuitfade.claims import Outcome
from circuitfade.commands.boundary import check_count
from circuitfade.io import write_csv, write_text
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.model.priors import PRIORS
from circuitfade.tasks import AssocRecall, make_task
from circuitfade.train import RunConfig, TrainConfig
from circuitfade.train.sweep import EXECUTOR_HELP, EXECUTORS, run_dir_for, run_sweep
from circuitfade.train.timing import adamw_step, median_ms, time_steps, torch_threads

__all__ = [
    "TASKS",
    "METHOD_LABELS",
    "PAPER",
    "FADE_PRIORS",
    "method_model",
    "method_path",
    "static_config",
    "removal_config",
    "experiment_configs",
    "tidy_results",
    "static_table",
    "removability_table",
    "to_markdown",
    "step_time_ms",
    "run",
    "main",
]

TASKS: dict[str, dict] = {
    "assoc": {"name": "assoc"},
    "markov": {"name": "markov", "p": 0.2},
    "linreg": {"name": "linreg"},
}
"""Task configs of the experiment (Markov induction at p = 0.2, as in the paper's Section 5)."""

TASK_TITLES = {"assoc": "associative recall", "markov": "Markov induction (p=0.2)", "linreg": "linear-regression ICL"}

METHOD_LABELS: dict[str, str] = {
    "vanilla": "vanilla (learned abs. PE)",
    "nope": "NoPE",
    "rope": "RoPE",
    "alibi": "ALiBi",
    "learned_rpe": "learned RPE (T5 buckets)",
    "dape": "DAPE",
    "cope": "CoPE",
    "fire": "FIRE",
    "kerple": "Kerple (log)",
    "gpsa": "GPSA",
    "soft_bias": "soft_bias",
    "soft_pos_only": "soft_pos_only",
    "soft_content_only": "soft_content_only",
}

PAPER: dict[tuple[str, str], tuple[float, float | None]] = {
    ("assoc", "soft_bias"): (0.794, 0.022),
    ("assoc", "soft_pos_only"): (0.783, None),
    ("assoc", "soft_content_only"): (0.067, None),
}
"""Main paper, Section 5: final associative-recall accuracy (mean, sd or None)."""

FADE_PRIORS: tuple[str, ...] = ("alibi", "fire", "t5")
"""Priors of the removability table by default (``t5`` is the learned relative bias)."""

FULL_FADE = "fade600->0"
QUICK_FADE = "fade50+50->0"  # the paper's fade scaled to a 300-step budget
QUICK_TRAIN = TrainConfig(steps=300, eval_every=100, checkpoint_every=300)


# --------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------
# -- the paper's static baselines ------------------------------------------------------
# SoftPriorConfig overrides for the thirteen static baselines of Section 4. A published
# bias runs at full strength (gate fixed at 1), on a NoPE backbone as in its paper;
# GPSA's gate plays ConViT's learned sigma(lambda) (init lambda = 1). The soft-prior
# variants use the model's defaults (learned gates starting at 0.5).
_FULL = {"gate_init": 1.0, "positional_embedding_type": "none"}
STATIC_METHODS: dict[str, dict] = {
    "vanilla": {"positional_embedding_type": "standard", "priors": ()},
    "nope": {"positional_embedding_type": "none", "priors": ()},
    "rope": {"positional_embedding_type": "rotary", "priors": ()},
    "alibi": {"priors": ("alibi",), "gate_modes": {"alibi": "fixed"}, **_FULL},
    "learned_rpe": {"priors": ("t5",), "gate_modes": {"t5": "fixed"}, **_FULL},
    "dape": {"priors": ("dape",), "gate_modes": {"dape": "fixed"}, **_FULL},
    "cope": {"priors": ("cope",), "gate_modes": {"cope": "fixed"}, **_FULL},
    "fire": {"priors": ("fire",), "gate_modes": {"fire": "fixed"}, **_FULL},
    "kerple": {"priors": ("kerple_log",), "gate_modes": {"kerple_log": "fixed"}, **_FULL},
    "gpsa": {
        "priors": ("gpsa",),
        "gate_modes": {"gpsa": "learned"},
        "gate_init": 1.0 / (1.0 + math.exp(-1.0)),
        "positional_embedding_type": "none",
    },
    "soft_bias": {"positional_embedding_type": "none", "priors": ("pos", "content")},
    "soft_pos_only": {"positional_embedding_type": "none", "priors": ("pos",)},
    "soft_content_only": {"positional_embedding_type": "none", "priors": ("content",)},
}


def method_config(name: str, **overrides) -> SoftPriorConfig:
    """The :class:`SoftPriorConfig` of static baseline ``name`` (a key of :data:`STATIC_METHODS`);
    ``overrides`` replace the method's own values."""
    if name not in STATIC_METHODS:
        raise ValueError(f"unknown static method {name!r}; known methods: {sorted(STATIC_METHODS)}")
    kw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in STATIC_METHODS[name].items()}
    kw.update(overrides)
    return SoftPriorConfig(**kw)


def _json(v):
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Mapping):
        return dict(v)
    return v


def method_model(name: str) -> dict:
    """``RunConfig.model`` overrides for static method ``name``: the entries of
    ``STATIC_METHODS[name]`` that differ from the ``SoftPriorConfig`` defaults, JSON-friendly.

    Leaving defaults out keeps run directories shared with other experiments that
    train the same model (e.g. ``soft_bias`` is the default model, ``model={}``).
    """
    if name not in STATIC_METHODS:
        raise ValueError(f"unknown static method {name!r}; expected one of {list(STATIC_METHODS)}")
    default = SoftPriorConfig()
    out = {}
    for k, v in STATIC_METHODS[name].items():
        if _json(v) != _json(getattr(default, k)):
            out[k] = _json(v)
    return out


def method_path(name: str) -> str:
    """Gate path that makes the gates behave as method ``name`` intends.

    ``forced_const1`` if every prior of the method has a fixed gate (a published
    bias at full strength), else ``unforced`` (learned gates, or no priors at all).
    """
    spec = STATIC_METHODS[name]
    priors = tuple(spec.get("priors", SoftPriorConfig().priors))
    modes = spec.get("gate_modes", {})
    if priors and all(modes.get(p) == "fixed" for p in priors):
        if float(spec.get("gate_init", 0.5)) != 1.0:
            raise ValueError(f"method {name!r}: fixed gates expected at 1.0, got gate_init {spec.get('gate_init')}")
        return "forced_const1"
    return "unforced"


def static_config(name: str, task: str, seed: int, train: TrainConfig) -> RunConfig:
    """Run config of static method ``name`` on ``task`` (a key of :data:`TASKS`)."""
    return RunConfig(path=method_path(name), task=TASKS[task], model=method_model(name), train=train, seed=seed)


def removal_config(prior: str, task: str, path: str, seed: int, train: TrainConfig) -> RunConfig:
    """Prior ``prior`` alone in the soft-prior slot (NoPE backbone, gate from ``path``, starting at 0.5)."""
    if prior not in PRIORS:
        raise ValueError(f"unknown prior {prior!r}; known priors: {sorted(PRIORS)}")
    return RunConfig(path=path, task=TASKS[task], model={"priors": [prior]}, train=train, seed=seed)


def _published_method(prior: str) -> str | None:
    """The static method that is ``prior`` alone at gate 1 (``alibi`` -> ``alibi``, ``t5`` -> ``learned_rpe``)."""
    for name, spec in STATIC_METHODS.items():
        if tuple(spec.get("priors", ())) == (prior,) and method_path(name) == "forced_const1":
            return name
    return None


@dataclass(frozen=True)
class Entry:
    """One row of an experiment table before training: which table, method/prior, config."""

    experiment: str  # "static" | "removability"
    task: str
    method: str  # static method name, or the prior name for removability
    prior: str  # comma-joined prior names ("" for none)
    config: RunConfig


def experiment_configs(
    seeds: Sequence[int],
    *,
    tasks: Sequence[str] = ("assoc", "markov", "linreg"),
    methods: Sequence[str] | None = None,
    fade_priors: Sequence[str] = FADE_PRIORS,
    train: TrainConfig = TrainConfig(),
    fade_path: str = FULL_FADE,
) -> list[Entry]:
    """Every (table, task, method, seed) entry of the experiment, in table order."""
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown task(s) {bad}; expected some of {list(TASKS)}")
    methods = list(STATIC_METHODS) if methods is None else list(methods)
    bad = [m for m in methods if m not in STATIC_METHODS]
    if bad:
        raise ValueError(f"unknown static method(s) {bad}; expected some of {list(STATIC_METHODS)}")
    entries = []
    for task in tasks:
        for m in methods:
            prior = ",".join(STATIC_METHODS[m].get("priors", SoftPriorConfig().priors))
            for s in seeds:
                entries.append(Entry("static", task, m, prior, static_config(m, task, s, train)))
        for p in fade_priors:
            pub = _published_method(p)
            paths = (["forced_const1"] if pub else []) + ["unforced", fade_path]
            for path in paths:
                for s in seeds:
                    cfg = static_config(pub, task, s, train) if path == "forced_const1" else removal_config(
                        p, task, path, s, train)
                    entries.append(Entry("removability", task, p, p, cfg))
    return entries


# --------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------
_NOT_METRICS = {"step", "seconds", "status", "error", "run", "run_dir", "path", "seed", "task"}


def tidy_results(entries: Sequence[Entry], sweep: pd.DataFrame, root: str | Path) -> pd.DataFrame:
    """Long format: one row per (entry, final metric).

    Columns ``experiment, task, method, prior, path, seed, step, status, error, run,
    metric, value``; metrics are the run's final ``metrics.csv`` row (``acc_normal``,
    ``acc_zero``, ``loss_*``, ``mse_*``, ``gate_<prior>``, ``train_loss``, ...).
    A failed run gives one row with ``metric = None`` and its error.
    """
    by_dir = {Path(d).name: row for d, row in zip(sweep["run_dir"], sweep.to_dict("records"))}
    rows = []
    for e in entries:
        key = run_dir_for(root, e.config).name
        r = by_dir.get(key, {"status": "failed", "error": Outcome.NOT_RUN})
        base = {"experiment": e.experiment, "task": e.task, "method": e.method, "prior": e.prior,
                "path": e.config.path, "seed": e.config.seed, "step": r.get("step"), "status": r["status"],
                "error": r.get("error"), "run": key}
        metrics = {k: v for k, v in r.items() if k not in _NOT_METRICS and isinstance(v, (int, float))
                   and not (isinstance(v, float) and math.isnan(v))}
        if r["status"] == "failed" or not metrics:
            rows.append({**base, "metric": None, "value": math.nan})
        for k, v in metrics.items():
            rows.append({**base, "metric": k, "value": float(v)})
    return pd.DataFrame(rows, columns=["experiment", "task", "method", "prior", "path", "seed", "step", "status",
                                       "error", "run", "metric", "value"])


def _metric_kind(task: str) -> str:
    """The task's primary metric column prefix (``Task.primary_metric``): ``acc`` or ``mse``."""

    return make_task(task).primary_metric.column


def _agg(df: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    sel = df[(df.metric == metric) & (df.status != "failed")]
    g = sel.groupby(keys, sort=False)["value"]
    return pd.DataFrame({f"{metric}_mean": g.mean(), f"{metric}_sd": g.std(ddof=1), f"{metric}_n": g.count()})


def static_table(results: pd.DataFrame) -> pd.DataFrame:
    """Static table: per (task, method) mean, sd (over seeds, ddof 1) and count of the final
    normal and zero-gate metric (accuracy, or MSE for linreg), plus the paper's number."""
    st = results[results.experiment == "static"]
    out = []
    for task in dict.fromkeys(st.task):
        t = st[st.task == task]
        kind = _metric_kind(task)
        a = _agg(t, ["method"], f"{kind}_normal").join(_agg(t, ["method"], f"{kind}_zero"), how="left")
        a = a.reindex(list(dict.fromkeys(t.method)))
        for m, r in a.iterrows():
            paper = PAPER.get((task, m), (math.nan, None))
            runs = t[t.method == m]
            out.append({"task": task, "method": m, "label": METHOD_LABELS.get(m, m), "metric": kind,
                        "prior": runs.prior.iloc[0], "path": runs.path.iloc[0],
                        "mean": r[f"{kind}_normal_mean"], "sd": r[f"{kind}_normal_sd"],
                        "n": int(r[f"{kind}_normal_n"]) if not pd.isna(r[f"{kind}_normal_n"]) else 0,
                        "zero_mean": r[f"{kind}_zero_mean"], "zero_sd": r[f"{kind}_zero_sd"],
                        "failed": int(runs.drop_duplicates("seed").status.eq("failed").sum()),
                        "paper_mean": paper[0], "paper_sd": paper[1] if paper[1] is not None else math.nan})
    return pd.DataFrame(out)


def removability_table(results: pd.DataFrame) -> pd.DataFrame:
    """Removability table: per (task, prior, path) mean/sd/n of the final zero-gate and normal
    metric and the mean final gate (``nan`` when the gate is fixed/scheduled at its end value)."""
    rm = results[results.experiment == "removability"]
    out = []
    for (task, prior, path), g in rm.groupby(["task", "method", "path"], sort=False):
        kind = _metric_kind(task)
        ok = g[g.status != "failed"]

        def stat(metric):
            v = ok.loc[ok.metric == metric, "value"]
            return v.mean(), (v.std(ddof=1) if len(v) > 1 else math.nan), len(v)

        zm, zs, n = stat(f"{kind}_zero")
        nm, ns, _ = stat(f"{kind}_normal")
        gm, _, _ = stat(f"gate_{prior}")
        out.append({"task": task, "prior": prior, "path": path, "metric": kind, "zero_mean": zm, "zero_sd": zs,
                    "normal_mean": nm, "normal_sd": ns, "gate": gm, "n": n,
                    "failed": int(g.drop_duplicates("seed").status.eq("failed").sum())})
    return pd.DataFrame(out)


def _pm(mean: float, sd: float) -> str:
    if pd.isna(mean):
        return "—"
    return f"{mean:.3f}" if pd.isna(sd) else f"{mean:.3f} ± {sd:.3f}"


def _config_words(prior: str, path: str, method: str) -> str:
    spec = STATIC_METHODS.get(method, {})
    pe = {"none": "NoPE", "standard": "learned abs. PE", "rotary": "RoPE"}.get(
        spec.get("positional_embedding_type", "none"), spec.get("positional_embedding_type"))
    if not prior:
        return pe
    gate = {"forced_const1": "gate fixed 1", "unforced": "gate learned"}.get(path, path)
    return f"{pe} + {prior.replace(',', '+')}, {gate}"


def to_markdown(results: pd.DataFrame, *, label: str = "", step_ms: pd.DataFrame | None = None,
                train: TrainConfig | None = None) -> str:
    """The experiment's report: static table and removability table per task, and the
    step-time table when ``step_ms`` (from :func:`step_time_ms`) is given."""
    lines = []
    head = "**Static baselines and removable priors**"
    lines += [head + (f" — {label}" if label else ""), ""]
    if train is not None:
        lines += [f"Matched backbone (attention-only, L=2, d_model=64, 4 heads of 16, ctx 32), AdamW lr {train.lr:g}, "
                  f"wd {train.weight_decay:g}, clip {train.grad_clip:g}, batch {train.batch_size}, {train.steps} steps; "
                  f"final metrics on {train.eval_size} held-out sequences; mean ± sd (ddof 1) over seeds.", ""]
    st = static_table(results)
    lines += ["## 1. Static methods", ""]
    for task, t in st.groupby("task", sort=False):
        kind = t.metric.iloc[0]
        name = "accuracy" if kind == "acc" else "MSE (lower is better)"
        lines += [f"### {task}: {TASK_TITLES.get(task, task)} — final {name}" + (f" [{label}]" if label else ""), "",
                  f"| method | config | {kind} | zero-gate {kind} | n seeds | paper |",
                  "|---|---|---|---|---|---|"]
        for _, r in t.iterrows():
            paper = "" if pd.isna(r.paper_mean) else _pm(r.paper_mean, r.paper_sd)
            zero = _pm(r.zero_mean, r.zero_sd) if r.prior else "(no prior)"
            n = f"{r.n}" + (f" ({r.failed} failed)" if r.failed else "")
            lines.append(f"| {r.label} | {_config_words(r.prior, r.path, r.method)} | {_pm(r['mean'], r.sd)} | "
                         f"{zero} | {n} | {paper} |")
        lines.append("")
    rm = removability_table(results)
    if len(rm):
        lines += ["## 2. Removability: published priors as fadeable priors", "",
                  "Zero-gate = every gate set to 0 at evaluation (the prior removed). `forced_const1` is the "
                  "published method (gate fixed at 1, table 1); `unforced` learns the gate from 0.5; the fade "
                  "holds 0.5 then fades the gate to 0 during training. Final gate: mean learned gate "
                  "(— when fixed or scheduled).", ""]
        for task, t in rm.groupby("task", sort=False):
            kind = t.metric.iloc[0]
            lines += [f"### {task}: {TASK_TITLES.get(task, task)}" + (f" [{label}]" if label else ""), "",
                      f"| prior | path | zero-gate {kind} | normal {kind} | final gate | n seeds |",
                      "|---|---|---|---|---|---|"]
            for _, r in t.iterrows():
                gate = "—" if (pd.isna(r.gate) or r.path != "unforced") else f"{r.gate:.3f}"
                n = f"{r.n}" + (f" ({r.failed} failed)" if r.failed else "")
                lines.append(f"| {r.prior} | {r.path} | {_pm(r.zero_mean, r.zero_sd)} | "
                             f"{_pm(r.normal_mean, r.normal_sd)} | {gate} | {n} |")
            lines.append("")
    if step_ms is not None and len(step_ms):
        lines += ["## 3. Cost: ms per training step", "",
                  "One AdamW step incl. backward, fused path, base model, batch 64, one thread; each prior alone "
                  "(gate fixed 1), interleaved rounds, median.", "",
                  "| prior | ms/step | × no prior |", "|---|---|---|"]
        for _, r in step_ms.iterrows():
            lines.append(f"| {r.prior} | {r.ms:.2f} | {r.ratio:.2f} |")
        lines.append("")
    fails = results[results.status == "failed"].drop_duplicates("run")
    if len(fails):
        lines += [f"**{len(fails)} run(s) failed**: " + "; ".join(
            f"{r.run}: {str(r.error).splitlines()[0] if r.error else '?'}" for _, r in fails.iterrows()), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# cost per step
# --------------------------------------------------------------------------------------
def step_time_ms(
    priors: Iterable[str] | None = None,
    *,
    steps: int = 30,
    rounds: int = 5,
    warmup: int = 5,
    threads: int = 1,
    batch_size: int = 64,
) -> pd.DataFrame:
    """Milliseconds per training step for each prior alone and for no prior, side by side.

    Each model is the base model (NoPE) with ``priors=[name]`` and its gate fixed at 1
    (``"none"``: no prior); one step = forward on the fused path (no hooks), the
    associative-recall loss, backward, gradient clipping at 1 and one AdamW step,
    on a fixed batch of ``batch_size``. Rounds are interleaved (each round times
    ``steps`` steps of every model in turn) so machine noise hits all alike; the
    median over rounds is reported. Columns ``prior, ms, ratio`` (ratio to ``"none"``).
    """
    import torch

    priors = [p for p in PRIORS] if priors is None else list(priors)
    task = AssocRecall()
    batch = task.sample(batch_size, torch.Generator().manual_seed(0))
    fns = {}
    with torch_threads(threads):  # models are built under the same thread setting they are timed with
        for name in ["none", *priors]:
            torch.manual_seed(0)
            cfg = SoftPriorConfig(priors=()) if name == "none" else SoftPriorConfig(
                priors=(name,), gate_modes={name: "fixed"}, gate_init=1.0)
            model = SoftPriorTransformer(cfg)
            fns[name] = adamw_step(model, lambda model=model: task.loss(model(batch.model_input), batch))
    ms = median_ms(time_steps(fns, steps=steps, rounds=rounds, warmup=warmup, threads=threads))
    return pd.DataFrame([{"prior": n, "ms": v, "ratio": v / ms["none"]} for n, v in ms.items()])


# --------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------
def run(
    seeds: int | Sequence[int],
    out: str | Path,
    *,
    executor: str = "auto",
    workers: int | None = None,
    quick: bool = False,
    tasks: Sequence[str] = ("assoc", "markov", "linreg"),
    progress: bool = True,
    methods: Sequence[str] | None = None,
    fade_priors: Sequence[str] = FADE_PRIORS,
    train: TrainConfig | None = None,
    fade_path: str | None = None,
    timing: bool = False,
) -> tuple[pd.DataFrame, str]:
    """Train every run of the experiment into ``out/runs`` and return ``(results, markdown)``.

    ``seeds``: a count (seeds ``0 .. n-1``) or explicit seeds. ``quick``: 300 steps
    (eval every 100) and the fade ``fade50+50->0``; tables are labelled as not
    comparable to the paper. Full: :class:`TrainConfig` defaults (3600 steps) and
    ``fade600->0``. ``train`` / ``fade_path`` override either (tests use tiny
    budgets). ``methods`` restricts the static table, ``fade_priors`` the
    removability table. ``timing=True`` measures :func:`step_time_ms` after
    training and adds it to the markdown. ``results`` is :func:`tidy_results`.
    """
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected a positive count or a non-empty list of seeds")
    train = train or (QUICK_TRAIN if quick else TrainConfig())
    fade_path = fade_path or (QUICK_FADE if quick else FULL_FADE)
    label = f"QUICK ({train.steps} steps) — not comparable to the paper" if (quick or train.steps != 3600) else ""
    root = Path(out) / "runs"
    entries = experiment_configs(seeds, tasks=tasks, methods=methods, fade_priors=fade_priors, train=train,
                                 fade_path=fade_path)
    sweep = run_sweep([e.config for e in entries], root, executor=executor, workers=workers, progress=progress)
    results = tidy_results(entries, sweep, root)
    step_ms = step_time_ms() if timing else None
    return results, to_markdown(results, label=label, step_ms=step_ms, train=train)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.paper static",
                                 description="Static baselines (13 methods) and removability of published priors.")
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (0 .. n-1)")
    ap.add_argument("--out", default="results/static", help="output folder (runs in OUT/runs)")
    ap.add_argument("--quick", action="store_true", help="300-step budget; not comparable to the paper")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--methods", nargs="+", default=None, choices=list(STATIC_METHODS))
    ap.add_argument("--fade-priors", nargs="*", default=list(FADE_PRIORS))
    ap.add_argument("--executor", default="auto", choices=list(EXECUTORS),
                    help=EXECUTOR_HELP)
    ap.add_argument("--workers", type=int, default=None, help="parallel training processes (or ensembles), one "
                    "torch thread each (default: one per core, os.cpu_count())")
    ap.add_argument("--timing", action="store_true", help="also measure ms per training step per prior")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    check_count("--workers", args.workers)
    out = Path(args.out)
    results, md = run(args.seeds, out, executor=args.executor, workers=args.workers, quick=args.quick,
                      tasks=tuple(args.tasks), progress=not args.no_progress, methods=args.methods,
                      fade_priors=tuple(args.fade_priors), timing=args.timing)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "static_baselines.csv", results)
    write_text(out / "results.md", md + "\n")
    print(md)
    return 0 if not (results.status == "failed").any() else 1


if __name__ == "__main__":
    sys.exit(main())
