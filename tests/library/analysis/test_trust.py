"""One evaluation convention, intervals on every measurement, a timeline with its uncertainty.

Planted cases with known answers: the coverage of bootstrap intervals, a crossing inside
the noise floor, a NaN model, the shipped series' numbers agreeing across entry points.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade import compat, stats
from circuitfade.analysis import (
    consolidation_timeline,
    evaluate,
    gate_intervention_table,
    head_diagnostics,
    mean_ablation_importance,
    successor_mass,
)
from circuitfade.analysis.heads import ABLATION_IMPORTANCE, SUCCESSOR_MASS
from circuitfade.analysis.timeline import timeline_long
from circuitfade.analysis.gates import condition_metrics
from circuitfade.store import attach, head_label, trace
from circuitfade.tasks import (
    EVAL_SEED,
    EVAL_SIZE,
    Batch,
    BatchTask,
    as_task,
    eval_set,
    make_task,
    parse_task_args,
)
from circuitfade.tasks.base import eval_label
from circuitfade.train import TrainConfig, read_metrics
from repo_root import REPO

torch.set_num_threads(1)
SERIES = REPO / "circuitfade" / "data" / "series"


# ------------------------------------------------------------------------ stats
def test_binomial_and_wilson_known_values():
    assert stats.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert math.isnan(stats.binomial_se(0.5, 0))
    lo, hi = stats.wilson_interval(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35  # Wilson 95% upper bound for 0/10 is 0.2775
    assert hi == pytest.approx(0.2775, abs=1e-3)
    lo, hi = stats.wilson_interval(50, 100)
    assert (lo, hi) == pytest.approx((0.4038, 0.5962), abs=1e-3)
    assert stats.z_value(0.95) == pytest.approx(1.959964, abs=1e-5)
    # one answer per example: binomial; several: by-example (cluster) standard error
    r = stats.proportion_interval([1] * 30 + [0] * 70, [1] * 100)
    assert r["method"] == "binomial" and r["se"] == pytest.approx(math.sqrt(0.3 * 0.7 / 100))
    r = stats.proportion_interval([2, 0] * 50, [2, 2] * 50)  # answers perfectly correlated within examples
    assert r["method"] == "cluster" and r["se"] == pytest.approx(math.sqrt(100 / 99) * math.sqrt(50 * 1 + 50 * 1) / 200)
    assert r["se"] > stats.binomial_se(0.5, 200)  # pooling positions would understate it


def test_t_interval_moved_to_stats_is_the_one_history_uses():
    from studies.history import study as history

    assert history.t_interval is stats.t_interval
    m, lo, hi = stats.t_interval([1, 2, 3, 4, 5])
    assert m == 3 and hi - m == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), abs=1e-5)
    s = stats.seed_summary([1, 2, 3, 4, 5])
    assert s["sd"] == pytest.approx(math.sqrt(2.5)) and s["sem"] == pytest.approx(math.sqrt(2.5 / 5)) and s["n"] == 5
    assert stats.compare_intervals((0.5, 0.6), (0.1, 0.4)) == "higher"
    assert stats.compare_intervals((0.1, 0.4), (0.5, 0.6)) == "lower"
    assert stats.compare_intervals((0.1, 0.5), (0.4, 0.6)) == "overlap"
    assert stats.compare_intervals((math.nan, 0.5), (0.4, 0.6)) == "unknown"


def test_bootstrap_ratio_interval_covers_the_true_value_at_the_stated_rate():
    """A planted ratio metric (answers per example 1..4, each correct with p = 0.3): over
    300 independent evaluation sets of 150 examples the 95% percentile interval covers
    0.3 in 95% of them, within a binomial tolerance (3 sd of 300 draws: ±0.038)."""
    rng = np.random.default_rng(1)
    truth, draws, n, level = 0.3, 300, 150, 0.95
    w = stats.bootstrap_weights(n, 400, seed=0)
    covered = 0
    for _ in range(draws):
        counts = rng.integers(1, 5, size=n)
        correct = rng.binomial(counts, truth)
        boot = stats.bootstrap_ratio(correct, counts, w)
        lo, hi = stats.percentile_interval(boot, level)
        covered += bool(lo <= truth <= hi)
    assert abs(covered / draws - level) <= 3 * math.sqrt(level * (1 - level) / draws) + 0.01


def test_bootstrap_weights_are_resamples():
    w = stats.bootstrap_weights(10, 50, seed=3)
    assert w.shape == (50, 10) and (w.sum(1) == 10).all() and (w >= 0).all()
    assert np.array_equal(w, stats.bootstrap_weights(10, 50, seed=3))
    with pytest.raises(ValueError, match="resamples"):
        stats.bootstrap_weights(10, 0)


# ------------------------------------------------------------- planted head metric
def uniform_attention_model(n_ctx: int = 12, d_vocab: int = 16):
    """Attention-only, zero QK: every head attends uniformly, so at answer position ``i``
    with one source its successor mass is exactly ``1 / (i + 1)``."""
    m = compat.plain_model(dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=n_ctx, d_vocab=d_vocab,
                                attn_only=True, normalization_type=None, seed=0))
    with torch.no_grad():
        m.blocks[0].attn.W_Q.zero_()
        m.blocks[0].attn.W_K.zero_()
    return m.eval()


def random_answer_batch(n: int, gen: torch.Generator, n_ctx: int = 12, d_vocab: int = 16) -> Batch:
    """Distinct tokens per row; one answer at a random position ``i`` whose target is the
    token at a random earlier position (so exactly one source)."""
    tokens = torch.stack([torch.randperm(d_vocab, generator=gen)[:n_ctx] for _ in range(n)])
    pos = torch.randint(1, n_ctx - 1, (n,), generator=gen)
    src = (torch.rand(n, generator=gen) * pos).long()
    mask = torch.zeros(n, n_ctx, dtype=torch.bool)
    mask[torch.arange(n), pos] = True
    targets = torch.zeros(n, n_ctx, dtype=torch.long)
    targets[torch.arange(n), pos] = tokens[torch.arange(n), src]
    return Batch.from_answers(tokens, mask, targets=targets)


def test_successor_mass_bootstrap_covers_the_planted_mass():
    """True mass of every head = E[1/(i+1)], i uniform on 1..10. Over 60 evaluation sets the
    95% interval of head_diagnostics covers it at about the stated rate (tolerance for 60
    draws: 3 sd ± 0.084, plus 0.02 for the bootstrap's own error)."""
    model = uniform_attention_model()
    truth = float(np.mean([1 / (i + 1) for i in range(1, 11)]))
    gen = torch.Generator().manual_seed(0)
    covered, draws = 0, 60
    for _ in range(draws):
        batch = random_answer_batch(80, gen)
        df = head_diagnostics(model, batch, BatchTask(batch), resamples=200)
        row = df[(df["metric"] == SUCCESSOR_MASS) & (df["head"] == 0)].iloc[0]
        assert row["se"] > 0 and len(row["boot"]) == 200
        covered += bool(row["lo"] <= truth <= row["hi"])
    assert abs(covered / draws - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / draws) + 0.02


def test_all_nan_model_reports_nan_not_zero():
    model = uniform_attention_model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    batch = random_answer_batch(16, torch.Generator().manual_seed(1))
    task = BatchTask(batch)
    assert torch.isnan(successor_mass(model, batch)).all()
    abl = mean_ablation_importance(model, batch, task, gates=None)
    assert abl["acc_drop"].isna().all() and abl["loss_increase"].isna().all()
    df = head_diagnostics(model, batch, task)
    assert df["value"].isna().all()


# --------------------------------------------------------------- tasks everywhere
def test_tasks_names_dicts_objects_and_user_batches_are_accepted():
    assoc = make_task("assoc")
    assert as_task("assoc").name == "assoc" and as_task(assoc) is assoc
    assert as_task({"name": "assoc", "n_pairs": 4}).config.n_pairs == 4
    batch = random_answer_batch(8, torch.Generator().manual_seed(2))
    bt = as_task(batch)
    assert isinstance(bt, BatchTask) and eval_set(bt) is batch
    with pytest.raises(ValueError, match="expected a Task, a task name"):
        as_task(3)
    with pytest.raises(ValueError, match="'name' key"):
        as_task({"n_pairs": 4})
    assert parse_task_args("assoc", ["n_pairs=4", "shared_vocab=false"]) == {
        "name": "assoc", "n_pairs": 4, "shared_vocab": False}
    with pytest.raises(ValueError, match="has no parameter 'nope'"):
        parse_task_args("assoc", ["nope=1"])
    with pytest.raises(ValueError, match="expected an integer"):
        parse_task_args("assoc", ["n_pairs=first"])
    with pytest.raises(ValueError, match="'name'"):
        parse_task_args("assoc", ["name=markov"])
    # from_answers: default targets are the next tokens, default sources earlier copies
    b = Batch.from_answers(torch.tensor([[3, 5, 3, 5]]), [[2]])
    assert b.targets[0, 2] == 5 and b.answer_sources[0, 2].tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="last position"):
        Batch.from_answers(torch.tensor([[3, 5]]), [[1]])


