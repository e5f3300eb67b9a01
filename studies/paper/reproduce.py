"""``python -m studies.paper reproduce``: run the main paper's experiments and write ``results.md``.

All experiments' runs go through one sweep (shared runs are trained once) into
``OUT/runs/``; then each experiment builds its table from the runs. ``OUT``
receives ``results.md`` (every table with the paper's numbers beside ours and a
claim-by-claim verdict table), ``results_runs.csv`` (final metrics of every run),
one CSV per table and ``report.html`` (training curves).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from circuitfade import stats
from circuitfade.claims import Claim, Declaration, Outcome, Verdict, seeds_cell
from circuitfade.claims import grade as claim_grade
from circuitfade.io import check_outputs, write_csv, write_text
from circuitfade.model.devices import check_device_name, resolve_device
from circuitfade.tasks import make_task
from circuitfade.train import RunConfig
from circuitfade.train.sweep import EXECUTOR_HELP, EXECUTORS, run_dir_for, run_sweep
from circuitfade.viz.html import Section, write_page
from circuitfade.train.rundir import RunDir
from studies.paper import protocol as P
from studies.paper import rules
from studies.paper.rules import DECLARATION


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
LARGE_ROWS = ("paths", "controls")
"""Experiments with large-model (L=4, d=128) rows; their config and table builders take ``large_seeds``."""


def _final(results: pd.DataFrame, root, cfg: RunConfig, key: str) -> float:
    r = results[results.run == run_dir_for(root, cfg).name]
    if r.empty or r.status.iloc[0] in ("failed", "missing") or key not in r:
        return float("nan")
    return float(r[key].iloc[0])


ACC_CONDITIONS = ("acc_normal", "acc_zero", "acc_param", "acc_half")


def _left_plateau(results, root, cfg: RunConfig, eval_n: int) -> bool | None:
    """Did the run leave associative recall's initial plateau? (best accuracy over the
    evaluation conditions has a Wilson lower bound above :data:`paper.PLATEAU_ACC`);
    ``None`` for tasks without a plateau rule or runs without results."""
    if cfg.task.get("name") != "assoc":
        return None
    vals = [_final(results, root, cfg, k) for k in ACC_CONDITIONS]
    vals = [v for v in vals if not np.isnan(v)]
    if not vals:
        return None
    return stats.wilson_interval(max(vals) * eval_n, eval_n)[0] > DECLARATION.data["plateau_acc"]


def _measure(results, root, cfgs, key, eval_n) -> P.Measure:
    vals = [_final(results, root, c, key) for c in cfgs]
    left = [x for x in (_left_plateau(results, root, c, eval_n) for c in cfgs) if x is not None]
    return P.Measure.of(vals, seeds=[c.seed for c in cfgs], proportion=not key.startswith(("mse", "query_mse")),
                        eval_n=eval_n, left=sum(left) if left else None)


def grade(full, part, have: bool, testable: bool = True) -> str:
    """The verdict word of :func:`circuitfade.claims.grade`, marked when only the partial rule held
    and the full rule was undecided."""
    v = claim_grade(full, part, have=have, testable=testable)
    return f"{v} (full rule undecided)" if v is Outcome.PARTLY and full is None else str(v)


def _testable(*ms: P.Measure) -> bool:
    lefts = [x.left for x in ms if x.left is not None]
    return not lefts or sum(lefts) > 0


def _d_str(a: P.Measure, bb: P.Measure, scale: float = 1.0, decl: Declaration = DECLARATION) -> str:
    """A difference as a table cell: ``+0.054 [-0.067, +0.175] (paired t)``."""
    d = rules.diff(a, bb, scale, decl)
    if np.isnan(d.estimate):
        return "—"
    return f"{d} ({d.method})" if not np.isnan(d.lo) else str(d)


def _row(c: Claim, value: str, verdict, *, key: str, ms: Sequence[P.Measure] = (), decl: Declaration = DECLARATION,
         declared: int | None = None) -> dict:
    """A verdict row: the claim's id (its key in the declaration), the claim, our value, its rule, the
    verdict, the seeds its arms ran on against the seeds declared (the fewest over ``ms``) and the
    declaration's provenance. Under a declaration with ``seeds_as_declared`` (v3) a claim whose arms
    ran on fewer seeds than declared is "not run (k of n seeds)" (:meth:`Verdict.checked_seeds`)."""
    word = str(verdict)
    outcome = Outcome.parse(word)
    declared = rules.declared_seeds(key) if declared is None else declared
    n_run = min((m.n for m in ms), default=None)
    v = Verdict(c, value, outcome, word[len(outcome.value):].strip(), rules.PROVENANCE[decl.version], n_run, declared)
    if "seeds_as_declared" in decl.data and n_run:
        v = v.checked_seeds()
    return {"id": key, "claim": c.name, "statistic": c.statistic, "ours (95% interval)": value, "rule": c.rule,
            "verdict": v.word, "seeds run": seeds_cell(v.seeds_run, v.seeds_declared),
            "provenance": str(v.provenance)}


def _path_claims(results: pd.DataFrame, root, b: P.Budget, seeds, model: dict | None = None,
                 control_seeds=None, decl: Declaration = DECLARATION, declared: int | None = None) -> list[dict]:
    """The five claims of Tables 1-2 (unforced collapses, forced_zero fails, the fade keeps
    zero-gate accuracy, the hard switch and post hoc continuation fall short) on one model
    (``model``: RunConfig.model overrides; ``None``: the base model) at ``seeds``; the two
    control claims compare with the fade on ``control_seeds`` (default ``seeds``), the seeds
    Table 2 has, so both sides of a difference come from the same seeds. ``declared``: the seeds
    each arm should have (default: the declaration's; the large model: the seeds asked for)."""
    run = lambda path, s, **kw: P.run(path, s, b, model=model, **kw)  # noqa: E731
    S = list(seeds)
    n_eval = b.eval_size
    fade, unf, fz = b.fade(), "unforced", "forced_zero"
    lab = (lambda p: p) if b.label != "full" else (lambda p: {fade: "fade600->0"}.get(p, p))  # noqa: E731
    names = {"fade": lab(fade), "switch": b.switch(1050), "switch_step": b.switch(1050)[7:]}
    m = lambda path, key="acc_zero", **kw: _measure(results, root, [run(path, s, **kw) for s in S], key, n_eval)  # noqa: E731
    C = lambda key: rules.claim(key, decl, **names)  # noqa: E731
    rows = []

    un_z, un_n = m(unf), m(unf, "acc_normal")
    R = lambda key, value, verdict, *ms: _row(C(key), value, verdict, key=key, ms=ms, decl=decl,  # noqa: E731
                                              declared=None if declared is None else min(declared, len(S)))
    rows.append(R("unforced_collapses", f"{un_z} / {un_n}",
                  grade(*rules.unforced_collapses(un_z, un_n, decl), un_z.n > 0, _testable(un_z, un_n)), un_z, un_n))
    fz_z, fa_z = m(fz), m(fade)
    rows.append(R("forced_zero_fails", f"{fz_z}; {_d_str(fz_z, fa_z, decl=decl)}",
                  grade(*rules.forced_zero_fails(fz_z, fa_z, decl), fz_z.n > 0, _testable(fz_z, fa_z)), fz_z, fa_z))
    rows.append(R("fade_keeps", f"{fa_z}; {_d_str(fa_z, fz_z, decl=decl)}",
                  grade(*rules.fade_keeps(fa_z, fz_z, decl), fa_z.n > 0, _testable(fa_z)), fa_z, fz_z))
    if control_seeds is not None and list(control_seeds) != S:
        S = list(control_seeds)
        fa_z = m(fade)
    sw = m(b.switch(1050))
    R = lambda key, value, verdict, *ms: _row(C(key), value, verdict, key=key, ms=ms, decl=decl,  # noqa: E731
                                              declared=None if declared is None else min(declared, len(S)))
    rows.append(R("switch_falls_short", f"{sw}; {_d_str(sw, fa_z, decl=decl)}",
                  grade(*rules.switch_falls_short(sw, fa_z, decl), sw.n > 0, _testable(sw, fa_z)), sw, fa_z))
    ph = _measure(results, root, [P.posthoc_config(root, s, b, model=model) for s in S], "acc_zero", n_eval)
    rows.append(R("posthoc_falls_short", f"{ph}; {_d_str(ph, fa_z, decl=decl)}",
                  grade(*rules.posthoc_falls_short(ph, fa_z, decl), ph.n > 0, _testable(ph, fa_z)), ph, fa_z))
    return rows


def _measurer(results, root, b: P.Budget, S: list[int]):
    """``m(path, key="acc_zero", **config)``: the :class:`~studies.paper.protocol.Measure` of a metric over seeds ``S``."""
    return lambda path, key="acc_zero", **kw: _measure(results, root, [P.run(path, s, b, **kw) for s in S], key,
                                                        b.eval_size)


def _fade_window_claim(m, b: P.Budget, decl: Declaration = DECLARATION) -> dict:
    fz_z = m("forced_zero")
    starts = [m(b.fade(st)) for st in (400, 500, 600, 700, 800)]
    have = all(x.n > 0 for x in starts)
    full, part = rules.fade_window(starts, fz_z, decl) if have else (None, None)
    value = (", ".join(f"{x.mean:.3f} [{x.lo:.3f}, {x.hi:.3f}]" for x in starts)
             + f"; spread {rules.spread(starts, decl)}") if have else "—"
    return _row(rules.claim("fade_window", decl), value, grade(full, part, have, _testable(*starts)),
                key="fade_window", ms=[*starts, fz_z], decl=decl)


def _shapes_claim(m, b: P.Budget, decl: Declaration = DECLARATION) -> dict:
    fa_z = m(b.fade())
    shapes = {sh: m(b.fade(shape=sh)) for sh in ("cosine", "convex")}
    two = m(b.twostep())
    have = two.n > 0 and all(x.n > 0 for x in shapes.values())
    smooth = [fa_z] + list(shapes.values())
    full, part = rules.shapes(smooth, two, decl) if have else (None, None)
    value = (f"{', '.join(f'{x.mean:.3f}' for x in smooth)} vs {two}; two-step − worst "
             f"{_d_str(two, min(smooth, key=lambda x: x.mean), decl=decl)}") if have else "—"
    return _row(rules.claim("shapes", decl), value, grade(full, part, have, _testable(*smooth, two)),
                key="shapes", ms=[*smooth, two], decl=decl)


def _markov_claim(m, b: P.Budget, decl: Declaration = DECLARATION) -> dict:
    fade, unf, fz = b.fade(), "unforced", "forced_zero"
    mk = {p: (m(fade, task={"name": "markov", "p": p}), m(unf, task={"name": "markov", "p": p}),
              m(fz, task={"name": "markov", "p": p})) for p in decl.data["claims"]["markov"]["ps"]}
    have = all(v[0].n > 0 for v in mk.values())
    txt = "; ".join(f"p={p}: fade {v[0].mean:.3f}, unforced {v[1].mean:.3f}, forced_zero {v[2].mean:.3f}"
                    f" (n={v[0].n})" for p, v in mk.items()) if have else "—"
    full, part = rules.markov(list(mk.values()), decl) if have else (None, None)
    return _row(rules.claim("markov", decl), txt, grade(full, part, have), key="markov",
                ms=[x for v in mk.values() for x in v], decl=decl)


def _linreg_claim(m, b: P.Budget, decl: Declaration = DECLARATION) -> dict:
    fade, unf, fz = b.fade(), "unforced", "forced_zero"
    lt = {p: m(p, "mse_zero", task={"name": "linreg"}) for p in (unf, fz, fade)}
    un_norm = m(unf, "mse_normal", task={"name": "linreg"})
    have = all(v.n > 0 for v in lt.values())
    full, part = rules.linreg(lt[unf], lt[fz], lt[fade], un_norm, decl) if have else (None, None)
    return _row(rules.claim("linreg", decl), f"{lt[unf]} / {lt[fz]} / {lt[fade]}; {un_norm}" if have else "—",
                grade(full, part, have), key="linreg", ms=[*lt.values(), un_norm], decl=decl)


def _consolidation_claim(mech: pd.DataFrame | None, decl: Declaration = DECLARATION) -> dict:
    c = rules.claim("consolidation", decl)
    if mech is not None and len(mech) and "both after gate 0 (sets)" in mech:
        counts = [tuple(int(x) for x in str(v).split("/")) for v in mech["both after gate 0 (sets)"]]
        before = [str(v) for v in mech["both before gate 0 (sets)"]]
        n_seeds = P.Measure.of([1.0] * len(counts))
        return _row(c, ", ".join(f"seed {s}: {k}/{K} ({bf})" for s, (k, K), bf in zip(mech["seed"], counts, before)),
                    grade(*rules.consolidation(counts, decl), True), key="consolidation", ms=[n_seeds], decl=decl)
    return {**_row(c, "—", Outcome.NOT_RUN, key="consolidation", decl=decl), "statistic": "—", "rule": "—"}


LARGE_VALUE, LARGE_VERDICT, LARGE_SEEDS = "large L=4 d=128 (95% interval)", "verdict (large)", "seeds run (large)"


def verdicts(results: pd.DataFrame, root, b: P.Budget, seeds, mech: pd.DataFrame | None,
             large_seeds: Sequence[int] = (), decl: Declaration = DECLARATION) -> pd.DataFrame:
    """Claim-by-claim verdicts from the declared rules on 95% intervals (:mod:`studies.paper.rules`).

    Every statistic is a :class:`~studies.paper.protocol.Measure`: the mean over seeds with a
    Student-t interval (one seed: the binomial/Wilson interval of its evaluation). A rule
    "x ≤ c" holds if the whole interval of x is ≤ c, fails if the whole interval is > c, and
    is undecided otherwise; a rule comparing two measurements uses the declaration's interval
    of their difference (:func:`studies.paper.rules.diff`; v2: paired t where the arms share
    their seeds, Welch t otherwise). Verdicts (:class:`circuitfade.claims.Outcome`): reproduced
    (full rule holds), partly (the partial rule holds, the full rule fails), "partly (full rule
    undecided)", not reproduced (both fail), inconclusive (undecided), not testable (none of
    the claim's runs left the initial plateau, :data:`protocol.PLATEAU_ACC`), not run.

    With ``large_seeds``, the claims of Tables 1-2 are graded again, by the same rules, on
    the large model (L=4, d=128) at those seeds: two more columns, ``"—"`` / ``"not run"``
    for the claims that have no large-model runs. ``decl``: the declaration whose rules apply
    (default: the current one; earlier versions give the outcomes they would have given).
    """
    m = _measurer(results, root, b, list(seeds))
    rows = _path_claims(results, root, b, list(seeds), decl=decl)
    for claim in (_fade_window_claim, _shapes_claim, _markov_claim, _linreg_claim):
        rows.append(claim(m, b, decl))
    rows.append(_consolidation_claim(mech, decl))
    df = pd.DataFrame(rows)
    if len(list(large_seeds)):
        ls = list(large_seeds)
        large = {r["claim"]: r for r in _path_claims(results, root, b, ls, model=P.LARGE,
                                                     control_seeds=ls[:len(list(seeds))], decl=decl,
                                                     declared=len(ls))}
        df.insert(4, LARGE_VALUE, [large[c]["ours (95% interval)"] if c in large else "—" for c in df.claim])
        df.insert(list(df.columns).index("verdict") + 1, LARGE_VERDICT,
                  [large[c]["verdict"] if c in large else str(Outcome.NOT_RUN) for c in df.claim])
        df.insert(list(df.columns).index("seeds run") + 1, LARGE_SEEDS,
                  [large[c]["seeds run"] if c in large else "—" for c in df.claim])
    return df


def earlier_verdicts(results: pd.DataFrame, root, b: P.Budget, seeds, mech: pd.DataFrame | None,
                     large_seeds: Sequence[int] = ()) -> pd.DataFrame:
    """One row per claim: its verdict under every declaration version (oldest first), base model
    (and large model with ``large_seeds``), so a change of rules shows what it changed."""
    cols = {}
    for version, decl in sorted(rules.DECLARATIONS.items()):
        v = verdicts(results, root, b, seeds, mech, large_seeds, decl=decl)
        cols["claim"] = v["claim"]
        cols[f"v{version}"] = v["verdict"]
        if LARGE_VERDICT in v:
            cols[f"v{version} (large)"] = v[LARGE_VERDICT]
    return pd.DataFrame(cols)


def collect(cfgs: list[RunConfig], root: Path, recorded: pd.DataFrame | None = None,
            runs_dir: Path | None = None) -> pd.DataFrame:
    """Results of already-finished runs (no training).

    A run's final metrics come from its ``done.json`` (in ``runs_dir`` if given, else
    ``root``); failing that from ``recorded`` (a previous ``results_runs.csv``, status
    ``"recorded"``: the run folder is gone but its final metrics were kept); otherwise
    the run is marked ``"missing"``.
    """
    rec = {} if recorded is None or "run" not in recorded else {r["run"]: r for r in recorded.to_dict("records")}
    rows = []
    for c in cfgs:
        d = run_dir_for(root, c)
        src = run_dir_for(runs_dir, c) if runs_dir is not None else d
        base = {"run": d.name, "run_dir": str(src if RunDir(src).is_done() else d), "path": c.path,
                "seed": c.seed, "task": c.task["name"]}
        if RunDir(src).is_done():
            rows.append({**base, "status": "cached", "error": None, **RunDir(src).read_done()["final"]})
        elif d.name in rec and rec[d.name].get("status") in ("cached", "done", "recorded"):
            kept = {k: v for k, v in rec[d.name].items() if k not in base and k not in ("status", "error")}
            rows.append({**base, "status": "recorded", "error": None, **kept})
        else:
            rows.append({**base, "status": "missing", "error": "not trained (tables-only run)"})
    return pd.DataFrame(rows).drop_duplicates("run")


def _seeds_of(names: list[str], seeds: int, seeds_for: dict) -> dict[str, list[int]]:
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; choose from {list(EXPERIMENTS)}")
    if seeds < 1:
        raise ValueError("--seeds must be >= 1")
    bad = [k for k in seeds_for if k not in EXPERIMENTS]
    if bad:
        raise ValueError(f"seeds_for names unknown experiment(s) {bad}")
    return {n: list(range(seeds_for.get(n, seeds))) for n in names}


CHECKPOINT_TABLES = ("mechanism", "interventions")
"""Tables built from the runs' checkpoints: a tables-only build without them keeps the previous build's."""


def _previous_section(text: str, title: str) -> str | None:
    """The body of section ``## title`` of a previous ``results.md`` (without its footer line)."""
    head = f"## {title}\n\n"
    if head not in text:
        return None
    body = text.split(head, 1)[1].split("\n## ", 1)[0]
    return body.rsplit("\n\n_(", 1)[0].strip() if "\n\n_(" in body else body.strip()


def _kept(n: str, df: pd.DataFrame, out: Path, previous: str) -> tuple[pd.DataFrame, str] | None:
    """The previous build's table ``n`` and its section when a tables-only rebuild lacks some of its
    rows (its checkpoints are gone); ``None`` when the rebuild is complete or there is nothing to keep."""
    old_csv = out / f"table_{n}.csv"
    if n not in CHECKPOINT_TABLES or not old_csv.is_file():
        return None
    old = pd.read_csv(old_csv, dtype=str, keep_default_na=False)
    if not len(old.columns):
        return None
    key = old.columns[0]
    have = set(df[key].astype(str)) if key in df.columns else set()
    if set(old[key]) <= have:
        return None
    body = _previous_section(previous, EXPERIMENTS[n].title)
    return (old, body) if body else None


def _tables(names, results, root, b, S_of, large_seeds, out, *, train: bool = True,
            previous: str = "") -> tuple[dict, list[str]]:
    sections, tables = [], {}
    for n in names:
        e = EXPERIMENTS[n]
        if n in LARGE_ROWS:
            df, md = e.table(results, root, b, S_of[n], large_seeds)
        elif n in CHECKPOINT_TABLES:
            df, md = e.table(results, root, b, S_of[n], out_dir=out)
        else:
            df, md = e.table(results, root, b, S_of[n])
        kept = None if train else _kept(n, df, out, previous)
        if kept is not None:
            tables[n], body = kept
            sections.append(f"## {e.title}\n\n{body}\n\n_({P.eval_note(b)}; kept from the previous build of "
                            f"table_{n}.csv: it needs the runs' checkpoints, which are not here)_\n")
            continue
        tables[n] = df
        write_csv(out / f"table_{n}.csv", df)
        sections.append(f"## {e.title}\n\n{md}\n\n_({P.eval_note(b)})_\n")
    return tables, sections


def _header(names, seeds, out, quick, train, runs_dir, seeds_for, S_of, large_seeds, results, b, train_s,
            decl: Declaration = DECLARATION) -> list[str]:
    failed = results[results.status == "failed"]
    quick_note = (f" — QUICK MODE ({b.steps} steps; not comparable to the paper: rows are labelled with the paths "
                  "actually trained, and no paper numbers are shown)") if quick else ""
    prov = [
        f"- Command: `python -m studies.paper reproduce {' '.join(names)} --seeds {seeds}"
        + (f" --large-seeds {large_seeds}" if large_seeds != 1 else "") + f" --out {out}"
        + (" --quick" if quick else "") + (" --tables-only" if not train else "")
        + (f" --runs {runs_dir}" if runs_dir is not None else "")
        + "".join(f" --seeds-for {k}={v}" for k, v in seeds_for.items())
        + f"` (seeds per experiment: {', '.join(f'{n} {len(S_of[n])}' for n in names)}; large model seeds {list(range(large_seeds))}).",
        f"- Runs: {len(results)} ({int((results.status == 'done').sum())} trained now, "
        f"{int((results.status == 'cached').sum())} reused, "
        f"{int((results.status == 'recorded').sum())} from the recorded results_runs.csv (folders gone), "
        f"{int((results.status == 'missing').sum())} not trained, "
        f"{len(failed)} failed); sweep wall time {train_s / 60:.1f} min.",
        f"- Declaration: {decl.stamp()} (`studies/paper/rules.py`: experiments, seeds, claims, rules, intervals); "
        f"{rules.PROVENANCE[decl.version]} (every version of it was written after results of its experiments "
        "existed).",
    ]
    head = [
        "**circuitfade: reproduction of the main paper**" + quick_note,
        "",
        f"Evaluation: {P.eval_note(b)}. Columns: *zero-gate* = every prior's gate at 0; *normal* = gates as at the "
        "final step (0 for every fade/linear/switch path, so normal = zero-gate there); *param* = sigmoid(gate logit) "
        "(for fixed/scheduled gates the initial 0.5); *g=0.5* = all gates at 0.5.",
        "",
        "Cells: mean over seeds with its 95% interval `[lo, hi]` (Student t over the seeds; `sd` = across-seed "
        "standard deviation). With one seed (`n=1, eval only`) the interval is the Wilson interval of that run's "
        f"accuracy on its {b.eval_size} evaluation examples: it covers evaluation noise only, not seed-to-seed "
        "variation. Verdicts compare these intervals (rules in the verdict table). A difference of two "
        "measurements has one interval wherever it appears: Student t over the seeds, paired where both arms have "
        "the same seeds (the runs of one seed share its initialisation and data order), Welch otherwise; an arm "
        f"with one seed carries only its evaluation's binomial error ({b.eval_size} examples, a large-sample "
        "error), so two one-seed arms compare by the normal interval.",
        "",
    ]
    if len(failed):
        head += ["**Failed runs:**", ""] + [f"- `{r.run}`: {str(r.error).splitlines()[0]}" for r in failed.itertuples()] + [""]
    return head, prov


def reproduce(names=None, *, seeds: int = 3, out: str | Path = "results/paper", executor: str = "local",
              workers: int | None = None, address: str | None = None, quick: bool = False,
              large_seeds: int = 1, progress: bool = True, seeds_for: dict | None = None,
              train: bool = True, runs_dir: str | Path | None = None, device: str = "cpu",
              ensemble_size: int | None = None) -> dict:
    """Run (or, with ``train=False``, only tabulate) the named experiments.

    ``device``: where the runs train (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``). It
    is not part of a run's identity, so runs finished on another device are reused.
    ``ensemble_size``: most members per ensemble with ``executor="ensemble"`` (default: the size
    measured on this machine on a CPU, :func:`~circuitfade.train.ensemble.default_ensemble_size`
    elsewhere; on a GPU, larger ensembles keep it busy).

    Tables-only (``train=False``) reads finished runs from ``runs_dir`` (default
    ``OUT/runs``) and, for runs whose folders are gone, the final metrics recorded in
    ``OUT/results_runs.csv``; tables that need checkpoints (mechanism, interventions)
    use the run folders that exist.

    ``seeds`` seeds (0..seeds-1) per experiment unless ``seeds_for={name: n}`` says
    otherwise; the large-model rows of "paths" use the first ``large_seeds``.
    """
    names = list(names or EXPERIMENTS)
    seeds_for = dict(seeds_for or {})
    S_of = _seeds_of(names, seeds, seeds_for)
    b = P.QUICK if quick else P.FULL
    out = Path(out)
    root = Path(runs_dir) if runs_dir is not None else out / "runs"
    cfgs = [c for n in names for c in (EXPERIMENTS[n].configs(S_of[n], root, b, large_seeds) if n in LARGE_ROWS
                                        else EXPERIMENTS[n].configs(S_of[n], root, b))]
    if device != "cpu":
        cfgs = [replace(c, train=replace(c.train, device=device)) for c in cfgs]
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if train:
        results = run_sweep(cfgs, root, executor=executor, workers=workers, address=address, progress=progress,
                            ensemble_size=ensemble_size)
    else:
        recorded = pd.read_csv(out / "results_runs.csv") if (out / "results_runs.csv").is_file() else None
        results = collect(cfgs, out / "runs", recorded, runs_dir=root)
    train_s = time.time() - t0
    recorded_runs = results.drop(columns=["config"], errors="ignore").copy()
    if not train:  # where the run lives in OUT's layout, whichever folder it was read from
        recorded_runs["run_dir"] = [str(out / "runs" / r) for r in recorded_runs["run"]]
    previous = (out / "results.md").read_text() if (out / "results.md").is_file() else ""
    write_csv(out / "results_runs.csv", recorded_runs)
    tables, sections = _tables(names, results, root, b, S_of, large_seeds, out, train=train, previous=previous)
    mech = tables.get("mechanism")
    v = verdicts(results, root, b, list(range(seeds)), mech, large_seeds=range(large_seeds))
    tables["verdicts"] = v
    head, prov = _header(names, seeds, out, quick, train, runs_dir, seeds_for, S_of, large_seeds, results, b, train_s)
    write_csv(out / "verdicts.csv", v)
    text = ("\n".join(head) + "\n## Claim-by-claim verdict\n\n"
            + f"Rules of {DECLARATION.stamp()}. *seeds run*: the fewest seeds any of the claim's arms has, of the "
            "seeds declared; a claim short of them is not run. *provenance*: when the rules were written relative "
            "to the results.\n\n" + P.md_table(v.drop(columns=["statistic"])) + "\n\n"
            + "\n".join(sections))
    if len(rules.DECLARATIONS) > 1:
        ev = earlier_verdicts(results, root, b, list(range(seeds)), mech, large_seeds=range(large_seeds))
        tables["verdicts_by_version"] = ev
        write_csv(out / "verdicts_by_version.csv", ev)
        text += ("\n## Verdicts under every declaration version\n\n"
                 + "; ".join(f"v{k}: {rules.VERSION_NOTES[k]}" for k in sorted(rules.DECLARATIONS)) + ".\n\n"
                 + P.md_table(ev) + "\n")
    text += "\n## Provenance\n\n" + "\n".join(prov) + "\n"
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
        if not RunDir(d).has_metrics():
            continue
        mt = RunDir(d).read_metrics()
        key = make_task(task).primary_metric.column  # acc for token tasks, mse for regression
        fig = go.Figure()
        for cond in ("normal", "zero"):
            if f"{key}_{cond}" in mt:
                fig.add_scatter(x=mt.step, y=mt[f"{key}_{cond}"], name=f"{key} ({cond})")
        if "gate_pos" in mt:
            fig.add_scatter(x=mt.step, y=mt.gate_pos, name="gate (pos, mean)", yaxis="y2", line={"dash": "dot"})
        fig.update_layout(title=f"{task} / {path} / {d.name}", xaxis_title="training step",
                          yaxis_title=make_task(task).primary_metric.name,
                          yaxis2={"title": "gate value", "overlaying": "y", "side": "right", "range": [0, 1]})
        figs.append(fig)

    write_page(out / "report.html", "python -m studies.paper reproduce", [Section("Training curves", figs)])


DEFAULT_OUT = "results/paper"
"""``python -m studies.paper reproduce`` writes here unless ``--out`` says otherwise; existing result files
are replaced only with ``--force``."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.paper reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", help=f"any of {list(EXPERIMENTS)} (default: all)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--large-seeds", type=int, default=1, help="seeds for the large (L=4, d=128) model rows")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"output folder (default {DEFAULT_OUT}; runs are cached in OUT/runs)")
    ap.add_argument("--force", action="store_true", help="replace results.md and the tables if OUT has them")
    ap.add_argument("--executor", choices=list(EXECUTORS), default="auto",
                    help=EXECUTOR_HELP)
    ap.add_argument("--address", help="Ray cluster address (with --executor ray)")
    ap.add_argument("--workers", type=int, help="parallel training processes (or ensembles), one torch thread "
                    "each (default: one per core, os.cpu_count())")
    ap.add_argument("--device", default="cpu",
                    help="where the runs train: cpu (default), cuda, cuda:N, mps or auto (not part of a run's "
                         "identity: finished runs are reused whichever device trained them)")
    ap.add_argument("--ensemble-size", type=int, metavar="E",
                    help="most runs per ensemble with --executor ensemble (default: measured on this machine on a "
                         "CPU; on a GPU give a large E, e.g. 256, so one ensemble keeps it busy)")
    ap.add_argument("--quick", action="store_true", help="360-step runs: minutes, for trying it out / CI")
    ap.add_argument("--seeds-for", action="append", default=[], metavar="EXP=N", help="per-experiment seed count")
    ap.add_argument("--tables-only", action="store_true",
                    help="do not train: tabulate the runs in OUT/runs (or --runs), else OUT/results_runs.csv")
    ap.add_argument("--runs", metavar="DIR", help="where the run folders are (default OUT/runs)")
    ns = ap.parse_args(argv)
    seeds_for = {}
    for item in ns.seeds_for:
        k, _, v = item.partition("=")
        if not v.isdigit():
            ap.error(f"--seeds-for expects EXP=N, got {item!r}")
        seeds_for[k] = int(v)
    out = Path(ns.out)
    names = ns.experiments or list(EXPERIMENTS)
    if ns.runs is not None and not Path(ns.runs).is_dir():
        raise ValueError(f"--runs {ns.runs}: no such folder of run directories")
    if ns.seeds < 1 or ns.large_seeds < 0 or (ns.workers is not None and ns.workers < 1) \
            or (ns.ensemble_size is not None and ns.ensemble_size < 1):
        raise ValueError(f"--seeds must be >= 1, --large-seeds >= 0, --workers and --ensemble-size >= 1; got --seeds "
                         f"{ns.seeds}, --large-seeds {ns.large_seeds}, --workers {ns.workers}, --ensemble-size "
                         f"{ns.ensemble_size}")
    if not ns.tables_only:
        resolve_device(check_device_name(ns.device))  # one line if the device is unknown or absent, before any work
    check_outputs([out / "results.md", out / "report.html", out / "results_runs.csv", out / "verdicts.csv",
                   *(out / f"table_{n}.csv" for n in names)], force=ns.force)  # before any training
    res = reproduce(ns.experiments, seeds=ns.seeds, out=ns.out, executor=ns.executor, workers=ns.workers,
                    address=ns.address, quick=ns.quick, large_seeds=ns.large_seeds, seeds_for=seeds_for,
                    train=not ns.tables_only, runs_dir=ns.runs, device=ns.device, ensemble_size=ns.ensemble_size)
    print(res["markdown"])
    if not ns.quick and set(names) == set(EXPERIMENTS):  # the page's figure, from the same runs as the full report
        from studies.paper.figures import write_paths_figure

        root = Path(ns.runs) if ns.runs is not None else out / "runs"
        why = write_paths_figure(lambda cfg: _final(res["results"], root, cfg, "acc_zero"), root, res["tables"],
                                 range(ns.seeds), out)
        if why:
            print(f"fig_paths.png not written: {why}")
    return 0
