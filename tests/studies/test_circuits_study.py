"""The circuits study (studies/circuits): planted edge scores with known circuits, overlaps and
prior shares through the study's own code path; rules that say yes and no; the tables-only
rebuild of the committed results, byte for byte."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from circuitfade.claims import Outcome, Provenance
from circuitfade.io import write_csv, write_json
from studies.circuits import study
from studies.circuits.declaration import DECLARATION, RULES, claims, rule_inputs
from repo_root import REPO

FADE, ZERO, FREE = DECLARATION.data["arms"]
ON, FINAL = DECLARATION.data["gate_on_step"], DECLARATION.data["final_step"]
EDGES = [f"e{i:02d}" for i in range(20)]
PRIOR = {"e18", "e19"}  # 2 of 20 edges: share_of_edges = 0.1


def frame(path: str, seed: int, step: int, top: list[str], prior_value: float = 0.0) -> pd.DataFrame:
    """Scores of the 20 planted edges: ``top`` (10 edges) score 10, 9, ... 1 in order, the others
    0.01 (prior edges ``prior_value`` unless in ``top``)."""
    vals = {e: 0.01 for e in EDGES}
    vals.update({e: prior_value for e in PRIOR})
    vals.update({e: 10.0 - i for i, e in enumerate(top)})
    return pd.DataFrame({"path": path, "seed": seed, "step": step, "edge": EDGES,
                         "kind": ["prior" if e in PRIOR else "resid" for e in EDGES],
                         "value": [vals[e] for e in EDGES]})


def planted(fade_final: dict, zero_final: dict, free_prior: dict, seeds=(0, 1, 2)) -> pd.DataFrame:
    """Fade gate-on circuit e00..e09 for every seed; the final fade / forced_zero circuits per seed
    as given; unforced's prior edges scoring ``free_prior[seed]`` (top circuit e00..e09)."""
    on = EDGES[:10]
    parts = []
    for s in seeds:
        parts += [frame(FADE, s, 0, EDGES[10:]), frame(FADE, s, ON, on), frame(FADE, s, FINAL, fade_final[s])]
        if s in zero_final:
            parts.append(frame(ZERO, s, FINAL, zero_final[s]))
        parts.append(frame(FREE, s, FINAL, on, prior_value=free_prior[s]))
    return pd.concat(parts, ignore_index=True)


# fade's final circuit shares 7, 8, 10 edges with its gate-on circuit (Jaccard 7/13, 8/12, 1)
KEEP = {0: EDGES[:7] + EDGES[10:13], 1: EDGES[:8] + EDGES[10:12], 2: EDGES[:10]}
# forced_zero's final circuit: e10..e19 (shares 3, 2, 0 edges with the fade's final circuit)
OTHER = {s: EDGES[10:] for s in range(3)}


def outcomes(scores):
    ps = study.per_seed(scores)
    vs = study.verdicts(study.summary_table(ps), ps)
    return ps, {k: v for k, v in zip(claims(), vs)}


def test_declaration_is_complete_and_runs_are_the_declared_ones():
    assert set(RULES) == set(claims()) == set(DECLARATION.data["claims"])
    assert all(set(rule_inputs(k)) <= set(DECLARATION.data["arms"]) for k in RULES)
    cfgs = study.run_configs()
    assert [(c.path, c.seed) for c in cfgs] == [(p, s) for p in (FADE, ZERO, FREE) for s in (0, 1, 2)]
    assert {c.train.steps for c in cfgs} == {3600} and {c.train.checkpoint_every for c in cfgs} == {300}
    assert ZERO == "forced_zero" and FADE == "fade600->0"
    # the fade reaches gate 0 at step 1050: the declared gate-on step is the last checkpoint before it
    sched = cfgs[0].gate_path().schedule
    assert sched(ON) > 0 and sched(ON + 300) == 0 and all(sched(s) > 0 for s in range(0, ON + 1, 300))
    assert cfgs[3].gate_path().value == 0.0 and cfgs[6].gate_path().mode == "learned"