def test_plain_models_traced_with_a_task_name_or_own_batch_keep_every_metric():
    models = [uniform_attention_model(), uniform_attention_model()]
    series = attach(models)
    with pytest.raises(ValueError, match="this series has no task; pass task="):
        trace(series, [head_diagnostics], progress=False)
    batch = random_answer_batch(16, torch.Generator().manual_seed(3))
    tr = trace(series, [head_diagnostics], task=batch, progress=False)
    assert set(tr["metric"]) == {SUCCESSOR_MASS, ABLATION_IMPORTANCE, "ablation_loss_increase"}
    assert tr["value"].notna().all() and tr["note"].isna().all()  # no "no gates" rows
    assert tr[["se", "lo", "hi"]].notna().all().all()
    # one name per metric: the function's trace name is the timeline's metric name
    one = trace(series, [successor_mass, condition_metrics], task=batch, progress=False)
    assert set(one["metric"]) == {SUCCESSOR_MASS, "accuracy", "loss"}
    consolidation_timeline(one, {SUCCESSOR_MASS: 0.25}, by=())
    acc = one[one["metric"] == "accuracy"]
    assert (acc["condition"] == "normal").all() and acc["se"].notna().all()
    # a head column that is the head index, read as df["head"]
    assert list(one.loc[one["metric"] == SUCCESSOR_MASS, "head"].unique()) == [0, 1]
    assert head_label(1, 3) == "L1H3"


