"""``circuitfade reproduce``: run the main paper's experiments and write ``results.md``.

All experiments' runs go through one sweep (shared runs are trained once) into
``OUT/runs/``; then each experiment builds its table from the runs. ``OUT``
receives ``results.md`` (every table with the paper's numbers beside ours and a
claim-by-claim verdict table), ``results_runs.csv`` (final metrics of every run),
one CSV per table and ``report.html`` (training curves).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from circuitfade.experiments import paper as P
from circuitfade.io import check_outputs
from circuitfade.train.sweep import run_dir_for, run_sweep
from circuitfade.train.loop import RunConfig
from circuitfade.io import write_csv, write_text


@dataclass(frozen=True)
class Experiment:
    title: str
    configs: Callable  # (seeds, root, budget) -> list[RunConfig]
    table: Callable  # (results, root, budget, seeds) -> (DataFrame, markdown)


EXPERIMENTS: dict[str, Experiment] = {
    "paths": Experiment("1. Training paths (Table 1)", P.paths_configs, P.paths_table),
    "controls": Experiment("2. Causal controls (Table 2)", P.controls_configs, P.controls_table),
    "fade_window": Experiment("3. Fade window (Sec. 7.2)", P.fade_window_configs, P.fade_window_table),
    "shapes": Experiment("4. Schedule shape (Sec. 7.2)", P.shape_configs, P.shape_table),
    "fixes": Experiment("5. Other training fixes (prior dropout, dual-condition loss)", P.fixes_configs, P.fixes_table),
    "markov": Experiment("6. Markov induction (Sec. 8)", P.markov_configs, P.markov_table),
    "linreg": Experiment("7. Linear-regression ICL boundary (Sec. 8)", P.linreg_configs, P.linreg_table),
    "mechanism": Experiment("8. Mechanism trace (Sec. 9, Table 3)", P.mechanism_configs, P.mechanism_table),
    "interventions": Experiment("9. Gate interventions on unforced models (Sec. 6)", P.interventions_configs,
                                P.interventions_table),
    "format": Experiment("10. Format sensitivity (where does the paper's pattern appear?)", P.format_configs,
                         P.format_table),
}


def _final(results: pd.DataFrame, root, cfg: RunConfig, key: str) -> float:
    r = results[results.run == run_dir_for(root, cfg).name]
    if r.empty or r.status.iloc[0] == "failed" or key not in r:
        return float("nan")
    return float(r[key].iloc[0])


def _mean(results, root, cfgs, key) -> tuple[float, int]:
    vals = [v for v in (_final(results, root, c, key) for c in cfgs) if not np.isnan(v)]
    return (float(np.mean(vals)) if vals else float("nan")), len(vals)


def verdicts(results: pd.DataFrame, root, b: P.Budget, seeds, mech: pd.DataFrame | None) -> pd.DataFrame:
    """Claim-by-claim verdicts from explicit rules on the measured means (rules in the table)."""
    run = lambda path, s, **kw: P.run(path, s, b, **kw)  # noqa: E731
    S = list(seeds)
    fade, unf, fz = b.fade(), "unforced", "forced_zero"
    m = lambda path, key="acc_zero", **kw: _mean(results, root, [run(path, s, **kw) for s in S], key)  # noqa: E731
    rows = []

    def add(claim, statistic, value, rule, verdict):
        rows.append({"claim": claim, "statistic": statistic, "ours": value, "rule": rule, "verdict": verdict})

    def fmt(x):
        return "—" if np.isnan(x[0]) else f"{x[0]:.3f} (n={x[1]})"

    def grade(ok_full, ok_part, have):
        if not have:
            return "not run"
        return "reproduced" if ok_full else ("partly" if ok_part else "not reproduced")

    un_z, un_n = m(unf), m(unf, "acc_normal")
    add("unforced collapses at zero gate", "unforced acc: zero-gate / normal", f"{fmt(un_z)} / {fmt(un_n)}",
        "zero ≤ .20 and normal ≥ .70 (partly: zero ≤ normal − .30)",
        grade(un_z[0] <= .2 and un_n[0] >= .7, un_z[0] <= un_n[0] - .3, un_z[1] > 0))
    fz_z, fa_z = m(fz), m(fade)
    add("forced_zero fails", "forced_zero zero-gate acc (vs fade600->0)", f"{fmt(fz_z)} (fade {fmt(fa_z)})",
        "≤ .20 (partly: ≤ fade − .20)", grade(fz_z[0] <= .2, fz_z[0] <= fa_z[0] - .2, fz_z[1] > 0))
    add("fade600->0 keeps zero-gate accuracy", "fade zero-gate acc, and margin over forced_zero",
        f"{fmt(fa_z)}; margin {fa_z[0] - fz_z[0]:+.3f}", "≥ .60 and ≥ forced_zero + .20 (partly: ≥ .60)",
        grade(fa_z[0] >= .6 and fa_z[0] >= fz_z[0] + .2, fa_z[0] >= .6, fa_z[1] > 0))
    sw = m(b.switch(1050))
    add("hard switch at 1050 falls short", "switch@1050 zero-gate acc vs fade", f"{fmt(sw)} vs {fmt(fa_z)}",
        "≤ fade − .20 (partly: ≤ fade − .05)", grade(sw[0] <= fa_z[0] - .2, sw[0] <= fa_z[0] - .05, sw[1] > 0))
    ph = _mean(results, root, [P.posthoc_config(root, s, b) for s in S], "acc_zero")
    add("post hoc continuation falls short", "posthoc zero-gate acc vs fade", f"{fmt(ph)} vs {fmt(fa_z)}",
        "≤ fade − .20 (partly: ≤ fade − .05)", grade(ph[0] <= fa_z[0] - .2, ph[0] <= fa_z[0] - .05, ph[1] > 0))
    starts = [m(b.fade(st)) for st in (400, 500, 600, 700, 800)]
    have = all(x[1] > 0 for x in starts)
    vals = [x[0] for x in starts]
    add("robust to fade start (400–800)", "zero-gate acc per start", ", ".join(f"{v:.3f}" for v in vals) if have else "—",
        "all ≥ .60 and spread ≤ .10, and each ≥ forced_zero + .20 (partly: first two)",
        grade(have and min(vals) >= .6 and max(vals) - min(vals) <= .1 and min(vals) >= fz_z[0] + .2,
              have and min(vals) >= .6 and max(vals) - min(vals) <= .1, have))
    shapes = {sh: m(b.fade(shape=sh)) for sh in ("cosine", "convex")}
    two = m(b.twostep())
    have = two[1] > 0 and all(x[1] > 0 for x in shapes.values())
    smooth = [fa_z[0]] + [x[0] for x in shapes.values()]
    add("smooth shapes work, two-step does not", "linear/cosine/convex vs two-step zero-gate acc",
        f"{', '.join(f'{v:.3f}' for v in smooth)} vs {two[0]:.3f}" if have else "—",
        "smooth ≥ .60 and two-step ≤ min(smooth) − .20 (partly: smooth ≥ .60)",
        grade(have and min(smooth) >= .6 and two[0] <= min(smooth) - .2, have and min(smooth) >= .6, have))
    mk = {p: (m(fade, task={"name": "markov", "p": p}), m(unf, task={"name": "markov", "p": p}),
              m(fz, task={"name": "markov", "p": p})) for p in (0.2, 0.5, 0.8)}
    have = all(v[0][1] > 0 for v in mk.values())
    txt = "; ".join(f"p={p}: fade {v[0][0]:.3f}, unforced {v[1][0]:.3f}, forced_zero {v[2][0]:.3f}" for p, v in mk.items()) if have else "—"
    full = have and all(v[0][0] >= v[1][0] + .2 and v[0][0] >= v[2][0] + .2 for v in mk.values())
    part = have and any(v[0][0] >= v[1][0] + .2 for v in mk.values())
    add("Markov induction replicates the pattern", "zero-gate acc per p", txt,
        "fade ≥ unforced + .20 and ≥ forced_zero + .20 at every p (partly: fade ≥ unforced + .20 at some p)",
        grade(full, part, have))
    lt = {p: m(p, "mse_zero", task={"name": "linreg"}) for p in (unf, fz, fade)}
    un_norm = m(unf, "mse_normal", task={"name": "linreg"})
    have = all(v[1] > 0 for v in lt.values())
    add("linear ICL is the boundary (forced_zero learns it; unforced degrades at zero gate)",
        "zero-gate MSE unforced / forced_zero / fade; unforced normal MSE",
        (f"{lt[unf][0]:.4f} / {lt[fz][0]:.4f} / {lt[fade][0]:.4f}; {un_norm[0]:.4f}") if have else "—",
        "forced_zero ≤ 1.5 × fade and unforced zero > 1.5 × unforced normal (partly: first)",
        grade(have and lt[fz][0] <= 1.5 * lt[fade][0] and lt[unf][0] > 1.5 * un_norm[0],
              have and lt[fz][0] <= 1.5 * lt[fade][0], have))
    if mech is not None and len(mech) and "both after gate 0" in mech:
        after = mech["both after gate 0"].astype("boolean")
        add("consolidation happens after the gate reaches zero", "seeds whose first crossings (succ ≥ .25, abl ≥ .03) come after g=0",
            f"{int(after.fillna(False).sum())}/{len(mech)}", "all seeds (partly: some)",
            grade(bool(after.fillna(False).all()), bool(after.fillna(False).any()), True))
    else:
        add("consolidation happens after the gate reaches zero", "—", "—", "—", "not run")
    return pd.DataFrame(rows)


def collect(cfgs: list[RunConfig], root: Path) -> pd.DataFrame:
    """Results of already-finished runs (no training); unfinished ones are marked "missing"."""
    import json

    rows = []
    for c in cfgs:
        d = run_dir_for(root, c)
        base = {"run": d.name, "run_dir": str(d), "path": c.path, "seed": c.seed, "task": c.task["name"]}
        if (d / "done.json").is_file():
            rows.append({**base, "status": "cached", "error": None, **json.loads((d / "done.json").read_text())["final"]})
        else:
            rows.append({**base, "status": "missing", "error": "not trained (tables-only run)"})
    return pd.DataFrame(rows).drop_duplicates("run")


def reproduce(names=None, *, seeds: int = 3, out: str | Path = "results", executor: str = "local",
              workers: int | None = None, address: str | None = None, quick: bool = False,
              large_seeds: int = 1, progress: bool = True, seeds_for: dict | None = None,
              train: bool = True) -> dict:
    """Run (or, with ``train=False``, only tabulate) the named experiments.

    ``seeds`` seeds (0..seeds-1) per experiment unless ``seeds_for={name: n}`` says
    otherwise; the large-model rows of "paths" use the first ``large_seeds``.
    """
    names = list(names or EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; choose from {list(EXPERIMENTS)}")
    if seeds < 1:
        raise ValueError("--seeds must be >= 1")
    b = P.QUICK if quick else P.FULL
    out = Path(out)
    root = out / "runs"
    seeds_for = dict(seeds_for or {})
    bad = [k for k in seeds_for if k not in EXPERIMENTS]
    if bad:
        raise ValueError(f"seeds_for names unknown experiment(s) {bad}")
    S_of = {n: list(range(seeds_for.get(n, seeds))) for n in names}
    S = list(range(seeds))
    cfgs = []
    for n in names:
        if n == "paths":
            cfgs += P.paths_configs(S_of[n], root, b, large_seeds)
        else:
            cfgs += EXPERIMENTS[n].configs(S_of[n], root, b)
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if train:
        results = run_sweep(cfgs, root, executor=executor, workers=workers, address=address, progress=progress)
    else:
        results = collect(cfgs, root)
    train_s = time.time() - t0
    write_csv(out / "results_runs.csv", results.drop(columns=["config"], errors="ignore"))
    sections, tables = [], {}
    mech = None
    for n in names:
        e = EXPERIMENTS[n]
        t1 = time.time()
        if n == "paths":
            df, md = e.table(results, root, b, S_of[n], large_seeds)
        else:
            df, md = e.table(results, root, b, S_of[n])
        tables[n] = df
        if n == "mechanism":
            mech = df
        write_csv(out / f"table_{n}.csv", df)
        sections.append(f"## {e.title}\n\n{md}\n\n_(table built in {time.time() - t1:.0f} s)_\n")
    v = verdicts(results, root, b, S, mech)  # rules use the main seed list; missing runs are skipped
    tables["verdicts"] = v
    failed = results[results.status == "failed"]
    head = [
        "# circuitfade: reproduction of the main paper" + (" — QUICK MODE (360 steps; not comparable to the paper)" if quick else ""),
        "",
        f"Command: `circuitfade reproduce {' '.join(names)} --seeds {seeds} --out {out}"
        + (" --quick" if quick else "") + "".join(f" --seeds-for {k}={v}" for k, v in seeds_for.items())
        + f"` (seeds per experiment: {', '.join(f'{n} {len(S_of[n])}' for n in names)}; large model seeds {S[:large_seeds]}).",
        f"Runs: {len(results)} ({int((results.status == 'done').sum())} trained now, "
        f"{int((results.status == 'cached').sum())} reused, {int((results.status == 'missing').sum())} not trained, "
        f"{len(failed)} failed); sweep wall time {train_s / 60:.1f} min.",
        "",
        "Columns: *zero-gate* = every prior's gate at 0; *normal* = gates as at the final step (0 for every "
        "fade/linear/switch path, so normal = zero-gate there); *param* = sigmoid(gate logit) (for fixed/scheduled "
        "gates the initial 0.5); *g=0.5* = all gates at 0.5. Mean ± sd over seeds.",
        "",
    ]
    if len(failed):
        head += ["**Failed runs:**", ""] + [f"- `{r.run}`: {str(r.error).splitlines()[0]}" for r in failed.itertuples()] + [""]
    text = "\n".join(head) + "\n" + "\n".join(sections) + "\n## Claim-by-claim verdict\n\n" + P.md_table(v) + "\n"
    write_text(out / "results.md", text)
    _write_html(out, results, root)
    return {"results": results, "tables": tables, "markdown": text}


def _write_html(out: Path, results: pd.DataFrame, root: Path) -> None:
    """Training curves (zero-gate and normal accuracy, gate) per path, first seed."""
    try:
        import plotly.graph_objects as go
    except ImportError:  # pragma: no cover
        return
    figs = []
    ok = results[results.status != "failed"]
    for (task, path), g in ok.groupby(["task", "path"], sort=False):
        d = Path(g.run_dir.iloc[0])
        if not (d / "metrics.csv").is_file():
            continue
        mt = pd.read_csv(d / "metrics.csv")
        key = "acc" if "acc_zero" in mt else "mse"
        fig = go.Figure()
        for cond in ("normal", "zero"):
            if f"{key}_{cond}" in mt:
                fig.add_scatter(x=mt.step, y=mt[f"{key}_{cond}"], name=f"{key} ({cond})")
        if "gate_pos" in mt:
            fig.add_scatter(x=mt.step, y=mt.gate_pos, name="gate (pos, mean)", yaxis="y2", line={"dash": "dot"})
        fig.update_layout(title=f"{task} / {path} / {d.name}", xaxis_title="training step",
                          yaxis_title="accuracy" if key == "acc" else "MSE",
                          yaxis2={"title": "gate value", "overlaying": "y", "side": "right", "range": [0, 1]})
        figs.append(fig)
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    write_text(out / "report.html", "<html><head><meta charset='utf-8'><title>circuitfade reproduce</title></head>"
               "<body><h1>Training curves</h1>" + "\n".join(parts) + "</body></html>")


DEFAULT_OUT = "runs/reproduce"
"""``circuitfade reproduce`` writes here unless ``--out`` says otherwise (never the committed results/)."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="circuitfade reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", help=f"any of {list(EXPERIMENTS)} (default: all)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--large-seeds", type=int, default=1, help="seeds for the large (L=4, d=128) model rows")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"output folder (default {DEFAULT_OUT}; runs are cached in OUT/runs)")
    ap.add_argument("--force", action="store_true", help="replace results.md and the tables if OUT has them")
    ap.add_argument("--executor", choices=["local", "ray", "serial"], default="local")
    ap.add_argument("--address", help="Ray cluster address (with --executor ray)")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--quick", action="store_true", help="360-step runs: minutes, for trying it out / CI")
    ap.add_argument("--seeds-for", action="append", default=[], metavar="EXP=N", help="per-experiment seed count")
    ap.add_argument("--tables-only", action="store_true", help="do not train: tabulate the runs already in OUT")
    ns = ap.parse_args(argv)
    seeds_for = {}
    for item in ns.seeds_for:
        k, _, v = item.partition("=")
        if not v.isdigit():
            ap.error(f"--seeds-for expects EXP=N, got {item!r}")
        seeds_for[k] = int(v)
    out = Path(ns.out)
    names = ns.experiments or list(EXPERIMENTS)
    check_outputs([out / "results.md", out / "report.html", out / "results_runs.csv",
                   *(out / f"table_{n}.csv" for n in names)], force=ns.force)  # before any training
    res = reproduce(ns.experiments, seeds=ns.seeds, out=ns.out, executor=ns.executor, workers=ns.workers,
                    address=ns.address, quick=ns.quick, large_seeds=ns.large_seeds, seeds_for=seeds_for,
                    train=not ns.tables_only)
    print(res["markdown"])
    return 0
