"""The circuits study: is the edge circuit of the soft-prior model at gate zero the one that
formed while the gate was on? ``python -m studies.circuits`` (``--help``).

Protocol (:mod:`studies.circuits.declaration`, fixed before the runs): three gate paths
(``fade600->0``, ``forced_zero``, ``unforced``) x seeds 0-2 of the base model, 3,600 steps
(:func:`train_runs`, through :func:`circuitfade.train.sweep.run_sweep`, one worker per core unless
``--workers`` says otherwise; the runs do not depend on it); EAP-IG edge
scores at every checkpoint (:func:`trace_runs`, :func:`circuitfade.analysis.edges.edge_attribution`
through :func:`circuitfade.store.trace`); per run the top-10 circuit of each checkpoint, its
Jaccard overlap with the final circuit and with the gate-on circuit, and the content-prior
edges' share of the attribution (:func:`timeline`); per seed the claims' quantities
(:func:`per_seed`); across seeds a Student-t interval (:func:`summary_table`) and the verdicts
(:func:`verdicts`).

Writes ``results/circuits/``: ``scores.csv`` (every edge score), ``timeline.csv``,
``per_seed.csv``, ``summary.csv``, ``verdicts.csv``, ``results.md``, ``config.json``,
``fig_circuits.png``; the runs go to ``runs/`` (not committed). ``--tables-only`` rebuilds every
table and ``results.md`` from ``scores.csv`` and ``config.json``, byte for byte.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from circuitfade.commands.boundary import check_count
from circuitfade.analysis.edges import EDGE_ATTRIBUTION, edge_attribution, top_edges
from circuitfade.claims import Outcome, Verdict, grade, verdict_table
from circuitfade.io import check_outputs, read_json, write_csv, write_json, write_text
from circuitfade.stats import chance_overlap, seed_summary
from circuitfade.train import RunConfig
from circuitfade.viz.tables import markdown_table
from circuitfade.train.rundir import RunDir
from studies.circuits.declaration import DECLARATION, PROVENANCE, RULES, rule_inputs
from studies.circuits.declaration import claims as declared_claims

__all__ = ["SCORE_COLUMNS", "run_configs", "train_runs", "trace_runs", "jaccard", "chance_jaccard", "timeline",
           "per_seed", "chance_baselines", "summary_table", "verdicts", "verdict_rows", "to_markdown", "figure",
           "write_tables", "rebuild", "main"]

SCORE_COLUMNS = ("path", "seed", "step", "edge", "kind", "value")
"""``scores.csv``: one EAP-IG score per run, checkpoint and edge (edges in graph order)."""
QUANTITIES = {
    "overlap_fade_final_on": "fade600->0: overlap of the step-3600 and step-900 circuits",
    "overlap_fade_final_zero": "overlap of the fade's step-3600 circuit and forced_zero's (same seed)",
    "overlap_gap": "difference of the two overlaps above",
    "prior_share_unforced": "unforced, step 3600: content-prior edges' share of Σ|score|",
    "prior_share_fade_final": "fade600->0, step 3600 (gate 0): content-prior edges' share of Σ|score|",
}
"""The per-seed quantities (``per_seed.csv`` columns besides ``seed``), in table order."""


def _decl_paths(decl) -> tuple[str, str, str]:
    fade, zero, free = decl.data["arms"]
    return fade, zero, free


# ------------------------------------------------------------------------------- runs
def run_configs(decl=DECLARATION) -> list[RunConfig]:
    """The declared runs: every arm x seed, with the declared training budget."""
    return [RunConfig(path=p, seed=int(s), task=dict(decl.data["task"]), train=dict(decl.data["train"]))
            for p in decl.data["arms"] for s in decl.data["seeds"]]


def train_runs(root: str | Path, decl=DECLARATION, *, workers: int | None = None,
               progress: bool = True) -> pd.DataFrame:
    """Train the declared runs into ``root`` (finished runs are kept); one row per run. ``workers``:
    training processes (``None``: one per core).
    Spawns worker processes: call it under ``if __name__ == "__main__":``."""
    from circuitfade.train.sweep import run_sweep

    return run_sweep(run_configs(decl), root, executor="local", workers=workers, progress=progress)


def trace_runs(root: str | Path, decl=DECLARATION, *, progress: bool = True) -> pd.DataFrame:
    """EAP-IG scores (the declared metric) at every checkpoint of every finished run in ``root``:
    a frame of :data:`SCORE_COLUMNS`, values to 6 significant digits. Runs without ``done.json``
    are left out (their seeds count as not run)."""
    import torch

    from circuitfade.store.sources import attach
    from circuitfade.store.tracing import trace
    from circuitfade.train.sweep import run_dir_for

    m = decl.data["metric"]
    metric = edge_attribution(method=m["method"], steps=m["steps"], objective=m["objective"])
    frames = []
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for cfg in run_configs(decl):
            d = run_dir_for(root, cfg)
            if not RunDir(d).is_done():
                continue
            df = trace(attach(d), [metric], n=m["examples"], progress=progress)
            df = df[df["metric"] == EDGE_ATTRIBUTION]
            frames.append(pd.DataFrame({"path": cfg.path, "seed": cfg.seed, "step": df["step"].astype(int),
                                        "edge": df["edge"], "kind": df["kind"],
                                        "value": [float(f"{v:.6g}") for v in df["value"]]}))
    finally:
        torch.set_num_threads(old)
    if not frames:
        return pd.DataFrame(columns=list(SCORE_COLUMNS))
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------- measures
def jaccard(a, b) -> float:
    """Jaccard overlap of two edge sets (1 for two empty sets)."""
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 1.0


def chance_jaccard(scores: pd.DataFrame, decl=DECLARATION) -> float:
    """The expected Jaccard overlap of two uniformly random top-k circuits of the traced graph's
    edges (:func:`circuitfade.stats.chance_overlap`; NaN without scores): context for every
    overlap, added after the runs and not part of any declared rule."""
    n = int(scores["edge"].nunique()) if len(scores) else 0
    if n == 0:
        return math.nan
    return chance_overlap(n, min(int(decl.data["circuit"]["k"]), n))["jaccard"]


def _check_scores(scores: pd.DataFrame) -> None:
    missing = [c for c in SCORE_COLUMNS if c not in scores.columns]
    if missing:
        raise ValueError(f"scores: missing columns {missing}; expected {list(SCORE_COLUMNS)} (scores.csv)")


def _circuits(scores: pd.DataFrame, k: int, by: str) -> dict[tuple, list[str]]:
    return {key: top_edges(g, k, by=by) for key, g in scores.groupby(["path", "seed", "step"], sort=True)}


def _prior_share(g: pd.DataFrame) -> float:
    a = g["value"].abs()
    total = float(a.sum())
    return float(a[g["kind"] == "prior"].sum()) / total if total > 0 else math.nan


def timeline(scores: pd.DataFrame, decl=DECLARATION) -> pd.DataFrame:
    """One row per run and checkpoint: ``path, seed, step``, ``overlap_final`` (with the run's
    final circuit), ``overlap_on`` (with the run's circuit at the declared gate-on step; NaN
    when that step was not traced), ``chance`` (:func:`chance_jaccard`: what two random
    circuits overlap by, the context for both), ``prior_share``, ``circuit`` (the top-k edges,
    best first, joined by spaces)."""
    _check_scores(scores)
    c = decl.data["circuit"]
    circuits = _circuits(scores, c["k"], c["by"])
    on, final = decl.data["gate_on_step"], decl.data["final_step"]
    chance = chance_jaccard(scores, decl)
    rows = []
    for (path, seed, step), g in scores.groupby(["path", "seed", "step"], sort=True):
        last = max(s for (p, sd, s) in circuits if p == path and sd == seed)
        ref_on = circuits.get((path, seed, on))
        rows.append({"path": path, "seed": int(seed), "step": int(step),
                     "overlap_final": jaccard(circuits[(path, seed, step)], circuits[(path, seed, last)])
                     if last == final else math.nan,
                     "overlap_on": jaccard(circuits[(path, seed, step)], ref_on) if ref_on is not None else math.nan,
                     "chance": chance, "prior_share": _prior_share(g), "circuit": " ".join(circuits[(path, seed, step)])})
    return pd.DataFrame(rows, columns=["path", "seed", "step", "overlap_final", "overlap_on", "chance", "prior_share",
                                       "circuit"])


def per_seed(scores: pd.DataFrame, decl=DECLARATION) -> pd.DataFrame:
    """One row per declared seed: the claims' quantities (:data:`QUANTITIES`; NaN where an arm of
    that seed was not traced to the final step) and ``share_of_edges`` (content-prior edges / all
    edges of the graph)."""
    _check_scores(scores)
    fade, zero, free = _decl_paths(decl)
    c = decl.data["circuit"]
    circuits = _circuits(scores, c["k"], c["by"])
    on, final = decl.data["gate_on_step"], decl.data["final_step"]
    first = scores.drop_duplicates(["path", "seed", "step"]).iloc[:1]
    share = math.nan
    if len(first):
        g = scores[(scores["path"] == first["path"].iloc[0]) & (scores["seed"] == first["seed"].iloc[0])
                   & (scores["step"] == first["step"].iloc[0])]
        share = float((g["kind"] == "prior").sum()) / len(g)
    rows = []
    for s in decl.data["seeds"]:
        f_fin, f_on, z_fin = circuits.get((fade, s, final)), circuits.get((fade, s, on)), circuits.get((zero, s, final))
        a = jaccard(f_fin, f_on) if f_fin is not None and f_on is not None else math.nan
        b = jaccard(f_fin, z_fin) if f_fin is not None and z_fin is not None else math.nan
        gu = scores[(scores["path"] == free) & (scores["seed"] == s) & (scores["step"] == final)]
        gf = scores[(scores["path"] == fade) & (scores["seed"] == s) & (scores["step"] == final)]
        rows.append({"seed": int(s), "overlap_fade_final_on": a, "overlap_fade_final_zero": b, "overlap_gap": a - b,
                     "prior_share_unforced": _prior_share(gu) if len(gu) else math.nan,
                     "prior_share_fade_final": _prior_share(gf) if len(gf) else math.nan,
                     "share_of_edges": share})
    return pd.DataFrame(rows, columns=["seed", *QUANTITIES, "share_of_edges"])


def chance_baselines(scores: pd.DataFrame, decl=DECLARATION) -> dict[str, float]:
    """Per quantity of :data:`QUANTITIES`, its value for random circuits and uniform attribution:
    the two overlaps :func:`chance_jaccard`, their difference 0, the two shares the content-prior
    edges' share of the edges. Context beside the measured values, added after the runs: no
    declared rule reads it (the share rule's 8/89 threshold is its own, declared before)."""
    j = chance_jaccard(scores, decl)
    share = float((scores.drop_duplicates("edge")["kind"] == "prior").mean()) if len(scores) else math.nan
    return {"overlap_fade_final_on": j, "overlap_fade_final_zero": j, "overlap_gap": 0.0 if j == j else math.nan,
            "prior_share_unforced": share, "prior_share_fade_final": share}


def summary_table(per_seed_frame: pd.DataFrame, chance: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per quantity: ``quantity, label, mean, lo, hi, n`` (95% Student t over seeds), and
    ``chance`` (:func:`chance_baselines`) when given."""
    rows = []
    for q, label in QUANTITIES.items():
        s = seed_summary(per_seed_frame[q].to_numpy(dtype=float))
        row = {"quantity": q, "label": label, "mean": s["mean"], "lo": s["lo"], "hi": s["hi"], "n": s["n"]}
        if chance is not None:
            row["chance"] = chance[q]
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(x: float, d: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _ci(r) -> str:
    if math.isnan(r["mean"]):
        return "—"
    return f"{r['mean']:.3f}" + ("" if math.isnan(r["lo"]) else f" [{r['lo']:.3f}, {r['hi']:.3f}]")


def verdicts(summary: pd.DataFrame, per_seed_frame: pd.DataFrame, decl=DECLARATION) -> list[Verdict]:
    """One verdict per declared claim (rules of ``decl``), with provenance and seeds run / declared;
    a claim whose arms ran on fewer seeds than declared is "not run (k of n seeds)"."""
    by = summary.set_index("quantity")
    out = []
    declared = len(decl.data["seeds"])
    for key, claim in declared_claims(decl).items():
        q = by.loc[decl.data["claims"][key]["quantity"]]
        s = {"mean": float(q["mean"]), "lo": float(q["lo"]), "hi": float(q["hi"])}
        n = int(q["n"])
        if n == 0:
            v = Verdict(claim, "—", Outcome.NOT_RUN, provenance=PROVENANCE[decl.version], seeds_run=0,
                        seeds_declared=declared)
        else:
            args = (s,) if key != "unforced_prior_share" else (s, float(per_seed_frame["share_of_edges"].iloc[0]))
            full, part = RULES[key](*args, decl=decl) if n >= 2 else (None, None)
            v = Verdict(claim, _ci(q), grade(full, part), provenance=PROVENANCE[decl.version], seeds_run=n,
                        seeds_declared=declared)
        out.append(v.checked_seeds())
    return out


def verdict_rows(vs: Sequence[Verdict]) -> pd.DataFrame:
    """``verdicts.csv``: the verdict table of ``vs`` with the claim ``id`` first (the declaration's
    keys, in order) and no ``study`` column (the question is our own: no published value)."""
    df = verdict_table(vs, columns={"ours": "ours (95% t interval)"}).drop(columns="study")
    df.insert(0, "id", list(declared_claims())[:len(df)])
    return df


_ANSWER = {Outcome.REPRODUCED: "Yes", Outcome.NOT_REPRODUCED: "No", Outcome.PARTLY: "Partly",
           Outcome.INCONCLUSIVE: "Undecided", Outcome.NOT_RUN: "Not answered yet"}


def _finding(vs: Sequence[Verdict]) -> str:
    """The finding, in words generated from the verdicts (the first claim answers the question)."""
    head = _ANSWER.get(vs[0].outcome, str(vs[0].outcome).capitalize())
    words = [f"{v.claim.name}: **{v.word}** ({v.ours})" for v in vs]
    return (f"**Is the edge circuit at gate zero the one that formed while the gate was on? {head}.** "
            "By claim (95% t intervals over seeds): " + "; ".join(words) + ".")


def to_markdown(scores: pd.DataFrame, decl=DECLARATION, *, note: str = "") -> str:
    """``results.md``: the finding, the verdict table, the per-seed table, the figure, provenance."""
    ps = per_seed(scores, decl)
    summary = summary_table(ps, chance_baselines(scores, decl))
    vs = verdicts(summary, ps, decl)
    c = decl.data["circuit"]
    m = decl.data["metric"]
    n_edges = scores["edge"].nunique()
    lines = ["**Circuits across the fade: EAP-IG edge circuits of three gate paths**", "", _finding(vs), "",
             markdown_table(verdict_rows(vs)), "",
             "| quantity | " + " | ".join(f"seed {s}" for s in ps["seed"]) + " | mean [95% t] | chance |",
             "|---" * (len(ps) + 3) + "|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r['label']} | " + " | ".join(_fmt(x) for x in ps[r["quantity"]]) + f" | {_ci(r)} | "
                     f"{_fmt(r['chance'])} |")
    lines += ["", f"Chance (context, added after the runs; no declared rule reads it): two random top-{c['k']} "
              f"circuits of the {n_edges} edges overlap by a Jaccard of {_fmt(chance_jaccard(scores, decl))} on "
              "average (`circuitfade.stats.chance_overlap`), so their difference is 0 by chance; with the "
              "attribution spread evenly the content-prior edges would carry their share of the edges.",
              "", "Figure `fig_circuits.png`: the overlap with the run's final circuit and the content-prior "
              "edges' share of the attribution at every checkpoint (thin: seeds; thick: mean; dashed: the fade "
              "starts at 600 and reaches gate 0 at 1050; dotted, left: the chance overlap).", "",
              "```text",
              f"declaration   {decl.stamp()}, committed before the runs (studies/circuits/declaration.py)",
              f"runs          {', '.join(decl.data['arms'])} x seeds {decl.data['seeds']}, "
              f"{decl.data['train']['steps']} steps, base model defaults",
              f"metric        {m['method']} ({m['steps']} steps), {m['objective']}, {m['examples']} examples, "
              f"corrupted: {m['corrupted']}",
              f"circuit       top {c['k']} edges by |score|; overlap: Jaccard; gate-on step {decl.data['gate_on_step']}",
              f"traced        {scores.groupby(['path', 'seed']).ngroups} runs, "
              f"{scores.drop_duplicates(['path', 'seed', 'step']).shape[0]} checkpoints, "
              f"{scores['edge'].nunique()} edges",
              "```"]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def figure(tl: pd.DataFrame, decl=DECLARATION):
    """Two panels over training steps, per arm: the top-k circuit's overlap with the run's final
    circuit (dotted: the chance overlap of two random circuits, when ``tl`` has its ``chance``
    column), and the content-prior edges' share of the attribution (seeds thin, mean thick)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.13, subplot_titles=["overlap with the final top-%d circuit" % decl.data["circuit"]["k"],
                                                        "content-prior edges' share of Σ|score|"])
    colors = dict(zip(decl.data["arms"], ("#d62728", "#1f77b4", "#2ca02c")))
    for col, q in ((1, "overlap_final"), (2, "prior_share")):
        for p in decl.data["arms"]:
            t = tl[tl["path"] == p]
            for s, ts in t.groupby("seed"):
                fig.add_trace(go.Scatter(x=ts["step"], y=ts[q], mode="lines", line=dict(color=colors[p], width=0.8),
                                         opacity=0.4, showlegend=False), row=1, col=col)
            mean = t.groupby("step", as_index=False)[q].mean()
            fig.add_trace(go.Scatter(x=mean["step"], y=mean[q], mode="lines+markers", name=p,
                                     line=dict(color=colors[p], width=2.5), showlegend=col == 1), row=1, col=col)
        for x in (600, 1050):
            fig.add_vline(x=x, line_dash="dash", line_color="grey", row=1, col=col)
        fig.update_xaxes(title_text="training step", row=1, col=col)
    if "chance" in tl.columns and tl["chance"].notna().any():
        chance = float(tl["chance"].dropna().iloc[0])
        fig.add_hline(y=chance, line_dash="dot", line_color="black", row=1, col=1,
                      annotation_text=f"chance {chance:.2f}", annotation_position="top right")
    fig.update_yaxes(range=[0, 1.02], title_text="Jaccard overlap with final circuit", row=1, col=1)
    fig.update_yaxes(tickformat=".2%", title_text="prior edges' share of Σ|score|", row=1, col=2)
    fig.update_layout(height=400, width=1050, title="Edge circuits (EAP-IG) over training, three gate paths")
    return fig


