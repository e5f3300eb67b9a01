"""The main paper's experiments as config lists plus table builders.

Every experiment here is two pure pieces:

* ``configs(seeds, root, budget) -> list[RunConfig]`` - the runs it needs (a run
  shared by two experiments has the same config, hence the same directory, and
  is trained once);
* ``table(results, root, budget) -> (DataFrame, markdown)`` - built from the
  sweep's results (final metrics of each run) and, for the mechanism
  experiments, from the runs' checkpoint series.

Evaluation conditions are reported explicitly (see :mod:`circuitfade.gating.evaluation`):
``normal`` = gates as at the final step (0 for every fade/linear/switch path,
which therefore has normal == zero), ``zero``, ``param`` = sigmoid(logit) (for
masked modes the initial 0.5), ``half`` = 0.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from circuitfade import stats
from circuitfade.analysis import gate_intervention_table, head_diagnostics
from circuitfade.analysis.timeline import DEFAULT_THRESHOLDS, timeline_long
from circuitfade.gating.paths import parse_path
from circuitfade.io import write_csv
from circuitfade.model.files import LARGE_OVERRIDES
from circuitfade.store import open_run, trace
from circuitfade.tasks import EVAL_SEED
from circuitfade.tasks.base import eval_label
from circuitfade.train import RunConfig, TrainConfig
from circuitfade.train.sweep import child_of, run_dir_for
from circuitfade.viz.tables import markdown_table
from circuitfade.train.rundir import RunDir

LARGE = LARGE_OVERRIDES  # the paper's larger model, as SoftPriorConfig.large() builds it

# Published numbers: (zero-gate, normal) as printed in the paper.
PAPER_T1_BASE = {
    "fade600->0": (".734 ± .028", ".694 ± .078"),
    "linear0.5->0": (".617 ± .024", ".792 ± .022"),
    "forced_const0.5": (".114 ± .006", ".164 ± .003"),
    "unforced": (".100 ± .006", ".780 ± .007"),
    "forced_zero": (".094 ± .013", ".092 ± .006"),
}
PAPER_T1_LARGE = {
    "fade600->0": (".731 ± .024", ".432 ± .091"),
    "linear0.5->0": (".635 ± .040", ".778 ± .015"),
    "forced_const0.5": (".160 ± .011", ".212 ± .024"),
    "unforced": (".102 ± .005", ".797 ± .017"),
    "forced_zero": (".102 ± .010", ".100 ± .016"),
}
PAPER_T2 = {
    "fade600->0": (".734 ± .028", ".694 ± .078"),
    "switch@1050": (".293 ± .128", ".367 ± .139"),
    "switch@600": (".097 ± .020", ".102 ± .024"),
    "posthoc": (".178 ± .035", ".619 ± .026"),
    "unforced": (".095 ± .009", ".772 ± .020"),
    "forced_zero": (".091 ± .012", ".088 ± .010"),
}
PAPER_FADE_WINDOW = {400: ".748", 500: ".745", 600: ".734", 700: ".751", 800: ".754"}
PAPER_SHAPES = {"linear": ".749–.764", "cosine": ".749–.764", "convex": ".749–.764", "concave": "unstable", "twostep": ".212"}
PAPER_MARKOV = {0.2: ".830", 0.5: ".920", 0.8: ".969"}
PAPER_LINREG = {"unforced": ("0.1296", "0.0656"), "forced_zero": ("0.0722", "—"), "fade600->0": ("0.0646", "—")}
PAPER_T3 = pd.DataFrame(
    {"seed": [0, 1, 2], "top successor head": ["L1H0", "L1H3", "L1H1"], "first successor ≥ .25": [1500] * 3,
     "top ablation head": ["L0H2", "L0H0", "L0H3"], "first ablation ≥ .03": [1200] * 3}
)
PAPER_GATE_INTERVENTIONS = {"normal": ".794", "content gate zeroed": ".791", "position gate zeroed": ".073",
                            "both gates zeroed": ".081"}

# Task formats searched by the format-sensitivity experiment (AssocRecallConfig kwargs).
FORMATS = {
    "default (15 pairs, split vocab)": {},
    "shared vocab (keys, values from all 32)": {"shared_vocab": True},
    "few pairs (4 pairs, split vocab)": {"n_pairs": 4},
    "distractors (8 pairs among 14 fillers)": {"n_pairs": 8, "n_keys": 8, "n_values": 8, "n_distractors": 14},
}


@dataclass(frozen=True)
class Budget:
    """Training length and the factor that scales the paper's step numbers."""

    steps: int = 3600
    label: str = "full"
    eval_size: int = 512

    @property
    def scale(self) -> float:
        return self.steps / 3600

    def s(self, n: int) -> int:
        return max(1, round(n * self.scale))

    def train(self, **kw) -> TrainConfig:
        if self.label == "full":
            return TrainConfig(**kw)
        return TrainConfig(steps=self.steps, eval_every=max(1, self.s(100)), checkpoint_every=max(1, self.s(300)),
                           eval_size=self.eval_size, **kw)

    def path(self, spec: str) -> str:
        """Canonical path name with step numbers scaled to this budget."""
        return parse_path(spec, total_steps=self.steps).name

    def fade(self, start: int = 600, width: int = 450, shape: str | None = None) -> str:
        spec = f"fade{self.s(start)}+{self.s(width)}->0" + (f":{shape}" if shape else "")
        return self.path(spec)

    def switch(self, at: int) -> str:
        return self.path(f"switch@{self.s(at)}")

    def twostep(self, start: int = 600, width: int = 450) -> str:
        return self.path(f"twostep{self.s(start)}+{self.s(width)}->0")


