"""The analysis layer on plain TransformerLens models of whichever line is installed.

Every test here runs on TransformerLens 3.9 (models are ``HookedTransformer``s) and on
4.x (``TransformerBridge.boot_native`` / ``boot_transformers`` bridges in compatibility
mode), built through :mod:`circuitfade.compat` only; ``make test-tl4`` runs this folder
in a TransformerLens 4.3 environment. The planted models are written through the
``W_Q``/``W_E``/... weight views both lines share, and the answers are known by
construction (or computed by a pure-torch reference forward), so a line whose hooks,
shapes or weight layout differed would fail here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis import (
    classify_heads,
    evaluate,
    head_diagnostics,
    mean_ablation_importance,
    mean_replacement,
    patch_resid,
    patched_logits,
    weight_pr,
    successor_mass,
)
from circuitfade.gating import NoGatesError
from circuitfade.analysis.patching import resid_hooks
from circuitfade.analysis.screens import attention_patterns, capability_selectivity, ordinary_tokens
from circuitfade.analysis.spectra import head_output_pr
from circuitfade.io import CheckpointError, save_tensors
from circuitfade.store import attach, load_hf_local, metric, trace
from circuitfade.tasks import eval_set
from planted import CopyTask, P, V  # tests/planted.py (tests/conftest.py puts tests/ on sys.path)

pytestmark = pytest.mark.tl4
torch.set_num_threads(1)

LINE_MODEL = "TransformerBridge" if compat.is_tl4() else "HookedTransformer"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def plain(**cfg):
    """A plain model with all weights zero (to be planted)."""
    model = compat.plain_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def test_plain_model_is_the_installed_lines_model():
    model = compat.plain_model(dict(n_layers=1, d_model=8, n_ctx=4, d_head=2, n_heads=4, d_vocab=5, attn_only=True))
    assert type(model).__name__ == LINE_MODEL and compat.is_tl_model(model)
    assert not compat.is_tl_model(torch.nn.Linear(2, 2))
    assert model.cfg.n_layers == 1 and model.cfg.n_heads == 4 and model.cfg.d_vocab == 5
    assert model.blocks[0].attn.W_Q.shape == (4, 8, 2)  # [head, d_model, d_head] on both lines
    with pytest.raises(ValueError, match="unknown .* fields"):
        compat.plain_model(dict(n_layers=1, d_model=8, n_ctx=4, d_head=2, n_heads=4, d_vocab=5, n_layer=3))


# ------------------------------------------------------------------ planted copy circuit




def copy_circuit():
    """As in tests/library/analysis/test_analysis.py: L0H1 copies the token at position 0 to the answer
    (score 100/sqrt(8)); L0H0 uniform with a weak copy; L0H2 attends to itself (decoy);
    layer 1 is zero."""
    model = plain(n_layers=2, d_model=2 * V + P, n_ctx=P, d_head=V, n_heads=3, d_vocab=V,
                  attn_only=True, normalization_type=None, positional_embedding_type="standard")
    tok, pos, out = torch.arange(V), torch.arange(P), torch.arange(V + P, 2 * V + P)
    with torch.no_grad():
        model.W_E[tok, tok] = 1.0
        model.W_pos[pos, V + pos] = 1.0
        model.W_U[out, tok] = 1.0
        a = model.blocks[0].attn
        a.W_Q[1, V + P - 1, 0] = 10.0
        a.W_K[1, V + 0, 0] = 10.0
        a.W_Q[2, V + pos, pos] = 10.0
        a.W_K[2, V + pos, pos] = 10.0
        for h, w in ((0, 0.1), (1, 1.0), (2, 0.3)):
            a.W_V[h, tok, tok] = 1.0
            a.W_O[h, tok, out] = w
    return model.eval()


def test_successor_mass_and_mean_ablation_single_out_the_copy_head():
    model, task = copy_circuit(), CopyTask()
    batch = eval_set(task, 256, seed=1)
    mass = successor_mass(model, batch)
    assert mass.shape == (2, 3) and mass[0, 1] > 0.999 and mass[0, 2] < 1e-6
    for l, h in ((0, 0), (1, 0), (1, 1), (1, 2)):  # uniform over the 6 positions
        assert mass[l, h] == pytest.approx(1 / P, abs=1e-6)
    df = mean_ablation_importance(model, batch, task, gates=None)
    assert (df["acc_clean"] == 1.0).all()
    row = df[(df["layer"] == 0) & (df["head"] == 1)].iloc[0]
    assert row["acc_ablated"] <= task.chance + 0.05 and row["loss_increase"] > 0.5
    others = df[~((df["layer"] == 0) & (df["head"] == 1))]
    assert (others["acc_drop"] == 0.0).all()
    assert (others.loc[others["layer"] == 1, "loss_increase"].abs() < 1e-6).all()
    tidy = head_diagnostics(model, batch, task, ablation_gates=None)
    assert len(tidy) == 3 * 6 and list(tidy.columns) == ["layer", "head", "metric", "value", "se", "lo", "hi", "boot"]
    # evaluation: a plain model has only the "normal" condition
    assert evaluate(model, batch, task)["accuracy"] == 1.0
    with pytest.raises(NoGatesError):
        evaluate(model, batch, task, gates="zero")


# ------------------------------------------------------------------ planted screen heads
SV, N = 24, 48  # vocabulary, context
D_HEAD = N
TOK, POS, PREV = 0, SV, SV + N
SCALE = 20.0 * math.sqrt(D_HEAD)
BOS, L = SV - 1, 11
EXPECTED_LABELS = {(0, 0): "previous_token", (0, 1): "none", (0, 2): "bos", (0, 3): "none",
                   (1, 0): "induction", (1, 1): "none", (1, 2): "bos", (1, 3): "previous_token"}


@pytest.fixture(scope="module")
def planted():
    """As in tests/library/analysis/test_screens.py: previous-token heads L0H0 (copies into PREV) and L1H3,
    induction head L1H0 (K-composition), BOS attractors L0H2 and L1H2, the rest uniform."""
    model = plain(n_layers=2, d_model=2 * SV + N, n_ctx=N, d_head=D_HEAD, n_heads=4, d_vocab=SV,
                  attn_only=True, normalization_type=None, positional_embedding_type="standard")
    idx_n, idx_v = torch.arange(N), torch.arange(SV)
    with torch.no_grad():
        model.embed.W_E[idx_v, TOK + idx_v] = 1.0
        model.pos_embed.W_pos[idx_n, POS + idx_n] = 1.0
        for layer, prev_head in ((0, 0), (1, 3)):
            attn = model.blocks[layer].attn
            attn.W_Q[prev_head, POS + idx_n, idx_n] = SCALE
            attn.W_K[prev_head, POS + idx_n[:-1], idx_n[1:]] = 1.0
            attn.W_Q[2, POS + idx_n, 0] = SCALE
            attn.W_K[2, POS + 0, 0] = 1.0
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        a0.W_V[0, TOK + idx_v, idx_v] = 1.0
        a0.W_O[0, idx_v, PREV + idx_v] = 1.0
        a1.W_Q[0, TOK + idx_v, idx_v] = SCALE
        a1.W_K[0, PREV + idx_v, idx_v] = 1.0
    return model


def test_screens_classify_the_planted_heads(planted):
    before = {k: v.clone() for k, v in planted.state_dict().items()}
    table = classify_heads(planted, d_vocab=SV, n=32, seq_len=L, seed=0, bos=BOS)
    assert {(int(r.layer), int(r.head)): r.label for r in table.itertuples()} == EXPECTED_LABELS
    row = table[(table["layer"] == 1) & (table["head"] == 0)].iloc[0]
    uniform = np.mean([1.0 / (t + 1) for t in range(1 + L, 1 + 2 * L)])
    assert row.induction_capability == pytest.approx(1.0, abs=1e-6)
    assert row.induction_control == pytest.approx(uniform, abs=1e-6)
    a = capability_selectivity(planted, d_vocab=SV, n=4, seq_len=L, seed=5)
    pd.testing.assert_frame_equal(a, capability_selectivity(planted, d_vocab=SV, n=4, seq_len=L, seed=5))
    assert all(torch.equal(before[k], v) for k, v in planted.state_dict().items())  # not modified
    assert not planted.hook_dict["blocks.0.attn.hook_pattern"].fwd_hooks  # no hooks left behind


def test_spectra_of_the_planted_heads(planted):
    table = weight_pr(planted)

    def value(layer, head, metric):
        sel = (table["layer"] == layer) & (table["head"] == head) & (table["metric"] == metric)
        return float(table[sel]["value"].iloc[0])

    assert value(0, 0, "ov_pr") == pytest.approx(SV)  # token -> PREV copy: SV equal singular values
    assert value(0, 0, "qk_pr") == pytest.approx(N - 1)
    assert value(1, 0, "qk_pr") == pytest.approx(SV)
    assert math.isnan(value(0, 1, "ov_pr"))
    # the copying head's output is the attended token's one-hot: PR over uniform tokens ~ the
    # number of distinct tokens it can copy (SV - 1 usable ids, positions >= 1)
    toks = ordinary_tokens(SV, 64, 30, gen(3))
    pr = head_output_pr(planted, toks, positions=slice(1, None))
    assert pr.shape == (2, 4) and pr[0, 0] == pytest.approx(SV - 1, rel=0.1)
    assert torch.isnan(pr[0, 1])  # writes nothing


# ---------------------------------------------------------------------------- patching
def random_pair():
    cfg = dict(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=20, attn_only=True,
               normalization_type=None, positional_embedding_type="standard")
    torch.manual_seed(1)
    a = compat.plain_model(cfg)
    torch.manual_seed(2)
    b = compat.plain_model(cfg)
    b.unembed.load_state_dict(a.unembed.state_dict())  # the same read-out: final resid decides the logits
    return a, b


def test_patching_everything_or_nothing_restores_all_or_none():
    A, B = random_pair()
    toks = torch.randint(0, 20, (8, 12), generator=gen(0))
    metric = lambda logits: logits[:, -1, 3].mean()  # noqa: E731
    with torch.no_grad():
        m_a, m_b = float(metric(A(toks))), float(metric(B(toks)))
    assert abs(m_a - m_b) > 1e-3
    final = resid_hooks(B)[-1][1]
    assert final == "blocks.1.hook_resid_post"
    assert float(metric(patched_logits(A, B, toks, {final: None}))) == pytest.approx(m_a, abs=1e-5)
    assert float(metric(patched_logits(A, B, toks, {}))) == pytest.approx(m_b, abs=1e-6)
    df = patch_resid(A, B, toks, metric)
    last = df[df.layer == 2].set_index("pos")["restored"]
    assert last[11] == pytest.approx(1.0, abs=1e-4) and last.drop(11).abs().max() < 1e-5


def test_mean_replacement_of_a_silent_head_changes_nothing():
    model, _ = random_pair()
    with torch.no_grad():
        model.blocks[0].attn.W_O[2].zero_()  # L0H2 writes nothing
    toks = torch.randint(0, 20, (8, 12), generator=gen(1))
    df = mean_replacement(model, toks, lambda logits: logits[:, -1].logsumexp(-1).mean(), position=-1)
    row = df.set_index("component")
    assert row.loc["L0H2", "delta"] == pytest.approx(0.0, abs=1e-6)
    assert row.loc["L1H0", "delta"] != pytest.approx(0.0, abs=1e-6)
    assert row.loc["none", "delta"] == 0.0 and len(df) == 1 + 2 * 4 + 1


# ----------------------------------------------------------------------- attach + trace
def ht_state_dict(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random weights in HookedTransformer's state-dict format (what a 3.x user saved)."""
    g = gen(seed)
    H, D, E = cfg["n_heads"], cfg["d_model"], cfg["d_head"]
    r = lambda *s: torch.randn(*s, generator=g) * 0.5  # noqa: E731
    sd = {"embed.W_E": r(cfg["d_vocab"], D), "pos_embed.W_pos": r(cfg["n_ctx"], D),
          "unembed.W_U": r(D, cfg["d_vocab"]), "unembed.b_U": r(cfg["d_vocab"])}
    for l in range(cfg["n_layers"]):
        p = f"blocks.{l}.attn."
        sd |= {p + "W_Q": r(H, D, E), p + "W_K": r(H, D, E), p + "W_V": r(H, D, E), p + "W_O": r(H, E, D),
               p + "b_Q": r(H, E), p + "b_K": r(H, E), p + "b_V": r(H, E), p + "b_O": r(D),
               p + "mask": torch.zeros(0, 0, dtype=torch.bool), p + "IGNORE": torch.tensor(-1e5)}
    return sd


