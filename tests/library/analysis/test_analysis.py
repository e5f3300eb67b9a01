"""Tests for circuitfade.analysis: gate interventions, per-head diagnostics, consolidation timeline.

Known answers come from hand-built models whose heads are set weight by weight:
a one-layer "copy the first token" circuit with a single responsible head, and a
soft-prior model whose only routing comes from a planted position bias.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis import (
    previous_token_score,
    consolidation_timeline,
    evaluate,
    gate_intervention_table,
    head_diagnostics,
    mean_ablation_importance,
    top_heads,
    successor_mass,
)
from circuitfade.analysis.heads import ABLATION_IMPORTANCE, ABLATION_LOSS_INCREASE, SUCCESSOR_MASS
from circuitfade.analysis.timeline import timeline_long
from circuitfade.analysis.gates import describe_gates, intervention_conditions
from circuitfade.gating import NoGatesError
from circuitfade.store import per_head_frame
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.tasks import AssocRecall, AssocRecallConfig, Batch, eval_set
from circuitfade.tasks.base import IGNORE_INDEX
from planted import CopyTask, P, V  # tests/planted.py (tests/conftest.py puts tests/ on sys.path)

torch.set_num_threads(1)





def zero_params(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()


def copy_circuit():
    """2 layers x 3 heads, attention-only, no LayerNorm; residual = [token | position | output] one-hots.

    * L0H1 (the circuit): query = last position, key = position 0 (scale 10 each, score
      100/sqrt(8) ≈ 35), OV copies the token one-hot into the output block -> answers.
    * L0H0: zero QK (uniform attention), OV copies with weight 0.1 (harmless noise).
    * L0H2: attends to its own position, OV copies with weight 0.3 (a decoy: it writes
      the query token, which is never the answer since tokens are distinct).
    * Layer 1: all zero (uniform attention, no output).
    The unembedding reads only the output block, so the direct path contributes nothing.
    """
    model = compat.plain_model(dict(
        n_layers=2, d_model=2 * V + P, n_ctx=P, d_head=V, n_heads=3, d_vocab=V,
        attn_only=True, normalization_type=None, positional_embedding_type="standard",
    ))  # fmt: skip
    zero_params(model)
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


# ------------------------------------------------------------------ planted circuit
def test_successor_mass_singles_out_the_copy_head():
    model = copy_circuit()
    batch = eval_set(CopyTask(0), 256, seed=1)
    mass = successor_mass(model, batch)
    assert mass.shape == (2, 3)
    assert mass[0, 1] > 0.999
    assert mass[0, 2] < 1e-6  # attends to itself, never to position 0
    for l, h in ((0, 0), (1, 0), (1, 1), (1, 2)):  # uniform over the 6 positions
        assert mass[l, h] == pytest.approx(1 / P, abs=1e-6)


def test_one_argument_order_and_the_previous_one_still_read_with_a_warning():
    """Model-level analyses take (model, batch, task); the previous release's (model, task, batch) and
    (model, task, batch=batch) give the same result for one release, with a DeprecationWarning."""
    model, task = copy_circuit(), CopyTask(0)
    batch = eval_set(task, 64, seed=1)
    now = mean_ablation_importance(model, batch, task, gates=None)
    with pytest.warns(DeprecationWarning, match=r"mean_ablation_importance\(model, batch, task\)"):
        before = mean_ablation_importance(model, task, batch, gates=None)
    pd.testing.assert_frame_equal(now, before)
    with pytest.warns(DeprecationWarning, match=r"evaluate\(model, batch, task\)"):
        assert evaluate(model, task, batch=batch) == evaluate(model, batch, task)
    assert evaluate(model, task, n=64, seed=1) == evaluate(model, batch, task)  # a task: its evaluation set
    with pytest.raises(ValueError, match="task= must not be given"):
        evaluate(model, task, task)
    assert torch.equal(previous_token_score(model, batch), previous_token_score(model, batch.tokens))


def test_mean_ablation_singles_out_the_copy_head():
    model, task = copy_circuit(), CopyTask(0)
    batch = eval_set(task, 256, seed=1)
    df = mean_ablation_importance(model, batch, task, gates=None)
    assert list(df.columns[:6]) == ["layer", "head", "acc_drop", "loss_increase", "acc_clean", "acc_ablated"]
    assert list(zip(df["layer"], df["head"])) == [(l, h) for l in range(2) for h in range(3)]
    assert (df["acc_clean"] == 1.0).all()
    row = df[(df["layer"] == 0) & (df["head"] == 1)].iloc[0]
    assert row["acc_ablated"] <= task.chance + 0.05
    assert row["acc_drop"] >= 1.0 - task.chance - 0.05
    assert row["loss_increase"] > 0.5
    others = df[~((df["layer"] == 0) & (df["head"] == 1))]
    assert (others["acc_drop"] == 0.0).all()
    assert (others.loc[others["layer"] == 1, "loss_increase"].abs() < 1e-6).all()  # layer 1 outputs nothing


def test_head_diagnostics_is_tidy():
    model, task = copy_circuit(), CopyTask(0)
    batch = eval_set(task, 64, seed=2)
    df = head_diagnostics(model, batch, task, ablation_gates=None)
    assert list(df.columns) == ["layer", "head", "metric", "value", "se", "lo", "hi", "boot"]
    assert ((df["lo"] <= df["value"] + 1e-9) & (df["value"] <= df["hi"] + 1e-9)).all()
    plain = head_diagnostics(model, batch, task, ablation_gates=None, resamples=0)
    assert list(plain.columns) == ["layer", "head", "metric", "value"]
    pd.testing.assert_series_equal(plain["value"], df["value"])
    assert set(df["metric"]) == {SUCCESSOR_MASS, ABLATION_IMPORTANCE, ABLATION_LOSS_INCREASE}
    assert len(df) == 3 * 6
    top = df[df["metric"] == SUCCESSOR_MASS].sort_values("value").iloc[-1]
    assert (top["layer"], top["head"]) == (0, 1)
    frame = per_head_frame(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "m")
    assert frame.to_dict("list") == {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "metric": ["m"] * 4,
                                     "value": [1.0, 2.0, 3.0, 4.0]}  # fmt: skip
    with pytest.raises(ValueError, match="layer, head"):
        per_head_frame(torch.zeros(3), "m")


# ------------------------------------------------------- batched == naive ablation
def naive_ablation(model, task, batch, gates_kwargs=None):
    """Reference: one forward per head with run_with_hooks, mean from run_with_cache."""
    ctx = model.gates(**gates_kwargs) if gates_kwargs else torch.no_grad()
    out = {}
    with torch.no_grad(), ctx:
        logits, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n.endswith("hook_z"))
        clean = (float(task.accuracy(logits, batch)), float(task.loss(logits, batch)))
        for l in range(model.cfg.n_layers):
            mean = cache[f"blocks.{l}.attn.hook_z"].mean(0)
            for h in range(model.cfg.n_heads):

                def hook(z, hook, h=h, mean=mean):
                    z = z.clone()
                    z[:, :, h, :] = mean[:, h, :]
                    return z

                lg = model.run_with_hooks(batch.tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_z", hook)])
                out[(l, h)] = (clean[0] - float(task.accuracy(lg, batch)), float(task.loss(lg, batch)) - clean[1])
    return out


def assert_matches_naive(df, ref):
    assert len(df) == len(ref)
    for r in df.itertuples():
        acc_drop, loss_inc = ref[(r.layer, r.head)]
        assert r.acc_drop == pytest.approx(acc_drop, abs=1e-6)
        assert r.loss_increase == pytest.approx(loss_inc, abs=1e-6)


def test_batched_ablation_equals_naive_loop_on_random_model():
    torch.manual_seed(0)
    task = AssocRecall(AssocRecallConfig(n_pairs=4, n_keys=6, n_values=6, d_vocab=12, max_len=9))
    model = compat.plain_model(dict(
        n_layers=2, d_model=24, n_ctx=9, d_head=6, n_heads=3, d_vocab=12, d_mlp=32, act_fn="gelu",
        dtype=torch.float64, seed=0,
    )).eval()  # fmt: skip
    assert {p.dtype for p in model.parameters()} == {torch.float64}  # the 1e-6 tolerances below assume float64
    with torch.no_grad():  # larger weights so that ablations move the argmax
        for p in model.parameters():
            p.mul_(4.0)
    batch = eval_set(task, 64, seed=3)
    ref = naive_ablation(model, task, batch)
    assert any(abs(v[0]) > 0 for v in ref.values())  # the comparison is not vacuous
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert_matches_naive(mean_ablation_importance(model, batch, task, gates=None), ref)
    assert_matches_naive(mean_ablation_importance(model, batch, task, gates=None, max_batch=64), ref)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training


def test_batched_ablation_equals_naive_loop_on_soft_prior_model_at_zero_gate():
    torch.manual_seed(1)
    task = AssocRecall(AssocRecallConfig(n_pairs=4, n_keys=6, n_values=6, d_vocab=12, max_len=9))
    model = SoftPriorTransformer(SoftPriorConfig(d_model=16, d_head=4, n_ctx=9, d_vocab=12, dtype=torch.float64))
    with torch.no_grad():
        for a in model.attn_layers:
            a.priors["pos"].pos_bias.normal_(0, 3.0)
        for p in model.parameters():
            p.mul_(3.0)
    model.train()  # the analysis must restore this
    batch = eval_set(task, 48, seed=4)
    df = mean_ablation_importance(model, batch, task)  # default gates="zero"
    assert_matches_naive(df, naive_ablation(model, task, batch, {"pos": 0.0, "content": 0.0}))
    df_normal = mean_ablation_importance(model, batch, task, gates="normal")
    assert_matches_naive(df_normal, naive_ablation(model, task, batch))
    assert model.training
    clean_zero = evaluate(model, batch, task, gates="zero")["accuracy"]
    assert df["acc_clean"].iloc[0] == pytest.approx(clean_zero, abs=1e-12)


def test_heads_per_forward_does_not_change_the_numbers():
    """One head per ablation forward, the default grouping and every head in one forward give the
    same values, intervals and resamples bit for bit (float32 model with an MLP), and the answer-only
    scoring of a task that scores with Task's own methods equals scoring every position."""
    import numpy as np

    from circuitfade.analysis.heads import _heads_per_forward

    torch.manual_seed(2)
    task = AssocRecall(AssocRecallConfig(n_pairs=4, n_keys=6, n_values=6, d_vocab=12, max_len=9))
    model = compat.plain_model(dict(
        n_layers=2, d_model=24, n_ctx=9, d_head=6, n_heads=3, d_vocab=12, d_mlp=32, act_fn="gelu", seed=2,
    )).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    batch = eval_set(task, 40, seed=5)
    assert _heads_per_forward(model, 40, 9, max_elements=None) == 3
    assert _heads_per_forward(model, 40, 9) == 3  # small: the whole layer in one forward
    assert _heads_per_forward(model, 40, 9, max_elements=40 * 9 * 32 * 2) == 2  # widest: d_mlp = 32
    assert _heads_per_forward(model, 40, 9, max_elements=1) == 1
    assert _heads_per_forward(model, 40, 9, max_batch=80) == 2
    assert _heads_per_forward(model, 4096, 1024) == 1  # large: split

    class EveryPosition(AssocRecall):  # scores its own way, so every position is scored
        def accuracy(self, logits, batch):
            return super().accuracy(logits, batch)

    kw = dict(ablation_gates=None, resamples=20)
    ref = head_diagnostics(model, batch, task, max_elements=None, **kw)
    assert ref.loc[ref["metric"] == ABLATION_IMPORTANCE, "value"].abs().max() > 0  # not vacuous
    for other in (head_diagnostics(model, batch, task, max_elements=1, **kw),
                  head_diagnostics(model, batch, task, **kw),
                  head_diagnostics(model, batch, task, max_batch=80, max_elements=None, **kw),
                  head_diagnostics(model, batch, EveryPosition(task.config), max_elements=1, **kw)):
        pd.testing.assert_frame_equal(ref.drop(columns="boot"), other.drop(columns="boot"), check_exact=True)
        assert np.array_equal(np.stack(ref["boot"].to_list()), np.stack(other["boot"].to_list()))
    with pytest.raises(ValueError, match="max_elements"):
        head_diagnostics(model, batch, task, max_elements=0, **kw)


