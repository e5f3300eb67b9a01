"""Precursors and the crossing predictor: planted models and curves with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.precursor import (activation_alignment, combine_parts, crossing_step, fit_crossing,
                                            label_alignment, median_interval, predict_crossing, relative_errors,
                                            source_attention)
from studies.alignment import precursor as P
from circuitfade.tasks import make_task
from circuitfade.tasks.kpart import hand_built_model


def _planted_attention_model(c: float, source: int) -> torch.nn.Module:
    """Head 0 scores key ``source`` at ``c / sqrt(d_head)`` and every other key at 0; head 1 is all zeros."""
    cfg = dict(n_layers=1, d_model=8, n_ctx=5, d_head=4, n_heads=2, d_vocab=6, attn_only=True,
               normalization_type=None, positional_embedding_type="standard", act_fn="relu")
    model = compat.plain_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.pos_embed.W_pos[torch.arange(5), torch.arange(5)] = 1.0  # position one-hots
        model.blocks[0].attn.W_K[0, source, 0] = 1.0  # key of position `source` = e_0, others 0
        model.blocks[0].attn.b_Q[0, 0] = c  # every query = c e_0
    return model.eval()


def test_source_attention_equals_the_hand_computed_softmax():
    torch.set_num_threads(1)
    c, source, q = 3.0, 2, 4
    model = _planted_attention_model(c, source)
    tokens = torch.randint(0, 6, (7, 5), generator=torch.Generator().manual_seed(0))
    got = source_attention(model, tokens, {(0, 0): source, (0, 1): source, (0, 1 + 0): source}, q)
    e = math.exp(c / 2.0)  # attn_scale = sqrt(d_head) = 2
    assert got[0] == pytest.approx(e / (e + q), abs=1e-6)  # q other keys at score 0
    assert got[1] == pytest.approx(1 / (q + 1), abs=1e-6)  # zero head: uniform over the q + 1 causal keys
    # at an earlier query row the source is one of fewer keys
    assert source_attention(model, tokens, {(0, 0): source}, 3)[0] == pytest.approx(e / (e + 3), abs=1e-6)
    with pytest.raises(ValueError, match="after the query"):
        source_attention(model, tokens, {(0, 0): 4}, 3)
    with pytest.raises(ValueError, match="no head"):
        source_attention(model, tokens, {(0, 5): 0}, 3)


def test_source_attention_of_the_pinned_kpart_parts():
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    tokens = task.sample(16, torch.Generator().manual_seed(0)).tokens
    got = source_attention(model, tokens, {h: task.positions[h[1]] for h in parts}, task.query_pos)
    n_other = task.query_pos  # keys 0..q, one of them the source
    assert got == pytest.approx(np.full(3, 1 / (1 + n_other * math.exp(-30))), abs=1e-9)


def test_label_alignment_planted_values():
    x = torch.tensor([[0.0], [2.0], [1.0], [3.0]])
    assert label_alignment(x, torch.tensor([0, 0, 1, 1])) == pytest.approx(0.2)  # between 1 / total 5
    assert label_alignment(x, torch.tensor([0, 1, 2, 3])) == pytest.approx(1.0)
    assert label_alignment(x, torch.tensor([0, 1, 1, 0])) == pytest.approx(0.0)  # both class means 1.5
    two = torch.tensor([[0.0, 5.0], [2.0, 5.0], [1.0, 7.0], [3.0, 7.0]])  # features pool their variance
    assert label_alignment(two, torch.tensor([0, 0, 1, 1])) == pytest.approx((1 + 4) / (5 + 4))
    with pytest.raises(ValueError, match="constant"):
        label_alignment(torch.ones(4, 2), torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="integers"):
        label_alignment(x, torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_activation_alignment_exact_on_enumerated_inputs():
    task = make_task("kpart", k=3, v=3, n_distractors=1)
    model, _ = hand_built_model(task)
    probe = P.probe_set(task)
    tok = probe["tokens"]
    assert len(tok) == 3 ** 4
    # the embedding at position 0 is a function of the token there, and exactly independent of the next one
    assert activation_alignment(model, tok, tok[:, 0], "hook_embed", 0) == pytest.approx(1.0, abs=1e-12)
    assert activation_alignment(model, tok, tok[:, 1], "hook_embed", 0) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="not a hook"):
        activation_alignment(model, tok, tok[:, 0], "blocks.0.nope", 0)


def test_probe_set_targets_and_partial_sums():
    task = make_task("kpart", k=4, v=3, n_distractors=1)
    probe = P.probe_set(task)
    vals = probe["tokens"][:, : task.n_values]
    assert torch.equal(probe["target"], task.target_of(vals[:, list(task.positions)]))
    for i, p in enumerate(probe["partial"]):
        assert torch.equal((probe["target"] - p) % task.v, task.perms[i][vals[:, i]])
    assert len(torch.unique(probe["tokens"], dim=0)) == 3 ** 5 and (probe["tokens"][:, -1] == task.query_token).all()


def test_measure_on_the_hand_built_circuit():
    task = make_task("kpart", k=4, v=3, n_distractors=1)
    model, _ = hand_built_model(task, margin=10.0)
    m = P.measure(model, task, P.probe_set(task))
    assert m["logit_target"] == pytest.approx(1.0, abs=1e-9)  # logits = 10 * onehot(y) on the answers
    others = task.d_vocab - 1
    assert m["loss_gap"] == pytest.approx(math.log(3) - math.log(1 + others * math.exp(-10)), abs=1e-5)
    assert m["source_attention_min"] == pytest.approx(1.0, abs=1e-9)
    assert 0 < m["hidden_target"] <= 1 and 0 <= m["hidden_partial_min"] <= 1


def test_combine_parts():
    assert combine_parts([0.5, 0.2, 0.8]) == 0.2
    assert combine_parts([0.5, 0.2, 0.8], "product") == pytest.approx(0.08)
    assert combine_parts([0.5, 0.2, 0.8], "mean") == pytest.approx(0.5)
    with pytest.raises(ValueError):
        combine_parts([0.5], "max")
    with pytest.raises(ValueError):
        combine_parts([])


def test_crossing_step_running_median_ignores_one_spike():
    s = np.arange(0, 100, 5)
    y = np.full(len(s), 1e-6)
    y[3] = 1.0  # one lucky evaluation at step 15: the median of 5 does not move
    y[10:] = 1e-3  # from step 50 on; median over 5 reaches it at the third such evaluation (step 60)
    assert crossing_step(s, y, 1e-4, window=5) == 60.0
    assert crossing_step(s, y, 1e-4, window=1) == 15.0
    assert crossing_step(s, y, 1e-4, window=5, before=60) is None
    assert crossing_step(s, y, 1e-2) is None
    with pytest.raises(ValueError):
        crossing_step(s[::-1], y, 1e-4)


def _planted_run(t0: float, drive: float, rate: float = 0.02, floor: float = 1e-6):
    """A precursor that grows exponentially at ``rate * drive`` from ``floor`` at ``t0``; ignition when it reaches 1."""
    s = np.arange(0, 4000, 5.0)
    y = floor * np.exp(rate * drive * np.clip(s - t0, 0, None))
    ignition = t0 + math.log(1 / floor) / (rate * drive)
    return s, y, ignition


def test_fit_crossing_recovers_the_planted_lead_and_predicts_exactly():
    runs = [_planted_run(t0, d) for t0, d in ((100, 1.0), (400, 0.5), (250, 0.7), (800, 1.0))]
    curves = [(s, y) for s, y, _ in runs]
    ig = [i for _, _, i in runs]
    drives = [1.0, 0.5, 0.7, 1.0]
    c = fit_crossing(curves, ig, drives, levels=(1e-4,), window=1)
    # crossing 1e-4 at t0 + ln(100)/(0.02 d), rounded up to the 5-step grid; lead*drive = ln(1e4)/0.02 minus the rounding
    assert c["lead"] == pytest.approx(math.log(1e4) / 0.02, abs=5.0)
    assert c["fit_median_rel_error"] < 0.01 and c["level"] == 1e-4
    s, y, actual = _planted_run(600, 0.6)
    pred, t = predict_crossing(s, y, c, drive=0.6, flat_until=actual)
    assert abs(pred - actual) / actual < 0.01 and t < actual
    # a level no run crosses before igniting is rejected; a curve that never crosses gets no prediction
    with pytest.raises(ValueError, match="no level"):
        fit_crossing(curves, ig, drives, levels=(10.0,), window=1)
    p, t = predict_crossing(s, np.zeros_like(y), c, drive=0.6)
    assert math.isnan(p) and math.isnan(t)
    err = relative_errors([p, 110.0], [100.0, 100.0])
    assert err[0] == math.inf and err[1] == pytest.approx(0.1)


def test_median_interval_keeps_infinite_errors_infinite():
    m, lo, hi = median_interval([0.1, 0.2, math.inf])
    assert m == pytest.approx(0.2) and lo <= m <= hi and hi == math.inf
    m, lo, hi = median_interval([0.05] * 6)
    assert (m, lo, hi) == (0.05, 0.05, 0.05)


def test_split_is_fixed_and_large_enough():
    assert not set(P.FIT_SEEDS) & set(P.HELD_SEEDS)
    assert len(P.HELD_SEEDS) * len(P.DRIVES) >= 6 and (len(P.FIT_SEEDS) + len(P.HELD_SEEDS)) * len(P.DRIVES) >= 12
    assert min(P.HELD_SEEDS) > 3  # the probe runs that chose the precursor used seeds 0-3 (fit split)


def test_precursor_verdict_rule_on_planted_numbers():
    v = lambda e, b: P.precursor_verdicts((e, e * 0.8, e * 1.2), b, 0.3, 18).verdict.iloc[0]  # noqa: E731
    assert v(0.05, 0.4) == "reproduced"
    assert v(0.10, 0.4) == "reproduced"
    assert v(0.15, 0.4) == "partly"
    assert v(0.05, 0.04) == "not reproduced"  # not better than the fit-median baseline
    assert v(0.5, 0.4) == "not reproduced"
    assert P.precursor_verdicts(None, None, None, 0).verdict.iloc[0] == "not run"


def test_frozen_predictor_round_trip_and_tamper_check(tmp_path):
    import json

    path = tmp_path / "c.json"
    const = {"level": 1e-4, "lead": 120.0, "window": 5, "fit_median_rel_error": 0.03, "n_fit": 18, "scan": []}
    P.freeze_predictor(path, const, fit_runs=pd.DataFrame({"seed": [0], "drive": [1.0], "ignition": [700.0]}))
    assert P.load_predictor(path)["lead"] == 120.0
    with pytest.raises(ValueError, match="different frozen"):
        P.freeze_predictor(path, {**const, "lead": 121.0}, fit_runs=pd.DataFrame({"seed": [0]}))
    doc = json.loads(path.read_text())
    doc["payload"]["constants"]["lead"] = 99.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="hash mismatch"):
        P.load_predictor(path)


def test_precursor_job_logs_every_evaluation_and_reports_censoring(tmp_path):
    from studies.alignment.apparatus import run_cached_jobs
    from studies.alignment.report import EXPERIMENTS

    assert "precursor" in EXPERIMENTS
    spec = {"kind": "precursor", "k": P.K, "seed": 0, "drive": 1.0, "every": P.EVERY, "cap": 20}
    res = run_cached_jobs(P.precursor_job, [spec], tmp_path)[0]  # through the study's cached job runner
    assert res["status"] == "censored" and res["ignition"] is None and res["final_step"] == 20
    c = res["curves"]
    assert c["step"] == [0, 5, 10, 15, 20]
    assert set(P.MEASURES) <= set(c) and all(len(c[m]) == 5 for m in P.MEASURES)
    assert all(a == pytest.approx(1.0, abs=1e-9) for a in c["source_attention_min"])  # pinned read-out
    assert all(0 <= v <= 1 for v in c["hidden_target"])


def test_the_data_argument_is_batch_and_tokens_still_works_for_one_release_with_a_warning():
    from circuitfade.analysis.parts import routing_parts
    from circuitfade.tasks import eval_set, make_task

    task = make_task("kpart", k=2, v=3, n_distractors=1)
    model, parts = hand_built_model(task)
    b = eval_set(task, 32)
    heads = {h: task.positions[h[1]] for h in parts}
    now = source_attention(model, b, heads, task.query_pos)
    assert np.array_equal(now, source_attention(model, b.tokens, heads, task.query_pos))  # a Batch or its ids
    with pytest.warns(DeprecationWarning, match=r"source_attention\(model, tokens=...\): the argument is now batch"):
        assert np.array_equal(source_attention(model, tokens=b.tokens, parts=heads, query_pos=task.query_pos), now)
    with pytest.warns(DeprecationWarning, match="routing_parts"):
        old = routing_parts(model, tokens=b.tokens, sources=task.positions, query_pos=task.query_pos)
    assert old == routing_parts(model, b, task.positions, task.query_pos)
    with pytest.raises(TypeError, match="give the data once, as batch"):
        activation_alignment(model, b, tokens=b.tokens, labels=b.targets[:, 0], hook="hook_embed", pos=0)
