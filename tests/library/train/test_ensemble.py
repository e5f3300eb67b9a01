"""The ensemble trainer: each member computes what its single run computes.

Equivalence is tested at three levels: every step's loss and gradients (bit for bit on the CPU
where every member scores the same positions; to 1e-5 relative otherwise), every file of the
run directory (weights, optimizer and RNG state, metrics, done/failed records), and the
behaviour around it (divergence of one member, interrupted ensembles, resuming a member alone,
sweeps that mix executors)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from circuitfade.gating.evaluation import EVAL_CHUNK, evaluate_conditions
from circuitfade.io import CheckpointError, load_tensors
from circuitfade.tasks import eval_set
from circuitfade.train import RunConfig, TrainConfig, TrainingDiverged, fit, new_run, train
from circuitfade.train.state import one_thread
from circuitfade.train.ensemble import (
    DEFAULT_MEMBERS,
    Ensemble,
    MemberStatus,
    default_ensemble_size,
    ensemble_key,
    ensemble_refusal,
    fit_ensemble,
    train_ensemble,
)
from repo_root import REPO

TINY = {"d_model": 16, "d_head": 4, "n_ctx": 13, "d_vocab": 16}
TASK = {"name": "assoc", "n_pairs": 6, "n_keys": 8, "n_values": 8, "d_vocab": 16, "max_len": 13}


def members(steps: int, model=None, task=None, **train_kw) -> list[RunConfig]:
    """Three members that differ in everything a member may differ in: gate path (scheduled,
    learned, fixed), seed, lr, weight decay, clipping norm."""
    tc = {**dict(steps=steps, eval_every=steps, eval_size=8, batch_size=8, checkpoint_every=10_000), **train_kw}
    model = TINY if model is None else model
    task = TASK if task is None else task
    per = [("fade3+4->0", 0, {}), ("unforced", 1, {"lr": 3e-3}),
           ("forced_zero", 2, {"weight_decay": 0.1, "grad_clip": 0.5})]
    return [RunConfig(path=p, seed=s, model=model, task=task, train=TrainConfig(**{**tc, **kw})) for p, s, kw in per]


class LossRecorder:
    """A task whose ``loss`` also records each value (everything else is the task's)."""

    def __init__(self, task):
        self._task, self.losses = task, []

    def __getattr__(self, name):
        return getattr(self._task, name)

    def loss(self, logits, batch):
        value = self._task.loss(logits, batch)
        self.losses.append(value.detach().clone())
        return value


def record_grads(params: dict, steps: list) -> None:
    """Append each parameter's gradient (before clipping) to ``steps[-1]`` as it is computed."""
    for n, p in params.items():
        if p.requires_grad:
            p.register_hook(lambda g, n=n: steps[-1].__setitem__(n, g.detach().clone()))


def trajectories(cfgs: list[RunConfig], steps: int):
    """Per member: the single run's and the ensemble member's losses, raw gradients (one dict per
    step) and final weights, over ``steps`` steps from the start."""
    singles = []
    for c in cfgs:
        run, task = new_run(c), LossRecorder(c.make_task())
        grads: list[dict] = []
        record_grads(dict(run.model.named_parameters()), grads)
        task.sample = lambda *a, _t=task, _g=grads, **k: (_g.append({}), _t._task.sample(*a, **k))[1]
        fit(run, until=steps, task=task, eval_batch=eval_set(task._task, 8), progress=False)
        singles.append((torch.stack(task.losses), grads, dict(run.model.named_parameters())))
    ens = Ensemble([new_run(c) for c in cfgs])
    task = cfgs[0].make_task()
    grads = []
    record_grads(ens.model.params, grads)
    losses = []
    with one_thread():  # as fit and fit_ensemble compute
        for _ in range(steps):
            grads.append({})
            losses.append(ens.train_step(task)[0])
    members_ = []
    for e in range(len(cfgs)):
        loss = torch.tensor([row[e] for row in losses])
        members_.append((loss, [{n: g[e] for n, g in step.items()} for step in grads],
                         {n: p[e] for n, p in ens.model.params.items()}))
    return singles, members_


VARIANTS = {
    "gate paths (fade, unforced, forced_zero), priors on, answer path": dict(),
    "priors off": dict(model={**TINY, "priors": []}),
    "full path (a last-layer prior that needs the scores)": dict(model={**TINY, "priors": ["pos", "cope"]}),
    "prior dropout and dual loss, MLP blocks": dict(model={**TINY, "attn_only": False, "d_mlp": 32},
                                                    prior_dropout=0.5, dual_loss=True),
    "soft-capped logits": dict(model={**TINY, "output_logits_soft_cap": 0.5}),
    "a batch larger than the vocabulary (the first block on a token-position table)": dict(batch_size=24),
}


def blas_batches_like_single() -> bool:
    """Whether this BLAS computes each matrix of a batched product (``bmm``) bit for bit as the
    single product (``mm``) for the tiny model's shapes, plain and transposed (as in backward
    passes): what bit-identity rests on. MKL on x86 does; where it does not, members still
    match to 1e-5 (the tolerance test below)."""
    g = torch.Generator().manual_seed(0)
    for m, k, n in [(104, 16, 48), (104, 16, 32), (8, 16, 16), (8, 16, 32), (16, 104, 48), (16, 8, 16), (104, 16, 16),
                    (208, 16, 48), (16, 208, 48)]:
        a, b = torch.randn(3, m, k, generator=g), torch.randn(3, k, n, generator=g)
        at = torch.randn(3, k, m, generator=g).transpose(1, 2)
        if not all(torch.equal(torch.bmm(a, b)[e], a[e] @ b[e]) and torch.equal(torch.bmm(at, b)[e], at[e] @ b[e])
                   for e in range(3)):
            return False
    return True


exact = pytest.mark.skipif(not blas_batches_like_single(), reason="this BLAS rounds batched products "
                           "differently from single ones: members match to 1e-5 (see the tolerance test)")


@exact
@pytest.mark.parametrize("steps", [25, pytest.param(100, marks=[pytest.mark.slow, pytest.mark.numerics])])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_members_match_their_single_runs_bit_for_bit(variant, steps):
    cfgs = members(steps, **VARIANTS[variant])
    singles, ensemble = trajectories(cfgs, steps)
    for (loss, grads, weights), (e_loss, e_grads, e_weights) in zip(singles, ensemble):
        if cfgs[0].train.dual_loss:  # the single run's two losses, added as it adds them
            loss = loss[0::2] + loss[1::2]
        assert len(loss) == len(e_loss) == len(grads) == steps
        assert torch.equal(loss.float(), e_loss.float())
        for step, (g, eg) in enumerate(zip(grads, e_grads)):
            assert g, step
            for n in g:  # every gradient the single run has (a learned gate under prior dropout has none)
                assert torch.equal(g[n], eg[n]), (step, n)
        for n, w in weights.items():
            assert torch.equal(w, e_weights[n]), n


def test_members_that_score_different_positions_match_within_1e_5():
    # markov batches score different positions per member: the last block computes the union of
    # them, so the matrix shapes differ from the single run's and bit-identity is not promised
    cfgs = members(40, model={"d_model": 16, "d_head": 4}, task={"name": "markov"})
    assert ensemble_key(cfgs[0]) == ensemble_key(cfgs[1])
    singles, ensemble = trajectories(cfgs, 40)
    differs = False
    for (loss, grads, _), (e_loss, e_grads, _) in zip(singles, ensemble):
        assert float(((loss - e_loss).abs() / loss.abs()).max()) <= 1e-5
        for g, eg in zip(grads, e_grads):
            a = torch.cat([g[n].flatten() for n in sorted(g)])
            b = torch.cat([eg[n].flatten() for n in sorted(g)])
            assert float((a - b).norm() / a.norm()) <= 1e-5
            differs |= not torch.equal(a, b)
    assert differs  # the case is real: shapes differ, rounding differs


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def assert_same_run_dirs(a: Path, b: Path) -> None:
    """Every file of two run directories holds the same thing (tensors, metadata, text)."""
    assert _files(a) == _files(b)
    for f in _files(a):
        if f.endswith(".safetensors"):
            ta, tb = load_tensors(a / f), load_tensors(b / f)
            assert ta.keys() == tb.keys(), f
            for k in ta:
                assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), (f, k)
            with safe_open(str(a / f), "pt") as x, safe_open(str(b / f), "pt") as y:
                assert x.metadata() == y.metadata(), f
        else:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f