# ------------------------------------------------------------------------------- outputs
TABLES = ("timeline.csv", "per_seed.csv", "summary.csv", "verdicts.csv", "results.md")


def write_tables(out: str | Path, decl=DECLARATION, *, note: str = "") -> str:
    """Write every table and ``results.md`` in ``out`` from its ``scores.csv``; returns the markdown."""
    out = Path(out)
    scores = pd.read_csv(out / "scores.csv")
    ps = per_seed(scores, decl)
    summary = summary_table(ps, chance_baselines(scores, decl))
    md = to_markdown(scores, decl, note=note)
    write_csv(out / "timeline.csv", timeline(scores, decl))
    write_csv(out / "per_seed.csv", ps)
    write_csv(out / "summary.csv", summary)
    write_csv(out / "verdicts.csv", verdict_rows(verdicts(summary, ps, decl)))
    write_text(out / "results.md", md + "\n")
    return md


def rebuild(out: str | Path = "results/circuits", *, force: bool = False, figure_too: bool = False) -> str:
    """Rebuild every table and ``results.md`` in ``out`` from its ``scores.csv`` and ``config.json``
    without training or tracing (the same bytes as the run wrote); ``figure_too``: redraw
    ``fig_circuits.png`` from the rebuilt ``timeline.csv`` as well (needs kaleido). Existing
    outputs are replaced only with ``force``; ``ValueError`` naming the file if an input is
    missing or was written under another declaration."""
    out = Path(out)
    for name in ("scores.csv", "config.json"):
        if not (out / name).is_file():
            raise ValueError(f"{out / name}: not found (a tables-only rebuild reads the files of a finished run)")
    cfg = read_json(out / "config.json")
    if cfg.get("declaration") != DECLARATION.stamp():
        raise ValueError(f"{out / 'config.json'}: written under {cfg.get('declaration')!r}, "
                         f"not the current {DECLARATION.stamp()!r}")
    check_outputs([out / n for n in TABLES] + ([out / "fig_circuits.png"] if figure_too else []), force=force)
    md = write_tables(out, DECLARATION, note=cfg.get("note", ""))
    if figure_too:
        from circuitfade.viz.export import save_figure

        save_figure(figure(pd.read_csv(out / "timeline.csv")), out / "fig_circuits")
    return md


