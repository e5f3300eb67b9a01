"""Failures never pass as results: divergence, lost workers, overrides that did not apply,
thread-dependent runs, locks, half-written directories, bad configs and bad gate values.

Each test plants the failure it checks (no sleeps, no network)."""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import stat
from pathlib import Path

import pytest
import torch

import circuitfade.train.rundir as rundir
import circuitfade.train.lock as locking
import circuitfade.train.loop as training
from circuitfade.io import CheckpointError, atomic_write, load_tensors
from circuitfade.train import RunConfig, TrainConfig, TrainingDiverged, branch, clone_run, fit, new_run, train
from circuitfade.train.loop import branch_config
from circuitfade.train.checkpoints import complete_checkpoints

TINY = dict(steps=10, eval_every=5, checkpoint_every=5, eval_size=32, batch_size=8)


def cfg(path="unforced", seed=3, **kw):
    return RunConfig(path=path, train=TrainConfig(**{**TINY, **kw}), seed=seed)


def weights(run_dir, step):
    return load_tensors(Path(run_dir) / "checkpoints" / f"step_{step:06d}.safetensors")


# --------------------------------------------------------------------------------------
# 1. divergence
# --------------------------------------------------------------------------------------
def _nan_loss_from(monkeypatch, step):
    """Plant a loss that turns NaN once the trainer reaches ``step``."""
    from circuitfade.tasks import AssocRecall

    orig = AssocRecall.loss
    calls = {"n": 0}

    def loss(self, logits, batch):
        out = orig(self, logits, batch)
        if logits.requires_grad:  # a training step (evaluation runs under no_grad)
            calls["n"] += 1
            if calls["n"] > step:
                return out * float("nan")
        return out

    monkeypatch.setattr(AssocRecall, "loss", loss)


def test_diverged_run_stops_is_marked_failed_and_keeps_finite_checkpoints(tmp_path, monkeypatch):
    _nan_loss_from(monkeypatch, 7)  # training steps 0..6 are fine, step 7's loss is NaN
    d = tmp_path / "r"
    with pytest.raises(TrainingDiverged, match="step 7"):
        train(cfg(), d, progress=False)
    assert not (d / "done.json").exists()
    failed = json.loads((d / "failed.json").read_text())
    assert failed["step"] == 7 and "non-finite" in failed["error"]
    assert complete_checkpoints(d) == [0, 5]  # nothing written after the divergence
    params = {n for n, _ in new_run(cfg()).model.named_parameters()}  # (buffers hold -inf masks)
    for s in (0, 5):
        assert all(torch.isfinite(t).all() for k, t in weights(d, s).items() if k in params)
    # asking again does not retrain and does not pass as finished
    monkeypatch.setattr(training, "fit", lambda *a, **k: pytest.fail("retrained a diverged run"))
    with pytest.raises(TrainingDiverged, match="step 7"):
        train(cfg(), d, progress=False)


def test_huge_learning_rate_diverges_instead_of_finishing(tmp_path):
    with pytest.raises(TrainingDiverged):
        train(cfg(lr=1e3), tmp_path / "r", progress=False)
    assert not (tmp_path / "r" / "done.json").exists()


def test_sweep_reports_diverged_run_as_failed(tmp_path):
    from circuitfade.train.sweep import run_sweep

    res = run_sweep([cfg(lr=1e3), cfg(seed=4)], tmp_path, executor="serial", progress=False)
    assert list(res.status) == ["failed", "done"]
    assert "diverged" in res.error.iloc[0] and "step" in res.error.iloc[0]
    assert "acc_normal" not in res or math.isnan(res.acc_normal.iloc[0])  # no final number for a failed run


def test_in_memory_run_raises_on_divergence(monkeypatch):
    _nan_loss_from(monkeypatch, 2)
    with pytest.raises(TrainingDiverged, match="step 2"):
        train(cfg(), None, progress=False)


# --------------------------------------------------------------------------------------
# 2. branch / clone apply the new lr and weight decay
# --------------------------------------------------------------------------------------
def _groups(state_file):
    from safetensors import safe_open

    with safe_open(str(state_file), framework="pt") as f:
        return json.loads(f.metadata()["param_groups"])


def test_branch_applies_new_lr_and_weight_decay(tmp_path):
    train(cfg(), tmp_path / "p", progress=False)
    run = branch(tmp_path / "p", 10, tmp_path / "b", path="forced_zero", steps=15, progress=False,
                 lr=1e-2, weight_decay=0.1)
    assert {g["lr"] for g in run.optimizer.param_groups} == {1e-2}
    assert {g["weight_decay"] for g in run.optimizer.param_groups} == {0.1}
    g = _groups(tmp_path / "b" / "checkpoints" / "step_000015.state.safetensors")
    assert {x["lr"] for x in g} == {1e-2} and {x["weight_decay"] for x in g} == {0.1}


