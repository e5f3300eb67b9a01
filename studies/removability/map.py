"""The removability map: where does the training path decide whether a circuit can
be removed?

A grid of cells (model size x task difficulty x budget). In each cell the same
runs: ``forced_zero`` (the baseline: no prior ever), ``fade600->0`` (the prior
helps, then is annealed away) and ``unforced`` (the prior is learned and kept).
The quantity of interest is the zero-gate accuracy margin
``fade600->0 - forced_zero`` with its interval over seeds.

Run configs are the same objects :mod:`studies.paper.protocol` builds, so a
map run shared with ``python -m studies.paper reproduce`` (e.g. the large model's default
cell) is trained once.

``python -m studies.removability`` trains the grid's missing runs (a sweep into ``--runs``),
copies every finished run's ``config.json``, ``metrics.csv`` and ``done.json``
(never its checkpoints) into ``OUT/runs/<run>/`` and builds the tables and the
figure from those copies, so ``python -m studies.removability --tables-only`` rebuilds everything
on a machine without the runs. Definitions and rules (declared, with the grid and how it
was extended, in :mod:`studies.removability.declaration`; both versions were written after map
results existed, and the 10,800-step budget was chosen after the 3,600-step results):

* zero-gate accuracy: the run's final ``acc_zero`` (``eval_size`` = 512 sequences;
  its binomial standard error ``sqrt(p (1 - p) / n)`` with ``n`` = the eval set's
  sequences, an approximation since answer positions within a sequence are pooled);
* margin: per seed, ``acc_zero(fade600->0) - acc_zero(forced_zero)`` (same seed);
  interval: 95% paired Student t over the seeds (``t_{.975, n-1} sd / sqrt(n)`` of the
  per-seed margins, :func:`circuitfade.stats.paired_t_interval`);
* on the plateau: final zero-gate accuracy below :data:`PLATEAU_ACC` = 0.3;
* time to threshold: the first evaluated step with ``acc_zero >= 0.5``
  (:data:`THRESHOLD`; evaluation every 100 steps; NaN = never within the budget);
* classification, version 2 (:func:`classify_interval`, the current one): from the margin's
  95% paired t interval; ``not testable`` where every seed of both paths ends on the plateau;
  ``path decides removability`` if the lower end is >= 0.2, ``margin below 0.2`` if the upper
  end is < 0.2, ``undecided`` otherwise. The grid's claim (some cell where the path decides)
  is judged over the testable cells at once with Bonferroni intervals (:func:`grid_verdict`);
* classification, version 1 (:func:`classify`), over the seeds having both runs:
  ``path decides removability`` if every seed's margin is >= 0.2;
  ``forced_zero better`` if every seed's margin is <= -0.2;
  ``mixed`` if some but not all seeds' margins are >= 0.2;
  ``prior only speeds learning`` if no seed's margin reaches 0.2 but the fade
  reaches 0.5 first (strictly earlier, never = infinitely late) in more than half
  the seeds; otherwise ``no difference``; fewer than 2 paired seeds: ``too few seeds``;
* a cell needs 5 seeds (the issue's rule) when ``|mean margin - 0.2| < 2 SE``.

The continuation signal (:mod:`circuitfade.analysis.continuation`) is measured on
the runs' checkpoints (``--continuation``): at step :data:`SIGNAL_STEP` (600, just
before the fade starts) for ``fade600->0`` and ``forced_zero``, at the last step
for ``unforced``; it predicts the run's final zero-gate accuracy if its Spearman
rank correlation is clearly positive (95% percentile bootstrap over runs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from circuitfade.analysis.continuation import continuation_signal
from circuitfade.commands.boundary import check_count
from circuitfade.io import atomic_write, check_outputs, write_json
from circuitfade.store import open_run
from circuitfade.tasks import eval_set
from circuitfade.train import RunConfig, TrainConfig
from circuitfade.tasks import EVAL_SEED
from circuitfade.train.sweep import EXECUTOR_HELP, EXECUTORS, run_sweep
from circuitfade.viz.tables import markdown_table
from circuitfade.stats import binomial_se, paired_t_interval, spearman, spearman_bootstrap, t_interval
from circuitfade.claims import Claim, Outcome, Verdict, any_of, at_least, grade, verdict_table
from circuitfade.train.rundir import CONFIG_FILE, DONE_FILE, METRICS_FILE, RunDir
from studies.removability.declaration import DECLARATION, DECLARATIONS, PROVENANCE
from studies.removability.figures import export_png, map_figure

_D = DECLARATION.data
MODELS = {k: dict(v) for k, v in _D["models"].items()}  # label -> RunConfig.model overrides (4 heads throughout)
TASKS = {k: dict(v) for k, v in _D["tasks"].items()}  # label -> RunConfig.task
GRID_TASKS = tuple(_D["grid_tasks"])  # grid() default; Markov only where asked for
BASELINE, FADE, UNFORCED = _D["paths"]["baseline"], _D["paths"]["fade"], _D["paths"]["unforced"]
PATHS = (BASELINE, FADE, UNFORCED)
# rough single-core minutes per 3,600-step run on the project's CI-class machine
COST_MIN = {"L2 d64": 1.5, "L2 d128": 2.5, "L4 d64": 3.0, "L4 d128": 8.0}

# ---- rules, declared before any map result was seen (studies/removability/declaration.py)
PLATEAU_ACC = _D["rules"]["plateau_acc"]
THRESHOLD = _D["rules"]["threshold"]
DECIDES_MARGIN = _D["rules"]["decides_margin"]
SIGNAL_STEP = _D["continuation"]["signal_step"]
SIGNAL_PRIMARY = _D["continuation"]["primary"]  # ||P_C g|| / ||g||: scale-free across model sizes
CLASSES_V1 = ("path decides removability", "mixed", "prior only speeds learning", "no difference",
              "forced_zero better", "too few seeds")
NOT_TESTABLE = str(Outcome.NOT_TESTABLE)  # the class of a cell on the plateau is the outcome word itself
CLASSES = ("path decides removability", "undecided", "margin below 0.2", NOT_TESTABLE, "too few seeds")
"""The classes of version 2 (:func:`classify_interval`), with the outcome each means for the cell's
claim ("the path decides removability here"): :data:`CLASS_OUTCOME`."""
CLASS_OUTCOME = {"path decides removability": Outcome.REPRODUCED, "undecided": Outcome.INCONCLUSIVE,
                 "margin below 0.2": Outcome.NOT_REPRODUCED, NOT_TESTABLE: Outcome.NOT_TESTABLE,
                 "too few seeds": Outcome.NOT_RUN}
FAMILY_ALPHA = 0.05
RUN_FILES = (CONFIG_FILE, METRICS_FILE, DONE_FILE)


@dataclass(frozen=True)
class Cell:
    model: str
    task: str
    steps: int = 3600

    def config(self, path: str, seed: int) -> RunConfig:
        train = TrainConfig() if self.steps == 3600 else TrainConfig(steps=self.steps)
        return RunConfig(path=path, task=dict(TASKS[self.task]), model=dict(MODELS[self.model]), train=train, seed=seed)


def grid(models=None, tasks=None, steps=tuple(_D["steps"])) -> list[Cell]:
    models = list(MODELS) if models is None else list(models)
    tasks = list(GRID_TASKS) if tasks is None else list(tasks)
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown map model {name!r}; expected one of {list(MODELS)}")
    for name in tasks:
        if name not in TASKS:
            raise ValueError(f"unknown map task {name!r}; expected one of {list(TASKS)}")
    return [Cell(m, t, s) for s in steps for m in models for t in tasks]


def configs(cells, seeds=tuple(_D["seeds"]), paths=PATHS, unforced_seeds=tuple(_D["unforced_seeds"])) -> list[RunConfig]:
    """Run configs of ``cells``, cheapest cells first (a sweep cut short keeps whole cells)."""
    out = []
    for cell in sorted(cells, key=lambda c: (COST_MIN.get(c.model, 10) * c.steps, list(TASKS).index(c.task))):
        for seed in seeds:
            for p in paths:
                if p == UNFORCED and seed not in unforced_seeds:
                    continue
                out.append(cell.config(p, seed))
    return out


def cell_of(cfg: RunConfig) -> Cell | None:
    """The map cell a run belongs to, or ``None`` if it is not a map run (other
    paths, non-default training settings, data mixes and branches are not)."""
    if cfg.path not in PATHS or cfg.parent or cfg.mix:
        return None
    if cfg.train != TrainConfig(steps=cfg.train.steps):
        return None
    model = next((m for m, d in MODELS.items() if dict(cfg.model) == d), None)
    task = next((t for t, d in TASKS.items() if dict(cfg.task) == d), None)
    if model is None or task is None:
        return None
    return Cell(model, task, cfg.train.steps)


# --------------------------------------------------------------------------- statistics
def time_to_threshold(metrics: pd.DataFrame, column: str = "acc_zero", threshold: float = THRESHOLD) -> float:
    """First ``step`` with ``metrics[column] >= threshold`` (NaN if never)."""
    if column not in metrics:
        raise ValueError(f"metrics: no column {column!r} (have {list(metrics.columns)})")
    hit = metrics.loc[metrics[column] >= threshold, "step"]
    return float(hit.min()) if len(hit) else math.nan


def classify(margins: Sequence[float], fade_earlier: Sequence[bool], *, margin: float = DECIDES_MARGIN) -> str:
    """The cell's class from its per-seed margins and "fade reached 0.5 strictly
    earlier" flags (same seeds), by the declared rule (module docstring). The paper's claim
    ("the path decides removability") holds only for the first class; every other class is
    a failing outcome for it. A NaN margin is an error, never a class."""
    m = [float(x) for x in margins]
    if len(m) != len(fade_earlier):
        raise ValueError("classify: margins and fade_earlier must have one entry per seed")
    if any(math.isnan(x) for x in m):
        raise ValueError(f"classify: margins must be finite, got {m}")
    if len(m) < 2:
        return "too few seeds"
    if all(x >= margin for x in m):
        return "path decides removability"
    if all(x <= -margin for x in m):
        return "forced_zero better"
    if any(x >= margin for x in m):
        return "mixed"
    if sum(bool(e) for e in fade_earlier) > len(m) / 2:
        return "prior only speeds learning"
    return "no difference"


def classify_interval(lo: float, hi: float, n_paired: int, plateau_all: bool, *,
                      margin: float = DECIDES_MARGIN) -> str:
    """Version 2's class of a cell from its margin interval ``[lo, hi]`` (95% paired t over
    ``n_paired`` seeds): ``too few seeds`` (n < 2), ``not testable`` (``plateau_all``: every seed of
    both paths ended on the plateau, so the cell cannot show removability either way), ``path
    decides removability`` (lo ≥ margin), ``margin below 0.2`` (hi < margin), else ``undecided``."""
    if n_paired < 2:
        return "too few seeds"
    if plateau_all:
        return NOT_TESTABLE
    if any(math.isnan(float(x)) for x in (lo, hi)):
        raise ValueError(f"classify_interval: the interval of {n_paired} paired seeds must be finite, got [{lo}, {hi}]")
    decides = at_least(lo, hi, margin)
    return {True: "path decides removability", False: "margin below 0.2", None: "undecided"}[decides]


def grid_verdict(cells: pd.DataFrame, *, alpha: float = FAMILY_ALPHA, margin: float = DECIDES_MARGIN) -> Verdict:
    """The grid's claim "the path decides removability in some cell", over the testable cells at
    once: each cell's margin with a Bonferroni interval (level ``1 − alpha / m``, ``m`` testable
    cells; columns ``bonf_lo``/``bonf_hi``); reproduced if some lower end is ≥ ``margin``, not
    reproduced if every upper end is < ``margin``, inconclusive otherwise; not testable when no
    cell is testable."""
    claim = Claim("the path decides removability in some cell of the grid", rule=(
        f"some cell's margin ≥ {margin} (Bonferroni over the testable cells; fails if every cell's "
        f"Bonferroni interval lies below {margin})"), study="the main paper's contrast, per model and format",
        statistic="fade600->0 − forced_zero zero-gate accuracy per cell", fails_if=f"every testable cell below {margin}")
    test = cells[~cells["class"].isin([NOT_TESTABLE, "too few seeds"])] if len(cells) else cells
    if not len(test):
        return Verdict(claim, "—", Outcome.NOT_TESTABLE, provenance=PROVENANCE[DECLARATION.version])
    lows = [at_least(lo, hi, margin) for lo, hi in zip(test.bonf_lo, test.bonf_hi)]
    decided = any_of(*lows)
    outcome = grade(decided, decided)
    ours = (f"{len(test)} testable cells, Bonferroni level {1 - alpha / len(test):.4f}: "
            f"{sum(x is True for x in lows)} with lower end ≥ {margin}, {sum(x is False for x in lows)} with upper "
            f"end < {margin}, {sum(x is None for x in lows)} undecided")
    return Verdict(claim, ours, outcome, provenance=PROVENANCE[DECLARATION.version],
                   seeds_run=int(test.n_paired.min()), seeds_declared=len(_D["seeds"]))


def _earlier(t_fade: float, t_base: float) -> bool:
    a = math.inf if math.isnan(t_fade) else t_fade
    b = math.inf if math.isnan(t_base) else t_base
    return a < b


# --------------------------------------------------------------------------- run files
def _run_dirs(root: Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and all((d / f).is_file() for f in RUN_FILES))


def _read_config(d: Path) -> RunConfig:
    return RunDir(d).read_config()


def persist(roots: Iterable[str | Path], dest: str | Path, *, timing: pd.DataFrame | None = None,
            force: bool = False) -> dict:
    """Copy every finished map run under ``roots`` (``config.json``, ``metrics.csv``,
    ``done.json``; never checkpoints) into ``dest/<run>/``, plus ``timing.json``
    (``seconds`` from ``timing`` - the sweep's result rows, columns ``run, seconds`` and, from
    the ensemble executor, ``ensemble``: a member's seconds are its ensemble's divided by the
    number of members, its share of the core time - or else from the files' times: ``done.json`` minus ``config.json`` modification
    time, i.e. the run's own wall time, resumes included).

    A run already in ``dest`` with different files is kept (counted in ``kept``)
    unless ``force``. Returns ``{"copied", "same", "kept", "skipped"}`` counts
    (``skipped``: run directories that are not map runs).
    """
    dest = Path(dest)
    counts = {"copied": 0, "same": 0, "kept": 0, "skipped": 0}
    sweep_sec = {}
    if timing is not None and len(timing):
        ok = timing[timing.get("status", pd.Series("done", index=timing.index)).astype(str) == "done"]
        for r in ok.itertuples():
            if pd.isna(r.seconds):
                continue
            n = getattr(r, "ensemble", 1)
            n = 1 if pd.isna(n) else int(n)
            sweep_sec[str(r.run)] = (float(r.seconds) / n, "sweep" if n == 1 else f"sweep (1/{n} of an ensemble)")
    for root in roots:
        for d in _run_dirs(Path(root)):
            if cell_of(_read_config(d)) is None:
                counts["skipped"] += 1
                continue
            target = dest / d.name
            same = target.is_dir() and all(
                (target / f).is_file() and (target / f).read_bytes() == (d / f).read_bytes() for f in RUN_FILES)
            if same:
                counts["same"] += 1
            elif target.exists() and not force:
                counts["kept"] += 1
                continue
            else:
                target.mkdir(parents=True, exist_ok=True)
                for f in RUN_FILES:
                    atomic_write(target / f, (d / f).read_bytes())
                counts["copied"] += 1
            tfile = target / "timing.json"
            old = json.loads(tfile.read_text()) if tfile.is_file() else None
            start, end = RunDir(d).config_file.stat().st_mtime, RunDir(d).done_file.stat().st_mtime
            if d.name in sweep_sec:
                sec, source = sweep_sec[d.name]
                new = {"seconds": sec, "source": source, "start": start, "end": end}
            else:
                new = {"seconds": end - start, "source": "file times", "start": start, "end": end}
            from_sweep = new["source"].startswith("sweep")
            if old is None or (not str(old.get("source", "")).startswith("sweep") and from_sweep) or (force and not same):
                write_json(tfile, new)
    return counts


def collect(root: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """One row per finished map run under ``root`` and a list of problems (runs that
    did not finish their budget or have non-finite accuracy: reported, never tabulated).

    Columns: ``run, model, task, steps, path, seed, acc_zero, acc_normal, se_zero,
    n_eval, acc_zero_step0, t50, plateau, seconds, seconds_source, start, end``.
    """
    rows, problems = [], []
    for d in _run_dirs(Path(root)):
        cfg = _read_config(d)
        cell = cell_of(cfg)
        if cell is None:
            continue
        done = RunDir(d).read_done()
        final = done.get("final", {})
        metrics = RunDir(d).read_metrics()
        acc = float(final.get("acc_zero", math.nan))
        if int(done.get("step", -1)) != cfg.train.steps or not math.isfinite(acc):
            problems.append(f"{d.name}: done.json step {done.get('step')} (budget {cfg.train.steps}), acc_zero {acc}")
            continue
        tim = json.loads((d / "timing.json").read_text()) if (d / "timing.json").is_file() else {}
        step0 = metrics.loc[metrics.step == 0, "acc_zero"]
        n = cfg.train.eval_size
        rows.append({
            "run": d.name, "model": cell.model, "task": cell.task, "steps": cell.steps, "path": cfg.path,
            "seed": cfg.seed, "acc_zero": acc, "acc_normal": float(final.get("acc_normal", math.nan)),
            "se_zero": binomial_se(acc, n), "n_eval": n,
            "acc_zero_step0": float(step0.iloc[0]) if len(step0) else math.nan,
            "t50": time_to_threshold(metrics), "plateau": bool(acc < PLATEAU_ACC),
            "seconds": float(tim.get("seconds", math.nan)), "seconds_source": tim.get("source", "unknown"),
            "start": float(tim.get("start", math.nan)), "end": float(tim.get("end", math.nan)),
        })
    cols = ["run", "model", "task", "steps", "path", "seed", "acc_zero", "acc_normal", "se_zero", "n_eval",
            "acc_zero_step0", "t50", "plateau", "seconds", "seconds_source", "start", "end"]
    df = pd.DataFrame(rows, columns=cols)
    order = {m: i for i, m in enumerate(MODELS)}, {t: i for i, t in enumerate(TASKS)}, {p: i for i, p in enumerate(PATHS)}
    if len(df):
        df = df.sort_values(["model", "task", "steps", "path", "seed"],
                            key=lambda s: s.map(order[0]) if s.name == "model" else (
                                s.map(order[1]) if s.name == "task" else (s.map(order[2]) if s.name == "path" else s)))
    return df.reset_index(drop=True), problems


def _fmt_list(values, spec="{:.3f}") -> str:
    return ", ".join("—" if (isinstance(v, float) and math.isnan(v)) else spec.format(v) for v in values)


def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: per-path zero-gate accuracy (mean, sd, n, per-seed), the margin
    with its t-interval, plateau fractions, times to threshold and the class."""
    rows, pairs = [], []
    for (model, task, steps), g in runs.groupby(["model", "task", "steps"], sort=False):
        row = {"model": model, "task": task, "steps": int(steps)}
        by = {p: g[g.path == p].sort_values("seed") for p in PATHS}
        for p, key in ((BASELINE, "fz"), (FADE, "fade"), (UNFORCED, "unforced")):
            s = by[p]
            row[f"{key}_n"] = len(s)
            row[f"{key}_mean"] = float(s.acc_zero.mean()) if len(s) else math.nan
            row[f"{key}_sd"] = float(s.acc_zero.std(ddof=1)) if len(s) > 1 else math.nan
            row[f"{key}_seeds"] = _fmt_list(s.acc_zero.tolist())
            row[f"{key}_plateau_frac"] = float(s.plateau.mean()) if len(s) else math.nan
            row[f"{key}_t50_median"] = float(s.t50.median()) if len(s) and s.t50.notna().sum() * 2 > len(s) else math.nan
            row[f"{key}_t50_seeds"] = _fmt_list(s.t50.tolist(), "{:.0f}")
        paired = by[FADE].merge(by[BASELINE], on="seed", suffixes=("_fade", "_fz"))
        margins = (paired.acc_zero_fade - paired.acc_zero_fz).tolist()
        earlier = [_earlier(a, b) for a, b in zip(paired.t50_fade, paired.t50_fz)]
        diff = paired_t_interval(paired.acc_zero_fade, paired.acc_zero_fz)  # the one margin interval
        mean, lo, hi, se = diff.estimate, diff.lo, diff.hi, diff.se
        pairs.append((paired.acc_zero_fade.to_numpy(), paired.acc_zero_fz.to_numpy()))
        plateau_all = bool(len(paired)) and bool(paired.plateau_fade.all() and paired.plateau_fz.all())
        row.update({
            "n_paired": len(margins), "paired_seeds": " ".join(str(s) for s in paired.seed),
            "margin_mean": mean, "margin_lo": lo, "margin_hi": hi, "margin_se": se,
            "margin_min": min(margins) if margins else math.nan, "margin_seeds": _fmt_list(margins, "{:+.3f}"),
            "n_seeds_margin_ge_0.2": sum(m >= DECIDES_MARGIN for m in margins),
            "n_fade_earlier": sum(earlier),
            "plateau_all": plateau_all,
            "class": classify_interval(lo, hi, len(margins), plateau_all),
            "class_v1": classify(margins, earlier),
            "needs_5_seeds": bool(len(margins) < 5 and not math.isnan(se) and abs(mean - DECIDES_MARGIN) < 2 * se),
        })
        row["outcome"] = str(CLASS_OUTCOME[row["class"]])
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):  # Bonferroni over the testable cells (the family the grid's claim is judged on)
        testable = ~df["class"].isin([NOT_TESTABLE, "too few seeds"])
        level = 1 - FAMILY_ALPHA / max(int(testable.sum()), 1)
        bonf = [paired_t_interval(a, b, level) if t else None for (a, b), t in zip(pairs, testable)]
        df["bonf_lo"] = [math.nan if d is None else d.lo for d in bonf]
        df["bonf_hi"] = [math.nan if d is None else d.hi for d in bonf]
    return df


