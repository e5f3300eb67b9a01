"""Trainer: schedules followed, atomic checkpoints, bit-identical resume, branching, bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import circuitfade.train.loop as training
from circuitfade.io import CheckpointError, load_tensors
from circuitfade.train import RunConfig, TrainConfig, branch, read_metrics, train
from circuitfade.train.checkpoints import complete_checkpoints

SMALL = dict(steps=40, eval_every=10, checkpoint_every=10, eval_size=64, batch_size=16)


def cfg(path="fade10+10->0", **kw):
    return RunConfig(path=path, train=TrainConfig(**{**SMALL, **kw}), seed=3)


def final_weights(run_dir, step=40):
    return load_tensors(run_dir / "checkpoints" / f"step_{step:06d}.safetensors")


def test_run_directory_layout_and_schedule_followed(tmp_path):
    run = train(cfg(), tmp_path / "r", progress=False)
    assert run.step == 40
    assert complete_checkpoints(tmp_path / "r") == [0, 10, 20, 30, 40]
    conf = json.loads((tmp_path / "r" / "config.json").read_text())
    assert conf["path"] == "fade10+10->0" and conf["circuitfade_version"]
    m = read_metrics(tmp_path / "r")
    assert list(m["step"]) == [0, 10, 20, 30, 40]
    # fade10+10->0: 0.5 up to step 10, 0.25 at 15, 0 from step 20
    assert m.loc[m.step == 10, "gate_pos"].item() == pytest.approx(0.5)
    assert m.loc[m.step == 20, "gate_pos"].item() == pytest.approx(0.0)
    # once the gate is 0, "normal" and "zero" evaluations coincide
    last = m.iloc[-1]
    assert last.acc_normal == last.acc_zero and last.loss_normal == last.loss_zero
    assert {"acc_param", "acc_half", "train_loss"} <= set(m.columns)
    assert (tmp_path / "r" / "done.json").is_file()
    assert not list((tmp_path / "r").rglob("*.tmp")) and not list((tmp_path / "r").rglob("*.cftmp"))


def test_gate_follows_schedule_each_step(monkeypatch):
    seen = []
    orig = training._set_gates_for_step

    def spy(model, path, step, last=None):
        v = orig(model, path, step, last)
        seen.append((step, float(model.gate_values()["pos"].mean())))
        return v

    monkeypatch.setattr(training, "_set_gates_for_step", spy)
    train(cfg(steps=20, eval_every=100), None, progress=False)
    by_step = dict(seen)
    assert by_step[0] == 0.5 and by_step[10] == 0.5 and by_step[15] == pytest.approx(0.25) and by_step[19] == pytest.approx(0.05)


def test_resume_after_kill_is_bit_identical(tmp_path, monkeypatch):
    train(cfg(), tmp_path / "full", progress=False)

    real_save = training.save_checkpoint
    calls = {"n": 0}

    def save_then_die(run, run_dir):
        out = real_save(run, run_dir)
        if run.step == 20:
            raise KeyboardInterrupt("killed after step 20's checkpoint")
        return out

    monkeypatch.setattr(training, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(cfg(), tmp_path / "killed", progress=False)
    monkeypatch.setattr(training, "save_checkpoint", real_save)
    assert complete_checkpoints(tmp_path / "killed")[-1] == 20
    assert not (tmp_path / "killed" / "done.json").exists()
    train(cfg(), tmp_path / "killed", progress=False)
    a, b = final_weights(tmp_path / "full"), final_weights(tmp_path / "killed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    pd.testing.assert_frame_equal(read_metrics(tmp_path / "full"), read_metrics(tmp_path / "killed"))
    del calls


def test_resume_ignores_half_written_checkpoint(tmp_path):
    train(cfg(steps=20), tmp_path / "r", progress=False)
    ck = tmp_path / "r" / "checkpoints"
    # a crash between the state file and the weights file leaves an incomplete checkpoint
    (ck / "step_000030.state.safetensors").write_bytes(b"partial")
    assert complete_checkpoints(tmp_path / "r")[-1] == 20


def test_finished_run_is_not_retrained(tmp_path, monkeypatch):
    train(cfg(steps=20), tmp_path / "r", progress=False)
    monkeypatch.setattr(training, "fit", lambda *a, **k: pytest.fail("retrained a finished run"))
    run = train(cfg(steps=20), tmp_path / "r", progress=False)
    assert run.step == 20


def test_different_run_in_same_directory_refused(tmp_path):
    train(cfg(steps=10), tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match="different run"):
        train(cfg(path="unforced", steps=10), tmp_path / "r", progress=False)


def test_branch_equals_uninterrupted_switch(tmp_path):
    """A hard switch run from scratch equals forced_const0.5 branched at the switch step to g=0."""
    train(cfg(path="forced_const0.5", steps=20), tmp_path / "const", progress=False)
    branch(tmp_path / "const", 20, tmp_path / "br", path="forced_zero", steps=40, progress=False)
    train(cfg(path="switch@20"), tmp_path / "switch", progress=False)
    a, b = final_weights(tmp_path / "br"), final_weights(tmp_path / "switch")
    for k in a:
        if "gate_" in k:  # gate modes differ (fixed vs scheduled): buffers hold the same value, logits untouched
            continue
        assert torch.equal(a[k], b[k]), k
    m = read_metrics(tmp_path / "br")
    assert list(m.step) == [0, 10, 20, 30, 40]
    assert json.loads((tmp_path / "br" / "config.json").read_text())["parent"]["step"] == 20


def test_posthoc_continuation_copies_optimizer_state(tmp_path):
    train(cfg(path="unforced", steps=20), tmp_path / "u", progress=False)
    run = branch(tmp_path / "u", 20, tmp_path / "post", path="posthoc20", steps=40, progress=False)
    assert run.step == 40
    state = load_tensors(tmp_path / "u" / "checkpoints" / "step_000020.state.safetensors")
    assert int(state["optim.0.step"]) == 20
    post = load_tensors(tmp_path / "post" / "checkpoints" / "step_000040.state.safetensors")
    assert int(post["optim.0.step"]) == 40  # the AdamW step count continued from the parent's


def test_truncated_checkpoint_raises_clear_error(tmp_path):
    train(cfg(steps=10), tmp_path / "r", progress=False)
    f = tmp_path / "r" / "checkpoints" / "step_000010.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    (tmp_path / "r" / "done.json").unlink()
    with pytest.raises(CheckpointError, match="step_000010.safetensors"):
        train(cfg(steps=10), tmp_path / "r", progress=False)


def test_bad_specs_rejected():
    with pytest.raises(ValueError, match="fade"):
        RunConfig(path="fade-to-nowhere")
    with pytest.raises(ValueError, match="positive integer"):
        TrainConfig(steps=10, batch_size=0)
    with pytest.raises(ValueError, match="name"):
        RunConfig(task={"n_pairs": 3})


def test_prior_dropout_and_dual_loss_train():
    r1 = train(cfg(path="unforced", steps=10, prior_dropout=0.5), None, progress=False)
    r2 = train(cfg(path="unforced", steps=10, dual_loss=True), None, progress=False)
    r3 = train(cfg(path="unforced", steps=10), None, progress=False)
    w = [dict(r.model.named_parameters())["blocks.0.attn.W_Q"] for r in (r1, r2, r3)]
    assert not torch.equal(w[0], w[2]) and not torch.equal(w[1], w[2])


def test_mix_schedule_reaches_task_sample(monkeypatch):
    from circuitfade.tasks import AssocRecall

    seen = []
    orig = AssocRecall.sample

    def sample(self, n, generator, **params):
        seen.append(params)
        return orig(self, n, generator)

    monkeypatch.setattr(AssocRecall, "sample", sample)
    c = RunConfig(path="unforced", train=TrainConfig(**{**SMALL, "steps": 4, "eval_every": 100}), mix={"p_icl": "pw(0:0.5,2:0.7)"})
    train(c, None, progress=False)
    train_calls = [p for p in seen if p]
    assert [round(p["p_icl"], 6) for p in train_calls] == [0.5, 0.6, 0.7, 0.7]


def test_clone_run_then_one_step_each_is_identical():
    from circuitfade.train import clone_run, new_run

    a = train(cfg(path="unforced", steps=5), None, progress=False)
    b = clone_run(a)
    c2 = RunConfig(path="unforced", train=TrainConfig(**{**SMALL, "steps": 6}), seed=3)
    a2, b2 = clone_run(a, c2), clone_run(b, c2)
    train(c2, None, progress=False, run=a2)
    train(c2, None, progress=False, run=b2)
    for (n, p), (_, q) in zip(a2.model.named_parameters(), b2.model.named_parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(a2.model.W_Q, a.model.W_Q)
    del new_run


def test_linreg_trains_with_real_inputs_and_mse_metrics():
    c = RunConfig(path="fade3+3->0", task={"name": "linreg", "n_points": 4, "d_x": 2},
                  train=TrainConfig(**{**SMALL, "steps": 10}))
    run = train(c, None, progress=False)
    assert run.model.cfg.input_mode == "real" and run.model.cfg.d_vocab_out == 1
    last = run.metrics[-1]
    assert {"mse_normal", "mse_zero", "query_mse_normal"} <= set(last) and "acc_normal" not in last
    assert last["mse_normal"] < run.metrics[0]["mse_normal"]  # it learns something in 10 steps


def test_run_directory_lock(tmp_path):
    import fcntl
    import os

    train(cfg(steps=10), tmp_path / "r", progress=False)
    (tmp_path / "r" / "done.json").unlink()
    lock = tmp_path / "r" / ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # another holder (locks are per open file)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242")
    try:
        with pytest.raises(RuntimeError, match="being trained by process 4242"):
            train(cfg(steps=10), tmp_path / "r", progress=False)
    finally:
        os.close(fd)  # the holder exits (or dies): the kernel releases its lock
    assert lock.exists()  # a lock file nobody holds is no lock
    train(cfg(steps=10), tmp_path / "r", progress=False)
    assert not lock.exists()


# ------------------------------------------------------------------ optional loggers
def test_train_calls_a_planted_logger_with_every_eval_row(tmp_path):
    from circuitfade.train.loggers import JSONLinesLogger, scalars

    calls = []
    cfg = RunConfig(path="fade20->0", train=TrainConfig(steps=20, eval_every=10, eval_size=16, checkpoint_every=20,
                                                         batch_size=8, eval_conditions=("normal", "zero")))
    run = train(cfg, None, progress=False, logger=lambda step, m: calls.append((step, m)))
    assert [s for s, _ in calls] == [0, 10, 20]
    assert [m for _, m in calls] == run.metrics  # the very rows of metrics.csv
    assert all(m["step"] == s for s, m in calls)
    assert scalars({"step": 3, "a": 1, "b": float("nan"), "c": "x", "d": True}) == {"a": 1.0}
    with JSONLinesLogger(tmp_path / "log.jsonl") as log:
        train(cfg, tmp_path / "run", progress=False, logger=log)
    lines = [json.loads(l) for l in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [0, 10, 20] and "acc_normal" in lines[-1]


def test_tensorboard_logger_needs_tensorboard_or_writes_events(tmp_path):
    from circuitfade.train.loggers import TensorBoardLogger

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            TensorBoardLogger(tmp_path / "tb")
        return
    with TensorBoardLogger(tmp_path / "tb") as log:
        log(10, {"step": 10, "acc_normal": 0.5})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
