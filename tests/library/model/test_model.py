"""SoftPriorTransformer: hooks, gates, equivalences, persistence, bad input (on either TransformerLens line)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformer_lens.utilities import get_act_name

from circuitfade.compat import is_tl4
from circuitfade.io import CheckpointError
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    m = SoftPriorTransformer(SoftPriorConfig(**kw))
    # make the priors non-trivial so that gating them changes the output
    with torch.no_grad():
        for attn in m.attn_layers:
            attn.priors["pos"].pos_bias.normal_(0, 1.0)
    return m


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 32, (4, 31), generator=torch.Generator().manual_seed(1))


def plain(model):
    """The installed line's plain TransformerLens model with ``model``'s backbone weights."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return model.to_plain_model()


def test_default_is_paper_base_model(model):
    cfg = model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.n_ctx, cfg.d_vocab) == (2, 4, 64, 32, 32)
    assert cfg.attn_only and cfg.positional_embedding_type == "none"
    assert not hasattr(model, "pos_embed")  # NoPE: no positional parameters at all
    assert 35_000 <= model.n_params() <= 45_000
    large = SoftPriorConfig.large()
    assert (large.n_layers, large.d_model) == (4, 128)


def test_hook_shapes(model, tokens):
    _, cache = model.run_with_cache(tokens)
    B, P = tokens.shape
    for layer in range(2):
        a = f"blocks.{layer}.attn."
        assert cache[a + "hook_pos_bias"].shape == (4, P, P)
        assert cache[a + "hook_content_bias"].shape == (B, 4, P, P)
        assert cache[a + "hook_gate_pos"].shape == (4,)
        assert cache[a + "hook_gate_content"].shape == (4,)
        assert cache[a + "hook_prior"].shape == (B, 4, P, P)
        assert cache[get_act_name("pattern", layer)].shape == (B, 4, P, P)


def test_prior_is_gated_sum_and_scores_include_it(model, tokens):
    _, cache = model.run_with_cache(tokens)
    a = "blocks.1.attn."
    g_pos, g_con = cache[a + "hook_gate_pos"], cache[a + "hook_gate_content"]
    expected = g_pos[:, None, None] * cache[a + "hook_pos_bias"] + g_con[:, None, None] * cache[a + "hook_content_bias"]
    torch.testing.assert_close(cache[a + "hook_prior"], expected)
    # hook_attn_scores = QK/sqrt(d) + prior on and below the diagonal
    q, k = cache[a + "hook_q"], cache[a + "hook_k"]
    qk = torch.einsum("bqhd,bkhd->bhqk", q, k) / model.cfg.d_head**0.5
    scores = cache[a + "hook_attn_scores"]
    tril = torch.ones(31, 31, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[..., tril], (qk + expected)[..., tril], atol=1e-5, rtol=1e-5)
    assert torch.isinf(scores[..., ~tril]).all()


def test_pos_bias_is_relative(model, tokens):
    _, cache = model.run_with_cache(tokens)
    b = cache["blocks.0.attn.hook_pos_bias"]
    table = model.blocks[0].attn.priors["pos"].pos_bias
    assert torch.equal(b[:, 5, 2], table[:, 3]) and torch.equal(b[:, 10, 7], table[:, 3])


def test_hook_editing_gate_changes_output(model, tokens):
    base = model(tokens)
    out = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_gate_pos", lambda g, hook: g * 0 + 3.0)])
    assert not torch.allclose(base, out)


def test_three_ways_of_zeroing_agree_and_equal_plain_backbone(tokens):
    model = make_model()
    with model.gates(pos=0.0, content=0.0):
        by_ctx = model(tokens)
    by_hook = model.run_with_hooks(tokens, fwd_hooks=model.gate_hooks(pos=0.0, content=0.0))
    sched = make_model(gate_modes={"pos": "scheduled", "content": "scheduled"})
    sched.load_state_dict(model.state_dict())
    sched.set_gate_values(pos=0.0, content=0.0)
    by_schedule = sched(tokens)
    backbone = plain(model)(tokens)
    assert torch.equal(by_ctx, by_schedule)
    torch.testing.assert_close(by_hook, by_ctx, atol=1e-5, rtol=0)
    torch.testing.assert_close(backbone, by_ctx, atol=1e-5, rtol=0)
    # and the gate matters: at the trained gates the logits differ
    assert (model(tokens) - by_ctx).abs().max() > 1e-2


