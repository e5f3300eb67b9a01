"""Throughput paths: answer-position fast path, torch.compile, devices, deduplicated evaluation."""

from __future__ import annotations

import pytest
import torch

from circuitfade.gating.evaluation import answer_logits, evaluate_batch, evaluate_conditions
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.tasks import AssocRecall, make_task


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    m = SoftPriorTransformer(SoftPriorConfig(**kw))
    with torch.no_grad():  # non-trivial priors, so a wrong row of the bias table shows
        for attn in m.attn_layers:
            if "pos" in attn.priors:
                attn.priors["pos"].pos_bias.normal_(0, 1.0)
    return m


def _loss_and_grads(model, batch, task, fast: bool):
    model.zero_grad(set_to_none=True)
    logits = answer_logits(model, batch) if fast else model(batch.model_input)
    loss = task.loss(logits, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kw", [
    {},                                           # the paper's base model
    {"attn_only": False, "d_mlp": 32},            # with an MLP in the last block
    {"positional_embedding_type": "standard"},    # with a learned absolute position
    {"priors": ("alibi", "content")},             # a zoo prior that ignores query_index
])
def test_answer_path_matches_full_path_loss_and_every_gradient(kw):
    task = AssocRecall()
    batch = task.sample(16, torch.Generator().manual_seed(3))
    m = make_model(seed=1, **kw) if "priors" not in kw else SoftPriorTransformer(SoftPriorConfig(**kw))
    lf, gf = _loss_and_grads(m, batch, task, fast=False)
    la, ga = _loss_and_grads(m, batch, task, fast=True)
    torch.testing.assert_close(la, lf, atol=1e-5, rtol=1e-5)
    assert ga.keys() == gf.keys() and len(gf) > 10
    for n in gf:
        torch.testing.assert_close(ga[n], gf[n], atol=1e-5, rtol=1e-4, msg=n)


def test_answer_path_computes_only_answer_rows_and_matches_them():
    m = make_model(seed=2)
    tokens = torch.randint(0, 32, (4, 31), generator=torch.Generator().manual_seed(0))
    full = m(tokens)
    part = m(tokens, positions=torch.tensor([30, 7]))
    torch.testing.assert_close(part[:, [7, 30]], full[:, [7, 30]], atol=1e-5, rtol=1e-5)
    others = [i for i in range(31) if i not in (7, 30)]
    assert torch.isnan(part[:, others]).all()  # not computed: never silently zeros
    # boolean masks and negative indices name the same rows
    torch.testing.assert_close(m(tokens, positions=torch.arange(31) == 30)[:, 30], full[:, 30])
    torch.testing.assert_close(m(tokens, positions=[-1])[:, 30], full[:, 30])
    with pytest.raises(ValueError, match="positions must be in"):
        m(tokens, positions=[31])
    with pytest.raises(ValueError, match="return_type='logits'"):
        m(tokens, return_type="loss", positions=[30])


def test_the_answer_rows_are_the_full_attention_reassociated_exactly_in_float64():
    """The answer path's last block moves the key and value products onto the queries
    (``(W_K q)·x + q·b_K``, ``(Σ p x) W_V + b_V``): with rounding out of the way (float64) it is the
    full attention at those rows to 1e-12, nonzero key and value biases, both priors and a bias
    prior included; a prior that needs the scores is refused."""
    from circuitfade.model.fused import ATTENTION_WEIGHTS, causal_mask, prior_attention, rows_attention

    m = make_model(seed=4).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    attn = m.blocks[1].attn
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 32, (3, 31), generator=g)
    x = torch.randn(3, 31, 64, generator=g, dtype=torch.float64)
    weights = {n: getattr(attn, n) for n in ATTENTION_WEIGHTS}
    gates = {n: attn.gate(n) for n in attn.priors}
    assert weights["b_K"].abs().min() > 0 and weights["b_V"].abs().min() > 0
    args = (attn, x, m.W_E[tokens], causal_mask(31).double(), weights, gates)
    rows = torch.tensor([5, 17, 30])
    full = prior_attention(*args, vocab=(tokens, m.W_E))
    part = prior_attention(*args, rows=rows, vocab=(tokens, m.W_E))
    torch.testing.assert_close(part, full[:, rows], atol=1e-12, rtol=0)
    assert (full[:, rows] - full[:, rows - 1]).abs().max() > 0.1  # the rows are told apart
    scored = SoftPriorTransformer(SoftPriorConfig(priors=("pos", "cope")))
    with pytest.raises(ValueError, match="needs the attention scores"):
        rows_attention(scored.blocks[1].attn, x.float(), m.W_E[tokens].float(), causal_mask(31),
                       {n: getattr(scored.blocks[1].attn, n) for n in ATTENTION_WEIGHTS},
                       {n: scored.blocks[1].attn.gate(n) for n in scored.blocks[1].attn.priors}, rows)


