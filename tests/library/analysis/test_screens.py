"""Head screens (circuitfade.analysis.screens) and PR spectra (circuitfade.analysis.spectra).

The main fixture is a 2-layer attention-only plain model (``compat.plain_model``: a
``HookedTransformer`` on TransformerLens 3, a ``TransformerBridge`` on 4) whose heads are set by
hand (standard positional embeddings, no normalisation). The residual stream holds
three one-hot blocks: the current token (TOK), the position (POS) and, after layer 0,
the previous token (PREV). Heads:

* L0H0: previous-token head (query of position i matches the key of position i-1)
  whose OV copies the attended token into PREV;
* L1H0: induction head by K-composition (query = current token, key = PREV block);
* L0H2, L1H2: BOS attractors (every query matches the key of position 0);
* L1H3: a second previous-token head (no OV);
* L0H1, L0H3, L1H1: uniform heads (W_Q = W_K = 0, no OV).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.screens import (
    CLASS_METRICS,
    DEFAULT_THRESHOLDS,
    METRICS,
    attention_patterns,
    bos_score,
    capability_selectivity,
    classify_heads,
    control_tokens,
    head_frame,
    induction_score,
    ordinary_tokens,
    previous_token_score,
    repeated_tokens,
)
from circuitfade.analysis.spectra import (
    elevated_pr,
    head_output_pr,
    participation_ratio,
    participation_ratio_of_spectrum,
    weight_pr,
)

V, N = 24, 48  # vocabulary, context
D_HEAD = N  # >= max(V, N): room for a one-hot position or token code
TOK, POS, PREV = 0, V, V + N  # residual blocks
D_MODEL = 2 * V + N
SCALE = 20.0 * math.sqrt(D_HEAD)  # attention logit 20 on the planted key (TL divides by sqrt(d_head))
BOS = V - 1
L = 11  # half-length of the screen inputs: 2L + BOS = 23 <= usable vocabulary, so controls never repeat

EXPECTED_LABELS = {
    (0, 0): "previous_token",
    (0, 1): "none",
    (0, 2): "bos",
    (0, 3): "none",
    (1, 0): "induction",
    (1, 1): "none",
    (1, 2): "bos",
    (1, 3): "previous_token",
}
UNIFORM_HEADS = [(0, 1), (0, 3), (1, 1)]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def planted_model():
    model = compat.plain_model(dict(
        n_layers=2, d_model=D_MODEL, n_ctx=N, d_head=D_HEAD, n_heads=4, d_vocab=V,
        attn_only=True, normalization_type=None, positional_embedding_type="standard", seed=0,
    ))
    idx_n, idx_v = torch.arange(N), torch.arange(V)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[idx_v, TOK + idx_v] = 1.0
        model.pos_embed.W_pos[idx_n, POS + idx_n] = 1.0
        for layer, prev_head in ((0, 0), (1, 3)):
            attn = model.blocks[layer].attn
            attn.W_Q[prev_head, POS + idx_n, idx_n] = SCALE  # query of position i: code i
            attn.W_K[prev_head, POS + idx_n[:-1], idx_n[1:]] = 1.0  # key of position j: code j + 1
            attn.W_Q[2, POS + idx_n, 0] = SCALE  # every query: code 0
            attn.W_K[2, POS + 0, 0] = 1.0  # only position 0 has key code 0
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        a0.W_V[0, TOK + idx_v, idx_v] = 1.0  # L0H0 reads the attended token ...
        a0.W_O[0, idx_v, PREV + idx_v] = 1.0  # ... and writes it into PREV
        a1.W_Q[0, TOK + idx_v, idx_v] = SCALE  # L1H0 query: current token
        a1.W_K[0, PREV + idx_v, idx_v] = 1.0  # L1H0 key: previous token
    return model


@pytest.fixture(scope="module")
def planted():
    return planted_model()


@pytest.fixture(scope="module")
def screen(planted):
    return classify_heads(planted, d_vocab=V, n=32, seq_len=L, seed=0, bos=BOS)


def random_model(seed: int = 1, **kw):
    model = compat.plain_model(dict(
        n_layers=2, d_model=32, n_ctx=48, d_head=8, n_heads=4, d_vocab=V, attn_only=True, seed=seed, **kw
    ))
    with torch.no_grad():  # sharpen the patterns so scores are not all near-uniform
        for block in model.blocks:
            block.attn.W_Q.mul_(4.0)
            block.attn.W_K.mul_(4.0)
    return model


def at(frame: pd.DataFrame, layer: int, head: int) -> pd.Series:
    return frame[(frame["layer"] == layer) & (frame["head"] == head)].iloc[0]


# -- inputs ------------------------------------------------------------------------------


def test_repeated_tokens_are_two_copies_of_distinct_tokens_after_bos():
    toks = repeated_tokens(V, 16, L, gen(), bos=BOS)
    assert toks.shape == (16, 2 * L + 1) and toks.dtype == torch.long
    assert (toks[:, 0] == BOS).all() and not (toks[:, 1:] == BOS).any()
    assert torch.equal(toks[:, 1 : L + 1], toks[:, L + 1 :])
    assert all(len(set(row.tolist())) == L for row in toks[:, 1 : L + 1])
    assert torch.equal(toks, repeated_tokens(V, 16, L, gen(), bos=BOS))  # reproducible
    assert repeated_tokens(V, 3, 5, gen()).shape == (3, 10)


def test_control_tokens_have_no_repeats_when_the_vocabulary_allows():
    toks = control_tokens(V, 16, L, gen(), bos=BOS)
    assert toks.shape == (16, 2 * L + 1) and (toks[:, 0] == BOS).all()
    assert all(len(set(row.tolist())) == 2 * L for row in toks[:, 1:])
    # too small a vocabulary for 2L distinct tokens: each half distinct, drawn independently
    fallback = control_tokens(V, 64, 20, gen())
    assert all(len(set(r[:20].tolist())) == 20 and len(set(r[20:].tolist())) == 20 for r in fallback)
    assert not torch.equal(fallback[:, :20], fallback[:, 20:])


def test_ordinary_tokens_are_uniform_and_exclude_bos():
    toks = ordinary_tokens(V, 200, 40, gen(), bos=BOS)
    assert toks.shape == (200, 41) and (toks[:, 0] == BOS).all() and not (toks[:, 1:] == BOS).any()
    counts = torch.bincount(toks[:, 1:].reshape(-1), minlength=V)[: V - 1].double()
    assert (counts / counts.mean() - 1).abs().max() < 0.15  # 8000 draws over 23 tokens


@pytest.mark.parametrize(
    "call",
    [
        lambda: repeated_tokens(V, 4, V + 1, gen()),  # more distinct tokens than the vocabulary
        lambda: repeated_tokens(V, 4, L, gen(), bos=V),  # bos outside the vocabulary
        lambda: repeated_tokens(V, 4, 1, gen()),  # half-length 1 has no induction target
        lambda: ordinary_tokens(V, 0, 4, gen()),
    ],
)
def test_input_builders_reject_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


# -- scores and classification on planted heads ------------------------------------------


def test_planted_heads_are_classified(screen):
    labels = {(int(r.layer), int(r.head)): r.label for r in screen.itertuples()}
    assert labels == EXPECTED_LABELS


def test_previous_token_head(screen):
    row = at(screen, 0, 0)
    assert row.previous_token_capability == pytest.approx(1.0, abs=1e-6)
    assert row.previous_token_control == pytest.approx(0.0, abs=1e-6)
    assert row.previous_token and not row.induction and not row.bos
    assert abs(row.induction_selectivity) < 1e-6


def test_induction_head_is_selective_for_repeats(screen):
    row = at(screen, 1, 0)
    assert row.induction_capability == pytest.approx(1.0, abs=1e-6)
    # on the control there is no earlier occurrence: the head attends uniformly over [0, t],
    # so the attention on t-L+1 is the mean of 1/(t+1) over the second-copy queries
    uniform = np.mean([1.0 / (t + 1) for t in range(1 + L, 1 + 2 * L)])
    assert row.induction_control == pytest.approx(uniform, abs=1e-6)
    assert row.induction_selectivity > 0.9
    assert row.induction and not row.previous_token and not row.bos


def test_uniform_heads_have_zero_selectivity(screen):
    for layer, head in UNIFORM_HEADS:
        row = at(screen, layer, head)
        for score in ("induction", "previous_token", "bos"):
            assert row[f"{score}_selectivity"] == pytest.approx(0.0, abs=1e-6)
        assert row.label == "none"


def test_bos_attractor(screen):
    for layer in (0, 1):
        row = at(screen, layer, 2)
        assert row.bos_capability == pytest.approx(1.0, abs=1e-6)
        assert row.bos_selectivity == pytest.approx(1.0, abs=1e-6)
        assert row.label == "bos"


def test_scores_match_their_definitions_on_a_planted_model(planted):
    toks = ordinary_tokens(V, 8, 30, gen(3))
    uniform_prev = np.mean([1.0 / (t + 1) for t in range(1, 30)])  # uniform head: A[t, t-1] = 1/(t+1)
    prev, bos = previous_token_score(planted, toks), bos_score(planted, toks)
    assert prev.shape == bos.shape == (2, 4)
    assert prev[0, 0] == pytest.approx(1.0, abs=1e-6) and prev[0, 1] == pytest.approx(uniform_prev, abs=1e-6)
    assert bos[1, 2] == pytest.approx(1.0, abs=1e-6) and bos[0, 1] == pytest.approx(uniform_prev, abs=1e-6)
    # without a BOS token the prefix is inferred as 0 from the even length
    ind = induction_score(planted, repeated_tokens(V, 8, 12, gen(4)))
    # query t = L (token s_0) also matches position 0, whose PREV block holds s_0 itself: 1/2 there
    assert ind[1, 0] == pytest.approx((11 + 0.5) / 12, abs=1e-6)


def test_screen_without_bos_and_overridden_thresholds(planted):
    table = classify_heads(planted, d_vocab=V, n=16, seq_len=L, seed=1)
    assert {(int(r.layer), int(r.head)): r.label for r in table.itertuples()} == EXPECTED_LABELS
    strict = classify_heads(planted, {"induction": 0.99}, d_vocab=V, n=16, seq_len=L, seed=1)
    assert at(strict, 1, 0).label == "none" and at(strict, 0, 0).label == "previous_token"
    with pytest.raises(ValueError, match="unknown threshold"):
        classify_heads(planted, {"copying": 0.5})


def test_classify_heads_accepts_stacked_frames_and_joins_labels(planted):
    scores = capability_selectivity(planted, d_vocab=V, n=8, seq_len=L, bos=BOS)
    assert list(scores.columns) == ["layer", "head", "metric", "value"]
    assert set(scores["metric"]) == set(METRICS) and len(scores) == 2 * 4 * len(METRICS)
    stacked = pd.concat([scores.assign(step=0), scores.assign(step=100)], ignore_index=True)
    table = classify_heads(stacked)
    assert len(table) == 16 and set(table["step"]) == {0, 100}
    # thresholds low enough that the BOS head also passes the previous-token test -> joined label
    loose = classify_heads(scores, {"previous_token": -1.0})
    assert at(loose, 0, 2).label == "previous_token+bos"
    assert set(CLASS_METRICS) == set(DEFAULT_THRESHOLDS)
    with pytest.raises(ValueError, match="several values"):
        classify_heads(pd.concat([scores, scores]))
    with pytest.raises(ValueError, match="lacks metrics"):
        classify_heads(scores[scores["metric"] != "bos_capability"])


def test_screens_do_not_modify_the_model(planted):
    before = {k: v.clone() for k, v in planted.state_dict().items()}
    a = capability_selectivity(planted, d_vocab=V, n=4, seq_len=L, seed=5)
    b = capability_selectivity(planted, d_vocab=V, n=4, seq_len=L, seed=5)
    pd.testing.assert_frame_equal(a, b)
    assert all(torch.equal(before[k], v) for k, v in planted.state_dict().items())
    assert not planted.hook_dict["blocks.0.attn.hook_pattern"].fwd_hooks


def test_scores_reject_bad_tokens(planted):
    with pytest.raises(ValueError, match="n_ctx"):
        previous_token_score(planted, torch.zeros(1, N + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        bos_score(planted, torch.full((1, 4), V))
    with pytest.raises(ValueError, match="integer tensor"):
        bos_score(planted, torch.zeros(4))
    with pytest.raises(ValueError, match="half_len"):
        induction_score(planted, torch.zeros(1, 6, dtype=torch.long), half_len=4)
    with pytest.raises(ValueError, match="n_ctx"):
        capability_selectivity(planted, seq_len=30)


def test_soft_prior_transformer_with_gates_off_screens_like_its_backbone():
    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

    torch.manual_seed(0)
    model = SoftPriorTransformer(SoftPriorConfig())
    with model.gates(pos=0.0, content=0.0):
        soft = capability_selectivity(model, n=4, seed=2)
    plain = capability_selectivity(model.to_plain_model(), n=4, seed=2)
    assert len(soft) == model.cfg.n_layers * model.cfg.n_heads * len(METRICS)
    np.testing.assert_allclose(soft["value"], plain["value"], atol=1e-5)


# -- agreement with TransformerLens's head detector --------------------------------------


def word_tokenizer(d_vocab: int):
    """An offline word-level tokenizer: "t7" <-> id 7 (no BOS is added)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(WordLevel({f"t{i}": i for i in range(d_vocab)}, unk_token="t0"))
    inner.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=f"t{d_vocab - 1}")


