"""The continuation signal (Section 3.3): gradient projections onto a circuit's heads.

Known answers: on a planted attention-only model whose attention is uniform and whose
value weights are zero, the zero-gate loss gradient has a closed form (only W_V and b_V
of each head, plus the embeddings, unembedding and output biases, receive gradient), so
the projection onto the circuit's heads is computed here by hand, without autograd.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.continuation import (
    backbone_parameters,
    circuit_heads,
    continuation_signal,
    continuation_trace,
    head_gradient_norms,
    head_slices,
)
from circuitfade.analysis.gates import NoGatesError
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.store.series import CheckpointSeries, Snapshot
from circuitfade.tasks import AssocRecall, AssocRecallConfig, Batch, eval_set
from planted import CopyTask, P, V  # tests/planted.py (tests/conftest.py puts tests/ on sys.path)

torch.set_num_threads(1)

# head_slices finds per-head parameters by their HookedTransformer names (blocks.{l}.attn.W_Q, ...). A
# TransformerLens 4 plain model (a TransformerBridge) has fused q/k/v/o projection weights whose per-head
# W_Q/... are views, not parameters, so gradient projections of plain models are 3.x-only for now: these
# tests are expected to fail on 4.x with that ValueError (strict: they report once the library gains it).
NEEDS_PER_HEAD_PARAMETERS = pytest.mark.xfail(
    compat.is_tl4(), raises=ValueError, strict=True,
    reason="head_gradient_norms on a TransformerBridge: per-head W_Q/W_K/W_V/W_O are views of fused "
           "projection weights, not parameters (continuation.head_slices needs them as parameters)",
)

TASK = AssocRecall(AssocRecallConfig(n_pairs=4, n_keys=6, n_values=6, d_vocab=12, max_len=9))
L, H, D, DH = 2, 3, 6, 2


def planted(seed: int = 0, circuit=((1, 2),), others_write: bool = True):
    """Attention-only, no LayerNorm, float64. W_Q = W_K = b_Q = b_K = 0 (uniform causal
    attention) and W_V = b_V = 0 (every head outputs 0); W_E, W_pos, W_U, b_U, b_O random;
    W_O random for the circuit's heads and, if ``others_write``, for the other heads too
    (else 0, which cuts every other head off from the loss)."""
    model = compat.plain_model(dict(n_layers=L, d_model=D, n_ctx=9, d_head=DH, n_heads=H, d_vocab=12, attn_only=True,
                                    normalization_type=None, positional_embedding_type="standard", dtype=torch.float64))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_E.copy_(torch.randn(model.W_E.shape, generator=g, dtype=torch.float64))
        model.W_pos.copy_(torch.randn(model.W_pos.shape, generator=g, dtype=torch.float64))
        model.W_U.copy_(torch.randn(model.W_U.shape, generator=g, dtype=torch.float64))
        model.b_U.copy_(torch.randn(model.b_U.shape, generator=g, dtype=torch.float64))
        for l in range(L):
            a = model.blocks[l].attn
            a.b_O.copy_(torch.randn(a.b_O.shape, generator=g, dtype=torch.float64))
            for h in range(H):
                if others_write or (l, h) in circuit:
                    a.W_O[h] = torch.randn(DH, D, generator=g, dtype=torch.float64)
    return model.eval()


def hand_gradient(model, batch: Batch) -> tuple[np.ndarray, float]:
    """Per-head squared gradient norms and the total squared norm, in closed form (numpy)."""
    f = lambda t: t.detach().numpy().astype(np.float64)  # noqa: E731
    tok, P = batch.tokens.numpy(), batch.tokens.shape[1]
    WE, Wpos, WU, bU = f(model.W_E), f(model.W_pos), f(model.W_U), f(model.b_U)
    bO = [f(model.blocks[l].attn.b_O) for l in range(L)]
    WO = [f(model.blocks[l].attn.W_O) for l in range(L)]
    x0 = WE[tok] + Wpos[None, :P]  # [B, P, D]
    x = [x0 + sum(bO[:l], np.zeros(D)) for l in range(L)]  # residual into layer l (all heads output 0)
    final = x0 + bO[0] + bO[1]
    logits = final @ WU + bU
    mask = batch.answer_mask.numpy()
    tgt = batch.targets.numpy()
    N = mask.sum()
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = np.zeros_like(p)
    b_idx, p_idx = np.nonzero(mask)
    y[b_idx, p_idx, tgt[b_idx, p_idx]] = 1.0
    dlogits = (p - y) * mask[..., None] / N
    delta = dlogits @ WU.T  # dL/d(final residual)
    A = np.tril(np.ones((P, P))) / np.arange(1, P + 1)[:, None]  # uniform causal attention, A[i, j]
    sq = np.zeros((L, H))
    for l in range(L):
        for h in range(H):
            dz = delta @ WO[l][h].T  # [B, P, DH]: dL/dz_i
            back = np.einsum("ij,bid->bjd", A, dz)  # Σ_i A_ij dz_i
            dWV = np.einsum("bjm,bjd->md", x[l], back)
            dbV = dz.sum((0, 1))
            sq[l, h] = (dWV**2).sum() + (dbV**2).sum()  # W_Q, W_K, b_Q, b_K, W_O get exactly 0
    dWU = np.einsum("bpm,bpv->mv", final, dlogits)
    dbU = dlogits.sum((0, 1))
    dbO = delta.sum((0, 1))  # the same for both layers' b_O
    dWE = np.zeros_like(WE)
    np.add.at(dWE, tok, delta)
    dWpos = np.zeros_like(Wpos)
    dWpos[:P] = delta.sum(0)
    total = sq.sum() + (dWU**2).sum() + (dbU**2).sum() + 2 * (dbO**2).sum() + (dWE**2).sum() + (dWpos**2).sum()
    return sq, float(total)


@NEEDS_PER_HEAD_PARAMETERS
def test_head_gradient_norms_equal_the_hand_computed_gradient():
    model = planted(0)
    batch = eval_set(TASK, 64, seed=3)
    sq, total = head_gradient_norms(model, batch, TASK, gates=None)
    ref_sq, ref_total = hand_gradient(model, batch)
    assert ref_sq.min() > 1e-8  # every head gets gradient: the check is not vacuous
    np.testing.assert_allclose(sq.numpy(), ref_sq, rtol=1e-5)
    assert total == pytest.approx(ref_total, rel=1e-5)


@NEEDS_PER_HEAD_PARAMETERS
def test_projection_on_a_given_circuit_equals_hand_computed():
    model = planted(1)
    batch = eval_set(TASK, 64, seed=4)
    circuit = [(0, 1), (1, 2)]
    ref_sq, ref_total = hand_gradient(model, batch)
    sig = continuation_signal(model, batch, TASK, heads=circuit, gates=None, n_random=0)
    ref_norm = math.sqrt(ref_sq[0, 1] + ref_sq[1, 2])
    assert sig["heads"] == "L0H1+L1H2" and sig["k"] == 2
    assert sig["circuit_norm"] == pytest.approx(ref_norm, rel=1e-5)
    assert sig["total_norm"] == pytest.approx(math.sqrt(ref_total), rel=1e-5)
    assert sig["circuit_share"] == pytest.approx(ref_norm / math.sqrt(ref_total), rel=1e-5)
    # each head owns 3*D*DH + 3*DH + DH*D = 4*D*DH + 3*DH coordinates (b_O belongs to none)
    n_total = sum(p.numel() for p in model.parameters())
    assert sig["param_share"] == pytest.approx(2 * (4 * D * DH + 3 * DH) / n_total)
    assert math.isnan(sig["random_mean"]) and math.isnan(sig["p_random"])


@NEEDS_PER_HEAD_PARAMETERS
def test_random_baseline_when_only_the_circuit_receives_gradient():
    # other heads write nothing (W_O = 0) and read nothing (W_V = 0): their gradient is exactly 0,
    # so a random single head has the circuit's share with probability 1/6 and share 0 otherwise
    model = planted(2, circuit=((1, 0),), others_write=False)
    batch = eval_set(TASK, 64, seed=5)
    sq, _ = head_gradient_norms(model, batch, TASK, gates=None)
    assert (sq > 0).sum() == 1 and sq[1, 0] > 0
    sig = continuation_signal(model, batch, TASK, heads=[(1, 0)], gates=None, n_random=600, seed=0)
    assert 0.12 < sig["p_random"] < 0.22  # ~ Binomial(600, 1/6) / 600
    assert sig["random_mean"] == pytest.approx(sig["circuit_share"] * sig["p_random"], rel=1e-9)
    assert sig["share_ratio"] == pytest.approx(1 / sig["p_random"], rel=1e-9)
    again = continuation_signal(model, batch, TASK, heads=[(1, 0)], gates=None, n_random=600, seed=0)
    assert again == sig  # seeded baseline
    other = continuation_signal(model, batch, TASK, heads=[(0, 0)], gates=None, n_random=50)
    assert other["circuit_norm"] == 0.0 and other["p_random"] == 1.0


# ------------------------------------------------------------------- default circuit




def copy_model():
    """1 layer x 3 heads; head 2 attends from the last position to position 0 and copies
    the token (the circuit); head 0 copies weakly with uniform attention; head 1 is zero."""
    model = compat.plain_model(dict(n_layers=1, d_model=2 * V + P, n_ctx=P, d_head=V, n_heads=3, d_vocab=V,
                                    attn_only=True, normalization_type=None, positional_embedding_type="standard"))
    tok, pos, out = torch.arange(V), torch.arange(P), torch.arange(V + P, 2 * V + P)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_E[tok, tok] = 1.0
        model.W_pos[pos, V + pos] = 1.0
        model.W_U[out, tok] = 1.0
        a = model.blocks[0].attn
        a.W_Q[2, V + P - 1, 0] = 10.0
        a.W_K[2, V + 0, 0] = 10.0
        for h, w in ((0, 0.1), (2, 1.0)):
            a.W_V[h, tok, tok] = 1.0
            a.W_O[h, tok, out] = w
    return model.eval()


def test_default_circuit_is_the_most_important_head():
    task, model = CopyTask(), copy_model()
    batch = eval_set(task, 128, seed=1)
    assert circuit_heads(model, batch, task, k=1, gates=None) == [(0, 2)]
    assert circuit_heads(model, batch, task, k=2, gates=None)[0] == (0, 2)


@NEEDS_PER_HEAD_PARAMETERS
def test_continuation_signal_defaults_to_the_most_important_head():
    task, model = CopyTask(), copy_model()
    batch = eval_set(task, 128, seed=1)
    sig = continuation_signal(model, batch, task, k=1, gates=None, importance_gates=None, n_random=10)
    assert sig["heads"] == "L0H2"
    given = continuation_signal(model, batch, task, heads=[(0, 2)], gates=None, n_random=10)
    assert given["circuit_norm"] == sig["circuit_norm"]


# ------------------------------------------------------------------- soft-prior models
def soft_prior_model() -> SoftPriorTransformer:
    torch.manual_seed(3)
    model = SoftPriorTransformer(SoftPriorConfig(d_model=16, d_head=4, n_ctx=9, d_vocab=12, dtype=torch.float64))
    with torch.no_grad():
        for a in model.attn_layers:
            a.priors["pos"].pos_bias.normal_(0, 3.0)
    return model


def test_soft_prior_model_backbone_only_and_untouched():
    model = soft_prior_model()
    model.train()
    batch = eval_set(TASK, 32, seed=6)
    sq, total = head_gradient_norms(model, batch, TASK)  # default: zero gates
    assert model.training and all(p.grad is None for p in model.parameters())
    prior = {n for n, _ in model.prior_parameters()}
    assert prior and not (prior & set(backbone_parameters(model)))
    # naive: backward at zero gates, sum squares of the backbone parameters' grads
    model.eval()
    with model.gates(pos=0.0, content=0.0):
        TASK.loss(model(batch.tokens), batch).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    ref_total = sum(float((grads[n].double() ** 2).sum()) for n in backbone_parameters(model) if grads[n] is not None)
    assert total == pytest.approx(ref_total, rel=1e-9)
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            ref = sum(float((grads[f"blocks.{l}.attn.{w}"][h].double() ** 2).sum())
                      for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"))
            assert float(sq[l, h]) == pytest.approx(ref, rel=1e-9)
    # the gates matter: at the learned gates the gradient differs
    sq_normal, _ = head_gradient_norms(model, batch, TASK, gates="normal")
    assert not torch.allclose(sq, sq_normal)


def test_head_slices_cover_each_head_parameter_once():
    model = soft_prior_model()
    sl = head_slices(model)
    assert len(sl) == model.cfg.n_layers * model.cfg.n_heads
    assert all(len(v) == 7 for v in sl.values())
    assert all(not n.endswith("b_O") for v in sl.values() for n, _ in v)


@NEEDS_PER_HEAD_PARAMETERS
def test_trace_over_a_series():
    models = {0: planted(0), 300: planted(1)}
    series = CheckpointSeries([Snapshot(s, (lambda m=m: m), f"planted {s}") for s, m in models.items()], task=TASK)
    batch = eval_set(TASK, 32, seed=7)
    tr = continuation_trace(series, batch=batch, heads=[(1, 2)], gates=None, importance_gates=None, n_random=20)
    assert list(tr.step) == [0, 300] and set(tr.heads) == {"L1H2"}
    for step, m in models.items():
        ref_sq, _ = hand_gradient(m, batch)
        assert tr.set_index("step").circuit_norm[step] == pytest.approx(math.sqrt(ref_sq[1, 2]), rel=1e-5)
    # heads="final": the last checkpoint's most important heads, held fixed
    task, cm = CopyTask(), copy_model()
    s2 = CheckpointSeries([Snapshot(0, planted_copy_untrained, "zero"), Snapshot(10, lambda: cm, "copy")], task=task)
    tr2 = continuation_trace(s2, heads="final", k=1, gates=None, n_random=5)
    assert list(tr2.heads) == ["L0H2", "L0H2"]
    only = continuation_trace(s2, steps=[10], heads=[(0, 0)], gates=None, n_random=0)
    assert list(only.step) == [10]


def planted_copy_untrained():
    m = copy_model()
    with torch.no_grad():
        m.blocks[0].attn.W_O.zero_()
    return m


def test_bad_input():
    model = planted(0)
    batch = eval_set(TASK, 8)
    with pytest.raises(ValueError, match="outside the model"):
        continuation_signal(model, batch, TASK, heads=[(2, 0)], gates=None)
    with pytest.raises(ValueError, match="duplicate"):
        continuation_signal(model, batch, TASK, heads=[(0, 0), (0, 0)], gates=None)
    with pytest.raises(ValueError, match="at least one"):
        continuation_signal(model, batch, TASK, heads=[], gates=None)
    with pytest.raises(ValueError, match="exceeds"):
        circuit_heads(model, batch, TASK, k=7, gates=None)
    with pytest.raises(ValueError, match="n_random"):
        continuation_signal(model, batch, TASK, heads=[(0, 0)], gates=None, n_random=-1)
    series = CheckpointSeries([Snapshot(0, lambda: model, "m")])
    with pytest.raises(ValueError, match="no task"):
        continuation_trace(series)


@NEEDS_PER_HEAD_PARAMETERS
def test_zero_gates_are_refused_on_a_plain_model():
    with pytest.raises(NoGatesError):
        head_gradient_norms(planted(0), eval_set(TASK, 8), TASK)  # plain model: zero gates do not apply