def dir_configs(**kw) -> list[RunConfig]:
    tc = dict(steps=24, eval_every=5, eval_size=16, batch_size=8, checkpoint_every=10, extra_checkpoints=(3,))
    per = [("fade4+8->0", 0, {}), ("unforced", 1, {"lr": 3e-3, "prior_dropout": 0.3}),
           ("forced_zero", 2, {"weight_decay": 0.1, "grad_clip": 0.5})]
    return [RunConfig(path=p, seed=s, model=TINY, task=TASK, train=TrainConfig(**{**tc, **k, **kw}))
            for p, s, k in per]


@exact
def test_train_ensemble_writes_what_the_single_trainer_writes(tmp_path):
    cfgs = dir_configs()
    outs = train_ensemble(cfgs, [tmp_path / f"e{i}" for i in range(3)])
    assert [o.status for o in outs] == [MemberStatus.DONE] * 3
    for i, c in enumerate(cfgs):
        train(c, tmp_path / f"s{i}", progress=False)
        assert_same_run_dirs(tmp_path / f"e{i}", tmp_path / f"s{i}")
        assert outs[i].final == outs[i].run.metrics[-1] and outs[i].final["step"] == 24
    again = train_ensemble(cfgs, [tmp_path / f"s{i}" for i in range(3)])  # finished single runs are reused
    assert [o.status for o in again] == [MemberStatus.CACHED] * 3


