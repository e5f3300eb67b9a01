"""History dependence between in-context and in-weights learning (balanced mix schedules).

Protocol ("Testing History Dependence Between In-Context and In-Weights Learning"), per seed:

1. **Anchor.** Train the study's small model (2 layers, 4 heads, ``d_model`` 64, GELU
   MLPs of width 128, learned absolute positions, no soft priors: 73,248 parameters)
   on ambiguous recall (:mod:`circuitfade.tasks.ambiguous`, 8 pairs) at a constant mix
   ``p_ICL = p0`` for ``anchor_steps`` updates (AdamW 1e-3, wd 0.01, clip 1, batch 64).
2. **Balanced branches.** Clone model *and* optimizer state (:func:`clone_run`) twice
   and train two branches for ``period`` updates on triangular mix schedules
   (:func:`circuitfade.gating.schedules.triangular`):

   * ``from_below``: ``p0 -> p0+δ -> p0-δ -> p0`` (``up_first``; the last leg comes up
     to ``p0`` from the IWL-favouring side ``p0-δ``);
   * ``from_above``: ``p0 -> p0-δ -> p0+δ -> p0`` (``down_first``; last leg comes down
     from the ICL-favouring side).

   Both branches see the **same multiset of examples**: :func:`balanced_plan` draws one
   batch per update ``k`` of the ``from_below`` schedule at its mix ``p_up(k)``; the
   triangle wave satisfies ``p_down(k) = 2 p0 - p_up(k) = p_up((k + period/2) mod
   period)``, so ``from_above`` replays the same batches cyclically shifted by half a
   period, each at exactly its own schedule's mix. Same number of updates, same
   examples, same total count of context-rule targets; only the order differs.
3. **Measures** at the end of the branches (on a fixed evaluation set; conflict
   trials = the two rules disagree):

   * behaviour: mean logit margin ``logit[context answer] - logit[fixed answer]`` at the
     query, per branch; **gap = margin(from_below) - margin(from_above)**; accuracy
     under each rule;
   * residual-stream patching in both directions (:func:`patch_resid`), the fraction
     of the margin gap restored at every (layer, position), and the correlation of
     the two maps;
   * mean replacement (:func:`mean_replacement`) of every head's ``hook_z`` / MLP
     output at the query by its checkpoint-specific batch mean: the fraction of the
     gap removed when all heads are replaced, and each history's dominant head
     (largest ``|Δ margin|`` when replaced alone);
   * relaxation: both branches continue at constant ``p0`` on the *same* fresh
     batches; the gap after ``relax_steps`` (0, 25, 100) further updates.
4. **Statistics over seeds**: mean, 95 % Student-t interval (``mean ± t_{0.975, n-1}
   · sd / √n``) and the exact two-sided sign-flip p-value (:func:`sign_flip_pvalue`).

The study does not give δ or the schedule length; we use δ = 0.3 and a period of 400
updates (100 up, 200 down, 100 back), after a 3,000-update anchor (enough for the
context circuit to form at ``p0 = 0.5``; the anchor's convergence is reported).

    python -m studies.history --seeds 5 --out results/history [--quick]
    python -m studies.history --tables-only --force      # rebuild the report from per_seed.csv

The claims compared with the study, and the rule that judges each, are declared in
:mod:`studies.history.declaration`; the report's headings come from the verdicts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from circuitfade.claims import Outcome, Verdict, grade, verdict_table
from circuitfade.commands.boundary import check_count
from circuitfade.io import check_outputs, read_json, write_csv, write_json, write_text
from circuitfade.stats import t_interval  # the one Student-t interval (re-exported here)
from circuitfade.viz.html import Section, write_page
from circuitfade.viz.tables import markdown_table
from studies.history.declaration import DECLARATION, PROVENANCE, RULES, rule_inputs
from studies.history.declaration import claims as declared_claims
from studies.history.figures import history_figures
from studies.history.protocol import (
    BRANCHES,
    DIRECTIONS,
    MODEL,
    BranchPlan,
    HistoryConfig,
    balanced_plan,
    behaviour,
    example_hashes,
    run_seed,
)

__all__ = ["BRANCHES", "DIRECTIONS", "MODEL", "STUDY", "HistoryConfig", "BranchPlan", "balanced_plan",
           "example_hashes", "behaviour", "sign_flip_pvalue", "t_interval", "summarize", "run_seed", "summary_table",
           "verdicts", "verdict_sections", "departures", "HEADINGS", "run", "rebuild", "to_markdown", "figures", "main"]

STUDY: dict[str, object] = {
    "gap_r0": "+0.0976 (5/5 seeds > 0, p = 0.0625)",
    "gap_r25": "reverses slightly",
    "gap_r100": "≈ 0 (vanished)",
    "frac_removed_all_heads": "86.8 %",
    "patch_corr": "> 0.999",
    "same_dominant_head": "same head in both histories",
}
"""The study's numbers (p0 = 0.5, five seeds) put beside ours in the report."""

