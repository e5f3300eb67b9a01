"""The removability map: cells, rules, tables from (planted) run directories, the figure."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from planted import run_study
from studies.removability import map as R
from circuitfade.io import save_tensors, write_json
from circuitfade.model import SoftPriorTransformer
from circuitfade.train import RunConfig, TrainConfig
from circuitfade.train.sweep import run_key

torch.set_num_threads(1)


# ------------------------------------------------------------------------- cells
def test_grid_configs_and_cell_of_round_trip():
    cells = R.grid()
    assert len(cells) == len(R.MODELS) * len(R.GRID_TASKS)
    markov = R.grid(models=["L4 d128"], tasks=["markov (p=0.5)"])[0]
    assert R.cell_of(markov.config("forced_zero", 2)) == markov
    cfgs = R.configs(cells)
    assert len(cfgs) == len(cells) * 7  # 3 seeds x (forced_zero, fade) + unforced seed 0
    assert [R.cell_of(c) for c in cfgs[:7]] == [R.Cell("L2 d64", "recall (default)")] * 7
    assert {R.cell_of(c) for c in cfgs} == set(cells)
    assert R.cell_of(RunConfig(path="switch@1050")) is None
    assert R.cell_of(RunConfig(path="unforced", train=TrainConfig(lr=3e-3))) is None
    assert R.cell_of(RunConfig(path="unforced", model={"n_layers": 3})) is None
    assert R.cell_of(RunConfig(path="unforced", train=TrainConfig(steps=10800))) == R.Cell("L2 d64", "recall (default)", 10800)
    # the large default cell is the paper module's large model: one run, trained once
    from studies.paper.protocol import LARGE

    assert run_key(R.Cell("L4 d128", "recall (default)").config("fade600->0", 1)) == run_key(
        RunConfig(path="fade600->0", model=dict(LARGE), seed=1))
    with pytest.raises(ValueError, match="unknown map model"):
        R.grid(models=["L8 d512"])


@pytest.mark.parametrize("margins, earlier, expected", [
    ([0.3, 0.25, 0.2], [True, True, True], "path decides removability"),
    ([0.3, 0.19, 0.5], [True, True, True], "mixed"),
    ([0.1, 0.0, -0.05], [True, True, False], "prior only speeds learning"),
    ([0.1, 0.0, -0.05], [True, False, False], "no difference"),
    ([0.1, 0.0], [True, False], "no difference"),  # exactly half is not more than half
    ([-0.3, -0.2, -0.4], [False, False, False], "forced_zero better"),
    ([0.5], [True], "too few seeds"),
])
def test_classify(margins, earlier, expected):
    assert R.classify(margins, earlier) == expected


def test_statistics():
    m = pd.DataFrame({"step": [0, 100, 200, 300], "acc_zero": [0.1, 0.49, 0.5, 0.2]})
    assert R.time_to_threshold(m) == 200
    assert math.isnan(R.time_to_threshold(m.assign(acc_zero=0.1)))
    assert R.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6*4/(5*24)
    assert R.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert R.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)  # ties: average ranks
    assert math.isnan(R.spearman([1, 1, 1], [1, 2, 3]))
    b = R.spearman_bootstrap(np.arange(20), np.arange(20) + np.sin(np.arange(20)) * 3, n_boot=300)
    assert b["lo"] <= b["rho"] <= b["hi"] and b["n"] == 20 and b["n_boot_valid"] == 300
    assert b == R.spearman_bootstrap(np.arange(20), np.arange(20) + np.sin(np.arange(20)) * 3, n_boot=300)
    assert R.binomial_se(0.5, 100) == pytest.approx(0.05)
    mean, lo, hi = R.t_interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)


# ------------------------------------------------------------------ planted run dirs
def write_run(root, cell: R.Cell, path: str, seed: int, curve, *, steps=None, seconds=60.0, ckpt=None):
    """A finished run directory with a planted zero-gate accuracy curve (one value per 100 steps)."""
    cfg = cell.config(path, seed)
    d = root / run_key(cfg)
    d.mkdir(parents=True)
    write_json(d / "config.json", cfg.to_dict())
    rows = [{"step": 100 * i, "acc_zero": a, "acc_normal": a, "loss_zero": 1.0} for i, a in enumerate(curve)]
    pd.DataFrame(rows).to_csv(d / "metrics.csv", index=False)
    write_json(d / "done.json", {"step": cfg.train.steps if steps is None else steps,
                                 "final": {"acc_zero": curve[-1], "acc_normal": curve[-1], "step": cfg.train.steps}})
    t0 = 1_700_000_000.0 + 1000 * seed
    os.utime(d / "config.json", (t0, t0))
    os.utime(d / "done.json", (t0 + seconds, t0 + seconds))
    if ckpt is not None:
        (d / "checkpoints").mkdir()
        for step, model in ckpt.items():
            save_tensors(d / "checkpoints" / f"step_{step:06d}.safetensors", model.state_dict())
    return d


def ramp(final: float, t50: int | None, n: int = 37) -> list[float]:
    """0.05 until t50 (a multiple of 100), then ``final`` (or 0.2 throughout the end if t50 is None)."""
    if t50 is None:
        return [0.05] + [final] * (n - 1)
    return [0.05 if 100 * i < t50 else final for i in range(n)]


A = R.Cell("L2 d64", "recall (default)")
B = R.Cell("L2 d64", "recall (shared vocab)")


@pytest.fixture
def planted_root(tmp_path):
    root = tmp_path / "runs"
    # cell A: fade beats forced_zero by >= 0.2 in every seed
    for s, (fz, fa) in enumerate([(0.2, 0.7), (0.25, 0.6), (0.1, 0.8)]):
        write_run(root, A, "forced_zero", s, ramp(fz, None))
        write_run(root, A, "fade600->0", s, ramp(fa, 1000 + 100 * s))
    write_run(root, A, "unforced", 0, ramp(0.15, None))
    # cell B: same end point, fade faster in 2 of 3 seeds
    for s, (t_fz, t_fa) in enumerate([(2000, 900), (1500, 1200), (1000, 1400)]):
        write_run(root, B, "forced_zero", s, ramp(0.7, t_fz))
        write_run(root, B, "fade600->0", s, ramp(0.72, t_fa))
    write_run(root, B, "fade600->0", 3, ramp(0.72, 900), steps=1800)  # unfinished: must not count
    (root / "stray").mkdir()  # not a run
    other = RunConfig(path="switch@1050")  # a finished run that is not a map run
    for name, obj in (("config.json", other.to_dict()), ("done.json", {"step": 3600, "final": {"acc_zero": 0.5}})):
        write_json(root / run_key(other) / name, obj)
    (root / run_key(other) / "metrics.csv").write_text("step,acc_zero\n0,0.1\n")
    return root


def test_tables_from_planted_runs(planted_root, tmp_path):
    out = tmp_path / "map"
    assert R.main(["--tables-only", "--runs", str(planted_root), "--out", str(out), "--no-figure"]) == 0
    cells = pd.read_csv(out / "map_cells.csv").set_index("task")
    a, b = cells.loc["recall (default)"], cells.loc["recall (shared vocab)"]
    assert a["class_v1"] == "path decides removability" and b["class_v1"] == "prior only speeds learning"
    # version 2: from the interval (3 seeds: [+0.14, +0.90] straddles 0.2) and [+0.02 ± tiny] below 0.2
    assert a["class"] == "undecided" and b["class"] == "margin below 0.2" and b.outcome == "not reproduced"
    assert a.margin_mean == pytest.approx(np.mean([0.5, 0.35, 0.7]))
    lo_hi = R.t_interval([0.5, 0.35, 0.7])
    assert (a.margin_lo, a.margin_hi) == pytest.approx(lo_hi[1:])
    assert a.margin_min == pytest.approx(0.35) and a.n_paired == 3 and a.unforced_n == 1
    assert a.fz_plateau_frac == 1.0 and a.fade_plateau_frac == 0.0 and math.isnan(a.fz_t50_median)
    assert a.fade_t50_median == 1100 and a.fade_t50_seeds == "1000, 1100, 1200"
    assert b.n_fade_earlier == 2 and b.fade_n == 3  # the unfinished seed-3 run is not a result
    assert b.margin_mean == pytest.approx(0.02)
    runs = pd.read_csv(out / "map.csv")
    assert len(runs) == 13 and set(runs.seconds) == {60.0} and set(runs.seconds_source) == {"file times"}
    md = (out / "results.md").read_text()
    assert "not tabulated" in md and "budget 3600" in md
    assert f"Declaration: {R.DECLARATION.stamp()}" in md  # the protocol the tables were built by
    # persisted: config, metrics, done and timing, never checkpoints
    persisted = sorted(p.name for p in (out / "runs").iterdir())
    assert len(persisted) == 14  # 13 finished + the unfinished map run (kept, reported)
    assert all(sorted(f.name for f in (out / "runs" / n).iterdir()) ==
               ["config.json", "done.json", "metrics.csv", "timing.json"] for n in persisted)
    # rebuild on a "new machine": the sweep root is gone, the tables come out the same
    first = (out / "map.csv").read_text(), (out / "map_cells.csv").read_text()
    shutil.rmtree(planted_root)
    with pytest.raises(ValueError, match="--force"):  # outputs exist: nothing is replaced without --force
        R.main(["--tables-only", "--runs", str(planted_root), "--out", str(out), "--no-figure"])
    assert R.main(["--tables-only", "--runs", str(planted_root), "--out", str(out), "--no-figure", "--force"]) == 0
    assert ((out / "map.csv").read_text(), (out / "map_cells.csv").read_text()) == first


def test_needs_five_seeds_flag():
    runs = pd.DataFrame([
        {"model": "m", "task": "t", "steps": 3600, "path": p, "seed": s, "acc_zero": a, "t50": np.nan,
         "plateau": a < 0.3, "run": f"{p}{s}"}
        for s, (fz, fa) in enumerate([(0.3, 0.45), (0.3, 0.55), (0.3, 0.5)]) for p, a in
        (("forced_zero", fz), ("fade600->0", fa))])
    c = R.cell_table(runs).iloc[0]
    assert c.margin_mean == pytest.approx(0.2) and bool(c.needs_5_seeds) and c["class_v1"] == "mixed"
    assert c["class"] == "undecided" and c.outcome == "inconclusive"


def _cell_runs(pairs, steps=3600):
    return pd.DataFrame([
        {"model": "m", "task": "t", "steps": steps, "path": p, "seed": s, "acc_zero": a, "t50": np.nan,
         "plateau": a < 0.3, "run": f"{p}{s}"}
        for s, (fz, fa) in enumerate(pairs) for p, a in (("forced_zero", fz), ("fade600->0", fa))])


def test_plateau_guard_and_interval_classes():
    """Both paths on the plateau in every seed: not testable, however tight the margin; a margin whose
    whole interval is above 0.2 decides; one whose whole interval is below does not."""
    on_plateau = R.cell_table(_cell_runs([(0.20, 0.25), (0.21, 0.26), (0.22, 0.27)])).iloc[0]
    assert on_plateau["class"] == "not testable" and on_plateau.outcome == "not testable"
    assert on_plateau.class_v1 == "no difference"  # version 1 called a plateau cell a finding
    decides = R.cell_table(_cell_runs([(0.30, 0.80), (0.31, 0.80), (0.32, 0.83)])).iloc[0]
    assert decides["class"] == "path decides removability" and decides.outcome == "reproduced"
    below = R.cell_table(_cell_runs([(0.70, 0.72), (0.71, 0.72), (0.72, 0.75)])).iloc[0]
    assert below["class"] == "margin below 0.2"
    assert R.classify_interval(0.1, 0.3, 1, False) == "too few seeds"


def test_grid_verdict_is_judged_over_the_family():
    """A cell that decides at 95% but not at the Bonferroni level leaves the grid's claim inconclusive."""
    one = _cell_runs([(0.30, 0.62), (0.31, 0.59), (0.32, 0.68)]).assign(model="a")
    flat = [_cell_runs([(0.70, 0.71), (0.71, 0.71), (0.72, 0.74)]).assign(model=f"f{i}") for i in range(9)]
    cells = R.cell_table(pd.concat([one, *flat], ignore_index=True))
    first = cells[cells.model == "a"].iloc[0]
    assert first["class"] == "path decides removability"  # per cell, 95%
    assert first.bonf_lo < 0.2 < first.margin_lo  # Bonferroni over 10 cells: no longer decided
    v = R.grid_verdict(cells)
    assert v.word == "inconclusive" and str(v.provenance) == "declared after the results"
    v_flat = R.grid_verdict(cells[cells.model != "a"])
    assert v_flat.word == "not reproduced"