def test_answer_path_is_ignored_when_a_hook_is_attached():
    m = make_model(seed=2)
    tokens = torch.randint(0, 32, (2, 31), generator=torch.Generator().manual_seed(0))
    seen = []
    out = m.run_with_hooks(tokens, positions=[30], fwd_hooks=[("blocks.1.attn.hook_pattern",
                                                              lambda act, hook: seen.append(act.shape))])
    assert not torch.isnan(out).any()  # hooked path: every position computed
    assert seen == [torch.Size([2, 4, 31, 31])]


def test_evaluation_metrics_unchanged_by_answer_path():
    task = make_task("markov")  # answers at varying positions per example
    batch = task.sample(32, torch.Generator().manual_seed(0))
    m = make_model(seed=4)
    fast = evaluate_batch(m, task, batch, "zero")
    m.use_fused = False  # hooked path: full positions
    full = evaluate_batch(m, task, batch, "zero")
    assert fast.keys() == full.keys()
    for k in fast:
        assert fast[k] == pytest.approx(full[k], abs=1e-5), k


def test_nope_prior_reads_its_own_embedding_tensor_under_inplace_residual_hook():
    """An in-place hook on blocks.0.hook_resid_pre must not change what the content prior reads."""
    m = make_model(seed=5, priors=("content",))
    tokens = torch.randint(0, 32, (2, 31), generator=torch.Generator().manual_seed(0))
    grab = {}

    def inplace(act, hook):
        act.mul_(0.0)  # wipe the residual in place (as TransformerLens's patching may)

    def keep(act, hook):
        grab["bias"] = act.detach().clone()

    m.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", inplace),
                                        ("blocks.0.attn.hook_content_bias", keep)])
    _, cache = m.run_with_cache(tokens, names_filter="blocks.0.attn.hook_content_bias")
    expected = cache["blocks.0.attn.hook_content_bias"]
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(grab["bias"], expected)


# --------------------------------------------------------------------------------------
# evaluation conditions with the same gate values run once
# --------------------------------------------------------------------------------------
def test_conditions_with_equal_gates_are_evaluated_once_and_logged_under_every_name(monkeypatch):
    import circuitfade.gating.evaluation as ev

    task = AssocRecall()
    batch = task.sample(16, torch.Generator().manual_seed(0))
    m = make_model(seed=6, gate_modes={"pos": "scheduled", "content": "scheduled"})  # param = half = 0.5
    calls = []
    real = ev.evaluate_batch

    def counting(model, task, batch, condition="normal"):
        calls.append(condition)
        return real(model, task, batch, condition)

    monkeypatch.setattr(ev, "evaluate_batch", counting)
    m.set_gate_values(pos=0.0, content=0.0)  # after the fade: normal = zero
    out = ev.evaluate_conditions(m, task, batch, ("normal", "zero", "param", "half"))
    assert calls == ["normal", "param"]
    assert out["acc_zero"] == out["acc_normal"] and out["loss_zero"] == out["loss_normal"]
    assert out["acc_half"] == out["acc_param"] and out["loss_half"] == out["loss_param"]
    assert out["loss_normal"] != out["loss_param"]  # the two groups are distinct models
    # and the values are what a separate evaluation of each condition gives
    monkeypatch.setattr(ev, "evaluate_batch", real)
    for c in ("normal", "zero", "param", "half"):
        assert out[f"loss_{c}"] == pytest.approx(real(m, task, batch, c)["loss"], abs=1e-6), c