# ------------------------------------------------------------------ gate table
def planted_soft_prior(content: bool = False) -> SoftPriorTransformer:
    """One layer, two heads, NoPE. Head 0 routes only through its position bias (+40 at
    distance 1, i.e. the previous token) and copies the token; head 1 is zero. The content
    bias is zero (W_cq = 0) unless ``content``."""
    cfg = SoftPriorConfig(n_layers=1, d_model=2 * V, n_heads=2, d_head=V, n_ctx=P, d_vocab=V, normalization_type=None)
    model = SoftPriorTransformer(cfg)
    zero_params(model)  # gate logits 0 -> gates sigmoid(0) = 0.5
    tok, out = torch.arange(V), torch.arange(V, 2 * V)
    with torch.no_grad():
        model.W_E[tok, tok] = 1.0
        model.W_U[out, tok] = 1.0
        a = model.attn_layers[0]
        a.priors["pos"].pos_bias[0, 1] = 40.0
        a.W_V[0, tok, tok] = 1.0
        a.W_O[0, tok, out] = 1.0
        if content:  # seeded: the planted content bias must not depend on what ran before
            g = torch.Generator().manual_seed(0)
            a.priors["content"].W_cq.normal_(0, 3.0, generator=g)
            a.priors["content"].W_ck.normal_(0, 3.0, generator=g)
    return model.eval()


