"""Edge attribution (EAP, EAP-IG), exact edge patching and the circuit timeline (analysis.edges)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from planted import P, V, CopyTask

from circuitfade import compat
from circuitfade.analysis.edges import (
    circuit_timeline,
    counterfactual_batch,
    edge_attribution,
    edge_effects,
    edge_graph,
    edge_scores,
    faithfulness_curve,
    patch_edges,
    smallest_circuit,
    top_edges,
)
from circuitfade.tasks import Batch, eval_set

PLANTED = {"input->L0H0.v", "L0H0->L1H0.v", "L1H0->logits"}
"""The planted copy circuit: L0H0 moves the token at position 0 into subspace A at every
position, L1H0 moves A into subspace B, the unembedding reads B."""


def _spearman(a, b) -> float:
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    return float(np.corrcoef(ra, rb)[0, 1])


def planted_model():
    """A two-layer attention-only model whose weights are set by hand (no normalisation): the
    copy circuit of :data:`PLANTED` plus two distractor heads with small random weights."""
    A, B, D = V + P, 2 * V + P, 3 * V + P
    cfg = dict(n_layers=2, d_model=D, n_heads=2, d_head=V, n_ctx=P, d_vocab=V, attn_only=True,
               normalization_type=None, positional_embedding_type="standard", seed=0)
    model = compat.plain_model(cfg)
    gen = torch.Generator().manual_seed(0)
    eye = torch.eye(V)
    sd = {"embed.W_E": torch.zeros(V, D), "pos_embed.W_pos": torch.zeros(P, D),
          "unembed.W_U": 0.1 * torch.randn(D, V, generator=gen), "unembed.b_U": torch.zeros(V)}
    sd["embed.W_E"][:, :V] = eye
    sd["pos_embed.W_pos"][:, V:V + P] = torch.eye(P)
    sd["unembed.W_U"][B:B + V] = 5 * eye
    for l in range(2):
        W = {w: 0.1 * torch.randn(2, D, V, generator=gen) for w in ("W_Q", "W_K", "W_V")}
        W["W_O"] = 0.1 * torch.randn(2, V, D, generator=gen)
        for w in W.values():
            w[0] = 0
        sd.update({f"blocks.{l}.attn.{k}": v for k, v in W.items()})
        sd.update({f"blocks.{l}.attn.b_{x}": torch.zeros(2, V) for x in "QKV"})
        sd[f"blocks.{l}.attn.b_O"] = torch.zeros(D)
    a0 = {w: sd[f"blocks.0.attn.{w}"] for w in ("W_Q", "W_K", "W_V", "W_O")}
    a0["W_Q"][0, V:V + P, 0] = 1.0             # every query: the same direction
    a0["W_K"][0, V, 0] = 40.0                  # only the key at position 0 answers it
    a0["W_V"][0, :V] = eye                     # copy the token ...
    a0["W_O"][0, :, A:A + V] = eye             # ... into subspace A
    a1 = {w: sd[f"blocks.1.attn.{w}"] for w in ("W_V", "W_O")}
    a1["W_V"][0, A:A + V] = eye                # L1H0 attends uniformly (A is the same everywhere)
    a1["W_O"][0, :, B:B + V] = eye             # and moves A into B
    missing, _ = model.load_state_dict(compat.native_state_dict(sd, model), strict=False)
    assert not [k for k in missing if ".W_" in k or "W_E" in k or "W_pos" in k or "W_U" in k]
    return model


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    clean = eval_set(CopyTask(), n=32, seed=1)
    return model, clean, counterfactual_batch(clean)


def test_planted_model_solves_the_task(planted):
    model, clean, _ = planted
    with torch.no_grad():
        pred = model(clean.tokens)[:, -1].argmax(-1)
    assert bool((pred == clean.targets[:, -1]).all())


def test_graph_names_and_upstream_edges_only():
    model = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=6, d_vocab=7, d_mlp=32))
    g = edge_graph(model)
    # layer 0 heads read input (3 roles x 2 heads); MLP0 reads input + 2 heads; layer 1 heads read
    # input, 2 heads, MLP0 (4 senders x 6); MLP1 reads 6 senders; logits read all 7
    assert len(g) == 6 + 3 + 24 + 6 + 7
    assert {"input->L0H0.q", "L0H1->MLP0", "MLP0->L1H1.k", "MLP1->logits"} <= set(g.names)
    assert not any(e.startswith("L1H0->L1") or e.startswith("L1H0->L0") for e in g.names)
    assert g.edges.set_index("edge").loc["L0H1->L1H0.k", "receiver_hook"] == "blocks.1.attn.hook_k"
    assert g.edges.set_index("edge").loc["MLP0->logits", "sender_hook"] == "blocks.0.hook_mlp_out"


def test_patching_no_edge_is_clean_and_every_edge_is_corrupted():
    model = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=P, d_vocab=V, d_mlp=32,
                                    act_fn="gelu", seed=3))
    clean = eval_set(CopyTask(), n=8, seed=2)
    corr = counterfactual_batch(clean)
    g = edge_graph(model)
    none = patch_edges(model, clean, corr, [], graph=g)
    every = patch_edges(model, clean, corr, g.names, graph=g)
    assert none["clean"] != pytest.approx(none["corrupted"], abs=1e-4)
    assert none["patched"] == pytest.approx(none["clean"], abs=1e-5)
    assert every["patched"] == pytest.approx(every["corrupted"], abs=1e-5)
    # keep=True: the whole graph as the circuit recovers everything, the empty circuit nothing
    assert patch_edges(model, clean, corr, g.names, keep=True, graph=g)["recovered"] == pytest.approx(1.0, abs=1e-5)
    assert patch_edges(model, clean, corr, [], keep=True, graph=g)["recovered"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.skipif(compat.is_tl4(), reason="float64 plain model: checked on the 3.x line")
def test_eap_equals_a_finite_difference():
    """EAP is the derivative of the objective along the edge's patch: d/de M(patch e by eps)."""
    model = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=P, d_vocab=V, d_mlp=32,
                                    act_fn="gelu", seed=4, dtype=torch.float64))
    clean = eval_set(CopyTask(), n=8, seed=3)
    corr = counterfactual_batch(clean)
    g = edge_graph(model)
    eap = edge_scores(model, clean, corr, method="eap", graph=g, resamples=20).set_index("edge")["value"]
    eps = 1e-6
    for e in ["input->L0H1.q", "input->L0H0.k", "L0H1->MLP0", "MLP0->L1H0.v", "L1H1->logits", "input->MLP1"]:
        r = patch_edges(model, clean, corr, {e: eps}, graph=g)
        fd = (r["clean"] - r["patched"]) / eps
        assert fd == pytest.approx(eap[e], abs=1e-5 + 1e-4 * abs(eap[e])), e
    assert eap.abs().max() > 1e-2