def wall_time(runs: pd.DataFrame) -> dict:
    """``{"runs", "core_seconds", "span_seconds", "sources"}``: the sum of per-run
    seconds (each run's own wall time, one process each; an ensemble member's share of its
    ensemble's) and the span from the first run's start to the last
    run's end (the map's wall time with the workers it had)."""
    ok = runs.dropna(subset=["seconds"])
    span = float(runs.end.max() - runs.start.min()) if runs.start.notna().any() else math.nan
    return {"runs": int(len(runs)), "core_seconds": float(ok.seconds.sum()), "span_seconds": span,
            "sources": ", ".join(f"{k}: {v}" for k, v in runs.seconds_source.value_counts().items())}


# --------------------------------------------------------------------------- continuation
def continuation_rows(runs: pd.DataFrame, roots: Sequence[str | Path], *, k: int = 2, n_random: int = 200,
                      n: int = 512, progress: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """The continuation signal of every map run whose checkpoints are under ``roots``
    (``<root>/<run>/checkpoints``): at :data:`SIGNAL_STEP` for fade600->0 and
    forced_zero, at the last checkpoint for unforced. Circuit = the ``k`` heads with
    the largest mean-ablation accuracy drop under the gates the run had at that step
    (``"normal"``); gradient of the zero-gate loss on ``eval_set(task, n)``
    with the trainer's eval seed (``n`` = 512: the run's own eval set).
    Returns the rows and the runs without checkpoints (listed, not guessed)."""
    from tqdm import tqdm

    rows, missing = [], []
    it = tqdm(list(runs.itertuples()), desc="continuation signal", unit="run", disable=not progress)
    for r in it:
        d = next((Path(root) / r.run for root in roots if RunDir(Path(root) / r.run).checkpoints_dir.is_dir()), None)
        if d is None:
            missing.append(r.run)
            continue
        series = open_run(d)
        step = series.steps[-1] if r.path == UNFORCED else SIGNAL_STEP
        if step not in series:
            missing.append(f"{r.run} (no step {step})")
            continue
        task = series.task
        batch = eval_set(task, n, EVAL_SEED)
        sig = continuation_signal(series[step], batch, task, k=k, gates="zero", importance_gates="normal",
                                  n_random=n_random, seed=0)
        rows.append({"run": r.run, "model": r.model, "task": r.task, "steps": r.steps, "path": r.path,
                     "seed": r.seed, "signal_step": int(step), **sig, "acc_zero_final": r.acc_zero})
    return pd.DataFrame(rows), missing


def continuation_tests(sig: pd.DataFrame, cells: pd.DataFrame, *, primary: str = SIGNAL_PRIMARY) -> pd.DataFrame:
    """Spearman rho (bootstrap 95%) of the signal against the final zero-gate accuracy:
    over fade runs (signal at step 600), over all runs, and over cells (mean fade
    signal vs the cell's mean margin). One row per (budget, set, statistic), each budget
    on its own: a run trained for 10,800 steps shares its step-600 signal with the
    3,600-step run of the same seed, so pooling budgets would count one signal twice.
    The primary test is on the smallest budget."""
    out = []
    stats = [primary] + [s for s in ("circuit_norm", "share_ratio") if s != primary]
    cells = cells.set_index(["model", "task", "steps"]) if len(cells) else cells
    budgets = sorted(set(sig.steps)) if "steps" in sig and len(sig) else [None]
    for steps in budgets:
        at = sig if steps is None else sig[sig.steps == steps]
        for stat in stats:
            if stat not in at:
                continue
            for name, sub in (("fade600->0 runs", at[at.path == FADE]), ("all runs", at),
                              ("forced_zero runs", at[at.path == BASELINE])):
                res = spearman_bootstrap(sub[stat], sub.acc_zero_final)
                out.append({"steps": steps, "set": name, "statistic": stat, "target": "final zero-gate acc", **res,
                            "primary": stat == primary and name == "fade600->0 runs" and steps == budgets[0]})
            fade = at[at.path == FADE]
            if len(fade) and len(cells):
                per = fade.groupby(["model", "task", "steps"])[stat].mean()
                margin = cells.reindex(per.index)["margin_mean"]
                res = spearman_bootstrap(per.to_numpy(), margin.to_numpy())
                out.append({"steps": steps, "set": "cells (mean fade signal)", "statistic": stat,
                            "target": "cell margin", **res, "primary": False})
    return pd.DataFrame(out)


def separation(sig: pd.DataFrame, cells: pd.DataFrame, *, stat: str = SIGNAL_PRIMARY,
               positive: Sequence[str] = ("path decides removability", "mixed")) -> dict:
    """Does the fade runs' mean signal (per cell) separate the cells where the path
    matters (class in ``positive``) from the rest? ``{"auc", "n_pos", "n_neg", "per_class"}``:
    ``auc`` = fraction of (positive, other) cell pairs in which the positive cell has the
    larger mean signal (ties count 1/2; NaN when either group is empty); ``per_class`` =
    rows ``class, cells, mean, min, max`` of the per-cell mean signal."""
    fade = sig[sig.path == FADE]
    if not len(fade) or not len(cells) or stat not in fade:
        return {"auc": math.nan, "n_pos": 0, "n_neg": 0, "per_class": pd.DataFrame()}
    per = fade.groupby(["model", "task", "steps"])[stat].mean().rename("signal").reset_index()
    col = "class_v1" if "class_v1" in cells else "class"  # the continuation test was set up on version 1's classes
    per = per.merge(cells[["model", "task", "steps", col]].rename(columns={col: "class"}), on=["model", "task", "steps"])
    pos = per[per["class"].isin(positive)].signal.to_numpy()
    neg = per[~per["class"].isin(positive)].signal.to_numpy()
    auc = float(np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])) if len(pos) and len(neg) else math.nan
    table = per.groupby("class").signal.agg(cells="count", mean="mean", min="min", max="max").reset_index()
    return {"auc": auc, "n_pos": int(len(pos)), "n_neg": int(len(neg)), "per_class": table}


