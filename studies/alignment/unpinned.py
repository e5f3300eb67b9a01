"""``python -m studies.alignment unpinned``: the part-ablation fingerprint where it can fail.

Protocol: :data:`~studies.alignment.protocol.PARTS_V2` (``alignment.parts`` v2). On the pinned apparatus
(v1) every part is the only route for its input and the task is shortcut-free, so ablating any part gives
chance in any model: "no partial credit" cannot fail there. Here the K-part circuit is trained from scratch
on the *unpinned* preset (``kpart_model(task, pinned=False)``: each head learns its own query-key routing;
K = 2, 3, 4; seeds 0-4; stopping rule, caps and evaluation batch as v1). Its parts are found after training
by :func:`~circuitfade.analysis.parts.routing_parts` (one distinct head per input, maximising the summed
query-row attention to the inputs on the evaluation batch); every other head is a non-part head. Each part
and each non-part head is ablated alone (:func:`~circuitfade.analysis.parts.part_ablation`; mean ablation is
the primary method, zero and resample are reported).

Verdicts (rules in the declaration, applied by :func:`unpinned_verdicts`):

* **no partial credit** by :func:`~circuitfade.analysis.parts.credit_verdict` on the cells K x seed:
  reproduced if the 95% interval of the median credit ratio lies below 0.5, not reproduced if above,
  inconclusive otherwise; the same rule re-judges v1's pinned circuits (a control: forced there) and the
  developing induction series (cells checkpoint x part: one training run).
* **a random non-part head leaves ~100%**: v1's rule (median >= 95%; partly >= 80%), now able to fail
  because a non-part head may carry an input too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from circuitfade.analysis.parts import METHODS, Credit, credit_verdict, part_ablation, pool_cells, routing_parts
from circuitfade.claims import Claim, Outcome, Verdict
from circuitfade.tasks import eval_set
from circuitfade.train import new_run
from circuitfade.tasks import EVAL_SEED
from circuitfade.viz.export import save_figure
from circuitfade.viz.tables import markdown_table
from studies.alignment.apparatus import CHUNK, base_config, from_scratch, run_cached_jobs
from studies.alignment.protocol import (FORCED_V3, IDENTIFY_MARGIN, MIN_IDENTIFIED, PARTS_V2, forced,
                                        rules_of, stamp, verdict_frame)

__all__ = ["KS", "SEEDS", "CAPS", "CLAIM_CREDIT", "CLAIM_RANDOM", "CLAIM_CREDIT_V3", "CLAIM_RANDOM_V3",
           "unpinned_base_job", "ablate_cell", "identification", "credit_row", "unpinned_verdicts",
           "unpinned_verdicts_v3", "credit_figure", "run"]

KS = tuple(PARTS_V2.data["ks"])
SEEDS = tuple(PARTS_V2.data["seeds"])
CAPS = {int(k): int(v) for k, v in PARTS_V2.data["base_cap"].items()}
_RULES = rules_of("parts", 2)
CLAIM_CREDIT = Claim("no partial credit: one part ablated leaves little (credit rule)",
                     rule=_RULES["no partial credit: one part ablated leaves little (credit rule)"],
                     study="median 17%, 32/32 below 50–83%, p = 2e-10",
                     statistic="credit ratio retained / ((K-1)/K) per cell, median with distribution-free 95% interval",
                     fails_if="the interval of the median credit ratio lies above 0.5")
CLAIM_RANDOM = Claim("a random non-part head leaves ~100%", rule=_RULES["a random non-part head leaves ~100%"],
                     study="100%", statistic="median retained fraction, one non-part head ablated",
                     fails_if="median retained below 80%")
_OUTCOME = {Credit.NONE: Outcome.REPRODUCED, Credit.PARTIAL: Outcome.NOT_REPRODUCED,
            Credit.UNDECIDED: Outcome.INCONCLUSIVE}
_RULES3 = rules_of("parts", 3)
_C3, _R3 = list(_RULES3)
CLAIM_CREDIT_V3 = Claim(_C3, rule=_RULES3[_C3], study=CLAIM_CREDIT.study, statistic=CLAIM_CREDIT.statistic,
                        fails_if="the parts pass the identification control and the interval of the median credit "
                                 "ratio lies above 0.5")
CLAIM_RANDOM_V3 = Claim(_R3, rule=_RULES3[_R3], study="100%",
                        statistic="median retained fraction, one non-part head of an identified cell ablated",
                        fails_if="median retained below 80% in the identified cells")
_FORCED_WHY = FORCED_V3.data["rows"]["parts v1 and v2, pinned: no partial credit, and a random non-part head "
                                     "leaves ~100%"]


def ablate_cell(model, task, batch, *, k: int, seed: int, methods=METHODS) -> tuple[pd.DataFrame, dict]:
    """One cell of the part-ablation experiment on a trained (or planted) model: its parts found by
    :func:`~circuitfade.analysis.parts.routing_parts` on ``batch``, then every part and every non-part head
    ablated alone by each of ``methods`` (:func:`~circuitfade.analysis.parts.part_ablation`). Returns the
    ablation rows (with ``k, seed``) and the routing (``parts, own, shared, attention``)."""
    route = routing_parts(model, batch.tokens, task.positions, task.query_pos)
    n_other = model.cfg.n_heads - len(route["parts"])
    frames = [part_ablation(model, batch, task, parts=route["parts"], method=m, n_random=n_other, seed=seed)
              .assign(k=k, seed=seed) for m in methods]
    return pd.concat(frames, ignore_index=True), {key: route[key] for key in ("parts", "own", "shared", "attention")}


def unpinned_base_job(spec: Mapping, out: str) -> dict:
    """Train the unpinned K-part circuit from scratch until ignition + margin; find its parts; ablate them."""
    torch.set_num_threads(1)
    k, seed = int(spec["k"]), int(spec["seed"])
    t0 = time.process_time()
    cfg_at = lambda s: base_config(k, seed, s, pinned=False)  # noqa: E731
    run = new_run(cfg_at(CHUNK))
    task = run.config.make_task()
    ig, steps, accs = from_scratch(run, cfg_at, CAPS[k], task.chance)
    res = {**spec, "ignition": ig, "final_step": run.step, "final_acc": accs[-1]}
    if ig is not None:
        ev = eval_set(task, n=512, seed=EVAL_SEED + 1)  # an evaluation batch the stopping rule never saw
        rows, res["routing"] = ablate_cell(run.model, task, ev, k=k, seed=seed)
        res["ablation"] = rows.to_dict("records")
    res["cpu_s"] = time.process_time() - t0
    return res


def identification(frame: pd.DataFrame, by: list[str], *, margin: float = IDENTIFY_MARGIN) -> pd.DataFrame:
    """The positive control of ``alignment.parts`` v3, per cell (``by``): ``part_max`` (the largest retained
    fraction over the cell's single-part ablations), ``other_min`` (the smallest over its non-part heads) and
    ``identified``: every part ablated leaves at least ``margin`` less than every non-part head (a cell
    without a finite part and non-part value is not identified)."""
    missing = [c for c in list(by) + ["kind", "retained"] if c not in frame.columns]
    if missing:
        raise ValueError(f"identification: ablation rows lack columns {missing}")
    index = frame.groupby(list(by)).size().index
    part = frame[frame.kind == "part"].groupby(list(by)).retained.max().reindex(index).rename("part_max")
    other = frame[frame.kind == "random"].groupby(list(by)).retained.min().reindex(index).rename("other_min")
    cells = pd.concat([part, other], axis=1).reset_index()
    ok = np.isfinite(cells.part_max.astype(float)) & np.isfinite(cells.other_min.astype(float))
    cells["identified"] = ok & (cells.part_max <= cells.other_min - margin)
    return cells


def credit_row(claim: Claim, cells: pd.DataFrame | None, what: str) -> tuple[Verdict, dict | None]:
    """One verdict of the credit rule on ``cells`` (columns ``retained, partial_credit``); NOT_RUN without cells."""
    if cells is None or not len(cells):
        return Verdict.not_run(claim), None
    c = credit_verdict(cells)
    ours = (f"median credit ratio {c['median']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}] ({c['coverage']:.0%} "
            f"distribution-free interval) over {c['n']} {what}: {c['verdict']}")
    return Verdict(claim, ours, _OUTCOME[c["verdict"]]), c


def _random_verdict(rows: pd.DataFrame) -> Verdict:
    rnd = rows[rows.kind == "random"].retained.dropna()
    if not len(rnd):
        return Verdict.not_run(CLAIM_RANDOM)
    med = float(rnd.median())
    outcome = Outcome.REPRODUCED if med >= 0.95 else (Outcome.PARTLY if med >= 0.8 else Outcome.NOT_REPRODUCED)
    return Verdict(CLAIM_RANDOM, f"median {med:.1%} over {len(rnd)} non-part head ablations (range "
                                 f"{rnd.min():.1%}–{rnd.max():.1%})", outcome)


def unpinned_verdicts(unpinned: pd.DataFrame | None, pinned: pd.DataFrame | None,
                      series: pd.DataFrame | None) -> tuple[pd.DataFrame, dict]:
    """Verdict rows (protocol ``alignment.parts`` v2) from mean-ablation rows of the unpinned jobs, v1's pinned
    jobs and the developing series (:func:`~circuitfade.analysis.parts.part_ablation` frames with ``k, seed``
    or ``step``). Returns the table and the credit summaries by apparatus."""
    rows, summaries = [], {}
    for name, frame, by, what in (("unpinned", unpinned, ["k", "seed"], "cells (K x seed)"),
                                  ("pinned (control: forced)", pinned, ["k", "seed"], "cells (K x seed)")):
        cells = None if frame is None or not len(frame) else pool_cells(frame, by)["cells"]
        v, summaries[name] = credit_row(CLAIM_CREDIT, cells, what)
        rows.append((v, name))
        if name == "unpinned":
            rows.append((_random_verdict(frame) if frame is not None else Verdict.not_run(CLAIM_RANDOM), name))
    cells = None
    if series is not None and len(series):
        cells = series[series.kind == "part"][["step", "part", "retained", "partial_credit"]]
    claim = Claim("developing series: no partial credit between the previous-token and the induction head",
                  rule=CLAIM_CREDIT.rule, study="no partial credit", statistic=CLAIM_CREDIT.statistic,
                  fails_if=CLAIM_CREDIT.fails_if)
    v, summaries["series"] = credit_row(claim, cells, "checkpoint x part ablations of one training run")
    rows.append((v, "developing series (local induction model)"))
    table = verdict_frame([v for v, _ in rows], "parts", 2, [a for _, a in rows])
    pinned_rows = table.apparatus.str.startswith("pinned")
    table.loc[pinned_rows] = forced(table[pinned_rows], {CLAIM_CREDIT.name: _FORCED_WHY}).values
    return table, summaries


def _v3_rows(frame: pd.DataFrame | None, by: list[str], what: str) -> tuple[list[Verdict], dict]:
    """The two v3 verdicts of one apparatus: identification first, then the credit and random-head rules on
    the identified cells only."""
    if frame is None or not len(frame):
        return [Verdict.not_run(CLAIM_CREDIT_V3), Verdict.not_run(CLAIM_RANDOM_V3)], {}
    ident = identification(frame, by)
    keep = ident[ident.identified][by]
    rows = frame.merge(keep, on=by)
    n_id, n = int(ident.identified.sum()), len(ident)
    head = f"parts identified in {n_id} of {n} {what} (every part at least {IDENTIFY_MARGIN:g} below every non-part head)"
    summary = {"identified": n_id, "cells": n, "table": ident}
    if n_id < MIN_IDENTIFIED:
        note = "(parts not identified)"
        return [Verdict(CLAIM_CREDIT_V3, head, Outcome.NOT_TESTABLE, note=note),
                Verdict(CLAIM_RANDOM_V3, head, Outcome.NOT_TESTABLE, note=note)], summary
    if "step" in by:  # the developing series: a cell is one part ablation at one checkpoint
        cells = rows[rows.kind == "part"][by + ["part", "retained", "partial_credit"]]
    else:
        cells = pool_cells(rows, by)["cells"]
    c = credit_verdict(cells)
    summary["credit"] = c
    credit = Verdict(CLAIM_CREDIT_V3, f"{head}; there the median credit ratio {c['median']:.2f} [{c['lo']:.2f}, "
                                      f"{c['hi']:.2f}] ({c['coverage']:.0%} distribution-free interval) over "
                                      f"{c['n']} cells: {c['verdict']}", _OUTCOME[c["verdict"]])
    rnd = rows[rows.kind == "random"].retained.dropna()
    med = float(rnd.median())
    outcome = Outcome.REPRODUCED if med >= 0.95 else (Outcome.PARTLY if med >= 0.8 else Outcome.NOT_REPRODUCED)
    random = Verdict(CLAIM_RANDOM_V3, f"{head}; there the median non-part head leaves {med:.1%} over {len(rnd)} "
                                      f"ablations", outcome)
    return [credit, random], summary


def unpinned_verdicts_v3(unpinned: pd.DataFrame | None, pinned: pd.DataFrame | None,
                         series: pd.DataFrame | None) -> tuple[pd.DataFrame, dict]:
    """Verdict rows of ``alignment.parts`` v3 (declared after the v2 results) from the same mean-ablation rows
    as :func:`unpinned_verdicts`: per apparatus, the identification control (:func:`identification`) first;
    the credit rule and the random-head rule only on the cells that pass it, "not testable (parts not
    identified)" with fewer than six; the pinned rows "forced by the apparatus". Returns the table and the
    summaries by apparatus."""
    verdicts, apparatus, summaries = [], [], {}
    for name, frame, by, what in (("unpinned", unpinned, ["k", "seed"], "cells (K x seed)"),
                                  ("pinned (v1 runs)", pinned, ["k", "seed"], "cells (K x seed)"),
                                  ("developing series (local induction model)", series, ["step"],
                                   "checkpoints of one training run")):
        if frame is not None and "step" in frame:
            frame = frame[np.isfinite(frame.retained.astype(float))]
        vs, summaries[name] = _v3_rows(frame, by, what)
        verdicts += vs
        apparatus += [name] * len(vs)
    table = verdict_frame(verdicts, "parts", 3, apparatus)
    pinned_rows = table.apparatus.str.startswith("pinned")
    table.loc[pinned_rows] = forced(table[pinned_rows], {c.name: _FORCED_WHY
                                                         for c in (CLAIM_CREDIT_V3, CLAIM_RANDOM_V3)}).values
    return table, summaries


def credit_figure(groups: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Credit ratio per cell (retained over (K-1)/K) by apparatus, with the two predictions and the split."""
    fig = go.Figure()
    rng = np.random.default_rng(0)
    colors = ["#1f77b4", "#7f7f7f", "#2ca02c"]
    for i, (name, cells) in enumerate(groups.items()):
        c = (cells.retained / cells.partial_credit).dropna()
        fig.add_scatter(x=i + rng.uniform(-0.15, 0.15, len(c)), y=c, mode="markers", name=name,
                        marker={"size": 8, "color": colors[i % 3], "opacity": 0.8})
    for y, text, dash in ((1.0, "partial credit (K-1)/K", "dash"), (0.5, "split of the rule", "dot"),
                          (0.0, "no partial credit", "dash")):
        fig.add_hline(y=y, line_dash=dash, annotation_text=text, annotation_position="top left")
    fig.update_layout(title="Part ablation: credit ratio per cell (retained / (K-1)/K; mean ablation)",
                      xaxis={"tickvals": list(range(len(groups))), "ticktext": list(groups)},
                      yaxis={"title": "credit ratio (0: no partial credit, 1: partial credit)"},
                      width=820, height=480, template="plotly_white", showlegend=False)
    return fig


