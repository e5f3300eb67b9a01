"""Ambiguous recall, balanced branches, patching / mean replacement, sign-flip statistics."""

from __future__ import annotations

import math

import pytest
import torch

from circuitfade.analysis.patching import mean_replacement, patch_resid, patched_logits, resid_hooks
from studies.history import study as history
from studies.history.study import (
    BRANCHES,
    HistoryConfig,
    balanced_plan,
    example_hashes,
    sign_flip_pvalue,
    t_interval,
)
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.tasks import make_task
from circuitfade.tasks.ambiguous import AmbiguousBatch, AmbiguousRecall, AmbiguousRecallConfig
from circuitfade.train import RunConfig, TrainConfig, clone_run, new_run, train
from repo_root import REPO

TINY_MODEL = {**history.MODEL, "d_model": 16, "d_head": 4, "d_mlp": 32, "n_ctx": 17}


@pytest.fixture(autouse=True)
def one_thread():
    # tiny models: extra threads only contend with other jobs on a shared machine
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def tiny_model(seed, **kw):
    torch.manual_seed(seed)
    cfg = SoftPriorConfig(**{**{k: v for k, v in TINY_MODEL.items()}, "priors": (), **kw})
    return SoftPriorTransformer(cfg)


# ------------------------------------------------------------------------------ task
def test_targets_follow_the_rules_at_the_right_rate():
    task = make_task("ambiguous")
    b = task.sample(4000, gen(0), p_icl=0.3)
    n_ctx = int(b.uses_context.sum())
    assert abs(n_ctx - 1200) < 3 * math.sqrt(4000 * 0.3 * 0.7)
    # context answer = the value right after the query key in the prompt; fixed = table[query]
    P = task.config.n_pairs
    q = b.tokens[:, -1]
    keys, vals = b.tokens[:, 0 : 2 * P : 2], b.tokens[:, 1 : 2 * P : 2]
    idx = (keys == q[:, None]).float().argmax(1)
    assert torch.equal(b.context_answer, vals[torch.arange(4000), idx])
    assert torch.equal(b.fixed_answer, task.table[q])
    assert torch.equal(b.targets[:, -1], torch.where(b.uses_context, b.context_answer, b.fixed_answer))
    assert (b.targets[:, :-1] == -100).all() and b.answer_mask[:, -1].all() and b.answer_mask.sum() == 4000
    # the fixed table is an injective key -> value map, fixed by table_seed
    t = task.table
    assert len(set(t.tolist())) == 16 and t.min() >= 16 and t.max() < 32
    assert torch.equal(t, AmbiguousRecall(AmbiguousRecallConfig(table_seed=0)).table)
    assert not torch.equal(t, AmbiguousRecall(AmbiguousRecallConfig(table_seed=1)).table)
    assert make_task("ambiguous", p_icl=0.2).config.p_icl == 0.2


def test_inputs_do_not_depend_on_p_icl():
    task = make_task("ambiguous")
    lo, hi, dflt = (task.sample(500, gen(1), p_icl=p) for p in (0.1, 0.9, None))
    for f in ("tokens", "context_answer", "fixed_answer", "conflict", "answer_mask"):
        assert torch.equal(getattr(lo, f), getattr(hi, f)), f
    # one uniform per example: the context set grows monotonically with p
    assert (lo.uses_context <= hi.uses_context).all() and hi.uses_context.sum() > 400 > 100 > lo.uses_context.sum()
    assert abs(dflt.uses_context.float().mean() - 0.5) < 0.1  # config default p_icl = 0.5
    with pytest.raises(ValueError, match="p_icl"):
        task.sample(4, gen(0), p_icl=1.5)