def test_learned_gates_keep_every_condition():
    task = AssocRecall()
    batch = task.sample(8, torch.Generator().manual_seed(0))
    m = make_model(seed=7)  # learned gates at 0.5: normal = param = half here, zero differs
    out = evaluate_conditions(m, task, batch)
    assert {"acc_normal", "acc_zero", "acc_param", "acc_half"} <= set(out)
    with torch.no_grad():
        m.blocks[0].attn.gate_pos_logit.fill_(3.0)  # now normal = param != half
    out = evaluate_conditions(m, task, batch)
    assert out["loss_normal"] == out["loss_param"] and out["loss_normal"] != out["loss_half"]


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False])
def test_torch_compile_matches_eager(fused):
    torch._dynamo.reset()
    m = make_model(seed=8, n_layers=1, d_model=16, d_head=4, n_ctx=8, d_vocab=8)
    m.use_fused = fused
    tokens = torch.randint(0, 8, (2, 8), generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(m)
    out = compiled(tokens)
    out.sum().backward()
    torch.testing.assert_close(out.detach(), m(tokens).detach(), atol=1e-5, rtol=1e-5)


def test_attn_scale_is_a_python_float():
    """SDPA's ``scale`` and torch.compile need a float, not the numpy scalar TransformerLens stores."""
    m = make_model(seed=0)
    assert all(type(a.attn_scale) is float for a in m.attn_layers)
    torch.testing.assert_close(m.attn_layers[0].attn_scale, 4.0)


# --------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------
from circuitfade.model.devices import resolve_device  # noqa: E402
from circuitfade.train import RunConfig, TrainConfig, train  # noqa: E402
from circuitfade.train.sweep import run_key  # noqa: E402
from repo_root import REPO  # noqa: E402


def test_device_does_not_change_run_identity():
    # keys computed by the release before TrainConfig.device existed (results/runs depend on them)
    assert run_key(RunConfig()) == "assoc-fade600to0-s0-78ea2186"
    assert run_key(RunConfig(path="unforced", seed=3, train=TrainConfig(steps=200, eval_every=50))) == \
        "assoc-unforced-s3-d3b59afd"
    assert run_key(RunConfig(train=TrainConfig(device="auto"))) == "assoc-fade600to0-s0-78ea2186"
    assert "device" not in RunConfig().to_dict()["train"]  # config.json of a default run: as before
    cfg = RunConfig(train=TrainConfig(device="cuda:1"))
    assert cfg.to_dict()["train"]["device"] == "cuda:1"  # recorded, so sweep workers get it ...
    assert RunConfig.from_dict(cfg.to_dict()).train.device == "cuda:1"
    assert cfg.same_run(RunConfig())  # ... but the same experiment


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="MPS is not available"):
        resolve_device("mps")
    for bad in ("gpu", "cuda:x", "cpu:0", ""):
        with pytest.raises(ValueError, match="device must be one of"):
            resolve_device(bad)
    with pytest.raises(ValueError, match="device must be one of"):
        TrainConfig(device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == torch.device("cuda")  # auto prefers CUDA where there is one
    with pytest.raises(ValueError, match="only 1 CUDA device"):
        resolve_device("cuda:1")


def test_unavailable_device_fails_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        train(RunConfig(train=TrainConfig(steps=2, device="cuda")), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    from circuitfade.cli import main

    assert main(["train", "--steps", "2", "--device", "cuda", "--out", str(tmp_path / "cli"), "--quiet"]) == 2
    assert not (tmp_path / "cli").exists()


def test_runs_are_bit_identical_on_the_same_device_whatever_the_name(tmp_path):
    tc = dict(steps=20, eval_every=10, checkpoint_every=10, eval_size=64)
    a = train(RunConfig(train=TrainConfig(**tc)), tmp_path / "a", progress=False)
    b = train(RunConfig(train=TrainConfig(**tc, device="auto")), None, progress=False)  # auto = cpu here
    for (n, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), n
    import json

    assert json.dumps(a.metrics) == json.dumps(b.metrics)  # (NaN train loss at step 0 compares equal here)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a" / "checkpoints" / "step_000020.safetensors"), framework="pt") as f:
        assert all(f.get_tensor(k).device.type == "cpu" for k in f.keys())


def test_trace_and_screens_take_a_device(monkeypatch):
    from circuitfade.analysis.development import screen_series
    from circuitfade.store import attach, trace

    def n_params(model):
        return float(sum(p.numel() for p in model.parameters()))

    n_params.metric_inputs = ("model",)  # a weight-only metric
    m = make_model(seed=9)
    series = attach([m, m])
    df = trace(series, {"n": n_params}, device="cpu", progress=False)
    assert len(df) == 2 and (df.value > 0).all()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        trace(series, {"n": n_params}, device="cuda", progress=False)
    with pytest.raises(ValueError, match="CUDA is not available"):
        screen_series(series, device="cuda", progress=False)


# --------------------------------------------------------------------------------------
# the one step-timing helper
# --------------------------------------------------------------------------------------
def test_time_steps_interleaves_rounds_and_restores_threads():
    from circuitfade.train.timing import median_ms, time_steps

    calls = []
    before = torch.get_num_threads()
    times = time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                       steps=2, rounds=3, warmup=1, threads=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3  # warm-up, then round by round
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert set(median_ms(times)) == {"a", "b"} and torch.get_num_threads() == before
    with pytest.raises(ValueError):
        time_steps({"a": lambda: None}, steps=0)


def test_trainer_uses_fused_adamw_and_old_checkpoints_resume_with_their_own_optimizer(tmp_path):
    """New runs step with fused AdamW; a checkpoint written by the non-fused optimizer of the
    previous release resumes with that implementation (its param_groups say so), so it
    continues exactly as it started."""
    from circuitfade.train.rundir import optimizer_from_tensors, optimizer_to_tensors
    from circuitfade.train.state import new_run

    run = new_run(RunConfig(train=TrainConfig(steps=2)))
    assert run.optimizer.param_groups[0]["fused"] is True
    old = torch.optim.AdamW(list(run.model.parameters()), lr=1e-3, weight_decay=0.01)  # previous release's
    tensors, meta = optimizer_to_tensors(old)
    optimizer_from_tensors(run.optimizer, tensors, meta)
    assert run.optimizer.param_groups[0]["fused"] is None


def test_clip_grad_norm_is_torchs_bit_for_bit():
    """The trainer's clip returns the same norm and leaves the same gradients as torch's
    foreach clip, clipping (large gradients) and not clipping (small ones)."""
    from circuitfade.train.optim import clip_grad_norm

    g = torch.Generator().manual_seed(0)
    for scale in (10.0, 1e-3):
        a = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((3, 5), (7,), (2, 2, 4))]
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        for pa, pb in zip(a, b):
            pa.grad = torch.randn(pa.shape, generator=g) * scale
            pb.grad = pa.grad.clone()
        a.append(torch.nn.Parameter(torch.zeros(2)))  # no gradient: skipped by both
        b.append(torch.nn.Parameter(torch.zeros(2)))
        ours, theirs = clip_grad_norm(a, 1.0), torch.nn.utils.clip_grad_norm_(b, 1.0, foreach=True)
        assert torch.equal(ours, theirs)
        assert all(torch.equal(pa.grad, pb.grad) for pa, pb in zip(a[:3], b[:3]))
        total = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in a[:3]])))
        assert (total <= 1.0 + 1e-5) if scale == 10.0 else (total < 1.0 and float(ours) == pytest.approx(total))