def test_analyze_accepts_task_dicts_and_task_args(tmp_path, capsys):
    from circuitfade.commands.analyze import analyze, analyze_main

    cfg = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=32, attn_only=True, seed=0)
    res = analyze([compat.plain_model(cfg), compat.plain_model(cfg)], task={"name": "assoc", "n_pairs": 4},
                  n=64, progress=False)
    assert res["task"].config.n_pairs == 4 and res["eval"] == "eval: 64 examples, seed 1000003"
    assert res["traced"]["value"].notna().all()  # plain models: every metric computed, no "no gates" rows
    assert analyze_main([str(tmp_path), "--task-arg", "n_pairs=4", "--out", str(tmp_path / "a.html")]) == 2
    assert "--task-arg needs --task NAME" in capsys.readouterr().err


# ------------------------------------------------------------------ the timeline
def planted_trace(step0_mass: float, crossing_mass: float, boot_spread: float = 0.0, R: int = 40) -> pd.DataFrame:
    """One series, steps 0..900 by 300, 1 layer x 2 heads. Head 1's mass is ``step0_mass``
    at step 0 and ``crossing_mass`` from step 300; head 0 stays at 0.05. Resamples
    (``boot``) put head 1 at value ± ``boot_spread`` (alternating)."""
    rows = []
    signs = np.where(np.arange(R) % 2 == 0, 1.0, -1.0)
    for step in (0, 300, 600, 900):
        for head, v in ((0, 0.05), (1, step0_mass if step == 0 else crossing_mass)):
            boot = (v + boot_spread * signs).astype(np.float32) if head == 1 else np.full(R, v, np.float32)
            rows.append({"step": step, "layer": 0, "head": head, "metric": SUCCESSOR_MASS, "value": v,
                         "se": float(np.std(boot)), "lo": float(boot.min()), "hi": float(boot.max()), "boot": boot})
    return pd.DataFrame(rows)


def test_crossing_inside_the_noise_floor_is_reported_as_such():
    # the untrained model already sits at 0.12 (upper bound 0.14); the "crossing" of .13 at 300 is not above it
    tl = timeline_long(planted_trace(0.12, 0.13, boot_spread=0.02), {SUCCESSOR_MASS: 0.125}, by=())
    r = tl.iloc[0]
    assert r["first_step"] == 300 and r["noise_floor"] == pytest.approx(0.12)
    assert r["noise_floor_hi"] == pytest.approx(0.14, abs=1e-6) and r["crossing"] == "within noise floor"
    # a threshold the untrained model reaches: within the noise floor at step 0
    r = timeline_long(planted_trace(0.3, 0.5), {SUCCESSOR_MASS: 0.25}, by=()).iloc[0]
    assert r["first_step"] == 0 and r["crossing"] == "within noise floor"
    # a clear crossing well above the floor
    r = timeline_long(planted_trace(0.06, 0.5, boot_spread=0.01), {SUCCESSOR_MASS: 0.25}, by=()).iloc[0]
    assert r["first_step"] == 300 and r["crossing"] == "crossed"
    assert r["top_margin"] == pytest.approx(0.45) and r["top_agreement"] == 1.0