def test_gate_intervention_table_on_planted_position_prior():
    model, task = planted_soft_prior(), CopyTask(src=P - 2)
    batch = eval_set(task, 256, seed=5)
    table = gate_intervention_table(model, batch, task)
    assert list(table.columns) == ["condition", "gates", "accuracy", "accuracy_se", "accuracy_lo", "accuracy_hi",
                                   "loss", "loss_se", "n_answers"]
    assert (table["accuracy_lo"] <= table["accuracy"]).all() and (table["accuracy"] <= table["accuracy_hi"]).all()
    assert list(table["condition"]) == ["normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"]
    assert list(table["gates"]) == ["as trained", "pos=0", "content=0", "pos=0, content=0"]
    acc = dict(zip(table["condition"], table["accuracy"]))
    loss = dict(zip(table["condition"], table["loss"]))
    assert acc["normal"] == 1.0
    assert acc["position gate zeroed"] < 0.5  # uniform attention: argmax is a tie among context tokens
    assert acc["content gate zeroed"] == acc["normal"]  # W_cq = 0: the content gate multiplies zero
    assert loss["content gate zeroed"] == pytest.approx(loss["normal"], abs=1e-6)
    plain = evaluate(model.to_plain_model(), batch, task)
    assert acc["both gates zeroed"] == plain["accuracy"]
    assert loss["both gates zeroed"] == pytest.approx(plain["loss"], abs=1e-5)
    # the planted head carries all successor mass only while the position gate is on
    mass = successor_mass(model, batch)
    assert mass[0, 0] > 0.999 and mass[0, 1] == pytest.approx(1 / P, abs=1e-6)
    assert successor_mass(model, batch, gates={"pos": 0.0})[0, 0] == pytest.approx(1 / P, abs=1e-6)
    # a row equals evaluate() under the same override
    r = evaluate(model, batch, task, gates={"pos": 0.0})
    assert (r["accuracy"], r["condition"]) == (acc["position gate zeroed"], "pos=0")
    assert r["loss"] == pytest.approx(loss["position gate zeroed"], abs=1e-7)