def _routing_table(jobs: list[dict]) -> pd.DataFrame:
    rows = [{"k": j["k"], "seed": j["seed"], "ignition": j["ignition"],
             "parts": " ".join(f"L{l}H{h}" for l, h in j["routing"]["parts"]),
             "own_attention_min": min(j["routing"]["own"]), "shared_attention_max": max(j["routing"]["shared"])}
            for j in jobs if j.get("routing")]
    return pd.DataFrame(rows)


def _identification_table(v3: Mapping) -> pd.DataFrame:
    frames = [x["table"].assign(apparatus=name) for name, x in v3.items() if x.get("table") is not None]
    if not frames:
        return pd.DataFrame()
    t = pd.concat(frames, ignore_index=True)
    return t[["apparatus"] + [c for c in t.columns if c != "apparatus"]]


def _markdown(out: Path, table, routing, cells_u, failed, cpu, v3: Mapping) -> str:
    ident = _identification_table(v3)
    return "\n".join([
        "## Part ablation on the unpinned apparatus", "",
        f"Protocol: {stamp('parts', 2)}. Command: `python -m studies.alignment unpinned --out {out}`. "
        f"K in {list(KS)}, seeds {list(SEEDS)}, the unpinned preset (no prior; every head learns its own "
        f"query-key routing), trained from scratch until ignition + 200 steps (caps {CAPS}); parts by "
        f"`routing_parts` on 512 fresh sequences; mean ablation. Not run: {PARTS_V2.data['not_run']}. "
        f"Training CPU {cpu / 60:.1f} core-min; {len(failed)} failed or censored jobs.", "",
        markdown_table(table), "",
        f"Identification first ({stamp('parts', 3)}, declared after the version-2 results): per cell, the "
        f"largest retained fraction over its single-part ablations (`part_max`) and the smallest over its "
        f"non-part heads (`other_min`); a cell's parts are identified when `part_max` <= `other_min` - "
        f"{IDENTIFY_MARGIN:g}. The credit and random-head rules of version 3 read only identified cells "
        f"(at least {MIN_IDENTIFIED}).", "",
        markdown_table(ident.round(3)) if len(ident) else "(no cells)", "",
        "Routing found by `routing_parts` (own = the part head's attention to its input at the query, shared = "
        "the other heads' attention to that input, summed):", "", markdown_table(routing.round(3)), "",
        "Cells (mean retained over the K single-part ablations; credit = retained / ((K-1)/K)):", "",
        markdown_table(cells_u.assign(credit=cells_u.retained / cells_u.partial_credit).round(3)), ""])