def test_agreement_with_transformer_lens_head_detector():
    from transformer_lens.head_detector import detect_head

    model = compat.plain_model(dict(
        n_layers=2, d_model=32, n_ctx=48, d_head=8, n_heads=4, d_vocab=V, attn_only=True, seed=1,
        default_prepend_bos=False,
    ), tokenizer=word_tokenizer(V))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(4.0)
            block.attn.W_K.mul_(4.0)
    toks = repeated_tokens(V, 4, 10, gen(7), bos=BOS)
    texts = [" ".join(f"t{i}" for i in row.tolist()) for row in toks]
    assert torch.equal(model.to_tokens(texts[0])[0], toks[0])
    T = toks.shape[1]
    # detect_head ("mul", no exclusions) divides by the total attention T of the sequence
    tl_prev = detect_head(model, texts, "previous_token_head", error_measure="mul")
    ours_prev = previous_token_score(model, toks)
    assert ours_prev.std() > 0.02  # a non-trivial comparison
    torch.testing.assert_close(tl_prev, ours_prev * (T - 1) / T, atol=1e-5, rtol=0)
    tl_ind = detect_head(model, texts, "induction_head", error_measure="mul")
    torch.testing.assert_close(tl_ind, induction_score(model, toks) * 10 / T, atol=1e-5, rtol=0)


