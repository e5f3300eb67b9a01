"""The soft-prior model is the same model on TransformerLens 3.9 and 4.x.

Two kinds of proof:

* on the installed line (``make test`` runs 3.9, ``make test-tl4`` runs 4.3): the
  fixture written on 3.9 (``data/make_soft_prior_fixture.py``) is reproduced here - for
  ten configurations (NoPE, priors off, learned positions with LayerNorm and a GELU MLP,
  rotary with ALiBi, shortformer with LNPre, the published priors, RMS with a seed,
  ``use_attn_result`` without norm, real inputs, scheduled/fixed gates) the 3.9 config
  JSON reads, ``torch.manual_seed`` gives the 3.9 initial weights, the same weights give
  the 3.9 logits and gradients on the fused, hooked and answer-position paths and at
  zero gates (to 1e-5), and ``run_with_cache`` fires the same hooks with the same shapes;
  a tiny 3.9 run directory resumes here to the 3.9 metrics, and a run trained here from
  the same seed has them too (the 200-step base-model run in the slow test);
* on 3.9 only: the native shell that 4.x uses (``circuitfade.model.native``) and the
  ``HookedTransformer`` shell agree *bit for bit* in one process (initialisation, state
  dict order, logits, gradients, caches), the shared attention arithmetic equals
  TransformerLens's ``Attention`` methods, and the backbone's config, components,
  activations and initialisation equal TransformerLens 3.9's.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

import soft_prior_cases as C  # tests/tl4/soft_prior_cases.py
import tolerances as T  # tests/tolerances.py: what a file from another machine may differ by
from circuitfade import compat
from circuitfade.io import load_tensors, read_json
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

pytestmark = [pytest.mark.tl4, pytest.mark.numerics]
torch.set_num_threads(1)
tl3_only = pytest.mark.skipif(compat.is_tl4(), reason="compares with TransformerLens 3.9's own classes")

DATA = Path(__file__).with_name("data")
ATOL = T.OUTPUTS["atol"]  # across machines (CPU kernels may differ); on one machine the lines agree bit for bit


@pytest.fixture(scope="module")
def fixture():
    return load_tensors(DATA / "soft_prior_39.safetensors"), read_json(DATA / "soft_prior_39.json")


def _group(tensors: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


# ------------------------------------------------------------------ fixture written on 3.9
def test_fixture_was_written_on_39(fixture):
    _, meta = fixture
    assert meta["transformer_lens"].startswith("3.9") and set(meta["cases"]) == set(C.CASES)


@pytest.mark.parametrize("name", list(C.CASES))
def test_39_config_json_reads_and_writes_back_the_same(fixture, name):
    _, meta = fixture
    written = meta["cases"][name]["config"]
    cfg = SoftPriorConfig.from_json_dict(written, source="fixture")
    assert cfg.to_json_dict() == written  # same fields, same derived values (d_vocab_out, attn_scale, ...)
    here = {k: v for k, v in C.config(name).to_json_dict().items() if k != "device"}
    assert here == {k: v for k, v in written.items() if k != "device"}  # this line derives the same config


@pytest.mark.parametrize("name", list(C.CASES))
def test_seeded_initialisation_is_the_39_one(fixture, name):
    tensors, meta = fixture
    model = C.build(name, cfg=SoftPriorConfig.from_json_dict(meta["cases"][name]["config"]))
    expected = _group(tensors, f"{name}/init/")
    got = model.state_dict()
    assert list(got) == meta["cases"][name]["state_dict_keys"]  # names and order (optimizer state lines up by position)
    assert set(got) == set(expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, **T.INIT, msg=k)  # a few ulps across CPUs (tests/tolerances.py)


def test_the_initialisation_comparison_can_fail(fixture):
    """Planted: another seed's initial weights fail the cross-machine tolerance the test above uses."""
    tensors, meta = fixture
    name = "standard_ln_gelu_mlp"
    cfg = SoftPriorConfig.from_json_dict({**meta["cases"][name]["config"], "seed": 12345})
    got = C.build(name, cfg=cfg).state_dict()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got["blocks.0.attn.W_Q"], tensors[f"{name}/init/blocks.0.attn.W_Q"], **T.INIT)


@pytest.mark.parametrize("name", list(C.CASES))
def test_same_weights_give_the_39_logits_gradients_and_hooks(fixture, name):
    tensors, meta = fixture
    model = SoftPriorTransformer(SoftPriorConfig.from_json_dict(meta["cases"][name]["config"]))
    model.load_weights(_group(tensors, f"{name}/weights/"))
    x = tensors[f"{name}/inputs"]
    got = C.outputs(model, x)
    expected = {k: v for k, v in _group(tensors, f"{name}/").items()
                if k.startswith(("logits_", "grad_"))}
    assert set(got) == set(expected)
    assert any(k.startswith("grad_rows/") for k in got) and len([k for k in got if k.startswith("grad_")]) > 30
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, atol=ATOL, rtol=1e-4, equal_nan=True, msg=k)
    assert C.hook_shapes(model, x) == meta["cases"][name]["hooks"]