@exact
def test_evaluation_in_chunks_matches_the_single_trainer(tmp_path):
    """Evaluation sets larger than one chunk (300 examples: chunks of 128, 128, 44) give the same
    metrics.csv as the single trainer, for members whose conditions fall into different groups
    (a fade: normal = param = half until it ends; learned gates; gates fixed at 0)."""
    cfgs = dir_configs(eval_size=300, steps=10, extra_checkpoints=())
    assert 300 > 2 * EVAL_CHUNK
    outs = train_ensemble(cfgs, [tmp_path / f"e{i}" for i in range(3)])
    assert [o.status for o in outs] == [MemberStatus.DONE] * 3
    for i, c in enumerate(cfgs):
        train(c, tmp_path / f"s{i}", progress=False)
        assert (tmp_path / f"e{i}" / "metrics.csv").read_bytes() == (tmp_path / f"s{i}" / "metrics.csv").read_bytes()


@exact
def test_ensemble_evaluate_equals_evaluate_conditions_under_every_condition():
    cfgs = dir_configs(eval_size=40)
    runs = [new_run(c) for c in cfgs]
    task = cfgs[0].make_task()
    batch = eval_set(task, 40)
    conditions = ["normal", "zero", {"pos": 0.0}, "param", "half", {"content": 0.25}]
    with one_thread():
        fit(runs[0], until=3, progress=False)  # members need not share weights, only a step
        runs[0].step = 0
        ens = Ensemble(runs)
        got = ens.evaluate([2, 0], task, batch, conditions)
        want = [evaluate_conditions(runs[i].model, task, batch, conditions) for i in (2, 0)]
    assert got == want
    assert list(got[0]) == list(want[0])  # the same columns in the same order
    assert got[0]["acc_zero"] == got[0]["acc_normal"]  # forced_zero: its normal gates are 0