def test_conflict_mask_and_answer_sources():
    task = make_task("ambiguous")
    b = task.sample(2000, gen(2), p_icl=0.5)
    assert torch.equal(b.conflict, b.context_answer != b.fixed_answer)
    assert abs(b.conflict.float().mean() - 15 / 16) < 0.03
    agree = ~b.conflict
    assert agree.any() and torch.equal(b.targets[agree, -1], b.fixed_answer[agree])
    # the prompt marks the context value as the source iff the target is the context answer
    has_src = b.answer_sources[:, -1].any(-1)
    assert torch.equal(has_src, b.targets[:, -1] == b.context_answer)


def test_ambiguous_batch_keeps_its_fields():
    task = make_task("ambiguous")
    b = task.sample(6, gen(3))
    for sub, idx in ((b[1:4], [1, 2, 3]), (b[[0, 5]], [0, 5]), (b[2], [2]), (b[torch.tensor([4, 1])], [4, 1])):
        assert isinstance(sub, AmbiguousBatch)
        assert torch.equal(sub.context_answer, b.context_answer[idx]) and torch.equal(sub.tokens, b.tokens[idx])
    cat = AmbiguousBatch.concat([b[:2], b[2:]])
    assert cat.equal(b) and isinstance(b.to("cpu"), AmbiguousBatch) and b.to("cpu").equal(b)
    with pytest.raises(ValueError, match="conflict"):
        AmbiguousBatch(b.tokens, b.targets, b.answer_mask, b.answer_sources, context_answer=b.context_answer,
                       fixed_answer=b.fixed_answer, conflict=~b.conflict, uses_context=b.uses_context)


def test_margin_and_rule_accuracy_on_planted_logits():
    task = make_task("ambiguous")
    b = task.sample(50, gen(4))
    logits = torch.zeros(50, b.n_pos, 32)
    r = torch.arange(50)
    logits[r, -1, b.fixed_answer] = -1.0
    logits[r, -1, b.context_answer] = 2.0  # on agreement trials the same entry: margin 0
    m = task.margin(logits, b)
    assert torch.allclose(m[b.conflict], torch.full_like(m[b.conflict], 3.0)) and (m[~b.conflict] == 0).all()
    acc = task.rule_accuracy(logits, b)
    assert acc == {"acc_context": 1.0, "acc_fixed": 0.0, "acc_either": 1.0}
    assert task.bayes_loss(0.5, 1.0) == pytest.approx(math.log(2))


# -------------------------------------------------------------------------- branches
def tiny_cfg(steps, **kw):
    return RunConfig(path="unforced", task={"name": "ambiguous", "n_pairs": 8}, model=TINY_MODEL,
                     train=TrainConfig(steps=steps, batch_size=16, eval_every=steps, eval_size=32,
                                       eval_conditions=("normal",)), seed=5, **kw)


def test_clone_copies_optimizer_state_exactly():
    anchor = train(tiny_cfg(6), None, progress=False)
    batch = make_task("ambiguous", n_pairs=8).sample(16, gen(9))
    one = lambda step, g: batch  # noqa: E731
    a, b = clone_run(anchor, tiny_cfg(7)), clone_run(anchor, tiny_cfg(7))
    for k, st in anchor.optimizer.state_dict()["state"].items():
        assert all(torch.equal(v, a.optimizer.state_dict()["state"][k][n]) for n, v in st.items())
    train(a.config, None, progress=False, sampler=one, run=a)
    train(b.config, None, progress=False, sampler=one, run=b)
    assert a.step == b.step == 7
    wa, wb, w0 = a.model.state_dict(), b.model.state_dict(), anchor.model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)  # the step did change the weights
    # same weights with a *fresh* optimizer give a different step: the copied state matters
    c = new_run(tiny_cfg(7))
    c.model.load_state_dict(anchor.model.state_dict())
    c.step = 6
    train(c.config, None, progress=False, sampler=one, run=c)
    assert any(not torch.equal(wa[k], c.model.state_dict()[k]) for k in wa)