def test_clone_run_applies_new_lr():
    a = train(cfg(steps=2), None, progress=False)
    b = clone_run(a, cfg(steps=3, lr=5e-3, weight_decay=0.0))
    assert {g["lr"] for g in b.optimizer.param_groups} == {5e-3}
    assert {g["weight_decay"] for g in b.optimizer.param_groups} == {0.0}
    assert int(b.optimizer.state_dict()["state"][0]["step"]) == 2  # the moments came along


def test_one_branch_config_builder_serves_branch_and_sweep(tmp_path):
    from circuitfade.train.sweep import child_of, run_dir_for

    parent = cfg(path="unforced")
    c = child_of(tmp_path, parent, 10, path="posthoc5", steps=15)
    assert c == branch_config(parent, run_dir_for(tmp_path, parent), 10, path="posthoc5", steps=15)
    assert c.parent == {"run": str(run_dir_for(tmp_path, parent).resolve()), "step": 10}
    with pytest.raises(ValueError, match="before its start step"):
        branch_config(parent, tmp_path, 10, path="forced_zero", steps=5)


# --------------------------------------------------------------------------------------
# 3. the torch thread count does not change a run
# --------------------------------------------------------------------------------------
def test_train_pins_one_thread_and_restores_the_callers(monkeypatch):
    seen = []
    real_fit = training.fit

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real_fit(*a, **k)

    monkeypatch.setattr(training, "fit", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(cfg(steps=2), None, progress=False)
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_same_config_same_bytes_whatever_the_callers_threads(tmp_path):
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            train(cfg(steps=5), tmp_path / f"t{n}", progress=False)
    finally:
        torch.set_num_threads(before)
    a, b = (tmp_path / "t1" / "checkpoints" / "step_000005.safetensors"), (tmp_path / "t2" / "checkpoints" / "step_000005.safetensors")
    assert a.read_bytes() == b.read_bytes()


# --------------------------------------------------------------------------------------
# 4, 5, 17: configs validated when made
# --------------------------------------------------------------------------------------
def test_continuation_path_without_parent_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="posthoc2550.*parent"):
        RunConfig(path="posthoc2550")
    c = branch_config(cfg(), tmp_path / "p", 10, path="posthoc5", steps=15)  # with a parent it is fine
    assert c.gate_path().is_continuation


@pytest.mark.parametrize("kw, match", [
    (dict(grad_clip=-1.0), "grad_clip"),
    (dict(grad_clip=float("nan")), "grad_clip"),
    (dict(lr=0.0), "lr"),
    (dict(lr=-1e-3), "lr"),
    (dict(lr=float("inf")), "lr"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(weight_decay=float("nan")), "weight_decay"),
    (dict(lr="1e-3"), "lr"),
    (dict(steps=2.5), "steps"),
    (dict(steps=True), "steps"),
    (dict(eval_conditions=("normal", "sideways")), "sideways"),
    (dict(extra_checkpoints=(-5,)), "extra_checkpoints"),
])
def test_train_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