@exact
def test_a_diverging_member_fails_as_its_single_run_does_and_the_others_go_on(tmp_path):
    cfgs = dir_configs()
    cfgs[1] = RunConfig.from_dict({**cfgs[1].to_dict(), "train": {**cfgs[1].to_dict()["train"], "lr": 1e3}})
    outs = train_ensemble(cfgs, [tmp_path / f"e{i}" for i in range(3)])
    assert [o.status for o in outs] == [MemberStatus.DONE, MemberStatus.FAILED, MemberStatus.DONE]
    assert "training diverged at step" in outs[1].error and outs[1].final == {}
    with pytest.raises(TrainingDiverged):
        train(cfgs[1], tmp_path / "s1", progress=False)
    for i in range(3):
        if i != 1:
            train(cfgs[i], tmp_path / f"s{i}", progress=False)
        assert_same_run_dirs(tmp_path / f"e{i}", tmp_path / f"s{i}")  # failed.json and checkpoints included
    again = train_ensemble(cfgs, [tmp_path / f"e{i}" for i in range(3)])  # a recorded failure is not retrained
    assert again[1].status is MemberStatus.FAILED and "failed.json" in again[1].error
    assert [again[0].status, again[2].status] == [MemberStatus.CACHED] * 2


class Interrupt(Exception):
    pass


@exact
def test_an_interrupted_ensemble_resumes_and_a_member_resumes_alone(tmp_path):
    cfgs = dir_configs()
    full = [tmp_path / f"full{i}" for i in range(3)]
    train_ensemble(cfgs, full)

    def stop_at_15(member, step, row):
        if step == 15:
            raise Interrupt

    cut = [tmp_path / f"cut{i}" for i in range(3)]
    with pytest.raises(Interrupt):
        train_ensemble(cfgs, cut, logger=stop_at_15)
    assert all((d / "checkpoints" / "step_000010.state.safetensors").is_file() for d in cut)
    assert not any((d / "done.json").exists() or (d / ".lock").exists() for d in cut)
    for f in (cut[2] / "checkpoints").glob("step_000010*"):
        f.unlink()  # member 2 is now behind (last complete checkpoint: step 3)
    train(cfgs[0], cut[0], progress=False)  # member 0 resumes alone, as a single run
    outs = train_ensemble(cfgs, cut)  # 1 and 2 resume at different steps: two groups
    assert [o.status for o in outs] == [MemberStatus.CACHED, MemberStatus.DONE, MemberStatus.DONE]
    for a, b in zip(full, cut):
        assert_same_run_dirs(a, b)


# ----------------------------------------------------------------------------------------------
# one member's fault stays with that member
# ----------------------------------------------------------------------------------------------
def _cut(cfgs, dirs) -> None:
    """Every member trained to step 15 and stopped (last complete checkpoint: step 10)."""

    def stop_at_15(member, step, row):
        if step == 15:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_ensemble(cfgs, dirs, logger=stop_at_15)


def _others_finish_as_single_runs(cfgs, dirs, tmp_path, failed: int) -> None:
    for i, c in enumerate(cfgs):
        if i != failed:
            train(c, tmp_path / f"single{i}", progress=False)
            assert_same_run_dirs(dirs[i], tmp_path / f"single{i}")
    assert not (dirs[failed] / "failed.json").exists() and not (dirs[failed] / "done.json").exists()