def test_balanced_branches_share_examples_and_rule_exposure():
    task = make_task("ambiguous", n_pairs=8)
    start, period = 6, 8
    plan = balanced_plan(task, 0.5, 0.3, period, 16, gen(11), start=start)
    hc = HistoryConfig(anchor_steps=start, period=period, delta=0.3)
    seen: dict[str, list] = {b: [] for b in BRANCHES}
    anchor = train(tiny_cfg(start), None, progress=False)
    for br in BRANCHES:
        sampler = plan.sampler(br)

        def spy(step, g, br=br, sampler=sampler):
            batch = sampler(step, g)
            seen[br].append((step, batch))
            return batch

        run = clone_run(anchor, tiny_cfg(start + period, mix={"p_icl": hc.schedule(br).spec}))
        train(run.config, None, progress=False, sampler=spy, run=run)
        # every update used a batch drawn at exactly this branch's mix p(step)
        for step, batch in seen[br]:
            i = plan.order[br][step - start]
            assert plan.batches[i] is batch and plan.p_icl[i] == pytest.approx(hc.schedule(br)(step), abs=1e-9)
    assert [s for s, _ in seen["from_below"]] == list(range(start, start + period))
    hashes = {b: example_hashes([x for _, x in seen[b]]) for b in BRANCHES}
    assert sorted(hashes["from_below"]) == sorted(hashes["from_above"])  # same multiset ...
    assert hashes["from_below"] != hashes["from_above"]  # ... in a different order
    ctx = {b: int(sum(x.uses_context.sum() for _, x in seen[b])) for b in BRANCHES}
    assert ctx["from_below"] == ctx["from_above"]
    # the mixes really differ in time: from below peaks first, from above dips first
    assert hc.schedule("from_below")(start + 2) == pytest.approx(0.8)
    assert hc.schedule("from_above")(start + 2) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="even"):
        balanced_plan(task, 0.5, 0.3, 7, 4, gen(0))


# -------------------------------------------------------------------------- patching
def margin_metric(task, batch):
    return lambda logits: task.margin(logits, batch)[batch.conflict].mean()


def test_patching_everything_or_nothing_restores_all_or_none():
    task = make_task("ambiguous", n_pairs=8)
    batch = task.sample(40, gen(6))
    A, B = tiny_model(1), tiny_model(2)
    # a different model, but the same read-out (ln_final + unembedding): then the final
    # residual stream at every position determines the logits completely
    B.ln_final.load_state_dict(A.ln_final.state_dict())
    B.unembed.load_state_dict(A.unembed.state_dict())
    metric = margin_metric(task, batch)
    with torch.no_grad():
        m_a, m_b = float(metric(A(batch.tokens))), float(metric(B(batch.tokens)))
    final = resid_hooks(B)[-1][1]
    assert final == "blocks.1.hook_resid_post"
    all_pos = patched_logits(A, B, batch.tokens, {final: None})
    nothing = patched_logits(A, B, batch.tokens, {})
    restored = lambda v: (float(metric(v)) - m_b) / (m_a - m_b)  # noqa: E731
    assert restored(all_pos) == pytest.approx(1.0, abs=1e-5)
    assert restored(nothing) == pytest.approx(0.0, abs=1e-6)
    df = patch_resid(A, B, batch.tokens, metric)
    assert len(df) == 3 * batch.n_pos and set(df.layer) == {0, 1, 2}
    assert df.attrs["metric_source"] == pytest.approx(m_a, abs=1e-5)
    last = df[(df.layer == 2)].set_index("pos")["restored"]
    # the final residual at the query fixes the query's logits; elsewhere it cannot matter
    assert last[batch.n_pos - 1] == pytest.approx(1.0, abs=1e-5)
    assert last.drop(batch.n_pos - 1).abs().max() < 1e-5
    assert A.training and B.training  # modes restored
    with pytest.raises(ValueError, match="differ in d_model"):
        patch_resid(A, tiny_model(3, d_model=32, d_head=8), batch.tokens, metric)