FULL = Budget(3600, "full")
QUICK = Budget(360, "quick")


def _main_paths(b: Budget) -> list[str]:
    return [b.fade(), b.path("linear0.5->0"), b.path("forced_const0.5"), "unforced", "forced_zero"]


def run(path: str, seed: int, b: Budget, task: dict | None = None, model: dict | None = None, **train_kw) -> RunConfig:
    return RunConfig(path=path, task=task or {"name": "assoc"}, model=model or {}, train=b.train(**train_kw), seed=seed)


# ----------------------------------------------------------------------------------------------
# config builders
# ----------------------------------------------------------------------------------------------
def paths_configs(seeds, root, b: Budget, large_seeds: int | None = None) -> list[RunConfig]:
    cfgs = [run(p, s, b) for p in _main_paths(b) for s in seeds]
    cfgs += [run(p, s, b, model=LARGE) for p in _main_paths(b) for s in _large_seeds(seeds, large_seeds)]
    return cfgs


def posthoc_config(root, seed: int, b: Budget, model: dict | None = None) -> RunConfig:
    parent = run("unforced", seed, b, model=model)
    extra = b.s(2550)
    return child_of(root, parent, b.steps, path=f"posthoc{extra}", steps=b.steps + extra)


def _large_seeds(seeds, large_seeds: int | None) -> list[int]:
    """Seeds ``0..large_seeds-1`` of the large-model rows (``None``: the base rows' seeds)."""
    return list(seeds) if large_seeds is None else list(range(large_seeds))


def controls_configs(seeds, root, b: Budget, large_seeds: int | None = 0) -> list[RunConfig]:
    """Table 2's paths on the base model at ``seeds`` and on the large model at seeds
    ``0..min(large_seeds, len(seeds))-1`` (``None``: the base seeds; default 0: none)."""
    paths = [b.fade(), b.switch(1050), b.switch(600), "unforced", "forced_zero"]
    ls = _large_seeds(seeds, large_seeds)[: len(list(seeds))]  # never more large than base seeds
    return ([run(p, s, b) for p in paths for s in seeds] + [posthoc_config(root, s, b) for s in seeds]
            + [run(p, s, b, model=LARGE) for p in paths for s in ls]
            + [posthoc_config(root, s, b, model=LARGE) for s in ls])


def fade_window_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run(b.fade(start), s, b) for start in (400, 500, 600, 700, 800) for s in seeds]


def shape_configs(seeds, root, b: Budget) -> list[RunConfig]:
    paths = [b.fade(shape=None)] + [b.fade(shape=sh) for sh in ("cosine", "convex", "concave")] + [b.twostep()]
    return [run(p, s, b) for p in paths for s in seeds]


def fixes_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return ([run("unforced", s, b, prior_dropout=0.5) for s in seeds]
            + [run("unforced", s, b, dual_loss=True) for s in seeds]
            + [run("unforced", s, b) for s in seeds] + [run(b.fade(), s, b) for s in seeds])