# --------------------------------------------------------------------------- report
def _md(df: pd.DataFrame) -> str:

    return markdown_table(df)


def _r(x, spec="{:.3f}"):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


_RULES_TEXT_V2 = (
    "Rules of version 2 (declared after the results): margin = fade600->0 − forced_zero final zero-gate accuracy, "
    "paired by seed, 95% paired Student t interval over the seeds; a cell is *not testable* when every seed of both "
    f"paths ends on the plateau (zero-gate acc < {PLATEAU_ACC}); *path decides removability* when the interval's "
    f"lower end is ≥ {DECIDES_MARGIN}, *margin below 0.2* when its upper end is < {DECIDES_MARGIN}, *undecided* "
    "otherwise. Each class is a claim about one cell at 95%; the grid's claim is judged over all testable cells at "
    "once with Bonferroni intervals (level 1 − 0.05 / testable cells). *fade first*: seeds in which the fade "
    f"reaches {THRESHOLD} zero-gate accuracy strictly before forced_zero (descriptive).")

_RULES_TEXT = (
    "Rules of version 1 (the *class v1* column; the 10,800-step budget was added after the "
    "3,600-step results, see the declaration's extensions): margin = "
    "fade600->0 − forced_zero final zero-gate accuracy, paired by seed; interval: 95% paired Student t over "
    f"the seeds; plateau: final zero-gate acc < {PLATEAU_ACC}; t50: first evaluated step (every 100) "
    f"with zero-gate acc ≥ {THRESHOLD} (— = never); class: 'path decides removability' = every seed's "
    f"margin ≥ {DECIDES_MARGIN}; 'mixed' = some seeds ≥ {DECIDES_MARGIN}, not all; 'prior only speeds "
    f"learning' = no seed ≥ {DECIDES_MARGIN} but the fade reaches {THRESHOLD} strictly first in more than "
    "half the seeds; else 'no difference' ('forced_zero better' = every seed ≤ −0.2). Per-run binomial "
    "SE of a zero-gate accuracy (n = 512 eval sequences) is ≤ 0.022.")