def reference_logits(sd: dict, cfg: dict, toks: torch.Tensor) -> torch.Tensor:
    """Attention-only, no LayerNorm, learned positions: the forward pass written out."""
    x = sd["embed.W_E"][toks] + sd["pos_embed.W_pos"][: toks.shape[1]]
    causal = torch.ones(toks.shape[1], toks.shape[1], dtype=torch.bool).tril()
    for l in range(cfg["n_layers"]):
        w = {k.rsplit(".", 1)[1]: v for k, v in sd.items() if k.startswith(f"blocks.{l}.attn.")}
        q, k, v = (torch.einsum("bpd,hde->bphe", x, w[f"W_{n}"]) + w[f"b_{n}"] for n in "QKV")
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg["d_head"])
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        x = x + torch.einsum("bqhe,hed->bqd", z, w["W_O"]) + w["b_O"]
    return x @ sd["unembed.W_U"] + sd["unembed.b_U"]


CFG = dict(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=4, d_vocab=12, attn_only=True,
           normalization_type=None, positional_embedding_type="standard")


def test_attach_hooked_transformer_state_dicts_and_trace(tmp_path):
    sds = {step: ht_state_dict(CFG, seed) for seed, step in enumerate((100, 250))}
    for step, sd in sds.items():
        save_tensors(tmp_path / f"ckpt_{step}.safetensors", sd)
    series = attach(tmp_path, config=dict(CFG))
    assert series.steps == [100, 250]
    toks = torch.randint(0, 12, (3, 10), generator=gen(2))
    for step, model in series:
        assert type(model).__name__ == LINE_MODEL
        with torch.no_grad():
            torch.testing.assert_close(model(toks), reference_logits(sds[step], CFG, toks), atol=1e-4, rtol=1e-4)

    def first_token_attention(model, batch):
        return attention_patterns(model, batch)[:, :, :, -1, 0].mean(1)  # [layer, head]

    df = trace(series, {"attn0": metric(first_token_attention, inputs=("model", "batch"))}, batch=toks, progress=False)
    assert len(df) == 2 * 2 * 4 and set(df["step"]) == {100, 250}
    ref = reference_pattern_last_to_first(sds[250], CFG, toks)
    got = df[df.step == 250].sort_values(["layer", "head"])["value"].to_numpy()
    np.testing.assert_allclose(got, ref.flatten().numpy(), atol=1e-5)