def test_timeline_reports_spread_agreement_and_margin_over_resamples():
    # half the resamples see head 1 at 0.26 (crossing .25 at 300), half at 0.24 (never crossing)
    tr = planted_trace(0.05, 0.25, boot_spread=0.01)
    r = timeline_long(tr, {SUCCESSOR_MASS: 0.25}, by=(), gate_zero_step=300).iloc[0]
    assert r["first_step"] == 300 and r["cross_rate"] == pytest.approx(0.5)
    assert r["first_step_lo"] == 300 and pd.isna(r["first_step_hi"])  # half never cross: no upper bound
    assert r["first_head_agreement"] == pytest.approx(0.5) and r["after_gate_zero_rate"] == 1.0
    wide = consolidation_timeline(tr, {SUCCESSOR_MASS: 0.25}, by=())
    for c in ("first_step_lo", "first_step_hi", "top_agreement", "top_margin", "noise_floor", "crossing"):
        assert f"{SUCCESSOR_MASS}_{c}" in wide.columns
    # without resamples: margins and the noise floor still, spread NA
    bare = timeline_long(tr.drop(columns="boot"), {SUCCESSOR_MASS: 0.25}, by=()).iloc[0]
    assert pd.isna(bare["first_step_lo"]) and math.isnan(bare["cross_rate"]) and bare["noise_floor"] == 0.05


# ------------------------------------------------------- one evaluation convention
def test_one_convention_defined_once():
    assert (EVAL_SIZE, EVAL_SEED) == (512, 1_000_003)
    assert eval_label() == "eval: 512 examples, seed 1000003"
    from circuitfade.train import loop

    assert loop.EVAL_SEED == EVAL_SEED and TrainConfig().eval_size == EVAL_SIZE
    assert make_task("linreg").primary_metric.name == "mse" and make_task("linreg").primary_metric.direction == "lower"
    pm = make_task("assoc").primary_metric
    assert (pm.name, pm.key("zero"), pm.direction, pm.chance) == ("accuracy", "acc_zero", "higher", 1 / 16)


def test_the_eval_convention_is_not_part_of_run_identity():
    """The shipped series keeps its cache key: the eval seed/size convention lives outside RunConfig."""
    import json

    from circuitfade.train import RunConfig
    from circuitfade.train.sweep import run_key

    cfg = RunConfig.from_dict(json.loads((SERIES / "fade600to0" / "config.json").read_text()))
    assert run_key(cfg) == "assoc-fade600to0-s0-78ea2186"  # the folder name in results/paper/results_runs.csv


def test_tables_only_rebuilds_from_the_recorded_csv(tmp_path):
    """No run folders, only results/paper/results_runs.csv: the tables and verdicts are rebuilt from it."""
    import shutil

    from studies.paper.reproduce import reproduce

    shutil.copy(REPO / "results" / "paper" / "results_runs.csv", tmp_path / "results_runs.csv")
    res = reproduce(["controls"], seeds=3, out=tmp_path, train=False, progress=False, large_seeds=0)
    md = res["markdown"]
    assert "18 from the recorded results_runs.csv (folders gone), 0 not trained" in md
    assert "| base L=2 d=64 | fade600->0 | 0.783 [0.697, 0.868] (n=3, sd 0.034) |" in md
    assert "eval: 512 examples, seed 1000003" in md
    v = res["tables"]["verdicts"].set_index("claim")["verdict"]
    assert v["forced_zero fails"] == "not reproduced" and v["hard switch at 1050 falls short"] == "inconclusive"


def _shipped_final():
    series = attach(SERIES / "fade600to0")
    m = read_metrics(SERIES / "fade600to0")
    return series, float(m.loc[m["step"] == 3600, "acc_zero"].iloc[0])


def test_every_entry_point_reports_the_same_zero_gate_accuracy():
    series, logged = _shipped_final()
    model = series[3600]
    assert logged == 0.763671875  # the README's 0.764
    assert evaluate(model, series.task, gates="zero")["accuracy"] == logged
    table = gate_intervention_table(model, series.task).set_index("condition")
    assert table.loc["both gates zeroed", "accuracy"] == logged
    tr = trace(series.select([3600]), [condition_metrics], progress=False)
    acc = tr[(tr["metric"] == "accuracy") & (tr["condition"] == "zero")].iloc[0]
    assert acc["value"] == logged
    assert acc["se"] == pytest.approx(math.sqrt(logged * (1 - logged) / 512))


def test_analyze_reports_the_same_zero_gate_accuracy():
    from circuitfade.commands.analyze import analyze

    series, logged = _shipped_final()
    res = analyze(series.select([3600]), progress=False)
    assert res["eval"] == "eval: 512 examples, seed 1000003"
    table = res["interventions"].set_index("condition")
    assert table.loc["both gates zeroed", "accuracy"] == logged