def _cells_sections(cells: pd.DataFrame) -> list[str]:
    """The verdict section (the grid's claim and the class counts) and the cells table."""
    lines: list[str] = []
    v = grid_verdict(cells)
    counts = cells["class"].value_counts()
    lines += ["## Verdict", "",
              f"{len(cells)} cells: " + ", ".join(f"{counts[c]} {c}" for c in CLASSES if c in counts)
              + f" (per cell, 95%). The grid's claim, over the testable cells at once: **{v.word}**.", "",
              _md(verdict_table([v], columns={"ours": "ours"}).drop(columns=["study"])), "", _RULES_TEXT_V2, ""]
    show = cells.assign(
        forced_zero=[f"{_r(m, '{:.2f}')} (n={n})" for m, n in zip(cells.fz_mean, cells.fz_n)],
        fade=[f"{_r(m, '{:.2f}')} (n={n})" for m, n in zip(cells.fade_mean, cells.fade_n)],
        margin=[f"{_r(m, '{:+.3f}')} [{_r(a, '{:+.3f}')}, {_r(b, '{:+.3f}')}]"
                for m, a, b in zip(cells.margin_mean, cells.margin_lo, cells.margin_hi)],
        bonferroni=[f"[{_r(a, '{:+.2f}')}, {_r(b, '{:+.2f}')}]" for a, b in zip(cells.bonf_lo, cells.bonf_hi)],
        plateau=[f"{_r(a, '{:.2f}')} / {_r(b, '{:.2f}')}" for a, b in zip(cells.fz_plateau_frac,
                                                                         cells.fade_plateau_frac)],
        fade_first=[f"{a} of {n}" for a, n in zip(cells.n_fade_earlier, cells.n_paired)],
    ).rename(columns={"class_v1": "class v1", "fade_first": "fade first", "plateau": "plateau fz / fade",
                      "bonferroni": "Bonferroni interval"})
    lines += ["## Cells (zero-gate accuracy at the end of the budget)", "",
              _md(show[["model", "task", "steps", "forced_zero", "fade", "margin", "Bonferroni interval",
                        "plateau fz / fade", "fade first", "class", "class v1"]]), "",
              "forced_zero, fade: mean zero-gate accuracy over seeds; margin: mean [95% paired t]; plateau: "
              f"fraction of seeds with zero-gate acc < {PLATEAU_ACC}; per-seed values, standard deviations and "
              "times to threshold are in map_cells.csv.", ""]
    for cls in CLASSES:
        sub = cells[cells["class"] == cls]
        if len(sub):
            lines.append(f"- **{cls}**: " + "; ".join(
                f"{r.model} × {r.task}, {r.steps} steps" for r in sub.itertuples()))
    lines.append("")
    return lines