def test_gates_matter_in_the_fixture_so_the_comparison_can_fail(fixture):
    tensors, _ = fixture
    on, off = tensors["nope_pos_content/logits_fused"], tensors["nope_pos_content/logits_zero_gates"]
    assert (on - off).abs().max() > 1e-2
    assert torch.isnan(tensors["nope_pos_content/logits_rows"][:, 0]).all()  # only the answer rows computed


def test_a_mismatching_output_is_detected(fixture):
    """Planted: a model whose one bias is off by 1e-3 fails the comparison the tests make."""
    tensors, meta = fixture
    name = "standard_ln_gelu_mlp"
    model = SoftPriorTransformer(SoftPriorConfig.from_json_dict(meta["cases"][name]["config"]))
    sd = _group(tensors, f"{name}/weights/")
    sd["blocks.1.attn.b_V"] = sd["blocks.1.attn.b_V"] + 1e-3
    model.load_weights(sd)
    got = C.outputs(model, tensors[f"{name}/inputs"])
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got["logits_hooked"], tensors[f"{name}/logits_hooked"], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("name", ["nope_pos_content", "standard_ln_gelu_mlp", "rotary_alibi", "rms_seeded_gelu_new"])
def test_plain_model_of_the_line_equals_the_model_at_zero_gates(name):
    """``to_plain_model``: a ``HookedTransformer`` on 3.x, a ``TransformerBridge`` on 4.x (rotary
    features reordered for the bridge's pairing); with every gate at zero, the same logits."""
    model = C.build(name)
    C.perturb(model)
    x = C.inputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        plain = model.to_plain_model()
    assert type(plain).__name__ == ("TransformerBridge" if compat.is_tl4() else "HookedTransformer")
    with torch.no_grad():
        ref = plain(x)
        with model.gates(**{p: 0.0 for p in model.cfg.priors}):
            torch.testing.assert_close(model(x), ref, atol=ATOL, rtol=1e-5)
        assert (model(x) - ref).abs().max() > 1e-3  # the priors matter at the trained gates


# ------------------------------------------------------------------ training across lines
def _metrics(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def _assert_same_metrics(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns) and list(got["step"]) == list(expected["step"])
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-5, atol=1e-6)


def test_a_run_directory_written_on_39_resumes_here_to_the_39_result(tmp_path):
    from circuitfade.train import RunConfig, train

    run = tmp_path / "run"
    shutil.copytree(DATA / "run39", run)
    for f in (run / "checkpoints").glob("step_000024*"):
        f.unlink()
    (run / "done.json").unlink()
    train(RunConfig(**C.RUN_CONFIG), run, progress=False)
    _assert_same_metrics(_metrics(run / "metrics.csv"), _metrics(DATA / "run39" / "metrics.csv"))
    want = load_tensors(DATA / "run39" / "checkpoints" / "step_000024.safetensors")
    got = load_tensors(run / "checkpoints" / "step_000024.safetensors")
    assert sorted(got) == sorted(want)  # (a safetensors file does not keep the order of empty tensors)
    steps_resumed = C.RUN_CONFIG["train"]["steps"] - 12
    lr = RunConfig(**C.RUN_CONFIG).train.lr
    for k in want:
        if T.has_zero_gradient(k):  # rounding noise that AdamW scales to ~lr a step: bounded, not equal
            assert float((got[k] - want[k]).abs().max()) <= 2 * lr * steps_resumed, k
        else:
            torch.testing.assert_close(got[k], want[k], **T.OUTPUTS, msg=k)
    # ... and the resumed model computes what the 3.9 one does
    from circuitfade.store import open_run

    ours, theirs = open_run(run)[24], open_run(DATA / "run39")[24]
    tokens = torch.randint(0, 8, (16, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens), **T.OUTPUTS)


def test_a_run_trained_here_from_the_same_seed_has_the_39_metrics(tmp_path):
    from circuitfade.train import RunConfig, train

    train(RunConfig(**C.RUN_CONFIG), tmp_path / "run", progress=False)
    expected = _metrics(DATA / "run39" / "metrics.csv")
    got = _metrics(tmp_path / "run" / "metrics.csv")
    _assert_same_metrics(got, expected)
    assert got["gate_pos"].iloc[-1] == 0.0 and got["loss_normal"].iloc[-1] < got["loss_normal"].iloc[0] - 0.5