# -- participation ratio -----------------------------------------------------------------


def test_pr_of_rank_one_data_is_one():
    g = gen(0)
    x = torch.randn(500, 1, generator=g) * torch.randn(1, 12, generator=g) + torch.randn(1, 12, generator=g)
    assert float(participation_ratio(x)) == pytest.approx(1.0, abs=1e-5)
    assert float(participation_ratio(x[:3])) == pytest.approx(1.0, abs=1e-5)  # n < d


def test_pr_of_isotropic_gaussian_is_the_dimension():
    x = torch.randn(20000, 8, generator=gen(1))
    assert float(participation_ratio(x)) == pytest.approx(8.0, rel=0.02)


def test_pr_of_two_equal_directions_is_two():
    x = torch.tensor([[1.0, 0, 0, 0], [-1, 0, 0, 0], [0, 1, 0, 0], [0, -1, 0, 0]])  # covariance diag(.5,.5,0,0)
    assert float(participation_ratio(x)) == pytest.approx(2.0, abs=1e-12)
    assert float(participation_ratio_of_spectrum(torch.tensor([1.0, 1.0, 0.0, 0.0]))) == pytest.approx(2.0)
    assert float(participation_ratio_of_spectrum(torch.ones(5))) == pytest.approx(5.0)


def test_pr_is_batched_and_undefined_for_constant_data():
    x = torch.randn(3, 2, 400, 6, generator=gen(2))
    x[1, 0] = 7.0  # constant samples: no variance
    pr = participation_ratio(x)
    assert pr.shape == (3, 2) and torch.isnan(pr[1, 0]) and not torch.isnan(pr[0]).any()
    assert float(pr[2, 1]) == pytest.approx(float(participation_ratio(x[2, 1])))
    with pytest.raises(ValueError):
        participation_ratio(torch.randn(5))
    with pytest.raises(ValueError):
        participation_ratio_of_spectrum(torch.tensor([1.0, -1.0]))