def run(*, out: str | Path, workers: int = 2, progress: bool = True, png: bool = True) -> dict:
    """Train and ablate the unpinned circuits (finished jobs reused), judge them, v1's pinned circuits and the
    developing series by the credit rule; writes ``OUT/unpinned.md``, ``unpinned_verdicts.csv``,
    ``part_ablation_unpinned.csv`` and ``fig_credit``."""
    out = Path(out)
    specs = [{"kind": "base", "apparatus": "unpinned", "k": k, "seed": s} for k in KS for s in SEEDS]
    jobs = run_cached_jobs(unpinned_base_job, specs, out, workers=workers, progress=progress, desc="unpinned jobs")
    failed = [j for j in jobs if j.get("status") == "failed" or j.get("ignition") is None]
    abl = pd.DataFrame([r for j in jobs for r in j.get("ablation", [])])
    abl.assign(protocol=stamp("parts", 2)).to_csv(out / "part_ablation_unpinned.csv", index=False)
    mean_u = abl[abl.method == "mean"] if len(abl) else None
    pinned = pd.read_csv(out / "part_ablation.csv") if (out / "part_ablation.csv").is_file() else None
    mean_p = None if pinned is None else pinned[pinned.method == "mean"]
    series = pd.read_csv(out / "part_ablation_series.csv") if (out / "part_ablation_series.csv").is_file() else None
    table2, summary = unpinned_verdicts(mean_u, mean_p, series)
    table3, summary["v3"] = unpinned_verdicts_v3(mean_u, mean_p, series)
    table = pd.concat([table3, table2], ignore_index=True)
    table.to_csv(out / "unpinned_verdicts.csv", index=False)
    cells_u = pool_cells(mean_u, ["k", "seed"])["cells"] if mean_u is not None else pd.DataFrame()
    groups = {"unpinned (K x seed)": cells_u}
    if mean_p is not None:
        groups["pinned (K x seed)"] = pool_cells(mean_p, ["k", "seed"])["cells"]
    if series is not None:
        groups["developing series (checkpoint x part)"] = series[series.kind == "part"]
    save_figure(credit_figure(groups), out / "fig_credit", png=png)
    cpu = sum(float(j.get("cpu_s", 0) or 0) for j in jobs)
    text = _markdown(out, table, _routing_table(jobs), cells_u, failed, cpu, summary["v3"])
    (out / "unpinned.md").write_text(text)
    return {"verdicts": table, "summary": summary, "ablation": abl, "markdown": text, "failed": failed}
