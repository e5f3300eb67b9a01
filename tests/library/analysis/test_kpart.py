"""The K-part apparatus: shortcut-free by the data distribution itself, the hand-built circuit, part
ablation on it and on plain TransformerLens / Hugging Face models, and part re-initialisation."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.parts import normalize_parts, part_ablation, pool_cells, sign_test, trace_part_ablation
from circuitfade.store import attach
from circuitfade.tasks import KPart, KPartConfig, eval_set, make_task
from circuitfade.tasks.kpart import PIN_PRIOR, conditional_target_table, hand_built_model, kpart_model
from circuitfade.train import RunConfig, TrainConfig, new_run
from circuitfade.train.surgery import reinit_heads

torch.set_num_threads(1)


# ------------------------------------------------------------------ shortcut-free, from the distribution
@pytest.mark.parametrize("k,v", [(2, 2), (2, 5), (3, 3), (4, 3), (3, 5), (5, 2), (6, 2)])
@pytest.mark.parametrize("permute", [True, False])
def test_target_is_uniform_given_any_strict_subset(k, v, permute):
    task = make_task("kpart", k=k, v=v, permute=permute)
    for size in range(k):  # every strict subset, the empty one included
        for known in itertools.combinations(range(k), size):
            table = conditional_target_table(task, known)
            assert table.shape == (v ** size, v)
            assert torch.equal(table, torch.full_like(table, 1.0 / v)), (known, table)
    full = conditional_target_table(task, tuple(range(k)))  # all K inputs: the target is determined
    assert torch.equal(full.max(1).values, torch.ones(v ** k, dtype=torch.float64))


def test_the_table_detects_a_shortcut(monkeypatch):
    """A variant whose target leaks one input is caught by the same enumeration (the test can fail)."""
    task = make_task("kpart", k=3, v=3)
    monkeypatch.setattr(task, "target_of", lambda x: (torch.as_tensor(x)[..., 0] * 2 + torch.as_tensor(x)[..., 1]
                                                      + (torch.as_tensor(x)[..., 2] > 0)) % 3)
    table = conditional_target_table(task, (0, 1))
    assert not torch.allclose(table, torch.full_like(table, 1 / 3))


def test_sample_follows_the_definition():
    task = make_task("kpart", k=4, v=5, n_distractors=2, perm_seed=3)
    b = task.sample(300, torch.Generator().manual_seed(0))
    assert b.tokens.shape == (300, 7) and task.n_ctx == 7 and task.d_vocab == 7
    assert bool((b.tokens[:, -1] == task.query_token).all()) and int(b.tokens[:, :-1].max()) < 5
    assert b.answer_mask[:, -1].all() and not b.answer_mask[:, :-1].any()
    want = sum(task.perms[i][b.tokens[:, i]] for i in range(4)) % 5
    assert torch.equal(b.targets[:, -1], want)
    assert all(sorted(p.tolist()) == list(range(5)) for p in task.perms)
    assert len({tuple(p.tolist()) for p in task.perms}) > 1  # distinct permutations per position
    again = task.sample(300, torch.Generator().manual_seed(0))
    assert b.equal(again)
    assert task.chance == pytest.approx(0.2)


def test_mix_base_sequences_copy_the_last_value():
    task = make_task("kpart", k=2, v=3, n_distractors=1)
    b = task.sample(400, torch.Generator().manual_seed(1), p_capability=0.0)
    assert bool((b.tokens[:, -1] == task.base_query_token).all())
    assert torch.equal(b.targets[:, -1], b.tokens[:, -2])
    assert b.answer_sources[:, -1, -2].all()
    half = task.sample(2000, torch.Generator().manual_seed(2), p_capability=0.5)
    share = float((half.tokens[:, -1] == task.query_token).float().mean())
    assert 0.45 < share < 0.55
    with pytest.raises(ValueError, match="p_capability"):
        task.sample(4, torch.Generator(), p_capability=1.5)


@pytest.mark.parametrize("kw,match", [({"k": 1}, "k:"), ({"k": 7}, "k:"), ({"v": 1}, "v:"),
                                      ({"k": 2, "positions": (1, 1)}, "positions"),
                                      ({"k": 2, "positions": (0, 9)}, "positions"), ({"unknown": 1}, "unknown")])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        make_task("kpart", **kw)


def test_preset_needs_default_positions():
    with pytest.raises(ValueError, match="positions 0..K-1"):
        kpart_model(KPart(KPartConfig(k=2, n_distractors=1, positions=(1, 2))))


# ------------------------------------------------------------------ the hand-built circuit
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_hand_built_circuit_is_exact(k):
    task = make_task("kpart", k=k, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    assert parts == [(0, i) for i in range(k)] and model.cfg.n_heads == k + 2
    b = eval_set(task, n=512)
    with torch.no_grad():
        assert float(task.accuracy(model(b.tokens), b)) == 1.0
    df = part_ablation(model, task, parts=parts, method="mean", n_random=2)
    part, rnd = df[df.kind == "part"], df[df.kind == "random"]
    assert len(part) == k and len(rnd) == 2
    assert (part.acc_intact == 1.0).all() and (part.partial_credit == (k - 1) / k).all()
    # each part alone takes it to chance (1/3 up to sampling noise of 512 answers: sd 0.021)
    assert (part.acc_ablated - 1 / 3).abs().max() < 0.08
    assert part.retained.abs().max() < 0.12
    assert (rnd.acc_ablated == 1.0).all() and (rnd.retained == 1.0).all()  # a non-part head changes nothing


@pytest.mark.parametrize("method", ["mean", "zero", "resample"])
def test_part_ablation_methods_on_hand_built(method):
    task = make_task("kpart", k=3, v=5, n_distractors=2)
    model, parts = hand_built_model(task, spare_heads=2)
    df = part_ablation(model, task, parts={"first": parts[0], "rest": parts[1:]}, method=method, n_random=5, seed=1)
    assert list(df.part[:2]) == ["first", "rest"] and df.heads[1] == "L0H1+L0H2"
    assert (df[df.kind == "part"].retained.abs() < 0.12).all()
    assert (df[df.kind == "random"].acc_ablated == 1.0).all()
    assert set(df[df.kind == "random"].heads) == {"L0H3", "L0H4"}  # only 2 non-part heads exist
    assert df.n_parts.iloc[0] == 2


def test_part_ablation_does_not_change_the_model():
    task = make_task("kpart", k=2, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    part_ablation(model, task, parts=parts, method="resample")
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_part_ablation_bad_input():
    task = make_task("kpart", k=2, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    with pytest.raises(ValueError, match="method"):
        part_ablation(model, task, parts=parts, method="median")
    with pytest.raises(ValueError, match="not in a model"):
        part_ablation(model, task, parts=[(0, 9)])
    with pytest.raises(ValueError, match="two parts"):
        normalize_parts({"a": (0, 1), "b": [(0, 1), (0, 2)]})
    with pytest.raises(ValueError, match="chance"):
        part_ablation(model, eval_set(task, 16), parts=parts)
    with pytest.raises(ValueError, match="task= must not be given"):
        part_ablation(model, task, task, parts=parts)
    with pytest.raises(TypeError, match="parts= is missing"):
        part_ablation(model, eval_set(task, 16), task)


def test_part_ablation_takes_the_previous_order_for_one_release_with_a_warning():
    task = make_task("kpart", k=2, v=3, n_distractors=1)
    model, parts = hand_built_model(task, spare_heads=2)
    b = eval_set(task, 64)
    now = part_ablation(model, b, task, parts=parts, n_random=2)
    for old in (lambda: part_ablation(model, parts, (task, b), n_random=2),
                lambda: part_ablation(model, parts, b, task=task, n_random=2)):
        with pytest.warns(DeprecationWarning, match=r"now part_ablation\(model, batch, task, parts=parts\)"):
            assert old().equals(now)


def test_part_ablation_on_a_plain_hooked_transformer_and_a_bare_batch():
    """Works on any TransformerLens model; a model at chance does not discriminate (NaN, never a number)."""
    cfg = dict(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=3, d_vocab=5, attn_only=True)
    torch.manual_seed(0)
    model = compat.plain_model(cfg)
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    b = eval_set(task, 64)
    df = part_ablation(model, b, parts=[(0, 1), (1, 2)], chance=1 / 3, n_random=10)
    assert len(df) == 2 + 4 and set(df.kind) == {"part", "random"}
    assert df.acc_intact.between(0, 1).all()
    if df.acc_intact.iloc[0] < 1 / 3 + 0.1:
        assert df.retained.isna().all()


def test_part_ablation_on_a_local_neox_revision(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    c = transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   vocab_size=64, max_position_embeddings=64)
    transformers.GPTNeoXForCausalLM(c).eval().save_pretrained(tmp_path / "step100")
    series = attach(tmp_path)
    task = make_task("repeats", d_vocab=63, seq_len=32, min_span=4, max_span=8, score="repeat")
    df = trace_part_ablation(series, {"prev": (0, 1), "ind": (1, 2)}, task, n_random=3, n=32)
    assert list(df.step.unique()) == [100]
    assert set(df.kind) == {"part", "random"} and len(df) == 5
    assert (df.metric == "retained").all() and df.acc_intact.between(0, 1).all()
    assert df.architecture.iloc[0] == "GPTNeoXForCausalLM"


def test_trace_part_ablation_over_an_in_memory_series():
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    series = attach([model, model], steps=[10, 20])
    df = trace_part_ablation(series, lambda m, b: parts, task, n=512)
    assert sorted(df.step.unique()) == [10, 20] and len(df) == 2 * (3 + 2)
    assert (df[df.kind == "part"].value.abs() < 0.15).all() and (df[df.kind == "random"].value == 1.0).all()
    # declaring only two of the three parts: the undeclared part shows up as a "random" head that matters
    df2 = trace_part_ablation(series, parts[:2], task, n=512, n_random=3)
    assert (df2[(df2.kind == "random") & (df2.heads == "L0H2")].value.abs() < 0.15).all()


# ------------------------------------------------------------------ pooled statistics
def test_sign_test_exact_values():
    assert sign_test(32, 32) == pytest.approx(2 ** -32)  # the study's 32/32: 2.3e-10
    assert sign_test(0, 10) == 1.0
    assert sign_test(9, 10) == pytest.approx(11 / 1024)
    with pytest.raises(ValueError):
        sign_test(5, 3)


def test_pool_cells_on_planted_frame():
    rows = []
    for cell, vals in enumerate([(0.1, 0.2), (0.0, 0.1), (0.9, 0.8), (float("nan"), float("nan"))]):
        for v in vals:
            rows.append({"cell": cell, "kind": "part", "retained": v, "partial_credit": 0.5})
        rows.append({"cell": cell, "kind": "random", "retained": 1.0, "partial_credit": 0.5})
    p = pool_cells(pd.DataFrame(rows), ["cell"])
    assert p["n_cells"] == 4 and p["n_discriminating"] == 3 and p["n_below"] == 2
    assert p["median"] == pytest.approx(0.15)
    assert p["p_sign"] == pytest.approx(0.5)  # P(Bin(3, 1/2) >= 2)
    assert p["median_lo"] <= p["median"] <= p["median_hi"]


# ------------------------------------------------------------------ re-initialising parts
def _small_run(k=3):
    task = make_task("kpart", k=k, v=3, n_distractors=1)
    cfg = RunConfig(path="unforced", task={"name": "kpart", "k": k, "v": 3, "n_distractors": 1},
                    model=kpart_model(task), train=TrainConfig(steps=5, eval_conditions=("normal",)), seed=0)
    return new_run(cfg)


def test_reinit_heads_touches_only_the_chosen_slices():
    run = _small_run()
    model = run.model
    assert PIN_PRIOR in model.cfg.priors
    x = torch.zeros(2, model.cfg.n_ctx, dtype=torch.long)
    run.optimizer.zero_grad()
    model(x).sum().backward()
    run.optimizer.step()  # creates moments
    before = {k: v.clone() for k, v in model.state_dict().items()}
    touched = reinit_heads(run, [(0, 1)], seed=5, slices=("q", "k"))
    attn = model.blocks[0].attn
    assert touched == ["blocks.0.attn.W_Q[1]", "blocks.0.attn.b_Q[1]", "blocks.0.attn.W_K[1]", "blocks.0.attn.b_K[1]"]
    for name, v in model.state_dict().items():
        if name in ("blocks.0.attn.W_Q", "blocks.0.attn.W_K"):
            assert not torch.equal(v[1], before[name][1])
            assert torch.equal(v[[0, 2, 3, 4]], before[name][[0, 2, 3, 4]])
        elif name not in ("blocks.0.attn.b_Q", "blocks.0.attn.b_K"):
            assert torch.equal(v, before[name]), name
    assert float(run.optimizer.state[attn.W_Q]["exp_avg"][1].abs().sum()) == 0.0
    assert float(run.optimizer.state[attn.W_Q]["exp_avg"][0].abs().sum()) > 0.0
    other = _small_run()
    other.model.load_state_dict({k: v for k, v in before.items()})
    reinit_heads(other, [(0, 1)], seed=5, slices=("q", "k"))
    assert torch.equal(other.model.blocks[0].attn.W_Q, attn.W_Q)  # a pure function of the seed
    with pytest.raises(ValueError, match="out of range"):
        reinit_heads(run, [(1, 0)], seed=0)
    with pytest.raises(ValueError, match="slices"):
        reinit_heads(run, [(0, 0)], seed=0, slices=("x",))


def test_reinit_destroys_a_part_of_the_hand_built_circuit():
    """Re-initialising one part of the exact circuit takes it to chance: no partial credit left."""
    task = make_task("kpart", k=4, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    run = _small_run(4)
    run.model.load_state_dict(model.state_dict())
    reinit_heads(run, [parts[2]], seed=0)
    b = eval_set(task, 512)
    with torch.no_grad():
        acc = float(task.accuracy(run.model(b.tokens), b))
    assert abs(acc - 1 / 3) < 0.08


def test_capability_share_is_a_mix_schedule_the_trainer_follows():
    """Drive via the data mix: RunConfig.mix schedules p_capability, so part 2 can set it per step."""
    from circuitfade.train import fit

    task = make_task("kpart", k=2, v=3, n_distractors=1)
    cfg = RunConfig(path="unforced", task={"name": "kpart", "k": 2, "v": 3, "n_distractors": 1},
                    model=kpart_model(task), mix={"p_capability": "pw(0:0.0,2:1.0)"},
                    train=TrainConfig(steps=4, batch_size=8, eval_every=2, eval_size=16, checkpoint_every=4,
                                      eval_conditions=("normal",)), seed=0)
    seen = []
    real = task.sample

    def spy(n, generator, **kw):
        seen.append(kw.get("p_capability"))
        return real(n, generator, **kw)

    run = new_run(cfg)
    ev = eval_set(task, 16)
    task.sample = spy
    fit(run, task=task, eval_batch=ev, progress=False)
    assert seen == [0.0, pytest.approx(0.5), 1.0, 1.0]
    assert [m["p_capability"] for m in run.metrics] == [0.0, 1.0, 1.0]


@pytest.mark.slow
@pytest.mark.numerics  # numbers from the shipped files or a trained run
def test_unpinned_base_job_trains_finds_routing_parts_and_ablates_them(tmp_path):
    """Version 2 of part ablation end to end on K = 2: trained from scratch on the unpinned preset until
    ignition, its parts found by routing, each part and each non-part head ablated (three methods)."""
    from studies.alignment.unpinned import unpinned_base_job

    r = unpinned_base_job({"kind": "base", "apparatus": "unpinned", "k": 2, "seed": 0}, str(tmp_path))
    assert r["ignition"] is not None and r["final_acc"] > 0.9
    parts = [tuple(p) for p in r["routing"]["parts"]]
    assert len(set(parts)) == 2 and all(0 <= h < 4 for _, h in parts)
    df = pd.DataFrame(r["ablation"])
    assert set(df.method) == {"mean", "zero", "resample"} and len(df[df.kind == "random"]) == 3 * 2
    assert set(df[df.kind == "part"].heads) == {f"L0H{h}" for _, h in parts}
