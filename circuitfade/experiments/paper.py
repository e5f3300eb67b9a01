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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from circuitfade.gating.paths import parse_path
from circuitfade.io import write_csv
from circuitfade.model import LARGE_OVERRIDES
from circuitfade.train.sweep import child_of, run_dir_for
from circuitfade.train.loop import RunConfig, TrainConfig

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
    ls = list(seeds)[: (large_seeds if large_seeds is not None else len(seeds))]
    cfgs += [run(p, s, b, model=LARGE) for p in _main_paths(b) for s in ls]
    return cfgs


def posthoc_config(root, seed: int, b: Budget) -> RunConfig:
    parent = run("unforced", seed, b)
    extra = b.s(2550)
    return child_of(root, parent, b.steps, path=f"posthoc{extra}", steps=b.steps + extra)


def controls_configs(seeds, root, b: Budget) -> list[RunConfig]:
    paths = [b.fade(), b.switch(1050), b.switch(600), "unforced", "forced_zero"]
    return [run(p, s, b) for p in paths for s in seeds] + [posthoc_config(root, s, b) for s in seeds]


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
def mean_sd(x) -> str:
    x = pd.Series(x, dtype=float).dropna()
    if len(x) == 0:
        return "—"
    if len(x) == 1:
        return f"{x.iloc[0]:.3f} (n=1)"
    return f"{x.mean():.3f} ± {x.std(ddof=1):.3f} (n={len(x)})"


def md_table(df: pd.DataFrame) -> str:
    from circuitfade.viz.report import markdown_table

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
        row = {"condition": label,
               f"zero-gate {metric}": mean_sd(ok.get(f"{metric}_zero")),
               f"normal {metric} (gates at end)": mean_sd(ok.get(f"{metric}_normal")),
               f"{metric} at gate param": mean_sd(ok.get(f"{metric}_param")),
               f"{metric} at g=0.5": mean_sd(ok.get(f"{metric}_half")),
               "failed": int((g.status == "failed").sum())}
        if paper is not None:
            pz, pn = paper.get(label, ("—", "—")) if isinstance(paper.get(label, ("—", "—")), tuple) else (paper.get(label), "—")
            row["paper zero-gate"], row["paper normal"] = pz, pn
        rows.append(row)
    return pd.DataFrame(rows)


def _label_path(b: Budget):
    inv = {b.fade(): "fade600->0", b.path("linear0.5->0"): "linear0.5->0", b.switch(1050): "switch@1050",
           b.switch(600): "switch@600"}

    def label(c: RunConfig) -> str:
        if c.parent:
            return "posthoc"
        return inv.get(c.path, c.path)

    return label


def paths_table(results, root, b: Budget, seeds, large_seeds=None):
    cfgs = paths_configs(seeds, root, b, large_seeds)
    sub = _results_for(results, root, cfgs)
    base = sub[sub.config.map(lambda c: not c.model)]
    large = sub[sub.config.map(lambda c: bool(c.model))]
    lab = _label_path(b)
    t_base = _acc_rows(base, lab, PAPER_T1_BASE)
    t_large = _acc_rows(large, lab, PAPER_T1_LARGE)
    parts = []
    for t, name in ((t_base, "base L=2 d=64"), (t_large, "large L=4 d=128")):
        if len(t):
            t.insert(0, "model", name)
            parts.append(t)
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return df, md_table(df)


def controls_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, controls_configs(seeds, root, b))
    df = _acc_rows(sub, _label_path(b), PAPER_T2)
    return df, md_table(df)


def fade_window_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, fade_window_configs(seeds, root, b))
    inv = {b.fade(st): st for st in (400, 500, 600, 700, 800)}
    df = _acc_rows(sub, lambda c: inv[c.path])
    df["paper zero-gate"] = df.condition.map(PAPER_FADE_WINDOW)
    df = df.rename(columns={"condition": "fade start"})
    return df, md_table(df)


def shape_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, shape_configs(seeds, root, b))
    inv = {b.fade(): "linear", b.fade(shape="cosine"): "cosine", b.fade(shape="convex"): "convex",
           b.fade(shape="concave"): "concave", b.twostep(): "twostep"}
    df = _acc_rows(sub, lambda c: inv[c.path])
    df["paper zero-gate"] = df.condition.map(PAPER_SHAPES)
    return df.rename(columns={"condition": "shape"}), md_table(df.rename(columns={"condition": "shape"}))