def run(out: str | Path = "results/circuits", *, train: bool = True, workers: int | None = None, progress: bool = True,
        force: bool = False) -> str:
    """Train (unless ``train=False``) and trace the declared runs under ``out/runs``, then write
    ``out``'s files; returns the markdown."""
    out = Path(out)
    check_outputs([out / n for n in ("scores.csv", "config.json", "fig_circuits.png", *TABLES)], force=force)
    t0 = time.time()
    if train:
        train_runs(out / "runs", workers=workers, progress=progress)
    scores = trace_runs(out / "runs", progress=progress)
    n_runs = scores.groupby(["path", "seed"]).ngroups if len(scores) else 0
    note = "" if n_runs == len(run_configs()) else \
        f"Only {n_runs} of the {len(run_configs())} declared runs had finished when this was written."
    write_json(out / "config.json", {"declaration": DECLARATION.stamp(), "note": note,
                                     "wall_s": round(time.time() - t0, 1)})
    write_csv(out / "scores.csv", scores)
    md = write_tables(out, note=note)
    from circuitfade.viz.export import save_figure

    save_figure(figure(pd.read_csv(out / "timeline.csv")), out / "fig_circuits")
    return md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.circuits",
                                 description="Edge circuits at gate zero and while the gate was on (EAP-IG).")
    ap.add_argument("--out", default="results/circuits")
    ap.add_argument("--train-only", action="store_true", help="train the declared runs into OUT/runs and stop")
    ap.add_argument("--no-train", action="store_true", help="trace only the runs already finished in OUT/runs")
    ap.add_argument("--workers", type=int, default=None,
                    help="parallel training processes, one torch thread each (default: one per core, os.cpu_count())")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--tables-only", action="store_true",
                    help="rebuild the tables and results.md from OUT's scores.csv and config.json")
    ap.add_argument("--figure", action="store_true",
                    help="with --tables-only: redraw fig_circuits.png from the rebuilt timeline.csv too")
    ap.add_argument("--force", action="store_true", help="replace OUT's existing result files")
    args = ap.parse_args(argv)
    check_count("--workers", args.workers)
    if args.tables_only:
        print(rebuild(args.out, force=args.force, figure_too=args.figure))
        return 0
    if args.train_only:
        print(train_runs(Path(args.out) / "runs", workers=args.workers, progress=not args.no_progress)
              .to_string(max_colwidth=40))
        return 0
    print(run(args.out, train=not args.no_train, workers=args.workers, progress=not args.no_progress,
              force=args.force))
    return 0