def test_eap_ig_recovers_the_planted_circuit_and_agrees_with_patching(planted):
    model, clean, corr = planted
    g = edge_graph(model)
    ig = edge_scores(model, clean, corr, steps=10, graph=g)
    exact = edge_effects(model, clean, corr, graph=g)
    assert set(top_edges(ig, 3)) == PLANTED
    assert set(top_edges(exact, 3)) == PLANTED
    assert _spearman(ig["value"], exact["value"]) > 0.9  # 0.96 measured
    top = ig.set_index("edge").loc[sorted(PLANTED)]
    assert bool((top["lo"] > 0).all()) and bool((top["lo"] <= top["value"]).all())
    # the positional key edge carries no difference between clean and corrupted runs
    assert ig.set_index("edge").loc["input->L0H0.k", "value"] == pytest.approx(0.0, abs=1e-6)
    assert patch_edges(model, clean, corr, PLANTED, keep=True, graph=g)["recovered"] > 0.9
    curve = faithfulness_curve(model, clean, corr, ig, ks=[0, 1, 2, 3, 5, len(g)], graph=g)
    assert curve["recovered"].iloc[0] == pytest.approx(0.0, abs=1e-6)
    assert curve["recovered"].iloc[-1] == pytest.approx(1.0, abs=1e-6)
    assert smallest_circuit(curve, 0.9)["k"] == 3
    # the interval over examples: exact at both ends (patching nothing / everything), around the value between
    assert curve[["lo", "hi"]].iloc[0].to_numpy() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert curve[["lo", "hi"]].iloc[-1].to_numpy() == pytest.approx([1.0, 1.0], abs=1e-6)
    assert bool((curve["lo"] <= curve["recovered"] + 1e-9).all()) and bool((curve["recovered"] <= curve["hi"] + 1e-9).all())
    assert bool(((curve["hi"] - curve["lo"]).iloc[3:5] > 1e-3).all())  # k = 3, 5: a ratio of noisy means