def test_mean_replacement_known_answers():
    task = make_task("ambiguous", n_pairs=8)
    batch = task.sample(40, gen(7))
    model = tiny_model(4)
    with torch.no_grad():
        model.blocks[0].attn.W_O[0].zero_()  # head L0H0 writes nothing
    metric = margin_metric(task, batch)
    df = mean_replacement(model, batch.tokens, metric).set_index("component")
    assert list(df.index[:2]) == ["none", "L0H0"] and {"all_heads", "L1MLP", "all_mlps"} <= set(df.index)
    assert df.loc["L0H0", "delta"] == pytest.approx(0.0, abs=1e-6)
    assert df.loc["L1H2", "delta"] != pytest.approx(0.0, abs=1e-6)
    # identical prompts: every activation equals its batch mean, nothing changes
    same = batch[[0] * 8]
    m2 = lambda lg: task.margin(lg, same).mean()  # noqa: E731
    d2 = mean_replacement(model, same.tokens, m2)
    assert d2["delta"].abs().max() < 1e-5


# ------------------------------------------------------------------------- statistics
def test_sign_flip_exact_pvalues_and_t_interval():
    assert sign_flip_pvalue([1, 2, 3, 4, 5]) == 0.0625
    assert sign_flip_pvalue([-1, -2, -3, -4, -5]) == 0.0625
    assert sign_flip_pvalue([1, -1]) == 1.0
    assert sign_flip_pvalue([3, 1, 2]) == 0.25
    with pytest.raises(ValueError):
        sign_flip_pvalue([])
    m, lo, hi = t_interval([1, 2, 3, 4, 5])
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert m == 3 and lo == pytest.approx(3 - half, abs=1e-5) and hi == pytest.approx(3 + half, abs=1e-5)


def test_tiny_experiment_end_to_end(tmp_path):
    hc = HistoryConfig(anchor_steps=8, period=8, relax_steps=(0, 2, 4), relax_every=2, trace_every=4, eval_size=64,
                       patch_size=32, batch_size=16, model=TINY_MODEL)
    per_seed, md = history.run([0], tmp_path, config=hc, progress=False)
    r = per_seed.iloc[0]
    assert r["ctx_targets_from_below"] == r["ctx_targets_from_above"]
    assert r["gap_r0"] == pytest.approx(r["margin_from_below"] - r["margin_from_above"], abs=1e-6)
    trace = __import__("pandas").read_csv(tmp_path / "trace.csv")
    a = trace[trace.phase == "anchor"]
    assert a.margin.nunique() == 1  # both branches start from the same anchor
    assert set(trace[trace.phase == "schedule"].k) == {4, 8}  # every trace_every=4 updates up to the period
    assert set(trace[trace.phase == "relax"].k) == {8, 10, 12}
    for f in ("per_seed.csv", "summary.csv", "patching.csv", "replacement.csv", "results.md", "figures.html"):
        assert (tmp_path / f).is_file(), f
    assert "+0.0976" in md and "86.8" in md and "sign-flip" in md