def results_markdown(runs: pd.DataFrame, cells: pd.DataFrame, problems: list[str], *, sig: pd.DataFrame | None = None,
                     tests: pd.DataFrame | None = None, missing_ckpt: Sequence[str] = (), expected: int | None = None,
                     command: str = "") -> str:
    w = wall_time(runs) if len(runs) else {"runs": 0, "core_seconds": math.nan, "span_seconds": math.nan, "sources": ""}
    lines = ["<!-- written by python -m studies.removability; rebuilt by `python -m studies.removability --tables-only` -->",
             ""]
    if len(cells):
        lines += _cells_sections(cells)
    if len(runs):
        lines += ["## Runs", "", _md(runs[["run", "model", "task", "path", "seed", "acc_zero", "se_zero",
                                           "acc_normal", "t50", "plateau", "seconds"]]), ""]
    if problems:
        lines += ["## Runs not tabulated (unfinished or invalid)", ""] + [f"- {p}" for p in problems] + [""]
    if sig is not None and len(sig):
        lines += ["## Continuation signal (Section 3.3)", "",
                  f"Signal at step {SIGNAL_STEP} (fade600->0, forced_zero; before the fade starts) or at the end "
                  "(unforced): zero-gate loss gradient on the run's eval set (512), projected onto the 2 heads with "
                  "the largest mean-ablation accuracy drop under the run's gates at that step. "
                  f"Primary statistic: `{SIGNAL_PRIMARY}` = ||P_C g|| / ||g||; primary test: its Spearman rho with "
                  "the final zero-gate accuracy over fade600->0 runs (95% percentile bootstrap over runs, 2000 "
                  "resamples). Other rows are secondary (several statistics were looked at: read them as "
                  "exploratory).", ""]
        if tests is not None and len(tests):
            lines += [_md(tests), ""]
        agg = sig.groupby(["model", "task", "steps", "path"], sort=False).agg(
            n=("run", "count"), circuit_share=("circuit_share", "mean"), share_ratio=("share_ratio", "mean"),
            circuit_norm=("circuit_norm", "mean"), acc_zero_final=("acc_zero_final", "mean")).reset_index()
        lines += ["Per cell and path (means over seeds):", "", _md(agg), ""]
        sep = separation(sig, cells)
        if len(sep["per_class"]):
            lines += [f"Separation of the cells where the path matters (version 1 classes 'path decides removability' or 'mixed', "
                      f"{sep['n_pos']} cells) from the others ({sep['n_neg']} cells) by the cell-mean fade signal "
                      f"(`{SIGNAL_PRIMARY}` at step {SIGNAL_STEP}): AUC {_r(sep['auc'], '{:.2f}')} "
                      "(1 = every such cell above every other; NaN = a group is empty).", "",
                      _md(sep["per_class"]), ""]
    if missing_ckpt:
        lines += [f"Runs without checkpoints for the continuation signal: {len(missing_ckpt)}.", ""]
    status = (f"{len(runs)} finished runs" + (f" (the default grid, 3 seeds x 2 tasks x 4 models, has {expected})"
                                              if expected else "") + f"; {len(cells)} cells")
    lines += ["## Provenance", "",
              f"- Declaration: {DECLARATION.stamp()} (`studies/removability/declaration.py`: grid, seeds, extensions, "
              f"rules), {PROVENANCE[DECLARATION.version]}; version 1 "
              f"({DECLARATIONS[1].stamp()}) was also {PROVENANCE[1]}.",
              f"- Command: `{command}`" if command else "- Command: —",
              f"- Status: {status}."]
    if len(runs):
        per_model = runs.groupby("model", sort=False).seconds.mean() / 60
        shared = "ensemble" in w["sources"]
        lines += [f"- Wall time: {w['core_seconds'] / 60:.1f} run-minutes in total (the sum of each "
                  f"run's own wall time{', an ensemble member counting its share of its ensemble' if shared else ''}; "
                  f"sources: {w['sources']}); first start to last end {w['span_seconds'] / 60:.1f} min; mean "
                  "minutes per run: " + ", ".join(f"{m} {v:.1f}" for m, v in per_model.items()) + "."]
    lines += ["", _RULES_TEXT, ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command
OUTPUTS = ("map.csv", "map_cells.csv", "verdicts.csv", "results.md")  # always written; figures and continuation files as asked


def verdict_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """``verdicts.csv``: the grid's claim (id ``grid``) and one claim per cell (id
    ``model|task|steps``), each with its outcome word, seeds run of declared and provenance."""
    cols = ["id", "claim", "ours", "rule", "verdict", "seeds run", "provenance"]
    if not len(cells):
        return pd.DataFrame(columns=cols)
    g = grid_verdict(cells)
    rows = [{"id": "grid", "claim": g.claim.name, "ours": g.ours, "rule": g.claim.rule, "verdict": g.word,
             "seeds run": "—" if g.seeds_run is None else f"{g.seeds_run} of {g.seeds_declared}",
             "provenance": str(g.provenance)}]
    for r in cells.to_dict("records"):
        rows.append({"id": f"{r['model']}|{r['task']}|{r['steps']}",
                     "claim": f"the path decides removability in {r['model']} × {r['task']} at {r['steps']} steps",
                     "ours": f"{_r(r['margin_mean'], '{:+.3f}')} [{_r(r['margin_lo'], '{:+.3f}')}, "
                             f"{_r(r['margin_hi'], '{:+.3f}')}] ({r['class']})",
                     "rule": f"95% paired t interval of the margin ≥ {DECIDES_MARGIN}; not testable on the plateau",
                     "verdict": r["outcome"], "seeds run": f"{r['n_paired']} of {max(r['n_paired'], len(_D['seeds']))}",
                     "provenance": str(PROVENANCE[DECLARATION.version])})
    return pd.DataFrame(rows, columns=cols)


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, df.to_csv(index=False).encode())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m studies.removability", description="The removability map: train the grid's "
                                 "missing runs, persist their configs/metrics, write tables and the figure.")
    ap.add_argument("--runs", action="append", default=None, metavar="DIR",
                    help="sweep root(s) holding run directories (default: results/removability/sweep); the first is trained into")
    ap.add_argument("--out", default="results/removability", help="output folder (default results/removability)")
    ap.add_argument("--tables-only", action="store_true", help="do not train: tabulate the runs already persisted "
                    "in OUT/runs (plus finished runs under --runs)")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), help="models (default: all)")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS),
                    help=f"tasks (default: {', '.join(GRID_TASKS)})")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(_D["seeds"]), help=f"seeds (default {_D['seeds']})")
    ap.add_argument("--unforced-seeds", type=int, nargs="*", default=list(_D["unforced_seeds"]),
                    help="seeds with an unforced run (default 0; none: give the flag alone)")
    ap.add_argument("--steps", type=int, nargs="+", default=list(_D["steps"]), help=f"budgets (default {_D['steps']})")
    ap.add_argument("--workers", type=int, help="parallel training runs (default: one per core, os.cpu_count())")
    ap.add_argument("--executor", choices=list(EXECUTORS), default="auto",
                    help=EXECUTOR_HELP)
    ap.add_argument("--timing", help="the sweep's result CSV (columns run, seconds, status) for per-run seconds")
    ap.add_argument("--continuation", action="store_true", help="also measure the continuation signal on the "
                    "runs' checkpoints (under --runs) and test it as a predictor")
    ap.add_argument("--force", action="store_true", help="overwrite outputs or persisted runs that differ")
    ap.add_argument("--no-figure", action="store_true")
    return ap


