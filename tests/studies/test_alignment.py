"""Ignition on planted curves, the rate equation on planted waiting times, frozen constants, the verdict
rules, and one tiny end-to-end run of ``circuitfade alignment``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade.analysis.ignition import as_curve, ignited_for, ignition_step
from studies.alignment import apparatus, report
from studies.alignment import parts as A
from repo_root import REPO

torch.set_num_threads(1)
CHANCE = 1 / 3


def _curve(n=40, at=17, every=25, lo=CHANCE, hi=0.99):
    steps = np.arange(n) * every
    vals = np.where(np.arange(n) >= at, hi, lo)
    return steps, vals


# ------------------------------------------------------------------ ignition
def test_ignition_at_the_planted_step():
    steps, vals = _curve(at=17)
    assert ignition_step(vals, steps=steps, baseline=CHANCE) == 17 * 25
    s = pd.Series(vals, index=steps)
    assert ignition_step(s, baseline=CHANCE) == 17 * 25
    assert ignition_step(dict(zip(steps, vals)), baseline=CHANCE) == 17 * 25
    assert ignition_step(pd.DataFrame({"step": steps, "value": vals}), baseline=CHANCE) == 17 * 25


def test_one_noisy_eval_before_does_not_ignite():
    steps, vals = _curve(at=20)
    vals[8] = 0.9  # a lucky evaluation on the plateau
    assert ignition_step(vals, steps=steps, baseline=CHANCE) == 20 * 25
    assert ignition_step(vals, steps=steps, baseline=CHANCE, patience=1) == 20 * 25  # it does not last either
    vals[9] = 0.9  # two in a row, then back: not "for good"
    assert ignition_step(vals, steps=steps, baseline=CHANCE) == 20 * 25


def test_one_noisy_eval_after_does_not_undo_it():
    steps, vals = _curve(at=10)
    vals[25] = 0.30  # one bad evaluation after ignition
    assert ignition_step(vals, steps=steps, baseline=CHANCE) == 10 * 25
    assert ignition_step(vals, steps=steps, baseline=CHANCE, patience=1) == 26 * 25  # strict: must never dip
    vals[26] = 0.30  # two bad ones in a row: it fell back, ignition is the later rise
    assert ignition_step(vals, steps=steps, baseline=CHANCE) == 27 * 25


def test_no_ignition_is_none_and_threshold_matters():
    steps, vals = _curve(at=99)
    assert ignition_step(vals, steps=steps, baseline=CHANCE) is None
    steps, vals = _curve(at=5, hi=0.6)  # 0.6 is above the 0.5 level only with a lower threshold
    assert ignition_step(vals, steps=steps, baseline=CHANCE) is None
    assert ignition_step(vals, steps=steps, baseline=CHANCE, threshold=0.25) == 5 * 25
    steps, vals = _curve(n=20, at=19)  # crossed at the very last evaluation: not yet confirmed
    assert ignition_step(vals, steps=steps, baseline=CHANCE) is None
    assert ignited_for(vals, steps=steps, baseline=CHANCE) == float("-inf")
    steps, vals = _curve(n=20, at=10)
    assert ignited_for(vals, steps=steps, baseline=CHANCE) == 9 * 25


def test_ignition_bad_input():
    with pytest.raises(ValueError, match="increasing"):
        as_curve([0.1, 0.2], steps=[5, 5])
    with pytest.raises(ValueError, match="finite"):
        ignition_step([0.3, float("nan")], baseline=CHANCE)
    with pytest.raises(ValueError, match="threshold"):
        ignition_step([0.3], baseline=CHANCE, threshold=1.5)
    with pytest.raises(ValueError, match="patience"):
        ignition_step([0.3], baseline=CHANCE, patience=0)
    with pytest.raises(ValueError, match="ceiling"):
        ignition_step([0.3], baseline=1.0)


# ------------------------------------------------------------------ the rate equation
PLANTED = {"c": 2e-4, "beta": 0.9, "delta": 3e-4, "sites": 1.0, "attempts": 128.0}


def _synthetic(constants, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(1, 6):
        for d in (0.5, 1.0, 2.0):
            w = float(A.predict_wait(m, d, constants))
            if np.isfinite(w):
                rows.append({"m": m, "drive": d, "wait": w * float(np.exp(noise * rng.standard_normal()))})
    return pd.DataFrame(rows)


def test_rate_fit_recovers_planted_constants():
    cells = _synthetic(PLANTED)
    assert len(cells) >= 10
    fit = A.fit_rate(cells)
    assert fit["beta"] == pytest.approx(PLANTED["beta"], rel=0.02)
    assert fit["c"] == pytest.approx(PLANTED["c"], rel=0.05)
    assert fit["delta"] == pytest.approx(PLANTED["delta"], rel=0.1)
    assert fit["rms_log_error"] < 0.01
    noisy = A.fit_rate(_synthetic(PLANTED, noise=0.1, seed=3))
    assert noisy["beta"] == pytest.approx(PLANTED["beta"], rel=0.2)


def test_rate_fit_without_destruction():
    planted = {**PLANTED, "delta": 0.0}
    fit = A.fit_rate(_synthetic(planted))
    assert fit["beta"] == pytest.approx(0.9, rel=0.02)
    assert fit["delta"] < 1e-5  # the destruction rate of a wait that never saturates is ~0


def test_predict_wait_is_infinite_without_a_positive_rate():
    assert np.isinf(A.predict_wait(10, 0.1, PLANTED))
    w = A.predict_wait(np.array([1, 2]), np.array([1.0, 1.0]), PLANTED)
    assert w[0] < w[1]


def test_rate_fit_bad_input():
    with pytest.raises(ValueError, match="finite"):
        A.fit_rate(pd.DataFrame({"m": [1, 2, 3], "drive": [1, 1, 1], "wait": [10, np.inf, 30]}))
    with pytest.raises(ValueError, match="columns"):
        A.fit_rate(pd.DataFrame({"m": [1, 2, 3]}))


def test_frozen_constants_round_trip_and_hash(tmp_path):
    path = tmp_path / "rate_constants.json"
    cells = _synthetic(PLANTED)
    doc = A.freeze_constants(path, PLANTED, fit_cells=cells)
    assert len(doc["sha256"]) == 64
    assert A.load_constants(path) == PLANTED
    A.freeze_constants(path, PLANTED, fit_cells=cells)  # identical: fine
    with pytest.raises(ValueError, match="different frozen constants"):
        A.freeze_constants(path, {**PLANTED, "beta": 1.0}, fit_cells=cells)
    d = json.loads(path.read_text())
    d["payload"]["constants"]["beta"] = 0.1  # edited by hand
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="hash"):
        A.load_constants(path)


# ------------------------------------------------------------------ verdict rules
def test_verdict_rules():
    pooled = {"n_discriminating": 20, "n_below": 20, "p_sign": 2 ** -20, "median": 0.01, "median_lo": 0.0,
              "median_hi": 0.02}
    v = A.verdicts({"ratio": (1.3, 1.1, 1.5), "pooled": pooled, "random_median": 1.0, "rate_error": 0.2,
                    "rate_n": 4}).set_index("claim").verdict
    assert list(v) == ["reproduced"] * 4
    v = A.verdicts({"ratio": (3.0, 2.5, 3.5), "pooled": {**pooled, "n_below": 10, "p_sign": 0.6, "median": 0.6},
                    "random_median": 0.5, "rate_error": 0.9, "rate_n": 4}).verdict
    assert list(v) == ["not reproduced"] * 4
    v = A.verdicts({}).verdict
    assert list(v) == ["not run"] * 4


def test_job_keys_are_stable_and_distinct():
    a = apparatus.job_key({"kind": "base", "k": 3, "seed": 0})
    assert a == apparatus.job_key({"seed": 0, "k": 3, "kind": "base"}) and a.startswith("base-k3-s0-")
    b = apparatus.job_key({"kind": "reinit", "k": 3, "m": 2, "seed": 0, "drive": 2.0, "base": {"kind": "base", "k": 3, "seed": 0}})
    assert b.startswith("reinit-k3-m2-s0-d2.0-")


def test_cli_rejects_unknown_experiment(tmp_path):
    from studies.common import study_main

    assert study_main("python -m studies.alignment", report.main, ["nonsense", "--out", str(tmp_path)]) == 2


@pytest.mark.slow
def test_end_to_end_tiny(tmp_path, monkeypatch):
    """K = 2 only, one seed, serial: every stage runs, files appear, finished jobs are reused."""
    monkeypatch.setattr(A, "KS", (2,))
    monkeypatch.setattr(A, "DRIVE_CELLS", ())
    r = report.run(["ablation", "waiting"], seeds=1, out=tmp_path, workers=1, progress=False, png=False)
    assert (tmp_path / "results.md").is_file() and (tmp_path / "waiting_times.csv").is_file()
    t = pd.read_csv(tmp_path / "waiting_times.csv")
    assert list(t.m) == [1, 2] and (t.ignited == 1).all() and (t.wait_median > 0).all()
    assert (r["reinit"].acc_after_reinit < 0.6).all()  # a re-initialised part leaves ~chance
    mtime = {p.name: p.stat().st_mtime for p in (tmp_path / "jobs").iterdir()}
    report.run(["waiting"], seeds=1, out=tmp_path, workers=1, progress=False, png=False)
    assert {p.name: p.stat().st_mtime for p in (tmp_path / "jobs").iterdir()} == mtime


# ------------------------------------------------------------------ the committed report
COMMITTED = REPO / "results" / "alignment"
CARRIED = ("part_ablation_series.csv", "cure_damage.csv")
"""Tables the rebuild reads instead of recomputing: the developing series' ablations and the damage at the
switch (their run folders, with checkpoints, are not committed; the finished jobs are)."""


def test_committed_results_rebuild_byte_identical_from_the_committed_jobs(tmp_path, capsys):
    """results/alignment is generated: the documented command on the committed jobs (and the carried tables)
    writes every committed text file again, byte for byte, and nothing that is not committed."""
    from studies.common import study_main

    out = tmp_path / "alignment"
    shutil.copytree(COMMITTED / "jobs", out / "jobs")
    for name in CARRIED:
        shutil.copy(COMMITTED / name, out / name)
    argv = ["--seeds", "5", "--out", str(out), "--with-series", "--quiet", "--no-png"]
    assert study_main("python -m studies.alignment", report.main, argv) == 0
    assert "No-partial-credit" in capsys.readouterr().out  # the report is printed too
    written = {p.name for p in out.iterdir() if p.is_file() and p.suffix != ".html"}
    committed = {p.name for p in COMMITTED.iterdir() if p.is_file() and p.suffix not in (".png", ".html")}
    assert written == committed
    figures = {p.stem for p in out.glob("fig_*.html")}
    assert figures == {p.stem for p in COMMITTED.glob("fig_*.png")}  # every figure it draws is committed
    for name in sorted(written):
        text = (out / name).read_text().replace(str(out), "results/alignment")
        assert text == (COMMITTED / name).read_text(), f"{name} differs from the committed file"
    v = pd.read_csv(COMMITTED / "verdicts.csv")
    assert set(v.protocol.map(report.version_of)) == {1, 2, 3}
    assert not ((v.verdict == "reproduced") & v.apparatus.str.startswith("pinned (control")).any()