def markov_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run(p, s, b, task={"name": "markov", "p": pr}) for pr in (0.2, 0.5, 0.8)
            for p in (b.fade(), "unforced", "forced_zero") for s in seeds]


def linreg_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run(p, s, b, task={"name": "linreg"}) for p in ("unforced", "forced_zero", b.fade()) for s in seeds]


def format_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run(p, s, b, task={"name": "assoc", **kw}) for kw in FORMATS.values()
            for p in ("forced_zero", "unforced", b.fade()) for s in seeds]


def mechanism_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run(b.fade(), s, b) for s in list(seeds)[:3]]


def interventions_configs(seeds, root, b: Budget) -> list[RunConfig]:
    return [run("unforced", s, b) for s in seeds]


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------
PLATEAU_ACC = 0.30
"""Accuracy of the initial plateau of associative recall, as an upper bound: every shipped
run sits at 0.18-0.27 (all conditions) for steps 100-500, before its circuit forms
(``circuitfade/data/series/*/metrics.csv``). A run whose best accuracy over the evaluation
conditions does not clear it (Wilson lower bound) never left the plateau."""


@dataclass(frozen=True)
class Measure:
    """A final metric over seeds: ``mean`` with its standard error and 95% interval.

    With two or more seeds: ``se = sd / sqrt(n)`` over the seeds' values (``df = n - 1``) and a
    Student-t interval (this includes evaluation noise; accuracies clipped to [0, 1]). With one
    seed: the binomial standard error of that run's accuracy on its ``eval_n`` evaluation
    examples and the Wilson interval (evaluation noise only: a single seed says nothing about
    seed spread; a large-sample error, ``df = inf``); MSE with one seed has no interval.
    ``left``: how many of the runs left the initial plateau (:data:`PLATEAU_ACC`; ``None`` when
    the task has no plateau rule). ``values`` / ``seeds``: the finite per-seed values and their
    seeds (in the same order), so that two arms with the same seeds can be compared pairwise.
    """

    mean: float
    se: float
    lo: float
    hi: float
    n: int
    sd: float = math.nan
    left: int | None = None
    df: float = math.nan
    values: tuple = ()
    seeds: tuple = ()

    @classmethod
    def of(cls, values, *, proportion: bool = True, eval_n: int = 512, left: int | None = None,
           seeds=None) -> "Measure":
        """The measure of per-seed ``values`` (NaN/None dropped, with their ``seeds``)."""
        vals = list(values)
        seeds = list(range(len(vals))) if seeds is None else list(seeds)
        if len(seeds) != len(vals):
            raise ValueError(f"Measure.of: {len(vals)} values but {len(seeds)} seeds")
        kept = [(float(v), s) for v, s in zip(vals, seeds)
                if v is not None and not (isinstance(v, float) and math.isnan(v))]
        x = tuple(v for v, _ in kept)
        sx = tuple(s for _, s in kept)
        if not x:
            return cls(math.nan, math.nan, math.nan, math.nan, 0, left=left)
        if len(x) == 1:
            if proportion:
                lo, hi = stats.wilson_interval(x[0] * eval_n, eval_n)
                return cls(x[0], stats.binomial_se(x[0], eval_n), lo, hi, 1, left=left, df=math.inf, values=x, seeds=sx)
            return cls(x[0], math.nan, math.nan, math.nan, 1, left=left, values=x, seeds=sx)
        s = stats.seed_summary(x)
        lo, hi = (max(0.0, s["lo"]), min(1.0, s["hi"])) if proportion else (s["lo"], s["hi"])
        return cls(s["mean"], s["sem"], lo, hi, s["n"], s["sd"], left, float(len(x) - 1), x, sx)

    def __str__(self) -> str:
        if self.n == 0:
            return "—"
        if math.isnan(self.lo):
            return f"{self.mean:.3f} (n={self.n}, no interval)"
        if self.n == 1:
            return f"{self.mean:.3f} [{self.lo:.3f}, {self.hi:.3f}] (n=1, eval only)"
        return f"{self.mean:.3f} [{self.lo:.3f}, {self.hi:.3f}] (n={self.n}, sd {self.sd:.3f})"


def mean_sd(x, *, proportion: bool = True) -> str:
    """A table cell: mean with its 95% interval over seeds (one seed: the binomial/Wilson
    interval of its evaluation), see :class:`Measure`."""
    return str(Measure.of(pd.Series(x, dtype=float).dropna().tolist(), proportion=proportion))


