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
@pytest.mark.xdist_group("ray")  # one local Ray instance at a time (pytest -n: the same worker)
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


# --------------------------------------------------------------------------------------
# the ensemble executor
# --------------------------------------------------------------------------------------
def test_plan_jobs_groups_runs_by_shape_and_budget(tmp_path):
    from circuitfade.train.sweep import plan_jobs

    same = [(RunConfig(path=p, train=TC, seed=s), tmp_path / f"{p}{s}") for p in ("unforced", "fade2+3->0")
            for s in range(5)]
    longer = [(RunConfig(path="unforced", train=TrainConfig(steps=20), seed=s), tmp_path / f"l{s}") for s in range(2)]
    branch = [(child_of(tmp_path, same[0][0], 10, path="posthoc5", steps=15), tmp_path / "b")]
    done = tmp_path / "done"
    done.mkdir()
    (done / "done.json").write_text("{}")
    finished = [(RunConfig(path="forced_zero", train=TC, seed=9), done)]
    jobs = plan_jobs(same + longer + branch + finished, size=4)
    sizes = sorted(len(j) for j in jobs)
    assert sizes == [1, 1, 2, 3, 3, 4]  # 10 runs of one shape in 3 ensembles of <= 4, 2 longer, branch, finished
    assert [j for j in jobs if len(j) == 1] == [branch, finished]
    assert sorted(d.name for j in jobs for _, d in j) == sorted(d.name for _, d in same + longer + branch + finished)
    for j in jobs:
        assert len({c.train.steps for c, _ in j}) == 1
    with pytest.raises(ValueError, match="ensemble_size"):
        plan_jobs(same, size=0)
    # enough jobs for every worker: the largest ensembles are split (10 runs of one shape, 4 workers)
    assert sorted(len(j) for j in plan_jobs(same, size=16, workers=1)) == [10]
    assert sorted(len(j) for j in plan_jobs(same, size=16, workers=2)) == [5, 5]
    assert sorted(len(j) for j in plan_jobs(same + longer, size=16, workers=4)) == [2, 3, 3, 4]
    assert sorted(len(j) for j in plan_jobs(longer, size=16, workers=8)) == [1, 1]  # no ensemble below one member
    assert sorted(len(j) for j in plan_jobs(same + branch, size=4, workers=2)) == [1, 3, 3, 4]  # already enough
    with pytest.raises(ValueError, match="workers"):
        plan_jobs(same, size=4, workers=0)


@pytest.mark.slow
@pytest.mark.numerics  # numbers from the shipped files or a trained run
def test_ensemble_executor_trains_what_serial_trains_and_reuses_finished_runs(tmp_path):
    from test_ensemble import blas_batches_like_single

    if not blas_batches_like_single():
        pytest.skip("this BLAS rounds batched products differently from single ones (members match to 1e-5)")
    cfgs = configs()
    parent = cfgs[0]
    child = child_of(tmp_path / "ens", parent, 10, path="posthoc5", steps=15)
    first = run_sweep(cfgs[:2], tmp_path / "ens", executor="serial", progress=False)
    assert list(first.status) == ["done", "done"]
    res = run_sweep(cfgs + [child], tmp_path / "ens", executor="ensemble", workers=2, progress=False)
    assert list(res.status) == ["cached", "cached", "done", "done", "done"]
    assert list(res.ensemble) == [1, 1, 2, 2, 1]  # finished runs and the branch: single jobs
    serial = run_sweep(cfgs, tmp_path / "serial", executor="serial", progress=False)
    assert list(serial.acc_zero) == list(res.acc_zero.iloc[:4])
    for c in cfgs:
        a, b = weights(run_dir_for(tmp_path / "ens", c)), weights(run_dir_for(tmp_path / "serial", c))
        for k in a:
            assert torch.equal(a[k], b[k]), k
        ma = (run_dir_for(tmp_path / "ens", c) / "metrics.csv").read_text()
        assert ma == (run_dir_for(tmp_path / "serial", c) / "metrics.csv").read_text()
    again = run_sweep(cfgs, tmp_path / "ens", executor="local", workers=2, progress=False)
    assert list(again.status) == ["cached"] * 4  # reused whichever executor trained them


def test_ensemble_executor_reports_a_diverged_member(tmp_path):
    good = RunConfig(path="unforced", train=TC, seed=0)
    bad = RunConfig(path="unforced", train=TrainConfig(**{**TC.__dict__, "lr": 1e3}), seed=1)
    from circuitfade.train.sweep import execute_ensemble

    rows = execute_ensemble([good.to_dict(), bad.to_dict()], [str(tmp_path / "g"), str(tmp_path / "b")])
    assert [r["status"] for r in rows] == ["done", "failed"]
    assert "diverged" in rows[1]["error"] and "acc_zero" in rows[0] and "acc_zero" not in rows[1]
    assert (tmp_path / "b" / "failed.json").is_file() and (tmp_path / "g" / "done.json").is_file()


# --------------------------------------------------------------------------------------
# Ray: an unreachable address, a worker killed on every attempt
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1", "nohost.invalid:6379", "127.0.0.1", "x:y"])
def test_a_bad_ray_address_fails_within_seconds_with_one_line(tmp_path, address):
    import time

    t0 = time.monotonic()
    with pytest.raises(ValueError) as info:
        run_sweep(configs()[:1], tmp_path, executor="ray", address=address, progress=False)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "\n" not in msg and repr(address) in msg
    assert not list(tmp_path.iterdir())  # nothing was trained


def die_on_seed_13(job):
    """Sweep worker that is killed (like an OOM kill) for seed 13, on every attempt."""
    import os
    import signal

    from circuitfade.train.sweep import execute

    if job[0]["seed"] == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return execute(*job)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray instance at a time (pytest -n: the same worker)
def test_ray_reports_a_run_whose_worker_dies_on_every_attempt(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import sys

    import ray
    import ray.cloudpickle

    import circuitfade.train.sweep as sweep

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers do not import this file
    monkeypatch.setattr(sweep, "execute_job", die_on_seed_13)
    cfgs = [RunConfig(path="unforced", train=TC, seed=s) for s in (13, 1)]
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        res = sweep.run_sweep(cfgs, tmp_path, executor="ray", progress=False)
    finally:
        ray.shutdown()
    assert list(res.status) == ["failed", "done"]
    assert "worker process died" in res.error.iloc[0] and "2 attempts" in res.error.iloc[0]
    assert (run_dir_for(tmp_path, cfgs[1]) / "done.json").is_file()