def _optimizer_pair(seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    a = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((3, 5), (7,), (2, 2, 4), (4,))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return a, b, torch.optim.AdamW(a, lr=1e-2, fused=True, **kw), torch.optim.AdamW(b, lr=1e-2, fused=True, **kw)


def test_the_trainers_optimizer_calls_are_torchs_adamw_step_bit_for_bit():
    """OptimizerCalls.step calls the fused kernel itself where it can and leaves every parameter and
    every state tensor as AdamW.step does: over steps where the last parameter has no gradient (no
    state: torch's own step creates it), then has one, with the learning rate and weight decay
    changed between steps; zero_grad sets every gradient to None. A planted wrong step count (the
    kernel called without adding 1) shows up."""
    from circuitfade.train.optim import OptimizerCalls

    g = torch.Generator().manual_seed(1)
    a, b, opt_a, opt_b = _optimizer_pair()
    calls = OptimizerCalls(opt_a, a)
    for step in range(8):
        for pa, pb in zip(a, b):
            if pa is a[-1] and step < 3:
                continue  # no gradient: skipped by both, its state created at step 3
            pa.grad = torch.randn(pa.shape, generator=g)
            pb.grad = pa.grad.clone()
        if step == 5:
            for opt in (opt_a, opt_b):
                opt.param_groups[0].update(lr=3e-3, weight_decay=0.1)
        calls.step()
        opt_b.step()
        assert all(torch.equal(pa, pb) for pa, pb in zip(a, b))
        for pa, pb in zip(a, b):
            sa, sb = opt_a.state.get(pa, {}), opt_b.state.get(pb, {})
            assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        calls.zero_grad()
        opt_b.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in a)
    assert calls.direct_steps == 6  # steps 0 and 3 created state through torch's own step
    assert opt_a.state_dict()["param_groups"] == opt_b.state_dict()["param_groups"]

    a, b, opt_a, opt_b = _optimizer_pair()
    for params, opt in ((a, opt_a), (b, opt_b)):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
    planted = OptimizerCalls(opt_a, a)
    planted._kernel_args = lambda: (lambda r: (*r[:-1], [torch.zeros_like(s) for s in r[-1]]))(
        OptimizerCalls._kernel_args(planted))  # step counts not advanced
    planted.step()
    opt_b.step()
    assert not all(torch.equal(pa, pb) for pa, pb in zip(a, b))