def test_persist_keeps_differing_runs_unless_forced(planted_root, tmp_path):
    dest = tmp_path / "persisted"
    first = R.persist([planted_root], dest)
    assert first == {"copied": 14, "same": 0, "kept": 0, "skipped": 1}
    assert R.persist([planted_root], dest)["same"] == 14
    victim = next(d for d in planted_root.iterdir() if d.name.startswith("assoc-unforced"))
    (victim / "metrics.csv").write_text("step,acc_zero\n0,0.9\n")
    assert R.persist([planted_root], dest)["kept"] == 1
    assert (dest / victim.name / "metrics.csv").read_text() != "step,acc_zero\n0,0.9\n"
    timing = pd.DataFrame({"run": [victim.name], "seconds": [123.0], "status": ["done"]})
    assert R.persist([planted_root], dest, timing=timing, force=True)["copied"] == 1
    assert (dest / victim.name / "metrics.csv").read_text() == "step,acc_zero\n0,0.9\n"
    assert json.loads((dest / victim.name / "timing.json").read_text())["seconds"] == 123.0
    # a member of an ensemble of 4 is charged a quarter of the ensemble's time
    timing = pd.DataFrame({"run": [victim.name], "seconds": [100.0], "status": ["done"], "ensemble": [4]})
    R.persist([planted_root], tmp_path / "fresh", timing=timing)
    t = json.loads((tmp_path / "fresh" / victim.name / "timing.json").read_text())
    assert t["seconds"] == 25.0 and t["source"] == "sweep (1/4 of an ensemble)"