def sign_flip_pvalue(values: Sequence[float]) -> float:
    """Exact two-sided sign-flip (randomisation) p-value of ``mean(values) = 0``.

    Enumerates all ``2^n`` sign assignments ``s`` and returns the fraction with
    ``|mean(s * values)| >= |mean(values)|`` (ties counted, with a 1e-12 relative
    tolerance). Five values of one sign give ``2/32 = 0.0625``, the smallest possible
    for ``n = 5``. NaNs are dropped; raises ``ValueError`` for no values or ``n > 20``.
    """
    x = np.asarray([float(v) for v in values if not math.isnan(float(v))])
    if x.size == 0:
        raise ValueError("sign_flip_pvalue: expected at least one finite value")
    if x.size > 20:
        raise ValueError(f"sign_flip_pvalue: exact enumeration of 2^{x.size} assignments is too large (n <= 20)")
    obs = abs(x.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=x.size)))
    stats = np.abs(signs @ x) / x.size
    return float(np.mean(stats >= obs - 1e-12 * max(obs, 1e-300)))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "ci_lo", "ci_hi", "n", "n_positive", "p_signflip"}`` over seeds."""
    x = [float(v) for v in values if not math.isnan(float(v))]
    m, lo, hi = t_interval(x)
    return {"mean": m, "ci_lo": lo, "ci_hi": hi, "n": len(x), "n_positive": sum(v > 0 for v in x),
            "p_signflip": sign_flip_pvalue(x) if x else math.nan}


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------
def _fmt(v, digits: int = 4) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:+.{digits}f}" if isinstance(v, float) else str(v)


def _frame(results) -> pd.DataFrame:
    """Per-seed rows (``per_seed.csv``'s columns) of finished results or of that file read back."""
    return results if isinstance(results, pd.DataFrame) else pd.DataFrame([r.row() for r in results])


def _quantities(hc: HistoryConfig, per_seed: pd.DataFrame):
    """``(key, label, column, statistics)`` per reported quantity; statistics: ``signed`` (interval,
    seeds > 0, sign-flip p), ``level`` (interval only) or ``share`` (mean only)."""
    parts = [p for p in ("heads", "mlps") if f"frac_removed_all_{p}" in per_seed
             and per_seed[f"frac_removed_all_{p}"].notna().all()]
    what = {"heads": "all query heads", "mlps": "both query MLPs"}
    q = [(f"gap_r{j}", f"margin gap (below − above) after {j} updates at p0", f"gap_r{j}", "signed")
         for j in hc.relax_steps]
    q += [(f"frac_removed_all_{p}", f"fraction of gap removed by mean-replacing {what[p]}", f"frac_removed_all_{p}",
           "signed") for p in parts]
    q += [("patch_corr", "correlation of patching maps (below→above vs above→below)", "patch_corr", "level"),
          ("same_dominant_head", "same dominant head in both histories (fraction of seeds)", "same_dominant_head",
           "share")]
    for field_, words in (("margin", "margin"), ("acc_context", "accuracy under the context rule"),
                          ("acc_fixed", "accuracy under the fixed rule")):
        q += [(f"{field_}_{b}", f"{words}, {b.replace('_', ' ')} (conflict trials)", f"{field_}_{b}", "level")
              for b in BRANCHES]
    return q + [("anchor_margin", "anchor: margin at p0 (conflict trials)", "anchor_margin", "level"),
                ("anchor_acc_either", "anchor: argmax is one of the two rule answers (conflict trials)",
                 "anchor_acc_either", "level"),
                ("anchor_loss_excess", "anchor: loss above the Bayes optimum (nats)", "anchor_loss_excess", "level")]


def summary_table(results, hc: HistoryConfig) -> pd.DataFrame:
    """One row per quantity: ``quantity, label, mean, ci_lo, ci_hi, n, n_positive, p_signflip, study``.

    ``results``: the seeds' :class:`SeedResult` objects, or their ``per_seed.csv`` rows (the same
    numbers: a report can be rebuilt from the file without training)."""
    per_seed = _frame(results)
    rows = []
    for key, label, column, kind in _quantities(hc, per_seed):
        if column not in per_seed:
            continue
        s = summarize(per_seed[column].astype(float).tolist())
        if kind != "signed":
            s.update(n_positive=math.nan, p_signflip=math.nan)
        if kind == "share":
            s.update(ci_lo=math.nan, ci_hi=math.nan)
        rows.append({"quantity": key, "label": label, **s, "study": STUDY.get(key, "")})
    if "frac_removed_all_heads" in {r["quantity"] for r in rows}:  # ratio of seed means: robust to a gap near 0
        pooled = 1 - per_seed["gap_sub_all_heads"].astype(float).mean() / per_seed["gap_sub"].astype(float).mean()
        rows.append({"quantity": "frac_removed_all_heads_pooled",
                     "label": "fraction removed by all heads, 1 − mean(gap after)/mean(gap before)",
                     "mean": float(pooled), "ci_lo": math.nan, "ci_hi": math.nan, "n": len(per_seed),
                     "n_positive": math.nan, "p_signflip": math.nan, "study": STUDY["frac_removed_all_heads"]})
    return pd.DataFrame(rows)


def _ours(key: str, g: pd.DataFrame, decl) -> str:
    """The claim's statistic as a table cell."""

    def iv(q, d=4):
        r = g.loc[q]
        return f"{r['mean']:+.{d}f}" + ("" if math.isnan(r["ci_lo"]) else f" [{r['ci_lo']:+.{d}f}, {r['ci_hi']:+.{d}f}]")

    def pos(q):
        r = g.loc[q]
        return f"{int(r['n_positive'])}/{int(r['n'])} seeds > 0"

    if key == "gap_sign":
        return f"{iv('gap_r0')}, {pos('gap_r0')}, sign-flip p = {g.loc['gap_r0', 'p_signflip']:.4f}"
    if key == "gap_reverses":
        return f"{iv('gap_r25')}, {pos('gap_r25')} (immediate gap {g.loc['gap_r0', 'mean']:+.4f})"
    if key == "gap_vanishes":
        b = decl.data["claims"]["gap_vanishes"]["fraction"] * abs(g.loc["gap_r0", "mean"])
        return f"{iv('gap_r100')} vs ±{b:.4f}"
    if key == "heads_carry_gap":
        pooled = g.loc["frac_removed_all_heads_pooled", "mean"] if "frac_removed_all_heads_pooled" in g.index else math.nan
        return f"{iv('frac_removed_all_heads', 3)} per seed; pooled {pooled:.3f}"
    if key == "patch_maps_agree":
        return iv("patch_corr")
    r = g.loc["same_dominant_head"]
    return f"{round(r['mean'] * r['n'])}/{int(r['n'])} seeds"


def verdicts(summary: pd.DataFrame, decl=DECLARATION) -> list[Verdict]:
    """Every declared claim judged by its rule (:mod:`studies.history.declaration`) on ``summary``
    (:func:`summary_table`); a claim whose quantities were not measured is "not run"."""
    g = summary.set_index("quantity")
    out = []
    for key, c in declared_claims(decl).items():
        names = rule_inputs(key)
        prov = PROVENANCE.get(decl.version)
        if not all(q in g.index for q in names):
            out.append(Verdict(c, "—", Outcome.NOT_RUN, provenance=prov, seeds_run=0, seeds_declared=decl.data["seeds"]))
            continue
        args = [{"mean": float(g.loc[q, "mean"]), "lo": float(g.loc[q, "ci_lo"]), "hi": float(g.loc[q, "ci_hi"]),
                 "n": int(g.loc[q, "n"])} for q in names]
        full, part = RULES[key](*args, decl=decl)
        outcome = grade(full, part)
        note = "(full rule undecided)" if outcome is Outcome.PARTLY and full is None else ""
        n_run = min(int(x["n"]) for x in args)
        v = Verdict(c, _ours(key, g, decl), outcome, note, prov, n_run, decl.data["seeds"])
        out.append(v)
    return out


def verdict_rows(summary: pd.DataFrame, decl=DECLARATION) -> pd.DataFrame:
    """``verdicts.csv``: one row per declared claim, its id (the declaration's key) first, then
    :func:`circuitfade.claims.verdict_table`'s columns with the seeds run and the provenance."""
    df = verdict_table(verdicts(summary, decl))
    df.insert(0, "id", list(declared_claims(decl)))
    return df


def departures(hc: HistoryConfig, n_seeds: int, decl=DECLARATION) -> list[str]:
    """How a run's settings and seed count differ from the declaration's (``[]``: they match)."""
    ours = json.loads(json.dumps(asdict(hc)))
    want = decl.data["config"]
    out = [f"{k} {ours.get(k)!r} vs declared {want.get(k)!r}" for k in sorted(set(ours) | set(want))
           if ours.get(k) != want.get(k)]
    if n_seeds != decl.data["seeds"]:
        out.append(f"{n_seeds} seeds vs declared {decl.data['seeds']}")
    return out


HEADINGS = ((Outcome.REPRODUCED, "What reproduced"), (Outcome.PARTLY, "What partly reproduced"),
            (Outcome.INCONCLUSIVE, "Inconclusive"), (Outcome.NOT_REPRODUCED, "What did not reproduce"),
            (Outcome.NOT_TESTABLE, "Not testable"), (Outcome.NOT_RUN, "Not run"))
"""The report's verdict headings, one per :class:`~circuitfade.claims.Outcome`, in this order."""


def verdict_sections(vs: Sequence[Verdict]) -> list[str]:
    """Markdown lines: under each outcome's heading (only those that occur), one bullet per claim."""
    lines = []
    for outcome, heading in HEADINGS:
        mine = [v for v in vs if v.outcome is outcome]
        if mine:
            lines += [f"{heading}:", ""] + [f"- {v.claim.name}: ours {v.ours}; study {v.claim.study}"
                                            + (f" ({v.note.strip('()')})" if v.note else "") + "." for v in mine] + [""]
    return lines


def to_markdown(results, summary: pd.DataFrame, hc: HistoryConfig, *, label: str = "",
                wall_s: float | None = None, note: str = "", decl=DECLARATION) -> str:
    """The report: settings, summary beside the study's numbers, per-seed table, and the verdicts
    under headings taken from their outcomes. ``results``: :class:`SeedResult` objects or their
    ``per_seed.csv`` rows."""
    per_seed = _frame(results)
    lines = ["**History dependence at a balanced ICL/IWL mix**", ""]
    if label:
        lines += [f"**{label}**", ""]
    if note:
        lines += [note, ""]
    lines += [
        f"Model: 2 layers, 4 heads, d_model 64, GELU MLP 128, learned positions, no priors; "
        f"task: ambiguous recall ({hc.n_pairs} pairs, 16 keys, 16 values). Anchor: {hc.anchor_steps} updates at "
        f"p0 = {hc.p0}; branches: triangular δ = {hc.delta}, period {hc.period} updates "
        f"(from below = p0→p0+δ→p0−δ→p0, from above = p0→p0−δ→p0+δ→p0), same multiset of examples; "
        f"relaxation at p0 on shared fresh batches. Batch {hc.batch_size}, AdamW lr {hc.lr}. "
        f"Evaluation: {hc.eval_size} fixed prompts (conflict trials for margins); patching / mean replacement "
        f"on the first {hc.patch_size}. Interval: 95 % Student-t over seeds; p: exact two-sided sign-flip.",
        "",
        f"Declaration: {decl.stamp()} (`studies/history/declaration.py`: settings, seeds, claims, rules; "
        f"declared {decl.data['declared']}).",
        "",
        "| quantity | ours: mean [95 % CI] | seeds > 0 | sign-flip p | study |",
        "|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        ci = "" if math.isnan(r["ci_lo"]) else f" [{r['ci_lo']:+.4f}, {r['ci_hi']:+.4f}]"
        npos = "" if math.isnan(r["n_positive"]) else f"{int(r['n_positive'])}/{int(r['n'])}"
        p = "" if math.isnan(r["p_signflip"]) else f"{r['p_signflip']:.4f}"
        study = "" if not isinstance(r["study"], str) else r["study"]
        lines.append(f"| {r['label']} | {r['mean']:+.4f}{ci} | {npos} | {p} | {study} |")
    later = [j for j in hc.relax_steps if j]
    lines += ["", "Per seed:", "",
              "| seed | anchor acc (either / ctx / fixed) | margin below | margin above | gap r0 | "
              + " | ".join(f"gap r{j}" for j in later) + " | frac removed (heads) | patch corr | "
              "dominant head (below / above) |", "|---" * (8 + len(later)) + "|"]
    for _, r in per_seed.iterrows():
        frac = r["frac_removed_all_heads"] if "frac_removed_all_heads" in r else math.nan
        lines.append(
            f"| {r['seed']} | {r['anchor_acc_either']:.3f} / {r['anchor_acc_context']:.3f} / {r['anchor_acc_fixed']:.3f} | "
            f"{_fmt(r['margin_from_below'])} | {_fmt(r['margin_from_above'])} | {_fmt(r['gap_r0'])} | "
            + " | ".join(_fmt(r[f"gap_r{j}"]) for j in later) + f" | {_fmt(frac, 3)} | "
            f"{_fmt(r['patch_corr'], 4)} | {r['dominant_head_from_below']} / {r['dominant_head_from_above']} |")
    vs = verdicts(summary, decl)
    off = departures(hc, len(per_seed), decl)
    lines += ["", f"Verdicts (rules of {decl.stamp()}):", ""]
    if off:
        lines += [f"**These settings differ from the declaration ({'; '.join(off)}): the verdicts below do not "
                  "test it.**", ""]
    lines += [
              markdown_table(verdict_table(vs, columns={"ours": "ours (95% t interval)"})), ""]
    lines += verdict_sections(vs)
    if wall_s is not None:
        lines += ["", f"Wall time: {wall_s / 60:.1f} min ({len(per_seed)} seeds, 1 thread)."]
    return "\n".join(lines).rstrip("\n")


def figures(trace: pd.DataFrame, patching: pd.DataFrame, hc: HistoryConfig) -> dict:
    """The study's figures (:func:`studies.history.figures.history_figures`) for finished frames."""
    return history_figures(trace, patching, hc.period)


def _write_html(figs: dict, path: Path, title: str) -> None:
    write_page(path, title, [Section(name, [fig]) for name, fig in figs.items()])


QUICK = dict(anchor_steps=300, period=40, relax_steps=(0, 5, 20), relax_every=5, trace_every=5, eval_size=512,
             patch_size=128)
"""Settings of ``--quick`` (the code path only: the context circuit has not formed; not comparable)."""


def run(seeds: int | Sequence[int] = 5, out: str | Path | None = "results/history", *,
        anchor_steps: int | None = None, delta: float | None = None, period: int | None = None,
        quick: bool = False, progress: bool = True, config: HistoryConfig | None = None,
        threads: int | None = 1) -> tuple[pd.DataFrame, str]:
    """Run the experiment for ``seeds`` (a count: ``0 .. n-1``, or explicit seeds) and write
    ``out/`` (``per_seed.csv``, ``summary.csv``, ``trace.csv``, ``patching.csv``,
    ``replacement.csv``, ``results.md``, ``figures.html``; nothing if ``out`` is None).

    Returns ``(per_seed, markdown)``: one row per seed with every scalar measure.
    ``config`` gives every setting; ``anchor_steps`` / ``delta`` / ``period`` override
    it; ``quick`` starts from :data:`QUICK`. ``threads``: torch threads while running.
    """
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected a positive count or a non-empty list")
    hc = config or (HistoryConfig(**QUICK) if quick else HistoryConfig())
    over = {k: v for k, v in dict(anchor_steps=anchor_steps, delta=delta, period=period).items() if v is not None}
    hc = replace(hc, **over)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.time()
    try:
        from tqdm import tqdm

        results = [run_seed(s, hc, progress=progress) for s in tqdm(seeds, disable=not progress, desc="history seeds")]
    finally:
        torch.set_num_threads(old)
    wall = time.time() - t0
    per_seed = pd.DataFrame([r.row() for r in results])
    frames = {"trace": pd.concat([r.trace for r in results], ignore_index=True),
              "patching": pd.concat([r.mechanism.patching for r in results], ignore_index=True),
              "replacement": pd.concat([r.mechanism.replacement for r in results], ignore_index=True)}
    summary = summary_table(results, hc)
    label = "QUICK — code path only, not comparable to the study" if quick else ""
    md = to_markdown(results, summary, hc, label=label, wall_s=wall)
    if out is not None:
        out = Path(out)
        for name, df in {"per_seed": per_seed, "summary": summary, **frames}.items():
            write_csv(out / f"{name}.csv", df)
        write_json(out / "config.json", asdict(hc))
        write_json(out / "run.json", {"seeds": seeds, "wall_s": wall, "quick": bool(quick)})
        write_csv(out / "verdicts.csv", verdict_rows(summary))
        write_text(out / "results.md", md + "\n")
        _write_html(figures(frames["trace"], frames["patching"], hc), out / "figures.html",
                    "History dependence between ICL and IWL")
    return per_seed, md


def rebuild(out: str | Path = "results/history", *, force: bool = False) -> str:
    """Rebuild ``summary.csv`` and ``results.md`` in ``out`` from its ``per_seed.csv`` and
    ``config.json`` (and ``run.json`` if there: wall time, quick mode), without training: the
    same numbers, judged by the current declaration. Existing outputs are replaced only with
    ``force``; ``ValueError`` naming the file if an input is missing."""
    out = Path(out)
    for name in ("per_seed.csv", "config.json"):
        if not (out / name).is_file():
            raise ValueError(f"{out / name}: not found (a tables-only rebuild reads the files of a finished run)")
    check_outputs([out / "summary.csv", out / "verdicts.csv", out / "results.md"], force=force)
    per_seed = pd.read_csv(out / "per_seed.csv")
    hc = HistoryConfig(**read_json(out / "config.json"))
    meta = read_json(out / "run.json") if (out / "run.json").is_file() else {}
    summary = summary_table(per_seed, hc)
    note = ("Rebuilt from per_seed.csv and config.json without training "
            "(`python -m studies.history --tables-only`)" + ("" if "wall_s" in meta else
                                                            "; the runs' wall time is not recorded there") + ".")
    md = to_markdown(per_seed, summary, hc, note=note, wall_s=meta.get("wall_s"),
                     label="QUICK — code path only, not comparable to the study" if meta.get("quick") else "")
    write_csv(out / "summary.csv", summary)
    write_csv(out / "verdicts.csv", verdict_rows(summary))
    write_text(out / "results.md", md + "\n")
    return md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.history",
                                 description="Balanced ICL/IWL mix schedules: history dependence, patching, relaxation.")
    ap.add_argument("--seeds", type=int, default=DECLARATION.data["seeds"])
    ap.add_argument("--out", default="results/history")
    ap.add_argument("--quick", action="store_true", help="tiny budget (code path only; not comparable)")
    ap.add_argument("--anchor-steps", type=int, default=None)
    ap.add_argument("--delta", type=float, default=None)
    ap.add_argument("--period", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--tables-only", action="store_true",
                    help="do not train: rebuild summary.csv and results.md from OUT's per_seed.csv and config.json")
    ap.add_argument("--force", action="store_true", help="with --tables-only: replace OUT's summary.csv and results.md")
    args = ap.parse_args(argv)
    check_count("--threads", args.threads)
    if args.tables_only:
        print(rebuild(args.out, force=args.force))
        return 0
    _, md = run(args.seeds, args.out, anchor_steps=args.anchor_steps, delta=args.delta, period=args.period,
                quick=args.quick, progress=not args.no_progress, threads=args.threads)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