def test_head_output_pr_matches_the_explicit_result_and_z():
    model = random_model(seed=3)
    toks = ordinary_tokens(V, 6, 20, gen(5))
    _, cache = model.run_with_cache(toks)
    pr, pr_z = head_output_pr(model, toks), head_output_pr(model, toks, space="z")
    pr_late = head_output_pr(model, toks, positions=slice(5, None))
    assert pr.shape == pr_z.shape == (2, 4)
    for layer in range(2):
        z = cache[f"blocks.{layer}.attn.hook_z"].double()  # [batch pos head d_head]
        result = torch.einsum("bphd,hdm->hbpm", z, model.blocks[layer].attn.W_O.double())
        torch.testing.assert_close(pr[layer], participation_ratio(result.flatten(1, 2)))
        torch.testing.assert_close(pr_z[layer], participation_ratio(z.permute(2, 0, 1, 3).flatten(1, 2)))
        torch.testing.assert_close(pr_late[layer], participation_ratio(result[:, :, 5:].flatten(1, 2)))


def test_head_output_pr_of_a_planted_copying_head(planted):
    # positions 1..V read tokens 0..V-1 exactly once each: the previous-token head writes a
    # uniformly distributed one-hot, whose covariance diag(1/V) - 1/V^2 has V-1 equal eigenvalues
    toks = torch.arange(V).repeat(2).unsqueeze(0)
    pr = head_output_pr(planted, toks, positions=slice(1, V + 1))
    assert float(pr[0, 0]) == pytest.approx(V - 1, abs=1e-6)
    assert torch.isnan(pr[0, 1])  # no OV: the head writes nothing
    with pytest.raises(ValueError, match="positions"):
        head_output_pr(planted, toks, positions="last")


