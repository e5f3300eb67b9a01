"""`circuitfade reproduce --quick` end to end on a tiny budget; tables-only mode; config sharing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import studies.paper.protocol as P
from planted import run_study
from studies.paper.reproduce import EXPERIMENTS
from circuitfade.train.sweep import run_key
from repo_root import REPO

TINY = P.Budget(36, "quick", eval_size=32)


def test_budget_scales_paper_paths():
    assert P.FULL.fade() == "fade600->0" and P.FULL.switch(1050) == "switch@1050"
    assert P.QUICK.fade() == "fade60+45->0" and P.QUICK.switch(1050) == "switch@105"
    q = P.posthoc_config("r", 0, P.QUICK)
    assert q.path == "posthoc255" and q.train.steps == 615 and q.parent["step"] == 360


def test_large_model_has_one_copy():
    from circuitfade.analysis.timeline import DEFAULT_THRESHOLDS
    from circuitfade.model import SoftPriorConfig

    assert dict(P.LARGE) == {"n_layers": 4, "d_model": 128, "d_head": 32, "n_heads": 4}
    large = SoftPriorConfig.large()
    assert {k: getattr(large, k) for k in P.LARGE} == dict(P.LARGE)
    # the run key computed before LARGE moved to the model layer
    assert run_key(P.run("fade600->0", 0, P.FULL, model=P.LARGE)) == "assoc-fade600to0-s0-122d4c0e"
    assert DEFAULT_THRESHOLDS == {"successor_mass": 0.25, "ablation_importance": 0.03}  # Table 3's


def test_experiments_share_runs():
    """The fade600->0 seed-0 run of Table 1 is the same run (same directory) as Table 2's and Table 3's."""
    t1 = {run_key(c) for c in P.paths_configs([0], "r", P.FULL, 0)}
    t2 = {run_key(c) for c in P.controls_configs([0], "r", P.FULL)}
    t3 = {run_key(c) for c in P.mechanism_configs([0], "r", P.FULL)}
    assert t3 <= t1 & t2
    assert len(t1) == 5 and len(t2) == 6


@pytest.mark.slow
def test_reproduce_quick_controls_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "QUICK", TINY)
    rc = run_study("paper", ["reproduce", "controls", "--seeds", "1", "--quick", "--executor", "serial", "--out", str(tmp_path),
               "--large-seeds", "0"])
    assert rc == 0
    md = (tmp_path / "results.md").read_text()
    assert "QUICK MODE" in md and "Causal controls" in md and "Claim-by-claim verdict" in md
    assert "paths actually trained" in md and "eval: 32 examples, seed 1000003" in md
    posthoc = P.posthoc_config(tmp_path / "runs", 0, TINY).path
    for row in (TINY.fade(), TINY.switch(1050), TINY.switch(600), posthoc, "unforced", "forced_zero"):
        assert f"| {row} |" in md  # labelled with the paths actually trained
    assert "| fade600->0 |" not in md and ".734 ± .028" not in md  # no paper numbers beside quick runs
    # 36-step runs never leave the initial plateau: their claims are not testable, not "not reproduced"
    verdict_rows = md.split("Claim-by-claim verdict")[1]
    assert "not testable" in verdict_rows and "| not reproduced |" not in verdict_rows
    assert (tmp_path / "table_controls.csv").is_file() and (tmp_path / "report.html").is_file()
    # results.md exists now: it is replaced only with --force
    again = ["reproduce", "controls", "--seeds", "1", "--quick", "--tables-only", "--out", str(tmp_path),
             "--large-seeds", "0"]
    assert run_study("paper", again) == 2 and "--force" in capsys.readouterr().err
    # tables-only re-run trains nothing and reports the same runs as reused
    rc = run_study("paper", again + ["--force"])
    assert rc == 0
    assert "6 reused, 0 from the recorded results_runs.csv (folders gone), 0 not trained, 0 failed" in (
        tmp_path / "results.md").read_text()


def test_verdicts_compare_intervals_and_report_untestable_claims():
    import math

    from studies.paper import reproduce as R

    from circuitfade.claims import at_least, at_most

    assert at_most(0.1, 0.19, 0.2) is True and at_most(0.21, 0.3, 0.2) is False and at_most(0.1, 0.3, 0.2) is None
    assert at_least(0.61, 0.7, 0.6) is True and at_least(0.5, 0.59, 0.6) is False and at_least(0.5, 0.7, 0.6) is None
    assert R.grade(True, True, True) == "reproduced"
    assert R.grade(False, True, True) == "partly" and R.grade(None, True, True) == "partly (full rule undecided)"
    assert R.grade(False, False, True) == "not reproduced" and R.grade(None, False, True) == "inconclusive"
    assert R.grade(True, True, True, testable=False) == "not testable" and R.grade(None, None, False) == "not run"
    one = P.Measure.of([0.5], eval_n=512)  # one seed: the Wilson interval of its evaluation
    assert one.n == 1 and one.lo < 0.5 < one.hi and one.se == math.sqrt(0.25 / 512)
    three = P.Measure.of([0.7, 0.8, 0.9])
    assert (three.mean, three.n) == (pytest.approx(0.8), 3) and three.lo < 0.7 and three.hi == 1.0  # clipped
    assert "[" in str(three) and "sd 0.100" in str(three)


def test_large_controls_configs_and_verdict_column():
    """Table 2 on the large model: the same paths (posthoc a child of the large unforced run) at
    min(large_seeds, base seeds) seeds; the verdicts grade Tables 1-2's claims again on the large
    model, by the same rules, from planted final accuracies."""
    from studies.paper import reproduce as R
    from circuitfade.train.sweep import run_dir_for

    base = P.controls_configs([0, 1, 2], "r", P.FULL)
    with_large = P.controls_configs([0, 1, 2], "r", P.FULL, large_seeds=5)
    large = [c for c in with_large if c.model]
    assert with_large[: len(base)] == base and len(large) == 6 * 3  # capped at the 3 base seeds
    assert all(c.model == P.LARGE for c in large) and {c.seed for c in large} == {0, 1, 2}
    ph = [c for c in large if c.parent]
    assert len(ph) == 3 and all(run_dir_for("r", P.run("unforced", c.seed, P.FULL, model=P.LARGE)).name == Path(c.parent["run"]).name
                                for c in ph)
    assert {c.seed for c in P.paths_configs([0, 1, 2], "r", P.FULL, 5) if c.model} == {0, 1, 2, 3, 4}

    # planted finals: base fade 0.75 = forced_zero 0.75 (no margin); large fade ~0.75 vs forced_zero ~0.10
    rows = []
    fade = P.FULL.fade()
    plant = {(fade, False): 0.75, ("forced_zero", False): 0.75, (fade, True): 0.75, ("forced_zero", True): 0.10}
    for (path, is_large), acc in plant.items():
        for s in range(3):
            c = P.run(path, s, P.FULL, model=P.LARGE if is_large else None)
            a = acc + 0.01 * (s - 1)
            rows.append({"run": run_dir_for("r", c).name, "status": "done", "acc_zero": a, "acc_normal": a,
                         "acc_param": a, "acc_half": a})
    v = R.verdicts(pd.DataFrame(rows), "r", P.FULL, [0, 1, 2], None, large_seeds=[0, 1, 2])
    keeps = v[v.claim == "fade600->0 keeps zero-gate accuracy"].iloc[0]
    assert keeps["verdict"] == "partly" and keeps[R.LARGE_VERDICT] == "reproduced"
    assert keeps[R.LARGE_VALUE].startswith("0.750 [") and "+0.650 [" in keeps[R.LARGE_VALUE]
    fails = v[v.claim == "forced_zero fails"].iloc[0]
    assert fails["verdict"] == "not reproduced" and fails[R.LARGE_VERDICT] == "reproduced"
    assert v[v.claim == "Markov induction replicates the pattern"].iloc[0][R.LARGE_VERDICT] == "not run"
    # controls are compared with the fade on Table 2's seeds (0-2), not on all five large seeds
    more = list(rows)
    for s in range(3):
        c = P.run(P.FULL.switch(1050), s, P.FULL, model=P.LARGE)
        a = 0.75 + 0.01 * (s - 1)  # equal to the large fade of the same seed
        more.append({"run": run_dir_for("r", c).name, "status": "done", "acc_zero": a, "acc_normal": a,
                     "acc_param": a, "acc_half": a})
    for s in (3, 4):
        c = P.run(fade, s, P.FULL, model=P.LARGE)
        more.append({"run": run_dir_for("r", c).name, "status": "done", "acc_zero": 0.2, "acc_normal": 0.2,
                     "acc_param": 0.2, "acc_half": 0.2})
    v5 = R.verdicts(pd.DataFrame(more), "r", P.FULL, [0, 1, 2], None, large_seeds=range(5))
    sw = v5[v5.claim == "hard switch at 1050 falls short"].iloc[0][R.LARGE_VALUE]
    assert "; +0.000 [" in sw  # same seeds on both sides: no difference
    assert list(R.verdicts(pd.DataFrame(rows), "r", P.FULL, [0, 1, 2], None).columns) == [
        "id", "claim", "statistic", "ours (95% interval)", "rule", "verdict", "seeds run",
        "provenance"]  # no large seeds: no large columns


def test_unknown_experiment_is_an_error(tmp_path, capsys):
    assert run_study("paper", ["reproduce", "nonsense", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert set(EXPERIMENTS) >= {"paths", "controls", "mechanism", "format"}


def test_tables_only_keeps_what_needs_checkpoints(tmp_path):
    """No run folders: Table 3 is rebuilt from the committed per-set timeline (the same table), the
    interventions table, which needs checkpoints for two of its rows, is kept from the previous build,
    and the verdicts carry the declaration's stamp and intervals."""
    import shutil

    from studies.paper.reproduce import reproduce
    from studies.paper.rules import DECLARATION

    src = REPO / "results" / "paper"
    for f in ("results_runs.csv", "results.md", "table_mechanism.csv", "table_interventions.csv",
              P.MECHANISM_PER_SET):
        shutil.copy(src / f, tmp_path / f)
    res = reproduce(["paths", "mechanism", "interventions"], seeds=3, out=tmp_path, train=False, progress=False,
                    large_seeds=0)
    md = res["markdown"]
    assert (tmp_path / "table_mechanism.csv").read_text() == (src / "table_mechanism.csv").read_text()
    assert f"Rebuilt from {P.MECHANISM_PER_SET}" in md
    assert (tmp_path / "table_interventions.csv").read_text() == (src / "table_interventions.csv").read_text()
    assert "kept from the previous build of table_interventions.csv" in md
    assert "| position gate zeroed | 0.379 [0.338, 0.422] (n=1, eval only) | 0 | .073 |" in md
    assert f"Declaration: {DECLARATION.stamp()}" in md and f"Rules of {DECLARATION.stamp()}" in md
    v = res["tables"]["verdicts"].set_index("claim")
    assert v.loc["consolidation happens after the gate reaches zero", "verdict"] == "not reproduced"
    assert "+0.054 [-0.067, +0.175] (paired t)" in v.loc["fade600->0 keeps zero-gate accuracy", "ours (95% interval)"]
    by_version = res["tables"]["verdicts_by_version"]
    assert list(by_version.columns) == ["claim", "v1", "v2", "v3"] and (tmp_path / "verdicts_by_version.csv").is_file()
    # v3: the one-seed arms are graded not run, with their seeds; every row states its provenance
    bv = by_version.set_index("claim")
    assert bv.loc["consolidation happens after the gate reaches zero", "v3"] == "not reproduced"
    assert v.loc["consolidation happens after the gate reaches zero", "seeds run"] == "3 of 3"
    assert set(v["provenance"]) == {"restated after the results"}