def test_faithfulness_interval_is_the_bootstrap_of_the_recovered_ratio(planted):
    """The band re-derived by hand from per-example patched objectives and the package's resamples."""
    from circuitfade.analysis.heads import BOOTSTRAP_SEED
    from circuitfade.stats import bootstrap_weights, percentile_interval

    model, clean, corr = planted
    g = edge_graph(model)
    ig = edge_scores(model, clean, corr, method="eap", graph=g, resamples=20)
    curve = faithfulness_curve(model, clean, corr, ig, ks=[3], graph=g, resamples=50, level=0.9)
    keep = top_edges(ig, 3)
    n = len(clean)
    per = []
    for i in range(n):  # one example at a time (twice: a batch needs two): clean, corrupted, patched
        r = patch_edges(model, clean[[i, i]], corr[[i, i]], keep, keep=True, graph=g)
        per.append([r["clean"], r["corrupted"], r["patched"]])
    vals = np.array(per)
    assert vals[:, 2].std() > 1e-3  # the examples differ, so the interval has width
    w = bootstrap_weights(n, 50, BOOTSTRAP_SEED)
    boot = w @ vals / n
    rec = (boot[:, 2] - boot[:, 1]) / (boot[:, 0] - boot[:, 1])
    lo, hi = percentile_interval(rec, 0.9)
    assert curve["lo"].iloc[0] == pytest.approx(lo, abs=1e-5) and curve["hi"].iloc[0] == pytest.approx(hi, abs=1e-5)


def test_chunked_scores_equal_the_whole_batch(planted):
    model, clean, corr = planted
    g = edge_graph(model)
    for method in ("eap", "eap-ig"):
        whole = edge_scores(model, clean, corr, method=method, steps=3, graph=g, resamples=30)
        for chunk in (5, 32, 100):
            part = edge_scores(model, clean, corr, method=method, steps=3, graph=g, resamples=30, chunk=chunk)
            for col in ("value", "se", "lo", "hi"):
                assert np.allclose(part[col], whole[col], rtol=1e-5, atol=1e-7), (method, chunk, col)
    with pytest.raises(ValueError, match="chunk"):
        edge_scores(model, clean, corr, chunk=0)