def test_gate_table_content_matters_when_planted_and_eval_set_default():
    model, task = planted_soft_prior(content=True), CopyTask(src=P - 2)
    default = evaluate(model, task, gates="normal", n=64)
    assert default == evaluate(model, eval_set(task, 64), task)
    assert evaluate(model, task, n=64, seed=7) == evaluate(model, eval_set(task, 64, 7), task)
    table = gate_intervention_table(model, task, n=64)
    loss = dict(zip(table["condition"], table["loss"]))
    # with the position gate off, only the (planted, nonzero) content bias routes attention
    assert abs(loss["position gate zeroed"] - loss["both gates zeroed"]) > 1e-3


def test_gate_table_one_row_per_prior_and_no_gates():
    model = SoftPriorTransformer(SoftPriorConfig(n_layers=1, d_model=16, d_head=4, n_ctx=P, d_vocab=V, priors=("pos",)))
    assert intervention_conditions(model) == [("normal", "normal"), ("position gate zeroed", {"pos": 0.0})]
    assert len(gate_intervention_table(model, CopyTask(), n=16)) == 2
    plain = copy_circuit()
    with pytest.raises(NoGatesError, match="has no gates"):
        gate_intervention_table(plain, CopyTask(), n=16)
    assert issubclass(NoGatesError, ValueError)
    assert describe_gates({"pos": 0.0, "content": torch.zeros(1, 2)}) == "pos=0, content=<shape (1, 2)>"
    assert describe_gates(None) == "normal"