def eval_note(b: "Budget") -> str:
    """The evaluation line every table prints."""
    return f"{eval_label(b.eval_size, EVAL_SEED)} (final checkpoint of each run)"


def md_table(df: pd.DataFrame) -> str:

    return markdown_table(df)


def _results_for(results: pd.DataFrame, root, cfgs: list[RunConfig]) -> pd.DataFrame:
    keys = {run_dir_for(root, c).name: c for c in cfgs}
    sub = results[results.run.isin(keys)].copy()
    sub["config"] = sub.run.map(keys)
    return sub


def _acc_rows(sub: pd.DataFrame, label_of, paper: dict | None = None, metric: str = "acc") -> pd.DataFrame:
    rows = []
    for label, g in sub.groupby(sub.config.map(label_of), sort=False):
        ok = g[g.status != "failed"]
        prop = metric == "acc"
        row = {"condition": label,
               f"zero-gate {metric}": mean_sd(ok.get(f"{metric}_zero"), proportion=prop),
               f"normal {metric} (gates at end)": mean_sd(ok.get(f"{metric}_normal"), proportion=prop),
               f"{metric} at gate param": mean_sd(ok.get(f"{metric}_param"), proportion=prop),
               f"{metric} at g=0.5": mean_sd(ok.get(f"{metric}_half"), proportion=prop),
               "failed": int((g.status == "failed").sum())}
        if paper is not None:
            pz, pn = paper.get(label, ("—", "—")) if isinstance(paper.get(label, ("—", "—")), tuple) else (paper.get(label), "—")
            row["paper zero-gate"], row["paper normal"] = pz, pn
        rows.append(row)
    return pd.DataFrame(rows)


def _label_path(b: Budget):
    """Row labels: the paper's path names at the full budget; at any other budget the
    paths actually trained (``fade60+45->0``, ``switch@105``, ``posthoc255``)."""
    inv = {b.fade(): "fade600->0", b.path("linear0.5->0"): "linear0.5->0", b.switch(1050): "switch@1050",
           b.switch(600): "switch@600"}

    def label(c: RunConfig) -> str:
        if b.label != "full":
            return c.path
        if c.parent:
            return "posthoc"
        return inv.get(c.path, c.path)

    return label


def _paper(b: Budget, table):
    """The paper's numbers for a table, only at the full budget (other budgets are not comparable)."""
    return table if b.label == "full" else None


def _by_model(sub: pd.DataFrame, b: Budget, paper_base, paper_large) -> pd.DataFrame:
    """One block of rows per model (base, then large), with a ``model`` column."""
    lab = _label_path(b)
    parts = []
    for name, is_large, paper in (("base L=2 d=64", False, paper_base), ("large L=4 d=128", True, paper_large)):
        t = _acc_rows(sub[sub.config.map(lambda c: bool(c.model) == is_large)], lab, _paper(b, paper))
        if len(t):
            t.insert(0, "model", name)
            parts.append(t)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def paths_table(results, root, b: Budget, seeds, large_seeds=None):
    df = _by_model(_results_for(results, root, paths_configs(seeds, root, b, large_seeds)), b,
                   PAPER_T1_BASE, PAPER_T1_LARGE)
    return df, md_table(df)


def controls_table(results, root, b: Budget, seeds, large_seeds: int | None = 0):
    """Table 2; the large-model block (no published numbers: the paper ran its controls on the
    base model only) appears when ``large_seeds`` selects any seed."""
    df = _by_model(_results_for(results, root, controls_configs(seeds, root, b, large_seeds)), b, PAPER_T2, {})
    return df, md_table(df)


def fade_window_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, fade_window_configs(seeds, root, b))
    inv = {b.fade(st): st for st in (400, 500, 600, 700, 800)}
    df = _acc_rows(sub, lambda c: inv[c.path])
    if b.label == "full":
        df["paper zero-gate"] = df.condition.map(PAPER_FADE_WINDOW)
    else:
        df["condition"] = [b.fade(st) for st in df.condition]
    df = df.rename(columns={"condition": "fade start"})
    return df, md_table(df)