def test_chunk_bounds_the_gradient_memory(planted):
    """The largest tensor made while scoring a 64-sequence batch shrinks with ``chunk`` (the
    gradient buffer ``[receivers, batch, pos, d_model]`` is made per chunk): every tensor a torch
    function returns is measured."""
    from torch.overrides import TorchFunctionMode

    class Largest(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.bytes = max(self.bytes, t.numel() * t.element_size())
            return out

    model, _, _ = planted
    clean = eval_set(CopyTask(), n=64, seed=2)
    corr = counterfactual_batch(clean)
    g = edge_graph(model)
    largest = {}
    for chunk in (None, 8):
        with Largest() as mode:
            edge_scores(model, clean, corr, method="eap", graph=g, resamples=20, chunk=chunk)
        largest[chunk] = mode.bytes
    grad_bytes = len(g.receivers) * 64 * clean.tokens.shape[1] * model.cfg.d_model * 4
    assert largest[None] >= grad_bytes and largest[8] * 8 <= largest[None], (largest, grad_bytes)


def test_timeline_on_a_planted_frame():
    rows = []
    values = {0: {"a": 3, "b": 2, "c": 1, "d": 0}, 1: {"a": 3, "c": 2, "b": 1, "d": 0},
              2: {"d": 3, "a": 2, "b": 1, "c": 0}, 3: {"d": 3, "a": 2, "b": 1, "c": 0}}
    for s, vs in values.items():
        rows += [{"step": s, "metric": "edge_attribution", "edge": e, "value": float(v)} for e, v in vs.items()]
    tl = circuit_timeline(pd.DataFrame(rows), k=2, overlap=1.0)
    assert tl.steps["circuit"].tolist() == [["a", "b"], ["a", "c"], ["d", "a"], ["d", "a"]]
    assert tl.steps["overlap_prev"].tolist()[1:] == pytest.approx([1 / 3, 1 / 3, 1.0])
    assert tl.match_step == 2 and tl.first_match == 2
    # chance: two random 2-edge circuits of 4 edges share 0, 1 or 2 edges with probability 1/6, 4/6, 1/6
    assert tl.chance == pytest.approx(4 / 6 * 1 / 3 + 1 / 6) and tl.n_edges == 4
    assert tl.steps["chance"].tolist() == pytest.approx([tl.chance] * 4)
    e = tl.edges.set_index("edge")
    assert e.loc["b", "entered"] == [0] and e.loc["b", "left"] == [1] and not e.loc["b", "in_final"]
    assert e.loc["d", "first_step"] == 2 and e.loc["a", "n_steps"] == 4
    with pytest.raises(ValueError, match="k: expected"):
        circuit_timeline(pd.DataFrame(rows), k=0)


def test_trace_on_the_shipped_series_with_prior_edges():
    from circuitfade.store import trace
    from circuitfade.store.examples import example_series

    series = example_series("fade600to0").select([300, 3600])
    traced = trace(series, [edge_attribution(steps=2, resamples=50)], n=16, progress=False)
    g = edge_graph(series[3600])
    assert g.priors == ("content",)
    assert len(traced) == 2 * len(g) and set(traced["step"]) == {300, 3600}
    assert bool((traced["lo"] <= traced["hi"]).all()) and traced["se"].notna().all()
    prior = traced[traced["kind"] == "prior"]
    # the content gate is 0 from step 600 on: its edges carry nothing at step 3600, something at 300
    assert prior.loc[prior["step"] == 3600, "value"].abs().max() == 0.0
    assert prior.loc[prior["step"] == 300, "value"].abs().max() > 1e-5
    tl = circuit_timeline(traced, k=5)
    assert len(tl.steps) == 2 and tl.steps["overlap_final"].iloc[-1] == 1.0


def test_bad_input_is_refused(planted):
    model, clean, corr = planted
    with pytest.raises(ValueError, match="method"):
        edge_scores(model, clean, corr, method="acdc")
    with pytest.raises(ValueError, match="corrupted: tokens of shape"):
        edge_scores(model, clean, corr[:4])
    with pytest.raises(ValueError, match="unknown edge"):
        patch_edges(model, clean, corr, ["L9H9->logits"])
    with pytest.raises(ValueError, match="objective"):
        edge_scores(model, clean, corr, objective="accuracy")
    with pytest.raises(ValueError, match="at least 2"):
        counterfactual_batch(clean[:1])


def _tl_reference():
    try:
        from transformer_lens.tools.analysis.attribution_patching import attribution_patch
    except ImportError:
        return None
    return attribution_patch


@pytest.mark.skipif(_tl_reference() is None,
                    reason="this TransformerLens has no transformer_lens.tools.analysis.attribution_patching")
def test_agrees_with_transformer_lens_own_attribution_patching():
    """TransformerLens's own attribution patching scores each writer at each position with the
    gradient at the corrupted run (its edge mode needs per-head results, which the plain bridge lacks). A writer's total over
    its outgoing edges is its node score, so our EAP with clean and corrupted swapped, summed over
    a sender's edges, is minus its node score summed over positions."""
    attribution_patch = _tl_reference()
    model = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=P, d_vocab=V, d_mlp=32,
                                    act_fn="gelu", seed=5))
    model.eval()
    clean = eval_set(CopyTask(), n=4, seed=4)
    corr = counterfactual_batch(clean)

    def margin(logits, *_):
        return logits[:, -1, 0] - logits[:, -1, 1]

    ref = attribution_patch(model, clean.tokens, corr.tokens, lambda lg: margin(lg)[0])
    totals: dict[str, float] = {}
    for node, score in ref.node_scores.items():
        name = {"embed": "input", "attn_head_out": f"L{node.layer}H{node.head}", "mlp_out": f"MLP{node.layer}"}[node.kind]
        totals[name] = totals.get(name, 0.0) + score
    ours = edge_scores(model, corr, clean, method="eap", objective=margin, resamples=20)
    per_sender = ours.groupby("sender")["value"].sum()
    assert set(totals) == set(per_sender.index)
    ref_values = np.array([totals[s] for s in per_sender.index])
    assert np.allclose(-per_sender.to_numpy(), ref_values, atol=1e-5), np.abs(per_sender.to_numpy() + ref_values).max()
    assert np.abs(ref_values).max() > 1e-2