# ------------------------------------------------------------------ bad input
def test_bad_input_raises():
    model, task = copy_circuit(), CopyTask()
    empty = Batch(
        torch.zeros(2, P, dtype=torch.long), torch.full((2, P), IGNORE_INDEX, dtype=torch.long),
        torch.zeros(2, P, dtype=torch.bool), torch.zeros(2, P, P, dtype=torch.bool),
    )  # fmt: skip
    with pytest.raises(ValueError, match="answer position"):
        successor_mass(model, empty)
    with pytest.raises(ValueError, match="answer position"):
        mean_ablation_importance(model, empty, task, gates=None)
    batch = eval_set(task, 8)
    with pytest.raises(NoGatesError, match="gates=None"):
        mean_ablation_importance(model, batch, task)  # default gates="zero" on a plain model
    with pytest.raises(ValueError, match="gates=None"):
        successor_mass(model, batch, gates={"pos": 0.0})
    with pytest.raises(NoGatesError, match="has no gates"):
        evaluate(model, batch, task, gates="zero")
    with pytest.raises(ValueError, match="Batch"):
        successor_mass(model, batch.tokens)
    with pytest.raises(ValueError, match="unknown gate condition"):
        mean_ablation_importance(planted_soft_prior(), batch, task, gates="off")
    with pytest.raises(ValueError, match="max_batch"):
        mean_ablation_importance(model, batch, task, gates=None, max_batch=0)


# ------------------------------------------------------------------ timeline
def fake_trace() -> pd.DataFrame:
    """Run "fade", seeds 0 and 1, steps 0..3600 every 300, 2 layers x 4 heads.

    Seed 0: L1H2's successor mass is 0.3 from step 1500 (0.1 before); L0H1 peaks at 0.2
    at step 900 (top head there, below threshold); L0H0's ablation importance is 0.05
    from step 1200 (0.0 before); every other value is 0.1 (mass) / 0.01 (ablation).
    Seed 1: everything below threshold, L0H3 slightly highest.
    Plus rows of another head metric and of a non-head metric (layer/head missing).
    """
    rows = []
    for seed in (0, 1):
        for step in range(0, 3601, 300):
            for layer in range(2):
                for head in range(4):
                    mass, abl = 0.1, 0.01
                    if seed == 0:
                        if (layer, head) == (1, 2) and step >= 1500:
                            mass = 0.3
                        if (layer, head) == (0, 1) and step == 900:
                            mass = 0.2
                        if (layer, head) == (0, 0):
                            abl = 0.05 if step >= 1200 else 0.0
                    elif (layer, head) == (0, 3):
                        mass, abl = 0.2, 0.02
                    base = dict(run="fade", seed=seed, step=step, layer=layer, head=head)
                    rows.append({**base, "metric": SUCCESSOR_MASS, "value": mass})
                    rows.append({**base, "metric": ABLATION_IMPORTANCE, "value": abl})
                    rows.append({**base, "metric": ABLATION_LOSS_INCREASE, "value": 9.0})
            rows.append(dict(run="fade", seed=seed, step=step, layer=None, head=None, metric="accuracy", value=0.9))
    return pd.DataFrame(rows)


def test_consolidation_timeline_planted_steps():
    table = consolidation_timeline(fake_trace(), by=("run", "seed"), gate_zero_step=1050)
    assert len(table) == 2
    s0, s1 = table.iloc[0], table.iloc[1]
    assert (s0["run"], s0["seed"]) == ("fade", 0)
    assert s0[f"{SUCCESSOR_MASS}_first_step"] == 1500
    assert s0[f"{SUCCESSOR_MASS}_first_head"] == "L1H2"
    assert s0[f"{SUCCESSOR_MASS}_top_head"] == "L1H2"
    assert s0[f"{ABLATION_IMPORTANCE}_first_step"] == 1200
    assert s0[f"{ABLATION_IMPORTANCE}_first_head"] == "L0H0"
    assert s0[f"{ABLATION_IMPORTANCE}_top_head"] == "L0H0"
    assert s0["gate_zero_step"] == 1050
    assert bool(s0[f"{SUCCESSOR_MASS}_after_gate_zero"]) and bool(s0["after_gate_zero"])
    # seed 1 never crosses
    assert pd.isna(s1[f"{SUCCESSOR_MASS}_first_step"]) and pd.isna(s1[f"{SUCCESSOR_MASS}_first_head"])
    assert pd.isna(s1[f"{ABLATION_IMPORTANCE}_first_step"]) and pd.isna(s1["after_gate_zero"])
    assert s1[f"{SUCCESSOR_MASS}_top_head"] == "L0H3"
    assert str(table[f"{SUCCESSOR_MASS}_first_step"].dtype) == "Int64"