def test_a_run_directory_written_on_39_opens_here(tmp_path):
    from circuitfade.store import open_run

    series = open_run(DATA / "run39")
    assert series.steps == [0, 12, 24]
    model = series[24]
    assert isinstance(model, SoftPriorTransformer) and compat.is_tl_model(model)
    gates = model.gate_values("effective")
    assert gates["pos"].shape == (2, 4) and float(gates["pos"].max()) == 0.0


@pytest.mark.slow
def test_the_200_step_run_has_the_39_metrics(tmp_path):
    """The base model, assoc, fade60+100->0, seed 0, 200 steps: metrics.csv equals the one
    written on 3.9 (bit for bit on the machine that wrote it; 1e-5 across machines)."""
    from circuitfade.train import RunConfig, train

    train(RunConfig(**C.RUN200_CONFIG), tmp_path / "run", progress=False)
    _assert_same_metrics(_metrics(tmp_path / "run" / "metrics.csv"), _metrics(DATA / "run200_39_metrics.csv"))


# ------------------------------------------------------------------ 3.9: the two shells in one process
def _native():
    from circuitfade.model.native import SoftPriorTransformer as Native

    return Native


@tl3_only
@pytest.mark.parametrize("name", list(C.CASES))
def test_native_shell_equals_the_hooked_transformer_shell_bit_for_bit(name):
    from transformer_lens import HookedTransformer

    hooked, native = C.build(name), C.build(name, cls=_native())
    assert isinstance(hooked, HookedTransformer) and not isinstance(native, HookedTransformer)
    assert [n for n, _ in hooked.named_parameters()] == [n for n, _ in native.named_parameters()]
    sd_h, sd_n = hooked.state_dict(), native.state_dict()
    assert list(sd_h) == list(sd_n)
    assert all(torch.equal(sd_h[k], sd_n[k]) and sd_h[k].dtype == sd_n[k].dtype for k in sd_h)
    assert list(hooked.hook_dict) == list(native.hook_dict)
    C.perturb(hooked)
    C.perturb(native)
    x = C.inputs(hooked)
    out_h, out_n = C.outputs(hooked, x), C.outputs(native, x)
    assert out_h.keys() == out_n.keys()
    for k in out_h:
        assert torch.equal(out_h[k].nan_to_num(), out_n[k].nan_to_num()), k
    _, cache_h = hooked.run_with_cache(x)
    _, cache_n = native.run_with_cache(x)
    assert list(cache_h) == list(cache_n) and all(torch.equal(cache_h[k], cache_n[k]) for k in cache_h)


@tl3_only
def test_shared_attention_arithmetic_equals_transformer_lens_attention():
    from transformer_lens.components import Attention

    g = torch.Generator().manual_seed(0)
    for case in ("nope_pos_content", "rotary_alibi"):
        model = C.build(case)
        attn = model.blocks[1].attn
        x = torch.randn(3, 8, model.cfg.d_model, generator=g)
        q, k, v = attn.qkv(x)
        for a, b in zip((q, k, v), Attention.calculate_qkv_matrices(attn, x, x, x)):
            assert torch.equal(a, b)
        if model.cfg.positional_embedding_type == "rotary":
            assert torch.equal(attn.rotate(q), Attention.apply_rotary(attn, q, 0, None))
            assert torch.equal(attn.rotary_sin, Attention.calculate_sin_cos_rotary(
                attn, model.cfg.rotary_dim, min(model.cfg.n_ctx, 2048), base=model.cfg.rotary_base)[0])
        scores = attn.scores(q, k)
        assert torch.equal(scores, Attention.calculate_attention_scores(attn, q, k))
        assert torch.equal(attn.causal_mask(scores), Attention.apply_causal_mask(attn, scores))
        pattern = scores.softmax(-1)
        assert torch.equal(attn.z_scores(v, pattern), Attention.calculate_z_scores(attn, v, pattern))


@tl3_only
@pytest.mark.parametrize("kw", [
    dict(n_layers=2, d_model=64, n_ctx=32, d_head=16, d_vocab=32),
    dict(n_layers=1, d_model=12, n_ctx=5, d_head=3, act_fn="gelu", positional_embedding_type="rotary"),
    dict(n_layers=3, d_model=16, n_ctx=9, d_head=4, n_heads=2, init_mode="xavier_normal", d_vocab=7,
         d_vocab_out=3, use_attn_scale=False, seed=5),
], ids=["base", "rotary", "options"])
def test_backbone_config_reproduces_hooked_transformer_config(kw):
    import dataclasses

    from transformer_lens import HookedTransformerConfig

    from circuitfade.model.backbone import BackboneConfig

    ours, theirs = BackboneConfig(**kw), HookedTransformerConfig(**kw)
    fields = lambda c: [(f.name, f.default) for f in dataclasses.fields(c)]  # noqa: E731
    assert fields(BackboneConfig) == fields(HookedTransformerConfig)
    assert ours.to_dict() == theirs.to_dict()
    assert type(ours.attn_scale) is type(theirs.attn_scale)  # numpy scalar, as in 3.9