def test_the_trainers_optimizer_calls_leave_other_optimizers_and_hooked_steps_to_torch():
    """Anything the direct call does not cover goes through the optimizer's own step: an optimizer
    other than AdamW, AMSGrad, a step pre-hook (which must run); with the same results as torch."""
    from circuitfade.train.optim import OptimizerCalls

    a, b, opt_a, opt_b = _optimizer_pair(amsgrad=True)
    seen = []
    for params, opt in ((a, opt_a), (b, opt_b)):
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()  # state exists: only the settings keep the direct call out
    calls = OptimizerCalls(opt_a, a)
    calls.step()
    opt_b.step()
    assert calls.direct_steps == 0 and all(torch.equal(pa, pb) for pa, pb in zip(a, b))
    a, _, opt_a, _ = _optimizer_pair()
    for p in a:
        p.grad = torch.ones_like(p)
    opt_a.step()
    opt_a.register_step_pre_hook(lambda opt, args, kwargs: seen.append(1))
    calls = OptimizerCalls(opt_a, a)
    calls.step()
    assert seen == [1] and calls.direct_steps == 0
    sgd = torch.optim.SGD(a, lr=0.1)
    calls = OptimizerCalls(sgd, a)
    before = [p.detach().clone() for p in a]
    calls.step()
    calls.zero_grad()
    assert calls.direct_steps == 0 and not any(torch.equal(p, q) for p, q in zip(a, before))
    assert all(p.grad is None for p in a)