def _renumber(d: Path, old: int, new: int) -> None:
    """Step ``old``'s checkpoint of run ``d`` rewritten as a valid checkpoint of step ``new``
    (names, ``step`` metadata, checksums and the state's record of its weights all agree)."""
    from circuitfade.io import CHECKSUM_KEY, save_tensors

    ck = d / "checkpoints"
    bound = None
    for state in (False, True):
        f = ck / f"step_{old:06d}{'.state' if state else ''}.safetensors"
        with safe_open(str(f), "pt") as g:
            t, meta = {k: g.get_tensor(k) for k in g.keys()}, dict(g.metadata())
        meta["step"] = str(new)
        if state:
            meta["weights_checksum"] = bound
        target = save_tensors(ck / f.name.replace(f"{old:06d}", f"{new:06d}"), t, metadata=meta)
        with safe_open(str(target), "pt") as g:
            bound = g.metadata()[CHECKSUM_KEY]
        f.unlink()


@exact
def test_a_member_with_a_checkpoint_past_its_end_fails_alone_naming_the_file(tmp_path):
    cfgs = dir_configs()
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    _cut(cfgs, dirs)
    _renumber(dirs[1], 10, 40)  # a valid checkpoint, of a step past the member's end (24)
    with pytest.raises(CheckpointError) as single:
        train(cfgs[1], dirs[1], progress=False)
    outs = train_ensemble(cfgs, dirs)
    assert [o.status for o in outs] == [MemberStatus.DONE, MemberStatus.FAILED, MemberStatus.DONE]
    assert outs[1].error == f"CheckpointError: {single.value}"  # the single trainer's message
    assert "step_000040.safetensors" in outs[1].error and "past the run's end" in outs[1].error
    _others_finish_as_single_runs(cfgs, dirs, tmp_path, failed=1)


@exact
def test_a_member_with_a_corrupt_optimizer_state_fails_alone_and_is_no_divergence(tmp_path):
    from safetensors.torch import save_file

    cfgs = dir_configs()
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    _cut(cfgs, dirs)
    f = dirs[2] / "checkpoints" / "step_000010.state.safetensors"
    with safe_open(str(f), "pt") as g:
        t, meta = {k: g.get_tensor(k) for k in g.keys()}, dict(g.metadata())
    t["optim.2.exp_avg_sq"] = -t["optim.2.exp_avg_sq"].abs() - 1.0
    save_file(t, str(f), metadata={k: v for k, v in meta.items() if k != "checksum"})  # as another tool writes
    outs = train_ensemble(cfgs, dirs)
    assert [o.status for o in outs] == [MemberStatus.DONE, MemberStatus.DONE, MemberStatus.FAILED]
    assert f.name in outs[2].error and "optim.2.exp_avg_sq" in outs[2].error and "negative" in outs[2].error
    _others_finish_as_single_runs(cfgs, dirs, tmp_path, failed=2)


@exact
def test_one_members_full_disk_stops_that_member_alone(tmp_path, monkeypatch):
    import errno

    import circuitfade.train.rundir as rundir

    cfgs = dir_configs()
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    full = dirs[0]

    def on_a_full_disk(write):
        def guarded(path, *a, **k):
            if Path(path).is_relative_to(full) and "step_000010" in Path(path).name:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return write(path, *a, **k)
        return guarded

    monkeypatch.setattr(rundir, "save_tensors", on_a_full_disk(rundir.save_tensors))
    outs = train_ensemble(cfgs, dirs)
    assert [o.status for o in outs] == [MemberStatus.FAILED, MemberStatus.DONE, MemberStatus.DONE]
    assert "No space left on device" in outs[0].error and "step_000010.state.safetensors" in outs[0].error
    assert not (full / ".lock").exists()
    monkeypatch.undo()
    _others_finish_as_single_runs(cfgs, dirs, tmp_path, failed=0)
    train_ensemble(cfgs, dirs)  # room again: the member resumes from its step-3 checkpoint
    train(cfgs[0], tmp_path / "single0", progress=False)
    assert_same_run_dirs(full, tmp_path / "single0")