def test_planted_overlaps_and_shares_are_measured_exactly():
    scores = planted(KEEP, OTHER, {0: 3.0, 1: 3.0, 2: 3.0})
    ps, _ = outcomes(scores)
    assert ps["overlap_fade_final_on"].tolist() == pytest.approx([7 / 13, 8 / 12, 1.0])
    assert ps["overlap_fade_final_zero"].tolist() == pytest.approx([3 / 17, 2 / 18, 0.0])
    assert ps["overlap_gap"].tolist() == pytest.approx([7 / 13 - 3 / 17, 8 / 12 - 2 / 18, 1.0])
    # unforced: |prior| = 2 x 3 against the top ten 10+9+...+1 = 55 and eight others at 0.01
    assert ps["prior_share_unforced"].tolist() == pytest.approx([6 / (55 + 6 + 0.08)] * 3)
    assert ps["share_of_edges"].tolist() == pytest.approx([0.1] * 3)
    tl = study.timeline(scores)
    row = tl[(tl.path == FADE) & (tl.seed == 0)].set_index("step")
    assert row.loc[ON, "overlap_final"] == pytest.approx(7 / 13) and row.loc[FINAL, "overlap_final"] == 1.0
    assert row.loc[0, "overlap_on"] == 0.0 and row.loc[ON, "overlap_on"] == 1.0
    assert row.loc[ON, "circuit"].split() == EDGES[:10]


def test_chance_is_context_beside_the_overlaps_and_leaves_the_verdicts_alone():
    from circuitfade.stats import chance_overlap

    scores = planted(KEEP, OTHER, {0: 3.0, 1: 3.0, 2: 3.0})
    j = chance_overlap(20, 10)["jaccard"]       # two random 10-edge circuits of the 20 planted edges
    assert study.chance_jaccard(scores) == pytest.approx(j) and 0.3 < j < 0.4
    assert study.timeline(scores)["chance"].tolist() == pytest.approx([j] * len(study.timeline(scores)))
    base = study.chance_baselines(scores)
    assert base == pytest.approx({"overlap_fade_final_on": j, "overlap_fade_final_zero": j, "overlap_gap": 0.0,
                                  "prior_share_unforced": 0.1, "prior_share_fade_final": 0.1})
    ps = study.per_seed(scores)
    with_chance = study.summary_table(ps, base)
    assert with_chance["chance"].tolist() == pytest.approx(list(base.values()))
    assert study.verdict_rows(study.verdicts(with_chance, ps)).equals(
        study.verdict_rows(study.verdicts(study.summary_table(ps), ps)))
    md = study.to_markdown(scores)
    assert "| mean [95% t] | chance |" in md and "added after the runs" in md and f"{j:.3f}" in md


def test_rules_say_yes_on_a_kept_circuit_and_a_strong_prior():
    _, v = outcomes(planted(KEEP, OTHER, {0: 10.0, 1: 10.5, 2: 11.0}))  # shares 0.27-0.28
    assert v["fade_keeps_circuit"].outcome is Outcome.PARTLY  # mean 0.735 ≥ 0.5, interval reaches below 0.5
    assert v["fade_closer_to_own_past"].outcome is Outcome.PARTLY  # gaps 0.36, 0.56, 1: mean > 0, lo < 0
    assert v["unforced_prior_share"].outcome is Outcome.REPRODUCED
    assert all(x.provenance is Provenance.DECLARED_BEFORE and x.seeds_run == 3 and x.seeds_declared == 3
               for x in v.values())
    rows = study.verdict_rows(list(v.values()))
    assert list(rows["id"]) == list(claims()) and list(rows["verdict"]) == ["partly", "partly", "reproduced"]
    tight = {s: EDGES[:8] + EDGES[10:12] for s in range(3)}  # 8/12 on every seed: the interval is the point
    _, v = outcomes(planted(tight, OTHER, {0: 3.0, 1: 3.0, 2: 3.0}))
    assert v["fade_keeps_circuit"].outcome is Outcome.REPRODUCED
    assert v["fade_closer_to_own_past"].outcome is Outcome.REPRODUCED  # 8/12 - 2/18 on every seed