def reference_pattern_last_to_first(sd, cfg, toks):
    """Mean attention of the last query on position 0, per layer and head, by hand."""
    x = sd["embed.W_E"][toks] + sd["pos_embed.W_pos"][: toks.shape[1]]
    causal = torch.ones(toks.shape[1], toks.shape[1], dtype=torch.bool).tril()
    out = []
    for l in range(cfg["n_layers"]):
        w = {k.rsplit(".", 1)[1]: v for k, v in sd.items() if k.startswith(f"blocks.{l}.attn.")}
        q, k, v = (torch.einsum("bpd,hde->bphe", x, w[f"W_{n}"]) + w[f"b_{n}"] for n in "QKV")
        pattern = (torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg["d_head"])).masked_fill(
            ~causal, float("-inf")).softmax(-1)
        out.append(pattern[:, :, -1, 0].mean(0))
        x = x + torch.einsum("bqhe,hed->bqd", torch.einsum("bhqk,bkhe->bqhe", pattern, v), w["W_O"]) + w["b_O"]
    return torch.stack(out)


def test_traced_bridge_metrics_plot_as_heatmaps():
    from circuitfade.viz import plots

    a, b = random_pair()
    batch = eval_set(CopyTask(), 16, seed=0)
    df = trace(attach({0: a, 10: b}), {"mass": metric(successor_mass, inputs=("model", "batch"))},
               batch=batch, progress=False)
    fig = plots.head_heatmap(df, "mass")
    assert len(fig.data) == 2  # one heatmap per step, slider over steps
    np.testing.assert_allclose(np.asarray(fig.data[-1].z, dtype=float), successor_mass(b, batch).numpy(),
                               atol=1e-6)