def test_gates_restored_after_exception(model, tokens):
    before = model(tokens)
    with pytest.raises(RuntimeError):
        with model.gates(pos=0.0):
            raise RuntimeError("boom")
    assert torch.equal(model(tokens), before)
    assert all(not a._gate_override for a in model.attn_layers)


def test_per_head_gate_override(model, tokens):
    g = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    with model.gates(pos=g):
        _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.attn.hook_gate_pos"], g[0])
    assert torch.equal(cache["blocks.1.attn.hook_gate_pos"], g[1])
    with pytest.raises(ValueError, match="gate value"):
        with model.gates(pos=torch.zeros(3)):
            pass
    with pytest.raises(ValueError, match="unknown gate"):
        with model.gates(alibi=0.0):
            pass


def test_fused_and_hooked_paths_match_logits_and_grads(tokens):
    m = make_model(seed=3)
    targets = torch.randint(0, 32, tokens.shape)

    def grads(use_fused):
        m.use_fused = use_fused
        m.zero_grad()
        logits = m(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    lf, gf = grads(True)
    lh, gh = grads(False)
    m.use_fused = True
    torch.testing.assert_close(lf, lh, atol=1e-5, rtol=1e-5)
    assert gf.keys() == gh.keys() and len(gf) > 10
    for n in gf:
        torch.testing.assert_close(gf[n], gh[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("mode,expect_update", [("learned", True), ("fixed", False), ("scheduled", False)])
def test_gate_modes(mode, expect_update, tokens):
    m = make_model(gate_modes={"pos": mode, "content": mode})
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)
    logit_before = m.blocks[0].attn.gate_pos_logit.detach().clone()
    table_before = m.blocks[0].attn.priors["pos"].pos_bias.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        m(tokens).logsumexp(-1).mean().backward()
        opt.step()
    changed = not torch.equal(m.blocks[0].attn.gate_pos_logit, logit_before)
    assert changed == expect_update
    assert not torch.equal(m.blocks[0].attn.priors["pos"].pos_bias, table_before)  # tables always train


def test_gate_values_reports_modes():
    m = make_model(gate_modes={"pos": "fixed"}, gate_init=0.25)
    m.set_gate_values(pos=0.1)
    ev = m.gate_values("effective")
    assert torch.allclose(ev["pos"], torch.full((2, 4), 0.1))
    assert torch.allclose(ev["content"], torch.full((2, 4), 0.25))  # learned: sigmoid(logit(0.25))
    assert torch.allclose(m.gate_values("parameter")["pos"], torch.full((2, 4), 0.25))


def test_save_load_roundtrip(tmp_path, model, tokens):
    model.save_pretrained(tmp_path / "m")
    loaded = SoftPriorTransformer.from_pretrained(tmp_path / "m")
    assert torch.equal(loaded(tokens), model(tokens))
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_from_pretrained_honours_dtype_and_refuses_processing_options(tmp_path, model, tokens):
    model.save_pretrained(tmp_path / "m")
    wide = SoftPriorTransformer.from_pretrained(tmp_path / "m", dtype=torch.float64)
    assert wide.cfg.dtype == torch.float64 and wide.W_E.dtype == torch.float64
    assert torch.allclose(wide(tokens).float(), model(tokens), atol=1e-5)
    assert SoftPriorTransformer.from_pretrained(tmp_path / "m", dtype="float64").W_E.dtype == torch.float64
    with pytest.raises(ValueError, match="fold_ln"):
        SoftPriorTransformer.from_pretrained(tmp_path / "m", fold_ln=True)


def test_truncated_weights_raise(tmp_path, model):
    model.save_pretrained(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        SoftPriorTransformer.from_pretrained(tmp_path / "m")


def test_config_weight_mismatch_raises(tmp_path, model):
    model.save_pretrained(tmp_path / "m")
    import json

    p = tmp_path / "m" / "config.json"
    meta = json.loads(p.read_text())
    meta["config"]["d_model"] = 32
    meta["config"]["d_head"] = 8
    p.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        SoftPriorTransformer.from_pretrained(tmp_path / "m")


def test_foreign_directory_raises(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(CheckpointError, match="not a circuitfade model"):
        SoftPriorTransformer.from_pretrained(tmp_path / "x")


def test_bad_tokens_raise(model):
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 32\)"):
        model(torch.tensor([[0, 1, 32]]))
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[-1, 1]]))
    with pytest.raises(ValueError, match="exceeds the context"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 5))
    with pytest.raises(TypeError, match="strings"):
        model("hello")