@tl3_only
@pytest.mark.parametrize("mode", ["gpt2", "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "muP"])
def test_initialisation_equals_hooked_transformer_init_weights(mode):
    hooked = C.build("standard_ln_gelu_mlp", cfg=SoftPriorConfig(
        **{**C.TINY, **C.CASES["standard_ln_gelu_mlp"], "init_mode": mode}))
    native = C.build("standard_ln_gelu_mlp", cls=_native(), cfg=hooked.cfg)
    sd_h, sd_n = hooked.state_dict(), native.state_dict()
    assert all(torch.equal(sd_h[k], sd_n[k]) for k in sd_h)
    assert sd_h["blocks.0.mlp.W_in"].std() > 0


@tl3_only
def test_backbone_components_and_activations_equal_transformer_lens():
    from transformer_lens.components import MLP, LayerNorm, LayerNormPre, RMSNorm, RMSNormPre, Unembed
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS

    from circuitfade.model import backbone as B

    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)) * 3
    for act in B.ACTIVATIONS:
        assert torch.equal(B.ACTIVATIONS[act](x), SUPPORTED_ACTIVATIONS[act](x)), act
    g = torch.Generator().manual_seed(2)
    for act in ("gelu_new", "solu_ln"):
        cfg = SoftPriorConfig(**{**C.TINY, "d_model": 16, "attn_only": False, "act_fn": act, "d_mlp": 16})
        for ours, theirs in ((B.LayerNorm, LayerNorm), (B.LayerNormPre, LayerNormPre), (B.RMSNorm, RMSNorm),
                             (B.RMSNormPre, RMSNormPre), (B.Unembed, Unembed), (B.MLP, MLP)):
            a, b = ours(cfg), theirs(cfg)
            assert list(a.state_dict()) == list(b.state_dict()), ours.__name__
            assert [n for n, _ in a.named_modules()] == [n for n, _ in b.named_modules()], ours.__name__
            sd = {k: torch.randn(v.shape, generator=g) for k, v in b.state_dict().items()}
            a.load_state_dict(sd)
            b.load_state_dict(sd)
            assert torch.equal(a(x), b(x)), ours.__name__


def test_to_hooked_transformer_is_a_deprecated_alias_of_to_plain_model():
    """One conversion, one name: the old name warns (pointing at the caller) and gives the same model."""
    model = C.build("standard_ln_gelu_mlp")
    x = C.inputs(model)
    with pytest.warns(DeprecationWarning, match=r"to_hooked_transformer\(\) is deprecated; use to_plain_model\(\)") as rec:
        b = model.to_hooked_transformer()
    assert any(w.filename == __file__ and "to_plain_model" in str(w.message) for w in rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a = model.to_plain_model()
    assert type(a) is type(b)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
        with model.gates(pos=0.0, content=0.0):
            torch.testing.assert_close(model(x), b(x), atol=ATOL, rtol=1e-5)
        assert (model(x) - b(x)).abs().max() > 1e-3  # the priors matter at the trained gates


def test_both_shells_read_their_config_argument_alike():
    """``as_config`` (model.shell) is the one reading of ``cfg``: None, a dict or a config, plus overrides."""
    shells = [SoftPriorTransformer] + ([] if compat.is_tl4() else [_native()])
    for cls in shells:
        assert cls(n_layers=1).cfg == SoftPriorConfig(n_layers=1)
        assert cls({"n_layers": 1, "d_vocab": 7}, d_vocab=9).cfg == SoftPriorConfig(n_layers=1, d_vocab=9)
        base = SoftPriorConfig(n_layers=1)
        assert cls(base).cfg is base and cls(base, n_heads=2).cfg.n_heads == 2 and base.n_heads == 4
        with pytest.raises(TypeError, match="^expected a SoftPriorConfig, got int$"):
            cls(42)


# ------------------------------------------------------------------ unsupported on the native shell
def test_native_shell_names_a_feature_it_does_not_implement():
    from circuitfade.model.native import SoftPriorTransformer as Native

    with pytest.raises(ValueError, match="gated_mlp"):
        Native(SoftPriorConfig(attn_only=False, gated_mlp=True, act_fn="silu", d_mlp=16))
    with pytest.raises(ValueError, match="act_fn='xielu'"):
        Native(SoftPriorConfig(attn_only=False, act_fn="xielu", d_mlp=16))
