"""Tests for the attention-prior interface and the prior zoo (circuitfade.model.priors, circuitfade.model.zoo).

For every registered prior: shape, finiteness, causality (changing future tokens
never changes past logits), the gate multiplies the bias (g = 0 gives exactly the
backbone; ``hook_prior = g · hook_<name>_bias``), gradients reach its parameters.
Closed forms: ALiBi slopes and bias, KERPLE log/power, T5 buckets, FIRE with an
identity MLP, CoPE counting, DAPE with a zero MLP, GPSA's local Gaussian.
"""

from __future__ import annotations

import math

import pytest
import torch

from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.model.zoo import alibi_slopes, t5_bucket
from circuitfade.model.priors import PRIORS, PriorInputs, build_prior


torch.set_num_threads(1)

ALL = sorted(PRIORS)
ZOO = [p for p in ALL if p not in ("pos", "content")]
H, N = 4, 32


def _model(name: str, fixed_one: bool = False, randomize: bool = False, seed: int = 0) -> SoftPriorTransformer:
    kw = dict(priors=(name,), seed=seed)
    if fixed_one:
        kw.update(gate_modes={name: "fixed"}, gate_init=1.0)
    model = SoftPriorTransformer(SoftPriorConfig(**kw))
    if randomize:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for block in model.blocks:
                for p in block.attn.priors.parameters():
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def _tokens(batch: int = 2, n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (batch, n), generator=torch.Generator().manual_seed(seed))


def _inputs(cfg, batch: int, n: int, seed: int = 0) -> PriorInputs:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, cfg.d_model, generator=g)
    scores = torch.randn(batch, cfg.n_heads, n, n, generator=g)
    return PriorInputs(token_embed=x, resid=x, scores=scores)


def _prior_params(model: SoftPriorTransformer, name: str) -> dict[str, torch.nn.Parameter]:
    return {k: p for k, p in model.named_parameters() if f".attn.priors.{name}." in k}


# -- every prior ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n", [5, N])
def test_shape_finite_and_zero_above_diagonal(name, n):
    cfg = SoftPriorConfig(priors=(name,))
    prior = build_prior(name, cfg, layer=0)
    bias = prior(_inputs(cfg, batch=3, n=n))
    assert bias.shape[0] in (1, 3) and bias.shape[1:] == (H, n, n)
    assert torch.isfinite(bias).all()
    if name in ZOO:  # the zoo fills masked entries with exactly 0
        assert (bias.triu(1) == 0).all()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("fused", [True, False])
def test_causal_consistency(name, fused):
    model = _model(name, fixed_one=True, randomize=True)
    model.use_fused = fused
    t = 11
    a = _tokens(seed=1)
    b = a.clone()
    b[:, t:] = _tokens(seed=2)[:, t:]
    assert (a[:, t:] != b[:, t:]).any()
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :t], lb[:, :t], atol=1e-5, rtol=0)
    assert not torch.allclose(la[:, t:], lb[:, t:])  # the future did change


@pytest.mark.parametrize("name", ALL)
def test_zero_gate_is_exactly_the_backbone(name):
    model = _model(name, randomize=True)
    tokens = _tokens()
    with torch.no_grad():
        ref = model.to_plain_model()(tokens)
        with model.gates(**{name: 0.0}):
            fused = model(tokens)
            hooked, _ = model.run_with_cache(tokens)
        full = model(tokens)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(hooked, ref, atol=1e-5, rtol=0)
    assert (full - ref).abs().max() > 1e-3  # the randomised prior does matter at its own gate