def test_timeline_long_top_heads_and_gate_zero_sources():
    trace = fake_trace()
    long = timeline_long(trace, by=("run", "seed"), gate_zero_step={("fade", 0): 1300})
    s0 = long[long["seed"] == 0].set_index("metric")
    assert s0.loc[SUCCESSOR_MASS, "peak_head"] == "L1H2" and s0.loc[SUCCESSOR_MASS, "peak_step"] == 1500
    assert s0.loc[SUCCESSOR_MASS, "top_value"] == pytest.approx(0.3)
    assert s0.loc[SUCCESSOR_MASS, "final_step"] == 3600
    assert bool(s0.loc[SUCCESSOR_MASS, "after_gate_zero"])  # 1500 >= 1300
    assert not bool(s0.loc[ABLATION_IMPORTANCE, "after_gate_zero"])  # 1200 < 1300
    assert long[long["seed"] == 1]["gate_zero_step"].isna().all()  # not named in the mapping
    wide = consolidation_timeline(trace, by="seed", gate_zero_step={0: 1300})
    assert not bool(wide["after_gate_zero"].iloc[0])  # bool(pd.NA) would raise
    # from a column of the trace; the default `by` picks up run and seed
    with_col = trace.assign(gate_zero_step=1050)
    assert bool(consolidation_timeline(with_col)["after_gate_zero"].iloc[0])
    with pytest.raises(ValueError, match="gate_zero_step"):
        consolidation_timeline(with_col, gate_zero_step=1050)
    # top head per step: L0H1 is top at step 900 although below threshold
    assert set(top_heads(trace, by=["run", "seed"])["metric"]) == {  # "accuracy" has no heads
        SUCCESSOR_MASS, ABLATION_IMPORTANCE, ABLATION_LOSS_INCREASE
    }
    top = top_heads(trace[trace["run"] == "fade"], [SUCCESSOR_MASS], by=["seed"])
    at900 = top[(top["seed"] == 0) & (top["step"] == 900)].iloc[0]
    assert (at900["head_label"], at900["value"]) == ("L0H1", 0.2)
    # a lower threshold moves the first crossing earlier, to that head
    low = timeline_long(trace, {SUCCESSOR_MASS: 0.15}, by=["seed"]).set_index("seed")
    assert (low.loc[0, "first_step"], low.loc[0, "first_head"]) == (900, "L0H1")


def test_timeline_bad_input():
    trace = fake_trace()
    with pytest.raises(ValueError, match="several rows"):
        consolidation_timeline(trace, by=("run",))  # two seeds collapse into one series
    with pytest.raises(ValueError, match="not in the trace"):
        consolidation_timeline(trace, {"nope": 0.1})
    with pytest.raises(ValueError, match="missing"):
        consolidation_timeline(trace.drop(columns="value"))
    with pytest.raises(ValueError, match="not in the trace"):
        consolidation_timeline(trace, by=("path",))


@pytest.mark.parametrize("kind", ["soft_prior", "hooked_transformer"])
def test_later_layers_resume_from_the_clean_residual_with_the_same_numbers(monkeypatch, kind):
    """Ablating a layer after the first resumes from the clean residual stream before it (the blocks
    before are not run again); the numbers are those of whole forwards."""
    from circuitfade.analysis import heads

    torch.manual_seed(3)
    task = AssocRecall(AssocRecallConfig(n_pairs=4, n_keys=6, n_values=6, d_vocab=12, max_len=9))
    if kind == "soft_prior":
        model = SoftPriorTransformer(SoftPriorConfig(d_model=16, d_head=4, n_ctx=9, d_vocab=12, n_layers=3))
    else:
        model = compat.plain_model(dict(n_layers=3, d_model=24, n_ctx=9, d_head=6, n_heads=3, d_vocab=12, d_mlp=32,
                                        act_fn="gelu", seed=3))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    batch = eval_set(task, 40, seed=6)
    runs = []
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: runs.append(x.shape[0]))
    gates = "zero" if kind == "soft_prior" else None
    resumed = mean_ablation_importance(model, batch, task, gates=gates)
    n_heads = model.cfg.n_heads
    if kind == "hooked_transformer" and compat.is_tl4():  # a TransformerBridge: every forward whole
        assert runs == [40] + [40 * n_heads] * 3
    else:
        assert runs == [40, 40 * n_heads]  # block 0: the clean forward and layer 0's ablations only
    runs.clear()
    monkeypatch.setattr(heads, "_resumes_at_layer", lambda model: False)
    whole = mean_ablation_importance(model, batch, task, gates=gates)
    assert runs == [40] + [40 * n_heads] * 3
    model.reset_hooks()
    assert (resumed["acc_drop"] != 0).any()  # not vacuous
    pd.testing.assert_frame_equal(resumed, whole, rtol=1e-5, atol=1e-6)