def shape_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, shape_configs(seeds, root, b))
    inv = {b.fade(): "linear", b.fade(shape="cosine"): "cosine", b.fade(shape="convex"): "convex",
           b.fade(shape="concave"): "concave", b.twostep(): "twostep"}
    df = _acc_rows(sub, lambda c: inv[c.path] if b.label == "full" else c.path)
    if b.label == "full":
        df["paper zero-gate"] = df.condition.map(PAPER_SHAPES)
    return df.rename(columns={"condition": "shape"}), md_table(df.rename(columns={"condition": "shape"}))


def fixes_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, fixes_configs(seeds, root, b))

    def lab(c: RunConfig) -> str:
        if c.train.prior_dropout:
            return f"unforced + prior dropout {c.train.prior_dropout}"
        if c.train.dual_loss:
            return "unforced + dual-condition loss"
        return ("fade600->0" if b.label == "full" else c.path) if c.path != "unforced" else "unforced"

    df = _acc_rows(sub, lab)
    return df, md_table(df)


def markov_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, markov_configs(seeds, root, b))
    lab = _label_path(b)
    df = _acc_rows(sub, lambda c: f"p={c.task['p']} {lab(c)}")
    if b.label == "full":
        df["paper zero-gate (fade)"] = [PAPER_MARKOV.get(float(s.split()[0][2:]), "") if "fade" in s else ""
                                        for s in df.condition]
    return df, md_table(df)


def linreg_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, linreg_configs(seeds, root, b))
    lab = _label_path(b)
    rows = []
    for label, g in sub.groupby(sub.config.map(lab), sort=False):
        ok = g[g.status != "failed"]
        row = {"path": label, "zero-gate MSE": mean_sd(ok.get("mse_zero"), proportion=False),
               "normal MSE (gates at end)": mean_sd(ok.get("mse_normal"), proportion=False),
               "MSE at g=0.5": mean_sd(ok.get("mse_half"), proportion=False),
               "zero-gate query MSE": mean_sd(ok.get("query_mse_zero"), proportion=False)}
        if b.label == "full":
            row["paper zero-gate"], row["paper normal"] = PAPER_LINREG.get(label, ("—", "—"))
        rows.append(row)
    df = pd.DataFrame(rows)
    return df, md_table(df)


def format_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, format_configs(seeds, root, b))
    names = {json_key(kw): name for name, kw in FORMATS.items()}
    lab = _label_path(b)
    rows = []
    for (fmt, path), g in sub.groupby([sub.config.map(lambda c: names[json_key({k: v for k, v in c.task.items() if k != "name"})]),
                                       sub.config.map(lab)], sort=False):
        ok = g[g.status != "failed"]
        rows.append({"format": fmt, "path": path, "zero-gate acc": mean_sd(ok.get("acc_zero")),
                     "normal acc (gates at end)": mean_sd(ok.get("acc_normal")), "failed": int((g.status == "failed").sum())})
    df = pd.DataFrame(rows)
    return df, md_table(df)


def json_key(d: dict) -> str:
    import json

    return json.dumps(d, sort_keys=True)


MECHANISM_EVAL_SETS = 5
"""Independent evaluation sets the mechanism table traces every run on (seeds
``EVAL_SEED + k``, ``k = 0..K-1``; ``k = 0`` is the package's one evaluation set)."""


def mechanism_trace(series, *, n: int = 512, eval_sets: int = MECHANISM_EVAL_SETS, progress: bool = False,
                    resamples: int = stats.DEFAULT_RESAMPLES) -> pd.DataFrame:
    """:func:`~circuitfade.analysis.head_diagnostics` of every checkpoint on ``eval_sets``
    independent evaluation sets, one trace with an ``eval_seed`` column."""

    frames = []
    for k in range(eval_sets):
        tr = trace(series, [head_diagnostics], task=series.task, n=n, seed=EVAL_SEED + k, progress=progress,
                   resamples=resamples)
        tr["eval_seed"] = EVAL_SEED + k
        tr["gate_zero_step"] = series.gate_zero_step()
        frames.append(tr)
    return pd.concat(frames, ignore_index=True)