def test_outputs_not_overwritten_without_force(planted_root, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.md").write_text("my notes\n")
    args = ["--tables-only", "--runs", str(planted_root), "--out", str(out), "--no-figure"]
    assert run_study("removability", args) == 2
    assert (out / "results.md").read_text() == "my notes\n"
    assert run_study("removability", args + ["--force"]) == 0
    assert (out / "results.md").read_text().startswith("<!-- written by python -m studies.removability")


def test_figure_values_and_hover(planted_root, tmp_path):
    from studies.removability.figures import map_figure

    R.persist([planted_root], tmp_path / "p")
    runs, _ = R.collect(tmp_path / "p")
    cells = R.cell_table(runs)
    fig = map_figure(cells, runs, models=list(R.MODELS), tasks=list(R.GRID_TASKS))
    heat = [t for t in fig.data if t.type == "heatmap"][1]
    assert heat.z[0][0] == pytest.approx(np.mean([0.5, 0.35, 0.7])) and heat.z[0][1] == pytest.approx(0.02)
    assert heat.z[1][0] is None  # L2 d128: not run
    assert "undecided" in heat.text[0][0] and "0.700, 0.600, 0.800" in heat.customdata[0][0]
    dots = [t for t in fig.data if t.type == "scatter"][0]
    assert len(dots.x) == 6 and sorted(np.round(dots.marker.color, 3))[-1] == 0.7
    assert sum(a.text == "not run" for a in fig.layout.annotations) == 6


def test_continuation_rows_on_planted_checkpoints(tmp_path):
    root = tmp_path / "runs"
    torch.manual_seed(0)
    base = SoftPriorTransformer(A.config("fade600->0", 0).model_config())
    for s, fa in enumerate([0.6, 0.7, 0.8]):
        write_run(root, A, "forced_zero", s, ramp(0.2, None))
        write_run(root, A, "fade600->0", s, ramp(fa, 1000), ckpt={0: base, 600: base})
    write_run(root, A, "unforced", 0, ramp(0.15, None), ckpt={3600: base})
    R.persist([root], tmp_path / "p")
    runs, _ = R.collect(tmp_path / "p")
    sig, missing = R.continuation_rows(runs, [root], n_random=20, n=32, progress=False)
    assert len(sig) == 4 and len(missing) == 3  # forced_zero runs have no checkpoints here
    assert set(sig.signal_step) == {600, 3600}
    # identical weights -> identical signal; the test of a constant predictor is undefined, not a number
    fade = sig[sig.path == "fade600->0"]
    assert fade.circuit_share.nunique() == 1
    tests = R.continuation_tests(sig, R.cell_table(runs))
    prim = tests[tests.primary].iloc[0]
    assert prim.statistic == R.SIGNAL_PRIMARY and math.isnan(prim.rho)


def test_continuation_tests_keep_budgets_apart():
    """A 10,800-step run repeats its 3,600-step twin's step-600 signal: each budget is tested on its
    own (planted: perfect rank agreement at 3,600, perfect disagreement at 10,800)."""
    sig = pd.DataFrame({"model": "a", "task": "t", "path": "fade600->0", "seed": [0, 1, 2] * 2,
                        "steps": [3600] * 3 + [10800] * 3, "circuit_share": [0.1, 0.2, 0.3] * 2,
                        "circuit_norm": [1.0, 2.0, 3.0] * 2, "share_ratio": [1.0, 1.1, 1.2] * 2,
                        "acc_zero_final": [0.2, 0.5, 0.9, 0.9, 0.5, 0.2]})
    tests = R.continuation_tests(sig, pd.DataFrame())
    fade = tests[(tests.set == "fade600->0 runs") & (tests.statistic == R.SIGNAL_PRIMARY)].set_index("steps")
    assert fade.loc[3600, "rho"] == pytest.approx(1.0) and fade.loc[10800, "rho"] == pytest.approx(-1.0)
    assert fade.loc[3600, "n"] == 3 and bool(fade.loc[3600, "primary"]) and not bool(fade.loc[10800, "primary"])


def test_separation_of_cells_by_signal():
    cells = pd.DataFrame({"model": ["a", "b", "c"], "task": "t", "steps": 3600,
                          "class": ["path decides removability", "no difference", "mixed"]})
    sig = pd.DataFrame({"model": ["a", "a", "b", "b", "c", "c", "c"], "task": "t", "steps": 3600,
                        "path": ["fade600->0"] * 6 + ["forced_zero"],
                        "circuit_share": [0.5, 0.7, 0.4, 0.2, 0.3, 0.35, 9.0]})
    sep = R.separation(sig, cells)
    assert (sep["n_pos"], sep["n_neg"]) == (2, 1) and sep["auc"] == 1.0  # 0.6 and 0.325 vs 0.3
    sep = R.separation(sig.assign(circuit_share=[0.5, 0.7, 0.4, 0.2, 0.1, 0.1, 9.0]), cells)
    assert sep["auc"] == 0.5
    assert math.isnan(R.separation(sig, cells.assign(**{"class": "no difference"}))["auc"])


@pytest.mark.slow
def test_map_command_trains_a_tiny_cell(tmp_path):
    args = ["--models", "L2 d64", "--tasks", "recall (default)", "--seeds", "0", "--steps", "30",
            "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "map"), "--workers", "1", "--no-figure",
            "--executor", "ensemble"]  # named: the default (auto) picks by a measurement on this machine
    assert run_study("removability", args) == 0
    runs = pd.read_csv(tmp_path / "map" / "map.csv")
    assert sorted(runs.path) == ["fade600->0", "forced_zero", "unforced"] and set(runs.steps) == {30}
    assert set(runs.seconds_source) == {"sweep (1/3 of an ensemble)"}  # --workers 1: one ensemble of three
    assert "an ensemble member counting its share" in (tmp_path / "map" / "results.md").read_text()
    assert not any((tmp_path / "map" / "runs").rglob("*.safetensors"))
