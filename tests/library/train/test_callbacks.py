"""Callbacks of the one stepping loop: order of the hooks, early stop, the L2 penalty, train passing them on."""

from __future__ import annotations

import pytest
import torch

from circuitfade.train import RunConfig, TrainConfig, fit, new_run, train
from circuitfade.train.callbacks import Callback, L2Penalty, divergence, is_eval_step
from circuitfade.train.config import TrainingDiverged

SMALL = dict(steps=20, eval_every=5, checkpoint_every=10, eval_size=32, batch_size=8, eval_conditions=("normal",))


def cfg(**kw):
    return RunConfig(path="unforced", model={"n_layers": 1}, train=TrainConfig(**{**SMALL, **kw}), seed=2)


class Log(Callback):
    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def on_loss(self, run, batch, loss):
        self.calls.append(("loss", run.step))
        return loss

    def before_update(self, run, grad_norm):
        self.calls.append(("before", run.step))

    def after_update(self, run):
        self.calls.append(("after", run.step))

    def on_record(self, run, row):
        self.calls.append(("record", row["step"]))
        return run.step == self.stop_at

    def on_checkpoint(self, run, step):
        self.calls.append(("checkpoint", step))

    def on_step(self, run):
        self.calls.append(("step", run.step))


def test_hooks_run_in_order_and_a_record_hook_stops_the_run(tmp_path):
    log = Log(stop_at=10)
    c = cfg()
    (tmp_path / "r").mkdir()
    run = fit(new_run(c), run_dir=tmp_path / "r", progress=False, callbacks=[log])
    assert run.step == 10 and [m["step"] for m in run.metrics] == [0, 5, 10]
    assert log.calls[:2] == [("record", 0), ("checkpoint", 0)]
    assert log.calls[2:7] == [("loss", 0), ("before", 0), ("after", 1), ("step", 1), ("loss", 1)]
    assert log.calls[-3:] == [("record", 10), ("checkpoint", 10), ("step", 10)]
    assert (tmp_path / "r" / "checkpoints" / "step_000010.safetensors").is_file()
    # continuing without the stop rule ends where one uninterrupted call ends
    fit(run, run_dir=tmp_path / "r", progress=False)
    whole = fit(new_run(c), progress=False)
    assert run.step == whole.step == 20
    assert all(torch.equal(a, b) for a, b in zip(run.model.parameters(), whole.model.parameters()))


def test_on_step_stops_and_the_gradient_seen_is_the_clipped_one():
    seen = []

    class Probe(Callback):
        def before_update(self, run, grad_norm):
            total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in run.model.parameters()
                                                          if p.grad is not None]))
            seen.append((float(grad_norm), float(total)))

        def on_step(self, run):
            return run.step == 3

    run = fit(new_run(cfg(grad_clip=1e-3)), progress=False, callbacks=[Probe()])
    assert run.step == 3 and len(seen) == 3
    assert all(before > 1e-3 and after == pytest.approx(1e-3, rel=1e-3) for before, after in seen)


def _sgd_run(c, lr=0.1):
    run = new_run(c)
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=lr)
    return run


def test_l2_penalty_adds_weight_decay_to_the_gradient():
    c = cfg(grad_clip=float("inf"), steps=1)
    wd, lr = 0.5, 0.1
    plain, pen = _sgd_run(c, lr), _sgd_run(c, lr)
    theta0 = [p.detach().clone() for p in plain.model.parameters()]
    fit(plain, progress=False)
    fit(pen, progress=False, callbacks=[L2Penalty(wd)])
    moved = 0
    for t0, a, b, (name, _) in zip(theta0, plain.model.parameters(), pen.model.parameters(),
                                   plain.model.named_parameters()):
        if a.grad is None and torch.equal(a, t0):  # a parameter with no data gradient (masked gate logit)
            continue
        # SGD: theta1 = theta0 - lr (g + wd theta0), so the penalised step differs by -lr wd theta0
        torch.testing.assert_close(b - a, -lr * wd * t0, atol=1e-6, rtol=1e-4, msg=name)
        moved += bool((t0 != 0).any())
    assert moved > 3
    assert pen.metrics[-1]["train_loss"] == plain.metrics[-1]["train_loss"]  # the column is the task loss


def test_l2_penalty_zero_is_the_plain_loop_bit_for_bit_and_bad_weights_are_refused():
    c = cfg(steps=6)
    a = fit(new_run(c), progress=False)
    b = fit(new_run(c), progress=False, callbacks=[L2Penalty(0.0)])
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    for bad in (-1.0, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match="L2Penalty"):
            L2Penalty(bad)


def test_train_passes_callbacks_to_fit():
    log = Log()
    run = train(cfg(steps=5), None, progress=False, callbacks=[log])
    assert run.step == 5 and ("after", 5) in log.calls and ("record", 5) in log.calls


def test_the_shared_rules():
    assert divergence(3, 1.0, 2.0) is None
    e = divergence(3, float("nan"), 2.0)
    assert isinstance(e, TrainingDiverged) and e.step == 3 and "non-finite loss nan" in str(e)
    assert is_eval_step(10, 5, 12) and is_eval_step(12, 5, 12) and not is_eval_step(11, 5, 12)