def test_rules_say_no_on_a_replaced_circuit_and_a_silent_prior():
    new = {s: EDGES[10:] for s in range(3)}  # the final circuit shares nothing with the gate-on one ...
    _, v = outcomes(planted(new, new, {0: 0.0, 1: 0.0, 2: 0.001}))  # ... and equals forced_zero's
    assert v["fade_keeps_circuit"].outcome is Outcome.NOT_REPRODUCED
    assert v["fade_closer_to_own_past"].outcome is Outcome.NOT_REPRODUCED
    assert v["unforced_prior_share"].outcome is Outcome.NOT_REPRODUCED


def test_missing_runs_are_not_run_with_their_seed_count():
    scores = planted(KEEP, {0: OTHER[0], 1: OTHER[1]}, {0: 3.0, 1: 3.0, 2: 3.0})  # forced_zero seed 2 missing
    ps, v = outcomes(scores)
    assert math.isnan(ps.loc[2, "overlap_gap"])
    assert v["fade_closer_to_own_past"].outcome is Outcome.NOT_RUN
    assert v["fade_closer_to_own_past"].word == "not run (2 of 3 seeds)"
    assert v["fade_keeps_circuit"].outcome is not Outcome.NOT_RUN
    empty = pd.DataFrame(columns=list(study.SCORE_COLUMNS))
    _, v = outcomes(empty)
    assert {x.outcome for x in v.values()} == {Outcome.NOT_RUN}


def test_scores_without_their_columns_are_refused():
    with pytest.raises(ValueError, match="scores: missing columns"):
        study.per_seed(pd.DataFrame({"edge": ["a"], "value": [1.0]}))


def _write(out: Path, scores: pd.DataFrame) -> None:
    write_csv(out / "scores.csv", scores)
    write_json(out / "config.json", {"declaration": DECLARATION.stamp(), "note": "", "wall_s": 1.0})


def test_tables_only_rebuilds_byte_identically(tmp_path, capsys):
    out = tmp_path / "circuits"
    _write(out, planted(KEEP, OTHER, {0: 3.0, 1: 3.5, 2: 4.0}))
    study.write_tables(out)
    before = {n: (out / n).read_bytes() for n in study.TABLES}
    assert "**partly**" in before["results.md"].decode()
    from studies.common import study_main

    assert study_main("python -m studies.circuits", study.main, ["--out", str(out), "--tables-only"]) == 2  # exists
    assert {n: (out / n).read_bytes() for n in study.TABLES} == before
    assert study_main("python -m studies.circuits", study.main,
                      ["--out", str(out), "--tables-only", "--force"]) == 0
    assert {n: (out / n).read_bytes() for n in study.TABLES} == before


def test_tables_only_needs_its_inputs(tmp_path):
    with pytest.raises(ValueError, match="scores.csv: not found"):
        study.rebuild(tmp_path)
    _write(tmp_path, planted(KEEP, OTHER, {0: 3.0, 1: 3.0, 2: 3.0}))
    write_json(tmp_path / "config.json", {"declaration": "circuits v0 (sha256 0)"})
    with pytest.raises(ValueError, match="config.json: written under"):
        study.rebuild(tmp_path, force=True)


@pytest.mark.skipif(not (REPO / "results/circuits/scores.csv").is_file(), reason="no committed results")
def test_committed_results_rebuild_byte_identically(tmp_path):
    out = tmp_path / "circuits"
    out.mkdir()
    for n in ("scores.csv", "config.json"):
        shutil.copy(REPO / "results/circuits" / n, out / n)
    study.rebuild(out)
    for n in study.TABLES:
        assert (out / n).read_bytes() == (REPO / "results/circuits" / n).read_bytes(), n
