"""The executor default is measured on the machine it runs on (circuitfade.train.calibrate)."""

from __future__ import annotations

import math

import pytest

import circuitfade.train.calibrate as cal
from circuitfade.train import RunConfig, TrainConfig
from circuitfade.train.calibrate import MARGIN, choose_executor, decide
from circuitfade.train.sweep import run_sweep

TC = TrainConfig(steps=6, batch_size=8, eval_every=3, eval_size=16, checkpoint_every=3)


def configs(n=2, **model):
    return [RunConfig(path="unforced", train=TC, seed=s, model=model) for s in range(n)]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cal.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(cal.EXECUTOR_ENV, raising=False)


def test_the_rule_takes_the_ensemble_only_when_it_is_faster_by_the_margin():
    assert decide({4: 1.2, 16: 1.3}) == ("ensemble", 16)
    assert decide({4: 1.3, 16: 1.3}) == ("ensemble", 4)  # a tie goes to the smaller ensemble (less memory)
    assert decide({4: 1.02, 16: 0.9}) == ("local", None)  # faster, but within the timer's noise
    assert decide({4: 0.95, 16: 0.86}) == ("local", None)  # slower: never the default
    assert decide({4: MARGIN}) == ("ensemble", 4)
    assert decide({}) == ("local", None)


def test_the_measurement_is_cached_per_machine_and_shape():
    calls = []

    def measure(cfg):
        calls.append(cfg)
        return {4: 1.4, 16: 1.1}

    first = choose_executor(configs(), measure=measure)
    assert (first.executor, first.members, first.source) == ("ensemble", 4, "measured")
    assert first.machine["cores"] >= 1 and "torch" in first.machine and "E=4: 1.40x" in first.describe()

    def must_not_measure(cfg):
        raise AssertionError("measured again although cached")

    again = choose_executor(configs(), measure=must_not_measure)
    assert (again.executor, again.members, again.source) == ("ensemble", 4, "cache")
    other_shape = choose_executor(configs(d_model=32), measure=lambda c: {4: 0.9, 16: 0.8})
    assert (other_shape.executor, other_shape.source) == ("local", "measured")
    assert len(calls) == 1


def test_other_code_measures_again(monkeypatch):
    """What older code measured is not read after the timed code changed (a release, a local edit)."""
    fingerprint = cal.code_fingerprint()
    assert fingerprint == cal.code_fingerprint() and len(fingerprint) == 16
    assert choose_executor(configs(), measure=lambda c: {4: 1.4}).source == "measured"
    assert choose_executor(configs(), measure=lambda c: {4: 0.5}).source == "cache"
    monkeypatch.setattr(cal, "code_fingerprint", lambda: "another release")
    changed = choose_executor(configs(), measure=lambda c: {4: 0.9, 16: 0.8})
    assert (changed.executor, changed.source) == ("local", "measured")


def test_an_unreadable_cache_is_measured_again(tmp_path):
    cache = tmp_path / "cache" / "executor.json"
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    choice = choose_executor(configs(), measure=lambda c: {4: 0.9})
    assert (choice.executor, choice.source) == ("local", "measured")


def test_forcing_and_nothing_to_batch(monkeypatch):
    boom = lambda c: (_ for _ in ()).throw(AssertionError("measured"))  # noqa: E731
    assert choose_executor(configs(1), measure=boom).source == "not applicable"
    parent = RunConfig(path="unforced", train=TC, seed=1, parent={"run": "/x", "step": 3})
    assert choose_executor([configs(1)[0], parent], measure=boom).executor == "local"  # a branch cannot join
    monkeypatch.setenv(cal.EXECUTOR_ENV, "ensemble")
    assert (choose_executor(configs(), measure=boom).executor, choose_executor(configs()).source) == ("ensemble", "forced")
    monkeypatch.setenv(cal.EXECUTOR_ENV, "fastest")
    with pytest.raises(ValueError, match="CIRCUITFADE_EXECUTOR='fastest'"):
        choose_executor(configs())


@pytest.mark.parametrize("speedups, ensembled", [({4: 1.5}, True), ({4: 0.9}, False)])
def test_run_sweep_auto_follows_the_measurement(tmp_path, monkeypatch, speedups, ensembled):
    monkeypatch.setattr(cal, "measure_speedups", lambda cfg: speedups)
    res = run_sweep(configs(), tmp_path / "runs", executor="auto", workers=1, progress=False)
    assert list(res.status) == ["done", "done"]
    if ensembled:
        assert list(res.ensemble) == [2, 2]  # the two runs trained as one ensemble
    else:
        assert "ensemble" not in res or res.ensemble.isna().all()


def test_the_real_measurement_times_both_trainers_here():
    speedups = cal.measure_speedups(configs(1)[0], members=(2,), steps=4)
    assert set(speedups) == {2} and math.isfinite(speedups[2]) and speedups[2] > 0


def test_the_forced_ensemble_takes_its_size_from_the_measurement_here(tmp_path, monkeypatch):
    """``executor="ensemble"`` without ``ensemble_size``: the size that measured fastest on this machine
    (even where the ensemble as a whole is not faster), never a figure measured elsewhere."""
    assert cal.ensemble_size_here(configs(), measure=lambda c: {4: 1.4, 16: 1.1}) == 4
    assert cal.ensemble_size_here(configs(d_model=32), measure=lambda c: {4: 0.8, 16: 0.9}) == 16
    assert cal.ensemble_size_here(configs(1), measure=lambda c: {4: 2.0}) is None  # nothing to batch
    monkeypatch.setattr(cal, "measure_speedups", lambda cfg: {4: 1.0, 16: 1.2})
    seen = []
    import circuitfade.train.sweep as sweep

    real = sweep.plan_jobs
    monkeypatch.setattr(sweep, "plan_jobs", lambda wave, size, workers: seen.append(size) or real(wave, size, workers))
    res = run_sweep(configs(3, d_model=16, d_head=8), tmp_path / "runs", executor="ensemble", workers=1,
                    progress=False)
    assert list(res.status) == ["done"] * 3 and seen == [16]



def test_compiled_runs_are_timed_eagerly(monkeypatch):
    """The calibration's short runs of a compiled config's shape never compile (a compile would cost
    more than their steps); they are the same shape otherwise."""
    import circuitfade.train.ensemble as ens
    import circuitfade.train.loop as loop

    seen = []
    monkeypatch.setattr(loop, "train", lambda cfg, out, **kw: seen.append(cfg))
    monkeypatch.setattr(ens, "train_ensemble", lambda cfgs, dirs, **kw: seen.extend(cfgs))
    compiled = RunConfig(path="unforced", train=TrainConfig(steps=600, batch_size=8, compile=True), seed=3)
    cal.measure_speedups(compiled, members=(2,), steps=5)
    assert len(seen) == 5 and not any(c.train.compile for c in seen)
    assert {c.train.batch_size for c in seen} == {8} and {c.train.steps for c in seen} == {2, 5}