def test_gate_buffers_follow_the_schedule_when_unchanged_values_are_not_rewritten():
    """Gates are rewritten only when the scheduled value changes; the buffers still hold the
    path's value at every step (planted: fade4+3->0 is 0.5 to step 4, then 1/3, 1/6, 0)."""
    from circuitfade.model import SoftPriorTransformer
    from circuitfade.train import RunConfig, TrainConfig
    from circuitfade.train.loop import _set_gates_for_step

    cfg = RunConfig(path="fade4+3->0", task={"name": "assoc"}, model={}, train=TrainConfig(steps=12), seed=0)
    model = SoftPriorTransformer(cfg.model_config())
    path, last, writes = cfg.gate_path(), None, []
    orig = model.set_gate_values
    model.set_gate_values = lambda **kw: (writes.append(kw), orig(**kw))[1]
    for step in range(12):
        last = _set_gates_for_step(model, path, step, last)
        expect = 0.5 if step <= 4 else max(0.0, 0.5 * (1 - (step - 4) / 3))
        assert last == pytest.approx(expect)
        assert all(torch.allclose(g, torch.full_like(g, expect)) for g in model.gate_values("effective").values())
    assert len(writes) == 4  # 0.5 once, then 1/3, 1/6, 0 and nothing after


@pytest.mark.slow
def test_the_trainer_keeps_freed_memory_for_reuse_unless_told_not_to(tmp_path):
    """keep_freed_memory sets glibc's mmap and trim thresholds once per process (the trainer calls
    it); CIRCUITFADE_KEEP_HEAP=0 leaves the allocator alone. Checked in fresh processes, through
    mallopt's own answer and by training one step."""
    import os
    import platform
    import subprocess
    import sys

    code = ("from circuitfade.model.devices import keep_freed_memory as k; "
            "from circuitfade.train import RunConfig, TrainConfig, fit, new_run; "
            "fit(new_run(RunConfig(train=TrainConfig(steps=1, eval_size=8))), progress=False); print(k(), k())")
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    for env, want in (({}, glibc), ({"CIRCUITFADE_KEEP_HEAP": "0"}, False)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, **env, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr[-1500:]
        assert out.stdout.split() == [str(want)] * 2


@pytest.mark.parametrize("kw", [{}, {"positional_embedding_type": "standard"}, {"attn_only": False, "d_mlp": 32}])
def test_the_first_block_on_a_token_position_table_computes_the_same_logits(kw, monkeypatch):
    """With more examples than vocabulary entries the first block's LayerNorm and query-key-value
    product run once per (token, position) and are looked up: the logits are those of the batch
    computed row by row, bit for bit; the gradients are summed per table row first (within 1e-5
    of the largest gradient; the key bias's is rounding alone, as softmax ignores it), and the table is really used (a batch smaller than the vocabulary has none)."""
    from circuitfade.model import fused

    task = AssocRecall()
    batch = task.sample(64, torch.Generator().manual_seed(3))  # 64 examples > 32 vocabulary entries
    m = make_model(seed=1, **kw)
    built = []
    table = fused.token_position_table
    monkeypatch.setattr(fused, "token_position_table", lambda *a: built.append(table(*a)) or built[-1])
    loss, grads = _loss_and_grads(m, batch, task, fast=True)
    with torch.no_grad():
        logits = m(batch.model_input)
    assert built and all(t is not None for t in built)
    rows_n = built[0][0].shape[0]
    assert rows_n == (32 if kw.get("positional_embedding_type") != "standard" else 32 * 31)
    monkeypatch.setattr(fused, "token_position_table", lambda *a: None)
    ref_loss, ref_grads = _loss_and_grads(m, batch, task, fast=True)
    with torch.no_grad():
        ref = m(batch.model_input)
    assert torch.equal(logits, ref) and torch.equal(loss, ref_loss)
    scale = max(g.abs().max().item() for g in ref_grads.values())
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, atol=1e-5 * scale, rtol=0, msg=n)
    tokens = batch.model_input
    assert table(tokens[:16], m.W_E, torch.zeros(31, 64)) is None  # 16 examples x 31 positions < 32 x 31 pairs
    assert table(tokens[:1], m.W_E, None) is None  # 31 positions < 32 tokens
    assert table(tokens[:2], m.W_E, None) is not None


