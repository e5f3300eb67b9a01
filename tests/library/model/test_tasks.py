"""Tests for circuitfade.tasks (synthetic task generators, Batch, scoring, registry)."""

from __future__ import annotations

import math

import pytest
import torch

from circuitfade.tasks import (
    AssocRecall,
    AssocRecallConfig,
    Batch,
    MarkovInduction,
    MarkovInductionConfig,
    Task,
    eval_set,
    make_task,
    register_task,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def perfect_logits(batch: Batch, d_vocab: int, margin: float = 1.0) -> torch.Tensor:
    """Logits that are one-hot (times margin) at the target of every answer position."""
    logits = torch.zeros(len(batch), batch.n_pos, d_vocab)
    b, i = batch.answer_mask.nonzero(as_tuple=True)
    logits[b, i, batch.targets[b, i]] = margin
    return logits


def wrong_logits(batch: Batch, d_vocab: int) -> torch.Tensor:
    """Logits whose argmax is (target + 1) mod d_vocab at every answer position."""
    logits = torch.zeros(len(batch), batch.n_pos, d_vocab)
    b, i = batch.answer_mask.nonzero(as_tuple=True)
    logits[b, i, (batch.targets[b, i] + 1) % d_vocab] = 10.0
    return logits


# --------------------------------------------------------------------- assoc
def _check_assoc(task: AssocRecall, batch: Batch) -> None:
    """Re-derive every target from the raw tokens and check all annotations."""
    c = task.config
    L = c.seq_len
    k_lo, k_hi = c.key_range
    v_lo, v_hi = c.value_range
    assert batch.tokens.shape == (len(batch), L)
    # exactly one answer per row, at the last position
    assert batch.answer_mask.sum(1).eq(1).all()
    assert batch.answer_mask[:, -1].all()
    assert (batch.targets[:, :-1] == -100).all()
    assert (batch.answer_sources[:, :-1] == False).all()  # noqa: E712
    for row in range(len(batch)):
        toks = batch.tokens[row].tolist()
        q = toks[-1]
        # Parse the context: walk left to right; a pair is (key, value), a filler
        # is a single token from the filler range.  Fillers never collide with keys.
        j, pairs, fillers = 0, [], 0
        while j < L - 1:
            if c.n_distractors and toks[j] >= c.filler_range[0]:
                fillers += 1
                j += 1
                continue
            pairs.append((j, toks[j], toks[j + 1]))
            j += 2
        assert len(pairs) == c.n_pairs and fillers == c.n_distractors
        keys = [k for _, k, _ in pairs]
        assert len(set(keys)) == c.n_pairs, "keys must be distinct"
        assert all(k_lo <= k < k_hi for k in keys)
        assert all(v_lo <= v < v_hi for _, _, v in pairs)
        hits = [(pos, v) for pos, k, v in pairs if k == q]
        assert len(hits) == 1, "the query must be exactly one of the keys"
        key_pos, value = hits[0]
        assert batch.targets[row, -1].item() == value
        src = batch.answer_sources[row, -1].nonzero().flatten().tolist()
        assert src == [key_pos + 1]
        assert toks[src[0]] == value


def test_assoc_default_format_and_targets():
    task = AssocRecall()
    assert task.n_ctx == 31 and task.d_vocab == 32 and task.chance == pytest.approx(1 / 16)
    batch = task.sample(256, gen(1))
    _check_assoc(task, batch)
    # default layout: strictly alternating keys (0..15) and values (16..31)
    assert (batch.tokens[:, 0:30:2] < 16).all() and (batch.tokens[:, 1:30:2] >= 16).all()
    src = batch.answer_sources[:, -1].nonzero()[:, 1]
    assert (src % 2 == 1).all()
    # the query index is not constant (uniform over 15 pairs)
    assert len(set(src.tolist())) > 10


def test_assoc_shared_vocab():
    task = AssocRecall(AssocRecallConfig(shared_vocab=True))
    assert task.chance == pytest.approx(1 / 32)
    batch = task.sample(256, gen(2))
    _check_assoc(task, batch)
    # keys really span the whole vocabulary, not just 0..15
    assert batch.tokens[:, 0:30:2].max() >= 16


def test_assoc_distractors():
    cfg = AssocRecallConfig(n_pairs=6, n_keys=8, n_values=8, d_vocab=32, n_distractors=5)
    task = AssocRecall(cfg)
    assert task.n_ctx == 2 * 6 + 5 + 1
    batch = task.sample(256, gen(3))
    _check_assoc(task, batch)
    # distractor placement varies: the answer source is not at a fixed parity
    src = batch.answer_sources[:, -1].nonzero()[:, 1]
    assert len(set((src % 2).tolist())) == 2


def test_assoc_config_validation():
    with pytest.raises(ValueError, match="n_pairs"):
        AssocRecallConfig(n_pairs=17, n_keys=16)
    with pytest.raises(ValueError, match="d_vocab"):
        AssocRecallConfig(n_keys=16, n_values=16, d_vocab=24)
    with pytest.raises(ValueError, match="max_len"):
        AssocRecallConfig(n_pairs=16, n_keys=16, n_values=16, d_vocab=32)  # 33 tokens
    with pytest.raises(ValueError, match="n_distractors"):
        AssocRecallConfig(n_distractors=1)  # no room outside keys/values in 32
    with pytest.raises(ValueError, match="n_pairs"):
        AssocRecallConfig(n_pairs=0)
    with pytest.raises(ValueError, match="query_position"):
        AssocRecallConfig(query_position="first")


# -------------------------------------------------------------------- markov
def _most_recent_successor(toks: list[int], i: int) -> int | None:
    """Position s+1 for the most recent s < i with toks[s] == toks[i], else None."""
    for s in range(i - 1, -1, -1):
        if toks[s] == toks[i]:
            return s + 1
    return None


def test_markov_answers_follow_induction_rule_and_rate_is_p():
    p = 0.5
    task = MarkovInduction(MarkovInductionConfig(p=p))
    assert task.n_ctx == 32 and task.chance == pytest.approx(1 / 32)
    batch = task.sample(2000, gen(4))
    toks_all = batch.tokens.tolist()
    mask_all = batch.answer_mask.tolist()
    n_eligible = n_copies = 0
    for row in range(len(batch)):
        toks, mask = toks_all[row], mask_all[row]
        assert not mask[-1]
        for i in range(len(toks) - 1):
            succ = _most_recent_successor(toks, i)
            if succ is not None:
                n_eligible += 1
            if mask[i]:
                n_copies += 1
                assert succ is not None, "answer at a position with no earlier occurrence"
                assert toks[i + 1] == toks[succ]
                assert batch.targets[row, i].item() == toks[i + 1]
    # sources: exactly the successor position on answer rows, nothing elsewhere
    b, i, j = batch.answer_sources.nonzero(as_tuple=True)
    assert torch.equal(batch.answer_mask.nonzero(as_tuple=True)[0], b)  # one source per answer
    assert (batch.tokens[b, j] == batch.targets[b, i]).all()
    for bb, ii, jj in zip(b[:200].tolist(), i[:200].tolist(), j[:200].tolist()):
        assert jj == _most_recent_successor(toks_all[bb], ii)
    # The Bernoulli draw is independent of eligibility, so copies ~ Binomial(n_eligible, p).
    # With ~2000*~20 eligible positions the s.d. of the rate is ~0.0025; 0.015 is > 5 s.d.
    assert n_eligible > 20_000
    assert abs(n_copies / n_eligible - p) < 0.015


@pytest.mark.parametrize("p", [0.2, 0.8, 1.0])
def test_markov_rate_other_p(p):
    batch = MarkovInduction(MarkovInductionConfig(p=p)).sample(1000, gen(5))
    t = batch.tokens
    # eligible(i) <=> toks[i] occurred at some earlier position (vectorised check)
    eq = (t[:, :, None] == t[:, None, :]) & torch.ones(32, 32, dtype=torch.bool).tril(-1)
    eligible = eq.any(-1)[:, :-1]
    rate = batch.answer_mask[:, :-1][eligible].float().mean().item()
    assert not batch.answer_mask[:, :-1][~eligible].any()
    assert abs(rate - p) < 0.02  # s.d. <= 0.004 for ~15k eligible positions


def test_markov_config_validation():
    for bad in (0, 0.0, -0.1, 1.5, True):
        with pytest.raises(ValueError, match="p"):
            MarkovInductionConfig(p=bad)
    with pytest.raises(ValueError, match="d_vocab"):
        MarkovInductionConfig(d_vocab=1)
    with pytest.raises(ValueError, match="seq_len"):
        MarkovInductionConfig(seq_len=1)


def test_markov_per_example_nan_when_no_answers():
    task = MarkovInduction(MarkovInductionConfig(p=0.2, d_vocab=32, seq_len=4))
    batch = task.sample(200, gen(6))
    counts = batch.answer_mask.sum(1)
    assert (counts == 0).any() and (counts > 0).any()
    acc = task.per_example_accuracy(perfect_logits(batch, 32), batch)
    assert torch.isnan(acc[counts == 0]).all()
    assert (acc[counts > 0] == 1.0).all()


# ------------------------------------------------------------ determinism etc.
@pytest.mark.parametrize("task", [AssocRecall(), MarkovInduction(),
                                  AssocRecall(AssocRecallConfig(n_pairs=6, n_keys=8, n_values=8,
                                                                n_distractors=4))])
def test_same_seed_identical_different_seed_differs(task: Task):
    a, b, c = task.sample(64, gen(7)), task.sample(64, gen(7)), task.sample(64, gen(8))
    assert a.equal(b)
    assert not torch.equal(a.tokens, c.tokens)
    # does not touch the global RNG
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    task.sample(4, gen(9))
    assert torch.equal(torch.rand(1), before)


def test_eval_set_fixed():
    task = MarkovInduction()
    e1, e2 = eval_set(task, n=32), eval_set(task, n=32)
    assert len(e1) == 32 and e1.equal(e2)
    assert not e1.equal(eval_set(task, n=32, seed=1))


# ------------------------------------------------------------------- scoring
@pytest.mark.parametrize("task", [AssocRecall(), MarkovInduction()])
def test_scoring_perfect_and_wrong(task: Task):
    batch = task.sample(128, gen(10))
    good = perfect_logits(batch, task.d_vocab)
    assert task.accuracy(good, batch).ndim == 0
    assert task.accuracy(good, batch).item() == 1.0
    assert task.accuracy(wrong_logits(batch, task.d_vocab), batch).item() == 0.0
    assert task.loss(perfect_logits(batch, task.d_vocab, margin=50.0), batch).item() < 1e-6
    uniform = torch.zeros(len(batch), batch.n_pos, task.d_vocab)
    assert task.loss(uniform, batch).item() == pytest.approx(math.log(task.d_vocab), rel=1e-5)
    # logits off the answer positions are ignored
    noisy = good.clone()
    noisy[~batch.answer_mask] = torch.randn(int((~batch.answer_mask).sum()), task.d_vocab) * 100
    assert task.accuracy(noisy, batch).item() == 1.0
    # d_vocab_out > d_vocab is accepted
    wide = torch.cat([good, torch.full((len(batch), batch.n_pos, 3), -1.0)], dim=-1)
    assert task.accuracy(wide, batch).item() == 1.0


def test_accuracy_partial_and_per_example():
    task = AssocRecall()
    batch = task.sample(8, gen(11))
    logits = perfect_logits(batch, 32)
    logits[:2] = wrong_logits(batch[:2], 32)
    assert task.accuracy(logits, batch).item() == pytest.approx(6 / 8)
    assert task.per_example_accuracy(logits, batch).tolist() == [0.0, 0.0] + [1.0] * 6


def test_logits_shape_validation():
    task = AssocRecall()
    batch = task.sample(4, gen(12))
    for shape in [(4, 30, 32), (3, 31, 32), (4, 31, 31), (4, 31)]:
        with pytest.raises(ValueError, match="logits"):
            task.accuracy(torch.zeros(shape), batch)
        with pytest.raises(ValueError, match="logits"):
            task.loss(torch.zeros(shape), batch)


# --------------------------------------------------------------------- Batch
def test_batch_validation_and_indexing():
    batch = AssocRecall().sample(10, gen(13))
    with pytest.raises(ValueError, match="targets"):
        Batch(batch.tokens, batch.targets[:, :-1], batch.answer_mask, batch.answer_sources)
    with pytest.raises(ValueError, match="answer_sources"):
        Batch(batch.tokens, batch.targets, batch.answer_mask, batch.answer_sources[:, :-1])
    with pytest.raises(ValueError, match="answer_mask"):
        Batch(batch.tokens, batch.targets, batch.answer_mask.long(), batch.answer_sources)
    with pytest.raises(ValueError, match="tokens"):
        Batch(batch.tokens.int(), batch.targets, batch.answer_mask, batch.answer_sources)
    with pytest.raises(ValueError, match="targets"):  # target at a non-answer position
        t = batch.targets.clone()
        t[:, 0] = 3
        Batch(batch.tokens, t, batch.answer_mask, batch.answer_sources)
    with pytest.raises(ValueError, match="causal"):
        s = batch.answer_sources.clone()
        s[0, 5, 6] = True
        m = batch.answer_mask.clone()
        m[0, 5] = True
        t = batch.targets.clone()
        t[0, 5] = 1
        Batch(batch.tokens, t, m, s)
    with pytest.raises(ValueError, match="non-answer positions"):  # a source on a row that is not scored
        s = batch.answer_sources.clone()
        s[3, 7, 2] = True
        Batch(batch.tokens, batch.targets, batch.answer_mask, s)
    empty = torch.zeros(2, 0, dtype=torch.long)
    assert len(Batch(empty, empty, empty.bool(), torch.zeros(2, 0, 0, dtype=torch.bool))) == 2

    assert len(batch) == 10
    sub = batch[2:5]
    assert len(sub) == 3 and torch.equal(sub.tokens, batch.tokens[2:5])
    idx = torch.tensor([9, 0])
    picked = batch[idx]
    assert torch.equal(picked.answer_sources, batch.answer_sources[idx])
    assert len(batch[3]) == 1 and torch.equal(batch[3].targets[0], batch.targets[3])
    assert Batch.concat([batch[:4], batch[4:]]).equal(batch)
    assert batch.to("cpu").equal(batch)
    with pytest.raises(ValueError):
        Batch.concat([])


# ------------------------------------------------------------------ registry
def test_make_task_and_registry():
    t = make_task("assoc", n_pairs=4, n_keys=8, n_values=8)
    assert isinstance(t, AssocRecall) and t.n_ctx == 9
    m = make_task("markov", p=0.8)
    assert isinstance(m, MarkovInduction) and m.config.p == 0.8
    with pytest.raises(ValueError, match="assoc"):  # lists known names
        make_task("nope")
    with pytest.raises(ValueError, match="n_pair"):
        make_task("assoc", n_pair=3)
    with pytest.raises(ValueError, match="p"):
        make_task("markov", p=0)
    with pytest.raises(ValueError, match="already registered"):
        register_task("assoc", lambda **kw: AssocRecall())


def test_linreg_targets_are_linear_in_context():
    import math

    from circuitfade.tasks import LinearRegressionICL, LinRegConfig

    task = LinearRegressionICL(LinRegConfig(n_points=6, d_x=3))
    b = task.sample(5, torch.Generator().manual_seed(0))
    assert b.inputs.shape == (5, 13, 4) and b.answer_mask.sum() == 5 * 7
    xs = b.inputs[:, 0::2, :3]
    ys_ctx = b.inputs[:, 1::2, 3]
    # solve for w from the 6 context pairs and predict every target (noise-free => exact)
    w = torch.linalg.lstsq(xs[:, :6], ys_ctx.unsqueeze(-1)).solution
    pred = (xs @ w).squeeze(-1)
    torch.testing.assert_close(pred, b.targets[:, 0::2], atol=1e-4, rtol=1e-4)
    assert torch.isnan(b.targets[:, 1::2]).all()
    perfect = torch.zeros(5, 13, 1)
    perfect[:, 0::2, 0] = b.targets[:, 0::2]
    assert task.loss(perfect, b) == 0
    assert abs(task.metrics(torch.zeros(5, 13, 1), b)["mse"] - float((b.targets[:, 0::2] ** 2).mean())) < 1e-6
    del math