def test_weight_pr_of_planted_heads(planted):
    table = weight_pr(planted)
    assert list(table.columns) == ["layer", "head", "metric", "value"] and len(table) == 16
    value = lambda layer, head, metric: float(  # noqa: E731
        table[(table["layer"] == layer) & (table["head"] == head) & (table["metric"] == metric)]["value"].iloc[0]
    )
    assert value(0, 0, "ov_pr") == pytest.approx(V)  # token -> PREV copy: V equal singular values
    assert value(0, 0, "qk_pr") == pytest.approx(N - 1)  # position i -> i-1 for i = 1..N-1
    assert value(0, 2, "qk_pr") == pytest.approx(1.0)  # BOS head: rank one
    assert value(1, 0, "qk_pr") == pytest.approx(V)  # induction: token <-> PREV, rank V
    assert math.isnan(value(0, 1, "ov_pr"))


# -- elevated PR -------------------------------------------------------------------------


def pr_series(values, layer=0, head=0):
    return pd.DataFrame({"step": [10 * 2**i for i in range(len(values))], "layer": layer, "head": head,
                         "value": values})


def test_elevated_pr_flags_a_planted_jump_and_not_a_flat_series():
    frame = pd.concat(
        [pr_series([5.0, 5.1, 4.9, 5.0, 9.0, 9.2], head=0), pr_series([5.0, 5.1, 4.9, 5.0, 5.05, 4.95], head=1)],
        ignore_index=True,
    )
    shuffled = frame.sample(frac=1.0, random_state=0)
    original = shuffled.copy()
    out = elevated_pr(shuffled)
    pd.testing.assert_frame_equal(shuffled, original)  # input untouched
    assert list(out.index) == list(shuffled.index)
    out = out.sort_values(["head", "step"])
    assert out[out["head"] == 0]["elevated"].tolist() == [False, False, False, False, True, True]
    assert not out[out["head"] == 1]["elevated"].any()
    first = out[out["step"] == 10]
    assert not first["elevated"].any() and first["baseline"].isna().all()
    assert out[(out["head"] == 0) & (out["step"] == 160)]["baseline"].iloc[0] == pytest.approx(5.0)


def test_elevated_pr_ratio_rule_window_and_bad_input():
    frame = pr_series([1.0, 1.0, 1.6, 1.6, 1.7])
    assert elevated_pr(frame, ratio=1.5)["elevated"].tolist() == [False, False, True, True, False]  # medians 1, 1, 1.3
    # a window of 1 compares with the previous revision only
    assert elevated_pr(frame, ratio=1.5, window=1)["elevated"].tolist() == [False, False, True, False, False]
    assert elevated_pr(frame, ratio=1.05, window=1)["elevated"].tolist() == [False, False, True, False, True]
    assert not elevated_pr(pr_series([3.0]))["elevated"].any()
    with pytest.raises(ValueError, match="several rows"):
        elevated_pr(pd.concat([frame.assign(metric="ov_pr"), frame.assign(metric="qk_pr")]))
    assert len(elevated_pr(pd.concat([frame.assign(metric="a"), frame.assign(metric="b")]),
                           by=("layer", "head", "metric"))) == 10
    with pytest.raises(ValueError, match="columns"):
        elevated_pr(frame.drop(columns="step"))


def test_head_frame_layout():
    frame = head_frame(torch.arange(6.0).reshape(2, 3), "x")
    assert frame[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert frame["value"].tolist() == [0, 1, 2, 3, 4, 5] and (frame["metric"] == "x").all()
    assert attention_patterns  # exported