@exact
def test_a_finished_member_holds_no_lock_while_the_others_train(tmp_path):
    """A killed ensemble leaves ``.lock`` files only in the members that had not finished."""
    cfgs = dir_configs()
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    _cut(cfgs, dirs)
    for f in (dirs[2] / "checkpoints").glob("step_000010*"):
        f.unlink()  # member 2 resumes from step 3 in a group of its own; 0 and 1 from step 10
    seen = {}

    def look(member, step, row):
        if member == 0 and step == 15:
            seen.update({i: ((d / ".lock").exists(), (d / "done.json").exists()) for i, d in enumerate(dirs)})

    outs = train_ensemble(cfgs, dirs, logger=look)
    assert [o.status for o in outs] == [MemberStatus.DONE] * 3
    assert seen == {0: (True, False), 1: (True, False), 2: (False, True)}


@exact
def test_the_sweep_worker_reports_one_bad_member_and_the_others_done(tmp_path):
    """``execute_ensemble`` (the ensemble executor's worker) on three members of which one holds a
    checkpoint past its end: that member is failed, naming the file; the two others are done."""
    from circuitfade.train.sweep import execute_ensemble

    cfgs = dir_configs()
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    _cut(cfgs, dirs)
    _renumber(dirs[1], 10, 40)
    rows = execute_ensemble([c.to_dict() for c in cfgs], [str(d) for d in dirs])
    assert [r["status"] for r in rows] == ["done", "failed", "done"]
    assert "step_000040.safetensors" in rows[1]["error"] and rows[0]["step"] == rows[2]["step"] == 24


def test_a_stopped_ensemble_reports_its_finished_members_as_finished(tmp_path, monkeypatch):
    """``execute_ensemble`` (the sweep's worker): when the ensemble raises, the members that have
    ``done.json`` are reported done with their final metrics, not failed."""
    import circuitfade.train.ensemble as ensemble
    from circuitfade.train.sweep import execute_ensemble

    cfgs = dir_configs(steps=4, eval_every=2, checkpoint_every=2, extra_checkpoints=())
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    train(cfgs[0], dirs[0], progress=False)

    def finish_one_then_stop(configs, run_dirs, **kw):
        train(cfgs[1], dirs[1], progress=False)
        raise RuntimeError("stopped")

    monkeypatch.setattr(ensemble, "train_ensemble", finish_one_then_stop)
    rows = execute_ensemble([c.to_dict() for c in cfgs], [str(d) for d in dirs])
    assert [r["status"] for r in rows] == ["cached", "done", "failed"]
    assert "RuntimeError: stopped" in rows[2]["error"] and rows[0]["error"] is None
    for r, d in zip(rows[:2], dirs):
        assert r["step"] == 4 and r["acc_normal"] == json.loads((d / "done.json").read_text())["final"]["acc_normal"]


@exact
def test_fit_ensemble_leaves_single_runs_that_fit_continues():
    cfgs = [RunConfig.from_dict({**c.to_dict(), "train": {**c.to_dict()["train"], "eval_every": 4}})
            for c in members(12)]
    runs = [new_run(c) for c in cfgs]
    assert fit_ensemble(runs, until=5) == [None] * 3
    for r, c in zip(runs, cfgs):
        assert r.step == 5
        fit(r, progress=False)  # each member continues alone
        ref = new_run(c)
        fit(ref, until=5, progress=False)  # the single step function stopped at the same step
        fit(ref, progress=False)
        assert json.dumps(r.metrics) == json.dumps(ref.metrics)  # (NaN train loss at step 0 included)
        for (n, p), q in zip(r.model.named_parameters(), ref.model.parameters()):
            assert torch.equal(p, q), n