def fixes_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, fixes_configs(seeds, root, b))

    def lab(c: RunConfig) -> str:
        if c.train.prior_dropout:
            return f"unforced + prior dropout {c.train.prior_dropout}"
        if c.train.dual_loss:
            return "unforced + dual-condition loss"
        return "fade600->0" if c.path != "unforced" else "unforced"

    df = _acc_rows(sub, lab)
    return df, md_table(df)


def markov_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, markov_configs(seeds, root, b))
    lab = _label_path(b)
    df = _acc_rows(sub, lambda c: f"p={c.task['p']} {lab(c)}")
    df["paper zero-gate (fade)"] = [PAPER_MARKOV.get(float(s.split()[0][2:]), "") if "fade" in s else "" for s in df.condition]
    return df, md_table(df)


def linreg_table(results, root, b: Budget, seeds):
    sub = _results_for(results, root, linreg_configs(seeds, root, b))
    lab = _label_path(b)
    rows = []
    for label, g in sub.groupby(sub.config.map(lab), sort=False):
        ok = g[g.status != "failed"]
        pz, pn = PAPER_LINREG.get(label, ("—", "—"))
        rows.append({"path": label, "zero-gate MSE": mean_sd(ok.get("mse_zero")),
                     "normal MSE (gates at end)": mean_sd(ok.get("mse_normal")),
                     "MSE at g=0.5": mean_sd(ok.get("mse_half")),
                     "zero-gate query MSE": mean_sd(ok.get("query_mse_zero")),
                     "paper zero-gate": pz, "paper normal": pn})
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


def mechanism_table(results, root, b: Budget, seeds, n: int = 512, progress: bool = False):
    """Trace each fade seed's checkpoints: successor mass + zero-gate ablation importance (Table 3)."""
    from circuitfade.analysis import DEFAULT_THRESHOLDS, consolidation_timeline, head_diagnostics
    from circuitfade.store import open_run, trace

    frames = []
    for c in mechanism_configs(seeds, root, b):
        d = run_dir_for(root, c)
        if not (d / "done.json").is_file():
            continue
        series = open_run(d)
        tr = trace(series, [head_diagnostics], task=series.task, n=n, progress=progress)
        tr["gate_zero_step"] = series.gate_zero_step()
        frames.append(tr)
    if not frames:
        return pd.DataFrame(), "(no finished runs)"
    traced = pd.concat(frames, ignore_index=True)
    write_csv(Path(root).parent / "mechanism_trace.csv", traced)
    tl = consolidation_timeline(traced, DEFAULT_THRESHOLDS, by=("seed",))
    cols = {"seed": "seed", "successor_mass_top_head": "top successor head", "successor_mass_first_step": "first successor ≥ .25",
            "ablation_importance_top_head": "top ablation head", "ablation_importance_first_step": "first ablation ≥ .03",
            "gate_zero_step": "gate reaches 0 at", "after_gate_zero": "both after gate 0"}
    tl = tl[[c for c in cols if c in tl.columns]].rename(columns=cols)
    tl.attrs["traced"] = traced
    return tl, md_table(tl) + "\n\nPaper (Table 3):\n\n" + md_table(PAPER_T3)


def interventions_table(results, root, b: Budget, seeds, n: int = 512):
    from circuitfade.analysis import gate_intervention_table
    from circuitfade.store import open_run

    frames = []
    for c in interventions_configs(seeds, root, b):
        d = run_dir_for(root, c)
        if not (d / "done.json").is_file():
            continue
        series = open_run(d)
        t = gate_intervention_table(series[series.steps[-1]], series.task, n=n)
        t["seed"] = c.seed
        frames.append(t)
    if not frames:
        return pd.DataFrame(), "(no finished runs)"
    allt = pd.concat(frames, ignore_index=True)
    rows = []
    for cond, g in allt.groupby("condition", sort=False):
        rows.append({"condition": cond, "accuracy": mean_sd(g.accuracy), "paper": PAPER_GATE_INTERVENTIONS.get(cond, "—")})
    df = pd.DataFrame(rows)
    return df, md_table(df)


def final_metrics_of(root: str | Path, cfg: RunConfig) -> dict:
    from circuitfade.io import read_json

    return read_json(run_dir_for(root, cfg) / "done.json")["final"]