def test_wrong_shaped_state_dict_fails_at_attach_naming_the_file(tmp_path):
    sd = ht_state_dict(CFG, 0)
    sd["blocks.1.attn.W_Q"] = torch.zeros(4, 16, 5)
    save_tensors(tmp_path / "ckpt_7.safetensors", sd)
    with pytest.raises(CheckpointError, match="ckpt_7.safetensors"):
        attach(tmp_path, config=dict(CFG))


def test_in_memory_models_are_traced():
    a, b = random_pair()
    series = attach({0: a, 10: b})
    batch = eval_set(CopyTask(), 16, seed=0)
    df = trace(series, {"mass": metric(successor_mass, inputs=("model", "batch"))},
               batch=batch, progress=False)
    assert len(df) == 2 * 2 * 4 and set(df["step"]) == {0, 10}
    got = df[df.step == 10].sort_values(["layer", "head"])["value"].to_numpy()
    np.testing.assert_allclose(got, successor_mass(b, batch).flatten().numpy(), atol=1e-6)


# ------------------------------------------------------------ local Hugging Face folders
def _neox(seed: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    c = transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   vocab_size=64, max_position_embeddings=64, attn_implementation="eager")
    return transformers.GPTNeoXForCausalLM(c).eval()


def _gpt2(seed: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    c = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64,
                                attn_implementation="eager")
    return transformers.GPT2LMHeadModel(c).eval()