@pytest.mark.parametrize("name", ALL)
def test_hook_prior_is_gate_times_bias(name):
    model = _model(name, randomize=True)
    tokens = _tokens()
    g = torch.tensor([0.3, 0.1, 0.7, 1.0])
    with torch.no_grad(), model.gates(**{name: g}):
        _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        bias = cache[f"blocks.{layer}.attn.hook_{name}_bias"]
        if bias.dim() == 3:  # batch-independent biases are exposed as [head, q, k]
            bias = bias.unsqueeze(0)
        prior = cache[f"blocks.{layer}.attn.hook_prior"]
        assert prior.shape == (2, H, N, N)
        torch.testing.assert_close(prior, (g[:, None, None] * bias).expand_as(prior), atol=1e-6, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_gate_{name}"], g)


@pytest.mark.parametrize("name", ALL)
def test_gradients_reach_prior_parameters(name):
    # from the default init (zero-initialised tables must still receive gradient)
    model = _model(name)
    model(_tokens(), return_type="loss").backward()
    params = _prior_params(model, name)
    if name == "alibi":
        assert params == {}
    for k, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), k
        assert p.grad.abs().sum() > 0, k
    # with a nonzero bias, the learned gate's logit gets gradient too
    model = _model(name, randomize=True)
    model(_tokens(), return_type="loss").backward()
    for layer, block in enumerate(model.blocks):
        grad = getattr(block.attn, f"gate_{name}_logit").grad
        assert grad is not None and (grad.abs() > 0).all(), layer


# -- closed forms ---------------------------------------------------------------------------
def test_alibi_slopes_and_bias():
    assert alibi_slopes(4) == [2**-2, 2**-4, 2**-6, 2**-8]
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    # not a power of two: slopes of 4 heads, then every other slope of 8 heads
    assert alibi_slopes(6) == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    cfg = SoftPriorConfig(priors=("alibi",))
    bias = build_prior("alibi", cfg, 0)(_inputs(cfg, 1, 8))[0]
    slopes = torch.tensor(alibi_slopes(4))
    torch.testing.assert_close(bias[:, 5, 2], -3 * slopes)
    torch.testing.assert_close(bias[:, 7, 0], -7 * slopes)
    assert (bias.diagonal(dim1=1, dim2=2) == 0).all()


def test_kerple_log_closed_form():
    cfg = SoftPriorConfig(priors=("kerple_log",))
    prior = build_prior("kerple_log", cfg, 0)
    r1, r2 = torch.tensor([0.5, 1.0, 2.0, 3.0]), torch.tensor([0.1, 0.5, 1.0, 2.0])
    prior.set_params(r1, r2)
    torch.testing.assert_close(prior.r1.detach(), r1)
    torch.testing.assert_close(prior.r2.detach(), r2)
    bias = prior(_inputs(cfg, 1, 10))[0]
    for i, j in [(5, 2), (9, 0), (4, 4)]:
        d = i - j
        torch.testing.assert_close(bias[:, i, j], -r1 * torch.log(1 + r2 * d))
    torch.testing.assert_close(bias[1, 5, 2], torch.tensor(-math.log(2.5)))


def test_kerple_power_closed_form():
    cfg = SoftPriorConfig(priors=("kerple_power",))
    prior = build_prior("kerple_power", cfg, 0)
    r1, r2 = torch.tensor([0.5, 1.0, 2.0, 3.0]), torch.tensor([0.5, 1.0, 1.5, 1.9])
    prior.set_params(r1, r2)
    torch.testing.assert_close(prior.r2.detach(), r2)
    bias = prior(_inputs(cfg, 1, 10))[0]
    for i, j in [(5, 2), (9, 0), (1, 0)]:
        torch.testing.assert_close(bias[:, i, j], -r1 * float(i - j) ** r2)
    assert (bias.diagonal(dim1=1, dim2=2) == 0).all()
    torch.testing.assert_close(bias[1, 5, 2], torch.tensor(-3.0))
    with pytest.raises(ValueError, match="r2"):
        prior.set_params(1.0, 2.5)