def _figures(cells: pd.DataFrame, runs: pd.DataFrame, out: Path) -> None:
    """One map per budget: ``map.html/png`` for the first, ``map_<steps>`` for the others."""
    budgets = sorted(set(cells.steps))
    for steps in budgets:
        name = "map" if steps == budgets[0] else f"map_{steps}"
        sub_c, sub_r = cells[cells.steps == steps], runs[runs.steps == steps]
        tasks = [t for t in TASKS if t in GRID_TASKS or t in set(sub_c.task)]
        fig = map_figure(sub_c, sub_r, models=list(MODELS), tasks=tasks,
                         title=f"Removability map ({steps} steps): zero-gate accuracy margin fade600->0 − "
                               f"forced_zero (dots: seeds; n = {', '.join(map(str, sorted(set(sub_c.n_paired))))}"
                               " per cell)")
        atomic_write(out / f"{name}.html", fig.to_html(include_plotlyjs="cdn").encode())
        why = export_png(fig, out / f"{name}.png")
        if why:
            print(f"PNG export skipped: {why}")


def _continuation(ns, runs: pd.DataFrame, cells: pd.DataFrame, roots: list[Path], out: Path):
    """The continuation signal: measured now (``--continuation``, needs checkpoints) or read back."""
    sig = tests = None
    missing: list[str] = []
    if ns.continuation and len(runs):
        sig, missing = continuation_rows(runs, roots)
        _write_csv(sig, out / "continuation.csv")
        tests = continuation_tests(sig, cells) if len(sig) else pd.DataFrame()
        _write_csv(tests, out / "continuation_tests.csv")
    elif (out / "continuation.csv").is_file() and len(runs):
        sig = pd.read_csv(out / "continuation.csv")  # measured earlier (needs checkpoints); keep reporting it
        tests = continuation_tests(sig, cells) if len(sig) else pd.DataFrame()
    return sig, tests, missing


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    check_count("--workers", ns.workers)
    roots = [Path(r) for r in (ns.runs or ["results/removability/sweep"])]
    out = Path(ns.out)
    outputs = [out / n for n in OUTPUTS]
    if not ns.no_figure:
        outputs += [out / "map.html", out / "map.png"]
    if ns.continuation:
        outputs += [out / "continuation.csv", out / "continuation_tests.csv"]
    check_outputs(outputs, force=ns.force)  # before any training: existing outputs need --force
    cells_grid = grid(ns.models, ns.tasks, tuple(ns.steps))
    cfgs = configs(cells_grid, seeds=tuple(ns.seeds), unforced_seeds=tuple(ns.unforced_seeds))
    timing = None
    if not ns.tables_only:

        print(f"python -m studies.removability: {len(cfgs)} runs over {len(cells_grid)} cells into {roots[0]}/ (finished runs reused)")
        timing = run_sweep(cfgs, roots[0], workers=ns.workers, executor=ns.executor)
        failed = timing[timing.status == "failed"]
        for r in failed.itertuples():
            print(f"FAILED {r.run}: {str(r.error).splitlines()[0] if r.error else 'unknown'}", file=sys.stderr)
    if ns.timing:
        timing = pd.read_csv(ns.timing)
    out.mkdir(parents=True, exist_ok=True)
    counts = persist(roots, out / "runs", timing=timing, force=ns.force)
    print(f"persisted runs into {out / 'runs'}: {counts}")
    runs, problems = collect(out / "runs")
    cells = cell_table(runs) if len(runs) else pd.DataFrame()
    _write_csv(runs, out / "map.csv")
    _write_csv(cells, out / "map_cells.csv")
    _write_csv(verdict_rows(cells), out / "verdicts.csv")
    sig, tests, missing = _continuation(ns, runs, cells, roots, out)
    command = "python -m studies.removability " + " ".join(argv if argv is not None else sys.argv[1:])
    md = results_markdown(runs, cells, problems, sig=sig, tests=tests, missing_ckpt=missing,
                          expected=len(configs(grid())), command=command.strip())
    atomic_write(out / "results.md", (md + "\n").encode())
    if not ns.no_figure and len(cells):
        _figures(cells, runs, out)
    print(md)
    for p in problems:
        print(f"not tabulated: {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