def test_summary_and_markdown_read_result_fields():
    # planted per-seed results, no training: the report reads dataclass fields, not packed keys
    from studies.history.protocol import Behaviour, Mechanism, SeedResult

    import pandas as pd

    hc = HistoryConfig(relax_steps=(0, 25))

    def seed_result(seed, gap0, gap25, gap_sub, after_heads):
        beh = Behaviour(margin=0.1 * seed, acc_context=0.5, acc_fixed=0.25, acc_either=0.75, loss=1.0)
        mech = Mechanism(patching=pd.DataFrame(), replacement=pd.DataFrame(), patch_corr=0.99, gap_sub=gap_sub,
                         gap_after={"heads": after_heads}, dominant={"from_below": ("L1H0", 0.2),
                                                                     "from_above": ("L1H0" if seed else "L0H1", 0.1)})
        return SeedResult(seed, beh, 0.05, {"from_below": 10, "from_above": 10},
                          {"from_below": beh, "from_above": beh}, mech, {0: gap0, 25: gap25}, pd.DataFrame())

    results = [seed_result(0, 0.2, -0.1, 0.2, 0.05), seed_result(1, 0.4, 0.1, 0.4, 0.1)]
    s = history.summary_table(results, hc).set_index("quantity")
    assert s.loc["gap_r0", "mean"] == pytest.approx(0.3) and s.loc["gap_r0", "n_positive"] == 2
    assert s.loc["gap_r0", "p_signflip"] == 0.5  # two positive values: 2 of 4 sign assignments as extreme
    assert s.loc["gap_r25", "n_positive"] == 1
    assert s.loc["frac_removed_all_heads", "mean"] == pytest.approx(0.75)  # 1 - 0.05/0.2 and 1 - 0.1/0.4
    assert s.loc["frac_removed_all_heads_pooled", "mean"] == pytest.approx(1 - 0.075 / 0.3)
    assert s.loc["same_dominant_head", "mean"] == 0.5 and math.isnan(s.loc["same_dominant_head", "ci_lo"])
    assert "frac_removed_all_mlps" not in s.index  # no MLP replacement measured
    assert results[1].row()["gap_r25"] == 0.1 and results[0].row()["dominant_head_from_above"] == "L0H1"
    md = history.to_markdown(results, s.reset_index(), hc)
    assert "| 1 | 0.750 / 0.500 / 0.250 |" in md and "L1H0 / L0H1" in md
    # headings come from the verdicts: 1 of 2 seeds with the same head is "not reproduced", gap_r100 was not measured
    did_not = md.split("What did not reproduce:")[1].split("Not run:")[0]
    assert "- the same dominant head in both histories: ours 1/2 seeds;" in did_not
    assert "- the gap vanishes after 100 updates at p0: ours —;" in md.split("Not run:")[1]
    assert "- mean-replacing all query heads removes most of the gap: ours +0.750 [+0.750, +0.750]" in md.split(
        "What reproduced:")[1].split("What did not reproduce:")[0]  # 0.75 in both seeds
    assert "settings differ from the declaration (relax_steps [0, 25] vs declared [0, 25, 100]; 2 seeds vs declared 5)" in md


def test_tables_only_rebuilds_the_report_from_per_seed_csv(tmp_path):
    """The committed per-seed results give the same summary, and the verdict headings from their outcomes:
    an opposite-sign immediate gap is listed under "What did not reproduce", never under "What reproduced"."""
    import shutil
    from pathlib import Path

    import pandas as pd

    from planted import run_study

    src = REPO / "results" / "history"
    for f in ("per_seed.csv", "config.json", "summary.csv"):
        shutil.copy(src / f, tmp_path / f)
    assert run_study("history", ["--tables-only", "--out", str(tmp_path)]) == 2  # summary.csv exists: needs --force
    md = history.rebuild(tmp_path, force=True)
    new, old = pd.read_csv(tmp_path / "summary.csv"), pd.read_csv(src / "summary.csv")
    assert list(new.quantity) == list(old.quantity)
    assert new[["mean", "ci_lo", "ci_hi", "n_positive", "p_signflip"]].to_numpy() == pytest.approx(
        old[["mean", "ci_lo", "ci_hi", "n_positive", "p_signflip"]].to_numpy(), rel=1e-12, abs=1e-15, nan_ok=True)
    assert "Declaration: history v1 (sha256 " in md and "settings differ" not in md
    reproduced = md.split("What reproduced:")[1].split("What partly reproduced:")[0]
    assert "study's sign" not in reproduced and "same dominant head" in reproduced
    assert "- history dependence with the study's sign" in md.split("What did not reproduce:")[1]
    (tmp_path / "per_seed.csv").unlink()
    with pytest.raises(ValueError, match="per_seed.csv: not found"):
        history.rebuild(tmp_path, force=True)