def test_interventions_read_back_per_seed_rows(tmp_path):
    """A seed whose run folder is gone takes its rows from interventions_per_seed.csv when a build with
    checkpoints wrote them; otherwise only the two conditions the recorded metrics give."""
    from circuitfade.train.sweep import run_dir_for

    root = tmp_path / "runs"
    runs = [{"run": run_dir_for(root, P.run("unforced", s, P.FULL)).name, "status": "recorded", "acc_normal": 1.0,
             "acc_zero": 0.4 + 0.01 * s} for s in range(2)]
    results = pd.DataFrame(runs)
    df, _ = P.interventions_table(results, root, P.FULL, [0, 1], out_dir=tmp_path)
    assert list(df.condition) == ["normal", "both gates zeroed"]
    pd.DataFrame({"condition": ["normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"],
                  "accuracy": [1.0, 0.37, 1.0, 0.4], "seed": 0}).to_csv(tmp_path / P.INTERVENTIONS_PER_SEED, index=False)
    df, _ = P.interventions_table(results, root, P.FULL, [0, 1], out_dir=tmp_path)
    t = df.set_index("condition")
    assert list(t.index) == ["normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"]
    assert t.loc["position gate zeroed", "seeds"] == "0" and t.loc["both gates zeroed", "seeds"] == "0, 1"