def test_bad_config_raises():
    with pytest.raises(ValueError, match="gate mode"):
        SoftPriorConfig(gate_modes={"pos": "sometimes"})
    with pytest.raises(ValueError, match="unknown prior"):
        SoftPriorConfig(priors=("pos", "nonsense"))
    with pytest.raises(ValueError, match="positional_embedding_type"):
        SoftPriorConfig(positional_embedding_type="alibi")


def test_standard_positional_backbone_and_mlp(tokens):
    m = make_model(positional_embedding_type="standard", attn_only=False, act_fn="gelu", d_mlp=128)
    with m.gates(pos=0.0, content=0.0):
        ours = m(tokens)
    torch.testing.assert_close(plain(m)(tokens), ours, atol=1e-5, rtol=0)
    m.use_fused = False
    with m.gates(pos=0.0, content=0.0):
        torch.testing.assert_close(m(tokens), ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw,words", [({"dtype": "int8"}, "float32 or float64"), ({"dtype": "float16"}, "half"),
                                      ({"dtype": "bfloat16"}, "half"), ({"attn_only": False, "d_mlp": -3}, "d_mlp")])
def test_config_refuses_dtypes_and_mlp_widths_the_forward_cannot_use(kw, words):
    with pytest.raises(ValueError, match=words):
        SoftPriorConfig(**kw)


@pytest.mark.parametrize("cap", [{"attn_scores_soft_cap": 0.5}, {"output_logits_soft_cap": 0.5}])
def test_soft_caps_apply_on_every_path_as_transformer_lens_applies_them(cap, tokens):
    """A soft cap changes the logits on the fused path, the hooked path and the answer path alike,
    and at zero gates the model equals the plain TransformerLens model with the same cap."""
    torch.manual_seed(0)
    model = SoftPriorTransformer(SoftPriorConfig.base(**cap))
    uncapped = SoftPriorTransformer(SoftPriorConfig.base())
    uncapped.load_state_dict(model.state_dict())
    with torch.no_grad():
        fused = model(tokens)
        hooked, _ = model.run_with_cache(tokens)
        answer = model(tokens, positions=[-1])
        with model.gates(pos=0.0, content=0.0):
            zero = model(tokens)
        ref = plain(model)(tokens)
        free = uncapped(tokens)
    torch.testing.assert_close(fused, hooked, atol=1e-5, rtol=0)
    torch.testing.assert_close(answer[:, -1], fused[:, -1], atol=1e-5, rtol=0)
    torch.testing.assert_close(zero, ref, atol=1e-5, rtol=0)
    assert (fused - free).abs().max() > 1e-3  # the cap did change something
    if "output_logits_soft_cap" in cap:
        assert fused.abs().max() < 0.5 and hooked.abs().max() < 0.5


@pytest.mark.skipif(is_tl4(), reason="the 4.x line's plain model has no shortformer positions to compare with")
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="shortformer positions are added to the residual "
                   "stream, not to the queries' and keys' inputs as TransformerLens adds them (docs/model.md)")
def test_shortformer_positions_are_transformer_lens_s_at_zero_gates(tokens):
    """At zero gates a shortformer model equals the plain TransformerLens model (standard positions,
    the control, do)."""
    torch.manual_seed(0)
    for pos in ("standard", "shortformer"):
        model = SoftPriorTransformer(SoftPriorConfig.base(positional_embedding_type=pos))
        with torch.no_grad(), model.gates(pos=0.0, content=0.0):
            fused = model(tokens)
        with torch.no_grad():
            ref = plain(model)(tokens)
        torch.testing.assert_close(fused, ref, atol=1e-5, rtol=0, msg=pos)


@pytest.mark.skipif(is_tl4(), reason="post_embedding_ln is a TransformerLens 3.x option (the native shell refuses it)")
def test_the_fused_path_reads_the_embedding_after_a_post_embedding_layer_norm(tokens):
    """With post_embedding_ln the token embedding is not W_E[tokens], so the content prior must not
    look it up per vocabulary entry: the fused path equals the hooked path with the priors on."""
    torch.manual_seed(0)
    model = SoftPriorTransformer(SoftPriorConfig.base(post_embedding_ln=True))
    with torch.no_grad():
        fused = model(tokens)
        hooked, _ = model.run_with_cache(tokens)
        answer = model(tokens, positions=[-1])
    torch.testing.assert_close(fused, hooked, atol=1e-5, rtol=0)
    torch.testing.assert_close(answer[:, -1], hooked[:, -1], atol=1e-5, rtol=0)