@pytest.mark.parametrize("build", [_neox, _gpt2], ids=["neox", "gpt2"])
def test_local_hf_folders_load_and_screen_like_the_hf_model(tmp_path, build):
    hf = {100: build(1), 200: build(2)}
    root = tmp_path / "llama-named-folder"  # TL 3 picks architectures by name substrings: must not matter
    for step, m in hf.items():
        m.save_pretrained(root / f"step{step}")
    series = attach(root)
    assert series.steps == [100, 200]
    toks = torch.randint(0, 64, (3, 20), generator=gen(0))
    for step, model in series:
        assert type(model).__name__ == LINE_MODEL and model.tokenizer is None
        with torch.no_grad():
            out = hf[step](toks, output_attentions=True)
            torch.testing.assert_close(model(toks), out.logits, atol=1e-4, rtol=1e-4)
        # the screens read the same attention the HF model computes
        torch.testing.assert_close(attention_patterns(model, toks), torch.stack(out.attentions), atol=1e-5, rtol=1e-4)
    processed = load_hf_local(root / "step200", process=True)  # folded weights: same log-probs
    with torch.no_grad():
        assert processed.W_U.mean(-1).abs().max() < 1e-5 < series[200].W_U.mean(-1).abs().max()  # center_unembed
        torch.testing.assert_close(processed(toks).log_softmax(-1), hf[200](toks).logits.log_softmax(-1),
                                   atol=1e-4, rtol=1e-4)
    table = classify_heads(series[200], d_vocab=64, n=8, seq_len=8, seed=0)
    assert len(table) == 2 * 4 and table["induction_capability"].between(0, 1).all()


def test_hf_folder_tokenizer_is_used(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(60)} | {"<unk>": 60, "<bos>": 61, "<eos>": 62, "<pad>": 63}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>",
                                                eos_token="<eos>", pad_token="<pad>")
    _neox(0).save_pretrained(tmp_path / "step1")
    fast.save_pretrained(tmp_path / "step1")
    model = load_hf_local(tmp_path / "step1")
    assert model.tokenizer is not None
    assert model.to_tokens("w1 w2 w3", prepend_bos=False).tolist() == [[1, 2, 3]]


def test_a_tl3_state_dict_gives_the_same_logits_on_this_line(tmp_path):
    """A HookedTransformer with LayerNorm and GELU MLPs saved by TransformerLens 3.9
    (tests/tl4/data/make_ht39_fixture.py), and its logits there: attached on either
    line, the model gives those logits."""
    from pathlib import Path

    from circuitfade.io import load_tensors

    sd = load_tensors(Path(__file__).with_name("data") / "ht39_ln_mlp.safetensors")
    tokens, logits = sd.pop("_tokens"), sd.pop("_logits")
    save_tensors(tmp_path / "step_5.safetensors", sd)
    cfg = dict(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=4, d_vocab=12, d_mlp=32, act_fn="gelu",
               normalization_type="LN", positional_embedding_type="standard")
    model = attach(tmp_path, config=cfg)[5]
    assert type(model).__name__ == LINE_MODEL
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), logits, atol=1e-5, rtol=1e-5)


def test_patching_and_mean_replacement_on_hf_folder_models(tmp_path):
    for step, seed in ((100, 1), (200, 2)):
        _neox(seed).save_pretrained(tmp_path / f"step{step}")
    series = attach(tmp_path)
    a, b = series[100], series[200]
    toks = torch.randint(0, 64, (4, 12), generator=gen(5))
    metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 7].mean()  # noqa: E731
    with torch.no_grad():
        m_b = float(metric(b(toks)))
    assert float(metric(patched_logits(a, b, toks, {}))) == pytest.approx(m_b, abs=1e-6)
    assert resid_hooks(b)[-1][1] == "blocks.1.hook_resid_post"
    df = patch_resid(a, b, toks, metric)
    assert len(df) == 3 * 12 and df["value"].notna().all()
    with torch.no_grad():
        b.blocks[1].attn.W_O[3].zero_()  # L1H3 writes nothing (through the weight view)
    rep = mean_replacement(b, toks, metric, position=-1).set_index("component")
    assert rep.loc["L1H3", "delta"] == pytest.approx(0.0, abs=1e-6)
    assert abs(rep.loc["L1H2", "delta"]) > 1e-6 and "L0MLP" in rep.index and "all_mlps" in rep.index