def test_device_and_ensemble_size_reach_every_run_and_an_absent_device_starts_no_work(tmp_path, monkeypatch, capsys):
    """``--device`` sets each run's TrainConfig.device (not its identity: the run folders are the
    CPU runs'), ``--ensemble-size`` reaches the sweep; a device this machine lacks is refused in one
    line before any work."""
    import torch

    from studies.paper import reproduce as R

    seen = {}

    class Stop(Exception):
        pass

    def sweep(cfgs, root, **kw):
        seen.update(cfgs=cfgs, root=root, **kw)
        raise Stop

    monkeypatch.setattr(R, "run_sweep", sweep)
    with pytest.raises(Stop):
        R.reproduce(["controls"], seeds=1, out=tmp_path, executor="ensemble", quick=True, large_seeds=0,
                    progress=False, device="auto", ensemble_size=256)
    assert seen["ensemble_size"] == 256 and seen["executor"] == "ensemble"
    assert {c.train.device for c in seen["cfgs"]} == {"auto"}
    cpu = P.controls_configs([0], tmp_path / "runs", P.QUICK)
    assert [run_key(c) for c in seen["cfgs"]] == [run_key(c) for c in cpu]  # the same runs, found again

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: no absent device to refuse")
    monkeypatch.chdir(tmp_path)
    rc = run_study("paper", ["reproduce", "controls", "--seeds", "1", "--quick", "--device", "cuda", "--out",
                             str(tmp_path / "gpu")])
    err = capsys.readouterr().err
    assert rc == 2 and "cuda" in err and len([line for line in err.splitlines() if line.strip()]) <= 2
    assert not (tmp_path / "gpu").exists()
    for bad in (["--device", "tpu"], ["--ensemble-size", "0"]):
        assert run_study("paper", ["reproduce", "controls", "--quick", "--out", str(tmp_path / "gpu"), *bad]) == 2
    capsys.readouterr()
