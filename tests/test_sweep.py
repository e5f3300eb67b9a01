"""Sweeps: local pool, caching of finished runs, failures reported, Ray == local."""

from __future__ import annotations

import pytest
import torch

from circuitfade.io import load_tensors
from circuitfade.train.sweep import child_of, run_dir_for, run_key, run_sweep
from circuitfade.train import RunConfig, TrainConfig

TC = TrainConfig(steps=10, eval_every=5, checkpoint_every=5, eval_size=32, batch_size=8)


def configs():
    return [RunConfig(path=p, train=TC, seed=s) for p in ("unforced", "fade2+3->0") for s in (0, 1)]


def weights(d):
    return load_tensors(d / "checkpoints" / "step_000010.safetensors")


def test_run_key_is_stable_and_distinct():
    a, b = configs()[:2]
    assert run_key(a) == run_key(RunConfig(path="unforced", train=TC, seed=0))
    assert run_key(a) != run_key(b)
    assert run_key(a).startswith("assoc-unforced-s0-")


@pytest.mark.parametrize("cfg, key", [
    (RunConfig(path="fade600->0", seed=3), "assoc-fade600to0-s3-291b9106"),
    (RunConfig(path="linear0.5->0", task={"name": "markov", "p": 0.5},
               train=TrainConfig(steps=360, eval_every=50), seed=1), "markov-linear0.5to0-s1-8203cccf"),
    (RunConfig(path="unforced", task={"name": "ambiguous"}, mix={"p_icl": "pw(0:0.5,100:0.6,300:0.4,400:0.5)"}),
     "ambiguous-unforced-s0-8d90fd6d"),
    (RunConfig(path="posthoc", parent={"run": "/x/assoc-unforced-s0-abcdef12", "step": 3600},
               train=TrainConfig(steps=6150)), "assoc-posthoc-s0-baf400db"),
])
def test_run_key_pinned(cfg, key):
    # keys computed before the schedule rewrite: results/runs caches depend on them
    assert run_key(cfg) == key


def test_run_config_parses_specs_once(monkeypatch):
    import circuitfade.train.config as loop

    cfg = RunConfig(path="fade600->0", task={"name": "ambiguous"}, mix={"p_icl": "linear0.2->0.8@0:100"})
    monkeypatch.setattr(loop, "parse_schedule", lambda *a, **k: pytest.fail("re-parsed a mix spec"))
    monkeypatch.setattr(loop, "parse_path", lambda *a, **k: pytest.fail("re-parsed the path spec"))
    assert cfg.mix_at(50) == {"p_icl": pytest.approx(0.5)} and cfg.mix_at(100) == {"p_icl": 0.8}
    assert cfg.gate_path() is cfg.gate_path() and cfg.gate_path().value_at(825) == pytest.approx(0.25)
    assert cfg.to_dict()["mix"] == {"p_icl": "linear0.2->0.8@0:100"}  # the JSON form stays the spec string


@pytest.mark.slow
def test_local_sweep_caches_and_reports_failures(tmp_path):
    # a bad task config is now refused when the config is made (RunConfig validates it), so the
    # run that fails inside the sweep is a branch whose parent checkpoint does not exist
    with pytest.raises(ValueError, match="n_pairs"):
        RunConfig(path="unforced", task={"name": "assoc", "n_pairs": 99}, train=TC, seed=0)
    broken = RunConfig(path="forced_zero", train=TC, seed=0, parent={"run": str(tmp_path / "nowhere"), "step": 5})
    res = run_sweep(configs() + [broken], tmp_path, workers=2, progress=False)
    assert list(res.status) == ["done"] * 4 + ["failed"]
    assert "nowhere" in res.error.iloc[-1]
    mtimes = {d: (run_dir_for(tmp_path, c) / "done.json").stat().st_mtime_ns for d, c in enumerate(configs())}
    again = run_sweep(configs(), tmp_path, workers=2, progress=False)
    assert list(again.status) == ["cached"] * 4
    assert list(again.acc_zero) == list(res.acc_zero.iloc[:4])
    for i, c in enumerate(configs()):
        assert (run_dir_for(tmp_path, c) / "done.json").stat().st_mtime_ns == mtimes[i]


def test_branch_waits_for_parent_serial(tmp_path):
    parent = RunConfig(path="unforced", train=TC, seed=0)
    child = child_of(tmp_path, parent, 10, path="posthoc5", steps=15)
    res = run_sweep([child, parent], tmp_path, executor="serial", progress=False)
    assert list(res.status) == ["done", "done"]
    assert res.loc[res.path == "posthoc5", "step"].item() == 15


@pytest.mark.slow
def test_ray_matches_local_pool_bit_for_bit(tmp_path):
    pytest.importorskip("ray")
    import ray

    cfgs = configs()[:2]
    run_sweep(cfgs, tmp_path / "local", workers=2, progress=False)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        res = run_sweep(cfgs, tmp_path / "ray", executor="ray", progress=False)
    finally:
        ray.shutdown()
    assert list(res.status) == ["done", "done"]
    for c in cfgs:
        a, b = weights(run_dir_for(tmp_path / "local", c)), weights(run_dir_for(tmp_path / "ray", c))
        for k in a:
            assert torch.equal(a[k], b[k]), k
        ma = (run_dir_for(tmp_path / "local", c) / "metrics.csv").read_text()
        mb = (run_dir_for(tmp_path / "ray", c) / "metrics.csv").read_text()
        assert ma == mb