def test_t5_buckets():
    d = torch.tensor([0, 1, 15, 16, 31, 127, 128, 1000])
    # exact below 16; 16 + floor(log(d/16) / log(8) * 16) above, capped at 31
    assert t5_bucket(d).tolist() == [0, 1, 15, 16, 21, 31, 31, 31]
    cfg = SoftPriorConfig(priors=("t5",))
    prior = build_prior("t5", cfg, 0)
    with torch.no_grad():
        prior.rel_bias.copy_(torch.arange(32.0).expand(H, 32))
    bias = prior(_inputs(cfg, 1, N))[0]
    assert bias[2, 31, 0] == 21 and bias[0, 20, 10] == 10 and bias[3, 30, 10] == 17


def test_fire_closed_form_with_identity_mlp():
    cfg = SoftPriorConfig(priors=("fire",))
    prior = build_prior("fire", cfg, 0)
    with torch.no_grad():  # f(x) = relu(x) for every head
        for p in prior.mlp.parameters():
            p.zero_()
        prior.mlp[0].weight[0, 0] = 1.0
        prior.mlp[2].weight[:, 0] = 1.0
    bias = prior(_inputs(cfg, 1, N))[0]
    c, L = 0.1, N / 4  # paper init c = 0.1; L = n_ctx / 4 = 8

    def fire(i, j):
        return math.log(1 + c * (i - j)) / (math.log(1 + c * max(L, i)) + 1e-6)

    for i, j in [(20, 5), (3, 1), (31, 0), (7, 7)]:
        torch.testing.assert_close(bias[:, i, j], torch.full((H,), fire(i, j)))


def test_cope_counts_gated_positions():
    cfg = SoftPriorConfig(priors=("cope",))
    prior = build_prior("cope", cfg, 0)
    with torch.no_grad():  # e_h[p] = p, so the bias is the contextual position itself
        prior.cope_bias.copy_(torch.arange(N + 1.0).expand(H, N + 1))
    n = 8
    x = torch.zeros(1, n, cfg.d_model)
    # scores 0 -> every gate 1/2 -> p_ij = (i - j + 1) / 2 (interpolated between integers)
    bias = prior(PriorInputs(x, x, torch.zeros(1, H, n, n)))[0]
    i, j = torch.tril_indices(n, n)
    torch.testing.assert_close(bias[:, i, j], ((i - j + 1) / 2.0).float().expand(H, -1))
    # only even keys "count" (gate ~1), odd keys don't (gate ~0): p_ij = #even k in [j, i]
    counted = (torch.arange(n) % 2 == 0).float()
    scores = (40 * counted - 20).expand(1, H, n, n)
    bias = prior(PriorInputs(x, x, scores))[0]
    expected = torch.tensor([[counted[jj : ii + 1].sum() for jj in range(n)] for ii in range(n)]).tril()
    torch.testing.assert_close(bias, expected.expand(H, n, n), atol=1e-6, rtol=0)


def test_dape_is_kerple_plus_pointwise_mlp():
    cfg = SoftPriorConfig(priors=("dape",))
    prior = build_prior("dape", cfg, 0)
    inputs = _inputs(cfg, 2, 9)
    # the MLP acts at each (i, j) across heads: perturbing one score moves one entry
    before = prior(inputs)
    scores = inputs.scores.clone()
    scores[1, 2, 6, 3] += 5.0
    after = prior(PriorInputs(inputs.token_embed, inputs.resid, scores))
    changed = (after - before).abs().amax(dim=1) > 0  # [batch, q, k]
    assert changed.nonzero().tolist() == [[1, 6, 3]]
    # with a zero output layer, DAPE is exactly its KERPLE-log base bias
    with torch.no_grad():
        prior.mlp[2].weight.zero_()
        prior.mlp[2].bias.zero_()
        prior.base.set_params(1.0, 0.5)
    bias = prior(inputs)
    assert bias.shape == (2, H, 9, 9)
    torch.testing.assert_close(bias[1, :, 5, 2], torch.full((H,), -math.log(2.5)))