def _edge_trace(steps=(0, 100)):
    """A trace-shaped frame of edge scores for a tiny plain model: value = a known number per edge."""
    model = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=6, d_vocab=7, d_mlp=32))
    edges = edge_graph(model).edges
    frames = []
    for i, s in enumerate(steps):
        f = edges.copy()
        f["value"] = np.arange(len(f), dtype=float) * (1 if i == 0 else -1) / len(f)
        f["lo"], f["hi"] = f["value"] - 0.1, f["value"] + 0.1
        f["step"], f["metric"] = s, "edge_attribution"
        frames.append(f)
    return pd.concat(frames, ignore_index=True), len(edges)


def test_figures_show_the_top_edges_per_step():
    from circuitfade.viz.circuits import circuit_graph, edge_heatmap, faithfulness_figure

    traced, n = _edge_trace()
    fig = circuit_graph(traced, k=5)
    edge_traces = [t for t in fig.data if t.name != "nodes"]
    assert len(edge_traces) == 10 and len(fig.layout.sliders[0].steps) == 2
    shown = [t.name for t in edge_traces if t.visible]
    assert shown == top_edges(traced[traced["step"] == 100], 5)          # the last step is shown first
    assert {t.line.color for t in edge_traces if t.visible} == {"#b2182b"}  # negative scores in red
    widths = [t.line.width for t in edge_traces if t.visible]
    assert widths[0] == pytest.approx(10.0) and widths == sorted(widths, reverse=True)
    one = circuit_graph(traced, k=3, step=0)
    assert [t.name for t in one.data if t.name != "nodes"] == top_edges(traced[traced["step"] == 0], 3)
    with pytest.raises(ValueError, match="step 7"):
        circuit_graph(traced, step=7)
    heat = edge_heatmap(traced, top=4)
    assert np.asarray(heat.data[0].z).shape == (4, 2) and list(heat.data[0].x) == ["0", "100"]
    assert heat.data[0].y[0] == traced["edge"].iloc[n - 1]                # the largest |score| first
    curve = pd.DataFrame({"k": [0, 2, 4, 8], "recovered": [0.0, 0.5, 0.9, 1.0]})
    star = faithfulness_figure(curve, fraction=0.8).data[-1]
    assert list(star.x) == [4] and "4 edges" in star.name
    assert smallest_circuit(curve, 0.95)["k"] == 8 and smallest_circuit(curve.iloc[:3], 0.95)["k"] is None


def test_auto_circuit_names_and_inputs_translate_without_the_peer():
    """The peer adapter's name translation, and its refusal of batches it would score wrongly
    (auto-circuit reads the last position's logits only), need no auto-circuit installed."""
    from circuitfade.analysis.peers import auto_circuit_eap, auto_circuit_node_name

    assert [auto_circuit_node_name(n) for n in ("Resid Start", "Resid End", "MLP 1", "A1.3", "A0.2.Q", "A1.0.V")] \
        == ["input", "logits", "MLP1", "L1H3", "L0H2.q", "L1H0.v"]
    tokens = torch.zeros(2, 5, dtype=torch.long)
    two_answers = Batch.from_answers(tokens, [[2, 4], [4]], targets=torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="one answer position per example, the last"):
        auto_circuit_eap(None, two_answers, two_answers, ac=object())
    not_last = Batch.from_answers(tokens, [[3], [3]], targets=torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="the last"):
        auto_circuit_eap(None, not_last, not_last, ac=object())


def test_trace_edges_over_a_plain_model_series_on_either_line():
    """A series of the installed line's own plain models (a 3.x ``HookedTransformer`` or a 4.x
    ``TransformerBridge``), traced with ``edge_attribution``: one row per edge and checkpoint, an
    interval on each, the same edge set at every step and scores that move between checkpoints."""
    from circuitfade.store import attach, trace

    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_head=16, n_ctx=P, d_vocab=V, attn_only=True,
               normalization_type="LN")
    models = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        models.append(compat.plain_model({**cfg, "seed": seed}))
    series = attach(models, steps=[0, 10, 20])
    traced = trace(series, [edge_attribution(steps=2, resamples=50)], CopyTask(), n=16, progress=False)
    n_edges = len(edge_graph(models[0]))
    assert len(traced) == 3 * n_edges and sorted(set(traced["step"])) == [0, 10, 20]
    assert traced.groupby("step")["edge"].apply(frozenset).nunique() == 1
    assert traced["se"].notna().all() and bool((traced["lo"] <= traced["hi"]).all())
    assert (traced["hi"] - traced["lo"]).max() > 0
    by_step = traced.pivot(index="edge", columns="step", values="value")
    assert (by_step[0] - by_step[20]).abs().max() > 1e-4  # different weights, different scores