def test_what_members_share_and_what_cannot_be_a_member():
    base = RunConfig(path="fade600->0", seed=0)
    same = [RunConfig(path="unforced", seed=3), RunConfig(path="forced_zero", seed=1, mix={}),
            RunConfig(path="fade600->0", train=TrainConfig(lr=3e-3, weight_decay=0.1, grad_clip=0.5,
                                                           prior_dropout=0.2, checkpoint_every=100))]
    other = [RunConfig(train=TrainConfig(steps=1000)), RunConfig(model={"d_model": 128, "d_head": 32}),
             RunConfig(task={"name": "markov"}), RunConfig(train=TrainConfig(batch_size=32)),
             RunConfig(train=TrainConfig(dual_loss=True)), RunConfig(train=TrainConfig(eval_every=50))]
    assert all(ensemble_key(c) == ensemble_key(base) for c in same)
    assert len({ensemble_key(c) for c in other} | {ensemble_key(base)}) == len(other) + 1
    branch = RunConfig(path="posthoc5", parent={"run": "/nowhere", "step": 3600}, train=TrainConfig(steps=3605))
    rotary = RunConfig(model={"positional_embedding_type": "rotary"})
    compiled = RunConfig(train=TrainConfig(compile=True))
    assert ensemble_refusal(compiled) is None and ensemble_key(compiled) != ensemble_key(base)  # with its kind
    capped = RunConfig(model={"attn_scores_soft_cap": 5.0})
    assert "branch" in ensemble_refusal(branch) and "rotary" in ensemble_refusal(rotary)
    assert "attn_scores_soft_cap" in ensemble_refusal(capped)
    assert ensemble_refusal(base) is None
    with pytest.raises(ValueError, match="cannot join an ensemble"):
        ensemble_key(branch)
    with pytest.raises(ValueError, match="differ"):
        train_ensemble([base, other[0]], ["/tmp/a", "/tmp/b"])
    with pytest.raises(ValueError, match="different steps"):
        runs = [new_run(c) for c in members(4)]
        runs[0].step = 2
        fit_ensemble(runs)


def test_default_size_per_device():
    assert default_ensemble_size("cpu") == DEFAULT_MEMBERS["cpu"] >= 1
    measured = json.loads((REPO / "results" / "benchmarks" / "ensemble.json").read_text())
    for kind, e in measured["default_members"].items():  # the constant is the committed measurement, not a guess
        assert DEFAULT_MEMBERS[kind] == e, f"DEFAULT_MEMBERS[{kind!r}] differs from results/benchmarks/ensemble.json"
    if not torch.cuda.is_available():
        assert default_ensemble_size("auto") == DEFAULT_MEMBERS["cpu"]
    assert math.isfinite(default_ensemble_size())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_that_is_not_here_fails_before_anything_is_written(tmp_path):
    cfgs = [RunConfig.from_dict({**c.to_dict(), "train": {**c.to_dict()["train"], "device": "cuda"}})
            for c in dir_configs()]
    with pytest.raises(ValueError, match="CUDA is not available"):
        train_ensemble(cfgs, [tmp_path / f"r{i}" for i in range(3)])
    with pytest.raises(ValueError, match="CUDA is not available"):
        default_ensemble_size("cuda")
    assert not list(tmp_path.iterdir())


def test_members_on_the_device_of_their_runs():
    # the stack, its optimizer state and the batches live where the runs' models are ("cpu" here)
    cfgs = [RunConfig.from_dict({**c.to_dict(), "train": {**c.to_dict()["train"], "device": "auto"}})
            for c in members(2)]
    ens = Ensemble([new_run(c) for c in cfgs])
    want = new_run(cfgs[0]).model.W_E.device
    assert all(p.device == want for p in ens.model.params.values())
    assert all(t.device == want for t in ens.opt.exp_avg.values()) and ens.model.learned.device == want
    with one_thread():
        losses, norms = ens.train_step(cfgs[0].make_task())
    assert all(math.isfinite(x) for x in losses + norms)