def test_gpsa_is_a_local_log_attention_map():
    cfg = SoftPriorConfig(priors=("gpsa",))
    bias = build_prior("gpsa", cfg, 0)(_inputs(cfg, 1, N))[0]
    probs = bias.exp().tril()
    torch.testing.assert_close(probs.sum(-1), torch.ones(H, N))  # log of a distribution over j <= i
    assert (bias <= 1e-6).all()
    for h in range(H):  # ConViT locality init: head h peaks at offset i - j = h
        for i in range(h, N):
            assert int(probs[h, i].argmax()) == i - h


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power", "fire", "dape"])
def test_random_prior_init_is_reproducible_from_the_seed(name):
    a = SoftPriorTransformer(SoftPriorConfig(priors=(name,), seed=3))
    b = SoftPriorTransformer(SoftPriorConfig(priors=(name,), seed=3))
    c = SoftPriorTransformer(SoftPriorConfig(priors=(name,), seed=4))
    pa, pb, pc = (_prior_params(m, name) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], pc[k]) for k in pa)
    layer0, layer1 = (a.blocks[i].attn.priors[name] for i in (0, 1))
    assert any(not torch.equal(x, y) for x, y in zip(layer0.parameters(), layer1.parameters()))


# -- per_token: a prior linear in the token embedding, computed per vocabulary entry --------------
def test_per_token_looks_up_the_same_values_the_embedding_product_gives():
    from dataclasses import replace

    from circuitfade.model.priors import per_token

    g = torch.Generator().manual_seed(0)
    V, D, n_out, E = 7, 16, 12, 3
    W_E = torch.randn(E, V, D, generator=g, requires_grad=True)
    w = torch.randn(E, D, n_out, generator=g, requires_grad=True)
    tokens = torch.randint(0, V, (E, 5, 9), generator=g)
    embed = W_E.reshape(E * V, D)[tokens + (torch.arange(E) * V).view(E, 1, 1)]  # as the stacked model embeds
    looked = PriorInputs(embed, embed, tokens=tokens, W_E=W_E)
    plain = replace(looked, tokens=None, W_E=None)
    for e in range(E):  # one member: the single model's case
        single = PriorInputs(embed[e], embed[e], tokens=tokens[e], W_E=W_E[e])
        assert torch.equal(per_token(single, w[e]), embed[e] @ w[e])  # the same dot products, bit for bit
    assert torch.equal(per_token(looked, w), torch.bmm(embed.reshape(E, -1, D), w).view(E, 5, 9, n_out))
    assert torch.equal(per_token(looked, w), per_token(plain, w))
    # gradients: summed per token rather than per position, equal up to float rounding
    grads = [torch.autograd.grad(per_token(x, w).square().sum(), (W_E, w)) for x in (looked, plain)]
    for a, b in zip(*grads):
        assert float((a - b).abs().max()) <= 1e-6 * float(a.abs().max())
    # a vocabulary as large as batch * pos: the product on the embeddings, as without tokens
    wide = replace(looked, tokens=tokens[:, :1, :3])
    assert torch.equal(per_token(replace(wide, token_embed=embed[:, :1, :3]), w),
                       torch.bmm(embed[:, :1, :3].reshape(E, -1, D), w).view(E, 1, 3, n_out))


def test_the_content_prior_gives_the_fused_path_the_same_logits_with_and_without_its_table():
    """The fused forward looks the content factors up per token; the hooked path (no token ids
    handed to the priors) computes them on the embeddings: the same content bias bit for bit."""
    model = _model("content", fixed_one=True, randomize=True)
    tokens = _tokens(batch=8, n=N)  # 32 tokens of a 32-entry vocabulary per row: 256 > 32, the table is used
    attn = model.blocks[0].attn
    embed = model.W_E[tokens]
    looked = PriorInputs(embed, embed, tokens=tokens, W_E=model.W_E)
    plain = PriorInputs(embed, embed)
    assert torch.equal(attn.priors["content"](looked), attn.priors["content"](plain))