def mechanism_summary(traced: pd.DataFrame, by: tuple[str, ...] = ("seed",)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_set, summary)`` of a :func:`mechanism_trace`: the timeline of every (series,
    evaluation set), and per series the crossing steps over the sets with their bootstrap
    spread, how often the top heads agree, and whether both crossings precede the gate's zero
    (:func:`timeline_summary`)."""

    long = timeline_long(traced, dict(DEFAULT_THRESHOLDS), by=list(by) + ["eval_seed"])
    return long, timeline_summary(long, by)


def timeline_summary(long: pd.DataFrame, by: tuple[str, ...] = ("seed",)) -> pd.DataFrame:
    """Per series (``by``), Table 3's row from the per-evaluation-set timeline ``long`` (the first
    output of :func:`mechanism_summary`, or ``mechanism_timeline_per_set.csv`` read back)."""
    rows = []
    for key, g in long.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        K = g["eval_seed"].nunique()
        for metric, short in (("successor_mass", "succ"), ("ablation_importance", "abl")):
            m = g[g["metric"] == metric]
            fs = m["first_step"].dropna().astype(int)
            row[f"{short} first step over {K} sets"] = (f"{fs.min()}–{fs.max()}" if fs.min() != fs.max()
                                                      else f"{fs.min()}") if len(fs) else "never"
            lo, hi = m["first_step_lo"].dropna(), m["first_step_hi"].dropna()
            row[f"{short} bootstrap 95% range"] = (f"{int(lo.min())}–{int(hi.max())}"
                                                  if len(lo) and len(hi) == len(m) else "open")
            tops = m["top_head"].dropna()
            row[f"{short} top head (sets naming it)"] = (f"{tops.mode().iloc[0]} ({int((tops == tops.mode().iloc[0]).sum())}/{K})"
                                                         if len(tops) else "—")
            row[f"{short} noise floor"] = f"{m['noise_floor'].max():.3f}"
            within = int((m["crossing"] == "within noise floor").sum())
            if within:
                row[f"{short} noise floor"] += f" ({within}/{K} crossings within it)"
        gz = g["gate_zero_step"].dropna()
        row["gate reaches 0 at"] = int(gz.iloc[0]) if len(gz) else pd.NA
        before = g.groupby("eval_seed").apply(
            lambda x: bool((x["first_step"].notna() & (x["first_step"] < x["gate_zero_step"])).all()), include_groups=False)
        after = g.groupby("eval_seed").apply(
            lambda x: bool((x["first_step"].notna() & (x["first_step"] >= x["gate_zero_step"])).all()), include_groups=False)
        row["both before gate 0 (sets)"] = f"{int(before.sum())}/{K}"
        row["both after gate 0 (sets)"] = f"{int(after.sum())}/{K}"
        rows.append(row)
    return pd.DataFrame(rows)


MECHANISM_PER_SET = "mechanism_timeline_per_set.csv"
"""The per-set timeline a mechanism build writes; a build without checkpoints rebuilds Table 3 from it."""


def _mechanism_note(n: int, eval_sets: int) -> str:
    return (f"{eval_sets} independent evaluation sets of {n} examples (seeds {EVAL_SEED}..{EVAL_SEED + eval_sets - 1}); "
            f"bootstrap: {stats.DEFAULT_RESAMPLES} resamples of each set's examples (range = widest 95% interval "
            "over the sets; 'open' when some resamples never cross). Thresholds: successor mass ≥ .25, zero-gate "
            "ablation accuracy drop ≥ .03. Noise floor: the largest value over heads at step 0 (untrained model).")


def mechanism_table(results, root, b: Budget, seeds, n: int = 512, progress: bool = False,
                    eval_sets: int = MECHANISM_EVAL_SETS, out_dir: str | Path | None = None):
    """Trace each fade seed's checkpoints on ``eval_sets`` evaluation sets: successor mass +
    zero-gate ablation importance (Table 3), with bootstrap and across-set spread.

    Writes ``mechanism_trace.csv`` (the trace without the resample arrays) and
    :data:`MECHANISM_PER_SET` (the timeline of every seed and evaluation set) into ``out_dir``
    (default: the parent of ``root``). Without run folders with checkpoints, Table 3 is rebuilt
    from an earlier :data:`MECHANISM_PER_SET` in ``out_dir`` if there is one (its seeds only)."""

    out_dir = Path(out_dir) if out_dir is not None else Path(root).parent
    frames = []
    for c in mechanism_configs(seeds, root, b):
        d = run_dir_for(root, c)
        if not RunDir(d).is_done() or not RunDir(d).checkpoints_dir.is_dir():
            continue
        frames.append(mechanism_trace(open_run(d), n=n, eval_sets=eval_sets, progress=progress))
    if not frames:
        per_set = out_dir / MECHANISM_PER_SET
        if not per_set.is_file():
            return pd.DataFrame(), "(no run folders with checkpoints: Table 3 needs them; see results/table_mechanism.csv)"
        long = pd.read_csv(per_set)
        long = long[long["seed"].isin([c.seed for c in mechanism_configs(seeds, root, b)])]
        df = timeline_summary(long)
        md = (md_table(df) + "\n\n" + _mechanism_note(n, int(long["eval_seed"].nunique()))
              + f" Rebuilt from {MECHANISM_PER_SET} (the per-set timeline traced when the checkpoints were here).")
    else:
        traced = pd.concat(frames, ignore_index=True)
        write_csv(out_dir / "mechanism_trace.csv", traced.drop(columns=["boot"], errors="ignore"))
        long, df = mechanism_summary(traced)
        write_csv(out_dir / MECHANISM_PER_SET, long)
        md = md_table(df) + "\n\n" + _mechanism_note(n, eval_sets)
    if b.label == "full":
        md += "\n\nPaper (Table 3):\n\n" + md_table(PAPER_T3)
    return df, md


INTERVENTIONS_PER_SEED = "interventions_per_seed.csv"
"""Every seed's gate-intervention rows (``condition, accuracy, seed``) as built from its checkpoint."""