@pytest.mark.parametrize("model, match", [
    ({"n_heads": 0}, "n_heads"),
    ({"n_layers": "two"}, "n_layers"),
    ({"content_rank": 2.5}, "content_rank"),
    ({"d_model": -4}, "d_model"),
    ({"dtype": "nonsense"}, "dtype"),
    ({"gate_init": float("nan")}, "gate_init"),
    ({"dtype": "float16"}, "dtype.*float16"),
    ({"dtype": "bfloat16"}, "dtype.*bfloat16"),
    ({"dtype": "int64"}, "dtype.*int64"),
    ({"d_mlp": -3, "attn_only": False}, "d_mlp"),
    ({"device": "meta"}, "device.*meta"),
])
def test_run_config_validates_the_model_when_made(model, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(path="unforced", model=model)


def test_seed_out_of_range_rejected():
    with pytest.raises(ValueError, match="seed"):
        RunConfig(seed=2**64)


@pytest.mark.parametrize("task, model, match", [
    ({"name": "assoc", "d_vocab": 64}, {}, r"task.*d_vocab=64.*model.*d_vocab=32"),
    ({"name": "assoc", "n_pairs": 19, "n_keys": 19, "shared_vocab": True, "max_len": 40}, {"n_ctx": 32},
     r"task.*n_ctx=39.*model.*n_ctx=32"),
])
def test_task_model_mismatch_found_at_setup_naming_both_sides(tmp_path, task, model, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(path="unforced", task=task, model=model)
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------------------
# 8. the run lock: an OS lock (flock) on RUN/.lock, released by the kernel when its holder dies
# --------------------------------------------------------------------------------------
def test_two_holders_never_hold_one_run_lock(tmp_path):
    """flock locks belong to an open file, so a second run_lock in this very process is a
    second writer and must be refused while the first holds the lock."""
    d = tmp_path / "r"
    d.mkdir()
    with locking.run_lock(d):
        assert (d / ".lock").read_text() == str(os.getpid())
        with pytest.raises(locking.RunLocked, match=f"being trained by process {os.getpid()}"):
            with locking.run_lock(d):
                pytest.fail("a second writer got the lock")
    assert not (d / ".lock").exists()
    with locking.run_lock(d):  # released: the next writer gets it
        pass


class _OsWithWindow:
    """``os`` as the lock module sees it, running ``window()`` once, right after the lock
    file is first opened (before it is locked): the moment a releasing holder or a
    competitor could act."""

    def __init__(self, window):
        self._window, self.opens = window, 0

    def __getattr__(self, name):
        real = getattr(os, name)
        if name != "open":
            return real

        def open_then_window(*a, **k):
            fd = real(*a, **k)
            self.opens += 1
            if self.opens == 1:
                self._window()
            return fd
        return open_then_window


def test_lock_on_a_file_its_holder_just_released_is_retried(tmp_path, monkeypatch):
    """A holder releases (unlinks .lock, then closes it) after we opened the old file and before
    we lock it, and a third writer takes a fresh .lock in between: our flock on the old,
    unlinked file must not count - we must see that .lock is another file now and be refused."""
    d = tmp_path / "r"
    d.mkdir()
    lock = d / ".lock"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    seen = {}

    def window():
        lock.unlink()  # the holder releases: unlink while holding, then close
        os.close(holder)
        third = os.open(lock, os.O_RDWR | os.O_CREAT)  # a third writer takes the new file
        fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(third, b"4242")
        seen["third"] = third

    fake = _OsWithWindow(window)
    monkeypatch.setattr(locking, "os", fake)
    with pytest.raises(locking.RunLocked, match="process 4242"):
        with locking.run_lock(d):
            pytest.fail("two writers hold the lock")
    assert fake.opens == 2  # it locked the unlinked file, saw that, and tried the current one
    os.close(seen["third"])
    monkeypatch.setattr(locking, "os", os)
    with locking.run_lock(d):  # the third writer is gone: free
        pass


def test_lock_file_left_by_a_dead_or_unrelated_process_is_no_lock(tmp_path):
    """A .lock that names a live process which does not hold it (a crashed trainer's pid,
    reused by an unrelated process) does not block the run."""
    d = tmp_path / "r"
    d.mkdir()
    (d / ".lock").write_text(str(os.getppid()))  # a live process that holds no lock
    with locking.run_lock(d):
        assert (d / ".lock").read_text() == str(os.getpid())


_HOLD_LOCK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lock", sys.argv[1])  # the lock module alone: stdlib only
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
with lock.run_lock(sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()  # hold it until killed
"""


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    import select
    import subprocess
    import sys

    d = tmp_path / "r"
    d.mkdir()
    child = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, locking.__file__, str(d)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready and child.stdout.readline() == b"locked\n", child.stderr.read()
        with pytest.raises(locking.RunLocked, match=f"process {child.pid}"):
            with locking.run_lock(d):
                pytest.fail("two writers hold the lock")
    finally:
        child.kill()
        child.wait()
    assert (d / ".lock").exists()  # killed: it never unlinked its lock file ...
    with locking.run_lock(d):  # ... but the kernel released the lock
        assert (d / ".lock").read_text() == str(os.getpid())


# --------------------------------------------------------------------------------------
# 11, 12: half-written directories, orphaned temp files, read-only finished runs
# --------------------------------------------------------------------------------------
def test_kill_during_first_config_write_does_not_brick_the_directory(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / ".config.json.0a1b2c3d.cftmp").write_bytes(b'{"path": "unf')  # what SIGKILL mid-write leaves
    run = train(cfg(steps=5), d, progress=False)
    assert run.step == 5 and (d / "done.json").is_file()
    assert not list(d.rglob("*.cftmp"))


def test_orphaned_temp_files_are_cleaned_on_resume_and_nothing_else(tmp_path):
    d = tmp_path / "r"
    train(cfg(steps=5), d, progress=False)
    (d / "done.json").unlink()
    orphan = d / "checkpoints" / ".step_000005.safetensors.0a1b2c3d.cftmp"
    orphan.write_bytes(b"half")
    mine = [d / ".notes.tmp", d / "checkpoints" / ".draft.tmp", d / ".x.0a1b2c3d.tmp", d / "notes.0a1b2c3d.cftmp"]
    for f in mine:
        f.write_text("the user's")
    train(cfg(steps=5), d, progress=False)
    assert not orphan.exists()
    assert all(f.read_text() == "the user's" for f in mine)  # not written by this code: kept


def test_atomic_write_temp_files_have_the_recognised_pattern(tmp_path, monkeypatch):
    from circuitfade.io import is_temp_file

    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: seen.append(Path(a).name) or real_replace(a, b))
    atomic_write(tmp_path / "config.json", b"{}")
    assert len(seen) == 1 and seen[0].startswith(".config.json.") and seen[0].endswith(".cftmp")
    assert is_temp_file(seen[0])
    assert not any(is_temp_file(n) for n in (".notes.tmp", ".config.json.abc.tmp", "config.json", ".lock",
                                             ".config.json.0A1B2C3D.cftmp", ".config.json.0a1b.cftmp"))


def test_foreign_files_still_refused(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        train(cfg(steps=5), d, progress=False)
    assert (d / "notes.txt").read_text() == "mine" and not (d / ".lock").exists()


def test_out_is_a_file_is_a_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        train(cfg(steps=5), f, progress=False)


def test_finished_run_rerequested_without_writing(tmp_path, monkeypatch):
    d = tmp_path / "r"
    train(cfg(steps=5), d, progress=False)

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system", str(d / ".lock"))

    monkeypatch.setattr(training, "run_lock", read_only)
    monkeypatch.setattr(rundir, "write_json", read_only)
    monkeypatch.setattr(rundir, "atomic_write", read_only)
    run = train(cfg(steps=5), d, progress=False)
    assert run.step == 5 and run.metrics[-1]["step"] == 5


# --------------------------------------------------------------------------------------
# fit(run, until=step): a step function that leaves run.config alone
# --------------------------------------------------------------------------------------
def test_fit_until_a_step_leaves_the_config_alone():
    c = cfg(steps=10)
    a = new_run(c)
    fit(a, until=4, progress=False)
    assert a.step == 4 and a.config is c
    fit(a, until=10, progress=False)
    b = train(c, None, progress=False)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(ValueError, match="until"):
        fit(a, until=11, progress=False)


def test_old_in_memory_step_function_call_still_works():
    from dataclasses import replace

    c = cfg(steps=10)
    a = train(replace(c, train=replace(c.train, steps=4, eval_every=4)), None, progress=False)
    a.config = c
    train(replace(c, train=replace(c.train, steps=10, eval_every=10)), None, progress=False, run=a)
    b = train(c, None, progress=False)
    assert torch.equal(a.model.W_Q, b.model.W_Q)


# --------------------------------------------------------------------------------------
# 9. a dead worker
# --------------------------------------------------------------------------------------
def die_on_seed_13(job: tuple[dict, str]) -> dict:
    """Sweep worker that is killed (like an OOM kill) for seed 13 and trains the rest."""
    from circuitfade.train.sweep import execute

    if job[0]["seed"] == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return execute(*job)


@pytest.mark.slow
def test_sweep_survives_a_killed_worker(tmp_path, monkeypatch):
    import circuitfade.train.sweep as sweep

    monkeypatch.setattr(sweep, "execute_job", die_on_seed_13)
    cfgs = [cfg(steps=2, seed=s) for s in (13, 1, 2)]
    res = sweep.run_sweep(cfgs, tmp_path, workers=2, progress=False)
    assert list(res.seed) == [13, 1, 2]
    assert list(res.status) == ["failed", "done", "done"]
    assert "worker process died" in res.error.iloc[0]
    assert (sweep.run_dir_for(tmp_path, cfgs[1]) / "done.json").is_file()


# --------------------------------------------------------------------------------------
# file modes follow the umask
# --------------------------------------------------------------------------------------
def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        f = atomic_write(tmp_path / "a.txt", b"x")
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
        os.umask(0o077)
        g = atomic_write(tmp_path / "b.txt", b"x")
        assert stat.S_IMODE(g.stat().st_mode) == 0o600
    finally:
        os.umask(old)


# --------------------------------------------------------------------------------------
# 5, 16: gate values
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.1, 1.5, "0.5", [0.5, float("nan"), 0.5, 0.5]])
@pytest.mark.parametrize("how", ["gates", "gate_hooks", "set_gate_values"])
def test_bad_gate_values_rejected(value, how):
    from circuitfade.model import SoftPriorTransformer

    m = SoftPriorTransformer(n_layers=1, d_model=16, d_head=4, n_heads=4, d_vocab=8, n_ctx=8)
    with pytest.raises(ValueError, match="pos"):
        if how == "gates":
            with m.gates(pos=value):
                pass
        else:
            getattr(m, how)(pos=value)
    with m.gates(pos=0.0, content=[1.0, 0.0, 0.5, 1.0]):  # boundaries are fine
        pass


# --------------------------------------------------------------------------------------
# 7, 13, 16: attaching and opening checkpoints
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model_files(tmp_path_factory):
    from circuitfade.compat import plain_model

    d = tmp_path_factory.mktemp("sd")
    hc = dict(n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=10, act_fn="relu")
    m = plain_model(dict(hc))
    for s in (0, 5):
        torch.save(m.state_dict(), d / f"step_{s}.pt")
    (d / "config.json").write_text(json.dumps(hc))
    return d, hc


def test_negative_step_in_a_name_is_rejected(small_model_files, tmp_path):
    from circuitfade.store import attach

    d, hc = small_model_files
    f = tmp_path / "step_-5.pt"
    f.write_bytes((d / "step_5.pt").read_bytes())
    with pytest.raises(CheckpointError, match="negative"):
        attach(f, config=hc)
    with pytest.raises(ValueError, match="negative"):
        attach([d / "step_0.pt"], config=hc, steps=[-1])
    with pytest.raises(ValueError, match="negative"):
        attach({-5: d / "step_5.pt"}, config=hc)
    # a hyphen that separates words is not a sign
    g = tmp_path / "ckpt-7.pt"
    g.write_bytes((d / "step_5.pt").read_bytes())
    assert attach(g, config=hc).steps == [7]


def test_dict_source_with_mixed_keys_is_a_clear_error(small_model_files):
    from circuitfade.store import attach

    d, hc = small_model_files
    with pytest.raises(ValueError, match=r"integer step keys.*'b'"):
        attach({1: str(d / "step_0.pt"), "b": str(d / "step_5.pt")}, config=hc)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.pop("d_vocab"), "d_vocab"),
    (lambda c: c.update(n_layers="two"), "n_layers"),
    (lambda c: c.update(dtype="nonsense"), "dtype"),
])
def test_config_json_errors_name_file_and_field(small_model_files, tmp_path, edit, field):
    from circuitfade.store import attach

    d, hc = small_model_files
    c = dict(hc)
    edit(c)
    (tmp_path / "config.json").write_text(json.dumps(c))
    (tmp_path / "step_0.pt").write_bytes((d / "step_0.pt").read_bytes())
    with pytest.raises(CheckpointError) as e:
        attach(tmp_path)
    assert "config.json" in str(e.value) and field in str(e.value)


def test_soft_prior_config_json_errors_name_field(tmp_path):
    from circuitfade.model import SoftPriorConfig

    with pytest.raises(CheckpointError, match=r"model\.json.*dtype.*nonsense"):
        SoftPriorConfig.from_json_dict({"dtype": "nonsense"}, source="model.json")
    with pytest.raises(CheckpointError, match=r"model\.json.*content_rank"):
        SoftPriorConfig.from_json_dict({"content_rank": 2.5}, source="model.json")


def test_open_run_checks_checkpoint_headers_at_open(tmp_path):
    from circuitfade.store import open_run

    d = tmp_path / "r"
    train(cfg(steps=10), d, progress=False)
    f = d / "checkpoints" / "step_000005.safetensors"
    f.write_bytes(f.read_bytes()[:64])
    with pytest.raises(CheckpointError, match="step_000005.safetensors"):
        open_run(d)


def test_attach_constructors_per_source_kind(small_model_files, tmp_path):
    """One constructor per source kind; attach() dispatches to them and they agree."""
    from circuitfade.store import sources

    d, hc = small_model_files
    a = sources.attach(d)
    b = sources.from_state_dicts(sorted(d.glob("*.pt")), config=d / "config.json")
    assert a.steps == b.steps == [0, 5]
    assert a.metadata["run"] == b.metadata["run"] == d.name
    r = tmp_path / "run"
    train(cfg(steps=5), r, progress=False)
    assert sources.from_run(r).steps == sources.attach(r).steps == [0, 5]
    m = sources.from_models({3: torch.nn.Linear(2, 2)})
    assert m.steps == [3]