def test_lookup_is_advanced_indexing_in_values_and_gradients_bit_for_bit():
    """``lookup`` (one index_select) returns ``table[index]`` and gives the same gradient, with and
    without a member axis (each member's rows from its own table), repeated indices included."""
    from circuitfade.model.priors import lookup

    g = torch.Generator().manual_seed(0)
    for table_shape, index_shape in [((32, 8), (5, 7)), ((3, 32, 8), (3, 5, 7))]:
        table = torch.randn(table_shape, generator=g, requires_grad=True)
        index = torch.randint(0, 32, index_shape, generator=g)
        index[..., 0, :] = 4  # one row gathered many times
        upstream = torch.randn(*index_shape, 8, generator=g)
        ref_table = table.detach().clone().requires_grad_(True)
        if table.dim() == 2:
            ref = ref_table[index]
        else:
            ref = torch.stack([ref_table[e][index[e]] for e in range(table_shape[0])])
        out = lookup(table, index)
        assert torch.equal(out, ref)
        out.backward(upstream)
        ref.backward(upstream)
        assert torch.equal(table.grad, ref_table.grad)


def test_per_token_prior_factors_are_folded_into_the_first_block_table(monkeypatch):
    """The first block's table holds the gated factors of priors that declare them per-token
    (``token_factors``; the content prior does), read per head with the queries and keys: the
    logits equal the batch computation's bit for bit. A prior whose factors depend on position is
    not folded (its factors are computed on the batch and the logits are still equal); declared
    per-token all the same, it is folded and the logits change (the declaration is what the fold
    rests on)."""
    from circuitfade.model import fused, priors

    class PositionalContent(priors.BilinearContentBias):
        """The content factors times (1 + position): not a function of the token alone."""

        def factors(self, inputs):
            a, b = super().factors(inputs)
            w = torch.arange(1, inputs.token_embed.shape[-2] + 1, dtype=a.dtype)
            return a * (w if inputs.query_index is None else w[inputs.query_index])[:, None], b * w[:, None]

    class DeclaredPerToken(PositionalContent):
        token_factors = True  # wrongly

    monkeypatch.setitem(priors.PRIORS, "poscontent", PositionalContent)
    monkeypatch.setitem(priors.PRIORS, "declared", DeclaredPerToken)
    task = AssocRecall()
    batch = task.sample(64, torch.Generator().manual_seed(3))
    folded = []
    real = fused.table_qkv
    monkeypatch.setattr(fused, "table_qkv", lambda *a: (out := real(*a), folded.append(out[3]))[0])
    table = fused.token_position_table

    def logits(m, with_table: bool):
        monkeypatch.setattr(fused, "token_position_table", table if with_table else (lambda *a: None))
        with torch.no_grad():
            return answer_logits(m, batch).nan_to_num()  # NaN where no answer is scored

    for prior, want_folded, equal in (("content", {"content"}, True), ("poscontent", set(), True),
                                      ("declared", {"declared"}, False)):
        m = make_model(seed=2, priors=("pos", prior))
        folded.clear()
        on_table = logits(m, True)
        assert [set(f) for f in folded] == [want_folded], prior
        assert torch.equal(on_table, logits(m, False)) is equal, prior