def interventions_table(results, root, b: Budget, seeds, n: int = 512, out_dir: str | Path | None = None):
    """Gate interventions on the final checkpoint of each unforced seed (Sec. 6).

    Run folders with checkpoints give every condition (:func:`gate_intervention_table`); their
    rows are written to :data:`INTERVENTIONS_PER_SEED` in ``out_dir`` and read back for a seed
    whose folder is gone; failing that, the recorded final metrics give the ``normal`` and
    ``both gates zeroed`` rows (``acc_normal``, ``acc_zero``: the same evaluation).
    """

    out_dir = Path(out_dir) if out_dir is not None else Path(root).parent
    kept = pd.read_csv(out_dir / INTERVENTIONS_PER_SEED) if (out_dir / INTERVENTIONS_PER_SEED).is_file() else None
    frames, traced = [], []
    for c in interventions_configs(seeds, root, b):
        d = run_dir_for(root, c)
        if RunDir(d).is_done() and RunDir(d).checkpoints_dir.is_dir():
            series = open_run(d)
            t = gate_intervention_table(series[series.steps[-1]], series.task, n=n)
            traced.append(t.assign(seed=c.seed))
        elif kept is not None and (kept.seed == c.seed).any():
            t = kept[kept.seed == c.seed].drop(columns=["seed"])
        else:
            r = results[(results.run == d.name) & results.status.isin(["cached", "done", "recorded"])]
            if r.empty:
                continue
            t = pd.DataFrame({"condition": ["normal", "both gates zeroed"],
                              "accuracy": [float(r.acc_normal.iloc[0]), float(r.acc_zero.iloc[0])]})
        t = t.assign(seed=c.seed)
        frames.append(t)
    if traced:
        now = pd.concat(traced, ignore_index=True)[["condition", "accuracy", "seed"]]
        if kept is not None:
            now = pd.concat([kept[~kept.seed.isin(now.seed)][["condition", "accuracy", "seed"]], now], ignore_index=True)
        write_csv(out_dir / INTERVENTIONS_PER_SEED, now.sort_values("seed", kind="stable"))
    if not frames:
        return pd.DataFrame(), "(no finished runs)"
    allt = pd.concat(frames, ignore_index=True)
    order = ["normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"]
    rows = []
    for cond in [c for c in order if c in set(allt.condition)] + [c for c in allt.condition.unique() if c not in order]:
        g = allt[allt.condition == cond]
        row = {"condition": cond, "accuracy": mean_sd(g.accuracy), "seeds": ", ".join(str(x) for x in g.seed)}
        if b.label == "full":
            row["paper"] = PAPER_GATE_INTERVENTIONS.get(cond, "—")
        rows.append(row)
    df = pd.DataFrame(rows)
    return df, md_table(df)


def final_metrics_of(root: str | Path, cfg: RunConfig) -> dict:

    return RunDir(run_dir_for(root, cfg)).read_done()["final"]