@pytest.mark.slow
def test_the_benchmark_measures_in_a_child_process(tmp_path):
    """``benchmarks/ensemble.py`` measures each trainer in a child process (``--child MODE N``):
    the protocol its rounds depend on works end to end on a two-step ensemble."""
    import subprocess
    import sys

    repo = REPO
    cmd = [sys.executable, str(repo / "benchmarks" / "ensemble.py"), "--child", "ensemble", "2", "--steps", "2",
           "--eval-every", "2", "--checkpoint-every", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["mode"] == "ensemble" and row["runs"] == 2 and row["status"] == ["done", "done"]
    assert row["cpu_s"] > 0 and row["rss_mib"] > 0


class StopAt:
    """Records every hook call per seed; stops the run of ``seed`` at ``step`` (``on_record`` or ``on_step``)."""

    def __init__(self, seed: int, step: int, hook: str):
        self.seed, self.step, self.hook, self.calls = seed, step, hook, []

    def _stop(self, run, hook: str) -> bool:
        return hook == self.hook and run.config.seed == self.seed and run.step >= self.step

    def on_record(self, run, row):
        self.calls.append(("record", run.config.seed, run.step, row["step"]))
        return self._stop(run, "on_record")

    def on_checkpoint(self, run, step):
        self.calls.append(("checkpoint", run.config.seed, step))

    def on_step(self, run):
        self.calls.append(("step", run.config.seed, run.step, float(next(run.model.parameters()).detach().sum())))
        return self._stop(run, "on_step")


@exact
@pytest.mark.parametrize("hook", ["on_record", "on_step"])
def test_a_callback_stops_one_member_where_fit_stops_its_single_run(tmp_path, hook):
    cfgs = [RunConfig.from_dict({**c.to_dict(), "train": {**c.to_dict()["train"], "eval_every": 4,
                                                          "checkpoint_every": 4}}) for c in members(12)]
    stop_seed = cfgs[1].seed
    ens_cb = StopAt(stop_seed, 8, hook)
    runs = [new_run(c) for c in cfgs]
    assert fit_ensemble(runs, run_dirs=[tmp_path / f"e{i}" for i in range(3)], callbacks=[ens_cb]) == [None] * 3
    assert [r.step for r in runs] == [12, 8, 12]  # the stopped member alone
    for i, (r, c) in enumerate(zip(runs, cfgs)):
        cb = StopAt(stop_seed, 8, hook)
        ref = new_run(c)
        fit(ref, run_dir=tmp_path / f"s{i}", progress=False, callbacks=[cb])
        assert ref.step == r.step and json.dumps(r.metrics) == json.dumps(ref.metrics)
        for (n, p), q in zip(r.model.named_parameters(), ref.model.parameters()):
            assert torch.equal(p, q), n
        assert all(torch.equal(a, b) for a, b in zip(r.optimizer.state_dict()["state"][0].values(),
                                                      ref.optimizer.state_dict()["state"][0].values()))
        # the same hooks, in the same order, seeing the same weights, as fit calls them for this run
        mine = [call for call in ens_cb.calls if call[1] == c.seed]
        assert mine == cb.calls and len(mine) > 10
        assert sorted(p.name for p in (tmp_path / f"e{i}").iterdir()) == sorted(p.name for p in (tmp_path / f"s{i}").iterdir())
    fit(runs[1], progress=False)  # the stopped member continues alone as an ordinary run
    assert runs[1].step == 12


def test_fit_ensemble_refuses_callbacks_that_act_inside_a_step():
    from circuitfade.train.callbacks import Callback, L2Penalty

    class Recorder(Callback):
        def on_record(self, run, row):
            return None

    class Clip:
        def before_update(self, run, grad_norm):
            pass

    runs = [new_run(c) for c in members(4)]
    for cb, named in ((L2Penalty(0.1), "on_loss"), (Clip(), "before_update")):
        with pytest.raises(ValueError, match=f"a callback defines {named}.*use fit"):
            fit_ensemble(runs, callbacks=[Recorder(), cb])
    assert all(r.step == 0 for r in runs)
    assert fit_ensemble(runs, until=2, callbacks=[Recorder()]) == [None] * 3  # Callback's own do-nothing hooks pass