def test_zero_gated_priors_are_left_out_with_the_values_and_gradients_computing_them_gives(monkeypatch):
    """A prior whose gate is exactly zero (a scheduled buffer, or an override) is left out where
    its term would only add zeros: a bias prior's bias, and the last block's low-rank product. The
    logits, the loss and every gradient are those of computing ``0 · B`` bit for bit (a zero term
    adds nothing; the first block keeps zero columns for the content prior, filled with zeros instead
    of computed, so its query-key product has the same columns), the left-out weights get a zero gradient (not none: AdamW then decays
    them as before), and a short fade trains to the same weights, optimizer state and metrics.
    Learned gates and gates zero on some heads only are never left out."""
    import math

    from circuitfade.model import fused
    from circuitfade.train import RunConfig, TrainConfig, fit, new_run

    assert fused.zero_gated({"pos": torch.zeros(4), "content": torch.tensor([0.0, 0.0, 0.0, 1e-30])}) == {"pos"}
    assert fused.zero_gated({"pos": torch.zeros(4, requires_grad=True)}) == frozenset()
    real = fused.zero_gated
    task = AssocRecall()
    batch = task.sample(64, torch.Generator().manual_seed(3))
    m = make_model(seed=4, gate_modes={"pos": "scheduled", "content": "scheduled"})
    calls = {"pos": [], "content": [], "first content": []}
    last, first = m.attn_layers[-1], m.attn_layers[0]
    for name, prior, method in (("pos", last.priors["pos"], "forward"), ("content", last.priors["content"], "factors"),
                                ("first content", first.priors["content"], "_factors")):
        f = getattr(prior, method)
        monkeypatch.setattr(prior, method, lambda *a, f=f, c=calls[name]: c.append(1) or f(*a))
    for gates in ({"pos": 0.0, "content": 0.0}, {"pos": 0.7, "content": 0.0}):
        m.set_gate_values(**gates)
        for c in calls.values():
            c.clear()
        loss, grads = _loss_and_grads(m, batch, task, fast=True)
        # left out where zero (the first block's table gets zero columns for the content prior)
        assert not calls["content"] and not calls["first content"] and bool(calls["pos"]) == (gates["pos"] > 0)
        monkeypatch.setattr(fused, "zero_gated", lambda gates: frozenset())
        ref_loss, ref_grads = _loss_and_grads(m, batch, task, fast=True)
        monkeypatch.setattr(fused, "zero_gated", real)
        assert calls["content"] and calls["first content"] and torch.equal(loss, ref_loss)
        assert grads.keys() == ref_grads.keys()
        for n, t in ref_grads.items():
            assert torch.equal(grads[n], t), n
            if ".priors.content." in n or (gates["pos"] == 0 and ".priors.pos." in n):
                assert not t.abs().max() > 0, n

    def trained(left_out: bool, zero_gradient: bool = True):
        monkeypatch.setattr(fused, "zero_gated", real if left_out else (lambda gates: frozenset()))
        if not zero_gradient:  # planted: the left-out weights get no gradient at all
            monkeypatch.setattr(fused.ZeroGradient, "apply", lambda x, *weights: x)
        cfg = RunConfig(path="fade3+4->0", train=TrainConfig(steps=60, eval_every=20, eval_size=64))  # zero from step 7
        run = fit(new_run(cfg), progress=False)
        monkeypatch.undo()
        state = [t for s in run.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        return run, {n: p.detach() for n, p in run.model.named_parameters()}, state

    run, params, state = trained(True)
    ref_run, ref_params, ref_state = trained(False)
    assert all(torch.equal(params[n], p) for n, p in ref_params.items())
    assert all(torch.equal(s, r) for s, r in zip(state, ref_state, strict=True))
    for row, ref in zip(run.metrics, ref_run.metrics, strict=True):
        assert all(row[k] == v or (math.isnan(v) and math.isnan(row[k])) for k, v in ref.items()), row["step"]
    # without the zero gradient AdamW would skip the prior's weights after the fade (no decay, no momentum)
    _, frozen, _ = trained(True, zero_gradient=False)
    for w in ("blocks.1.attn.priors.content.W_cq", "blocks.0.attn.priors.content.W_cq"):  # both left out
        assert (frozen[w] - ref_params[w]).abs().max() > 1e-5, w
