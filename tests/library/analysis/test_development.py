"""Developmental screens over revision series.

* :mod:`circuitfade.store.revisions`: revision-name parsing, log-spaced selection, hub series
  with an injected loader (no network), integrity checks on a tiny local GPT-NeoX series
  (a planted duplicate and a corrupted revision);
* :mod:`circuitfade.analysis.development`: series-level tables on planted screen tables
  with known answers, and ``screen_series`` end to end on the tiny local series;
* :mod:`circuitfade.tasks.repeats`: targets and repeated spans are where claimed;
* :mod:`circuitfade.commands.screen`: the CLI on the local series; the
  tutorial notebook (slow).
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.development import (
    PR_METRIC,
    class_fractions,
    convergence_summary,
    emergence_shape,
    layer_counts,
    pr_lead_test,
    screen_model,
    screen_series,
    set_convergence,
    zero_layers,
)
from circuitfade.analysis.screens import capability_selectivity
from circuitfade.store.revisions import (
    PYTHIA_REVISIONS,
    PYTHIA_TOKENS_PER_STEP,
    Revision,
    check_integrity,
    hub_series,
    log_spaced,
    parse_revision,
    pythia_revisions,
    revision_table,
    sound_revisions,
    weights_digest,
)
from circuitfade.store import attach
from circuitfade.tasks import IGNORE_INDEX, make_task
from repo_root import REPO

transformers = pytest.importorskip("transformers")



# --------------------------------------------------------------------------------------
# a tiny local GPT-NeoX revision series
# --------------------------------------------------------------------------------------
def _neox_series(folder: Path, steps=(0, 10, 100)) -> Path:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = GPTNeoXConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, rotary_pct=0.25)
    for s in steps:
        torch.manual_seed(s)
        GPTNeoXForCausalLM(cfg).save_pretrained(folder / f"step{s}")
    return folder


@pytest.fixture(scope="module")
def neox(tmp_path_factory) -> Path:
    return _neox_series(tmp_path_factory.mktemp("neox"))


# --------------------------------------------------------------------------------------
# revision names and selection
# --------------------------------------------------------------------------------------
def test_pythia_revision_list():
    assert len(PYTHIA_REVISIONS) == 154
    assert PYTHIA_REVISIONS[:12] == ("step0", "step1", "step2", "step4", "step8", "step16", "step32", "step64",
                                     "step128", "step256", "step512", "step1000")
    assert PYTHIA_REVISIONS[-2:] == ("step142000", "step143000")
    revs = pythia_revisions()
    assert revs[-1] == Revision(143000, "step143000", 143000 * PYTHIA_TOKENS_PER_STEP, None)


@pytest.mark.parametrize("name, step, tokens, stage", [
    ("step1000", 1000, None, None),
    ("step0", 0, None, None),
    ("step1000-tokens4B", 1000, 4_000_000_000, None),
    ("step5000-tokens20B", 5000, 20_000_000_000, None),
    ("step477000-tokens2000B", 477000, 2_000_000_000_000, None),
    ("stage1-step140000-tokens1174B", 140000, 1_174_000_000_000, "stage1"),
    ("step10-tokens2.5M", 10, 2_500_000, None),
    ("step20-tokens41943040", 20, 41_943_040, None),
])
def test_parse_revision_names(name, step, tokens, stage):
    assert parse_revision(name) == Revision(step, name, tokens, stage)


def test_parse_revision_steps_ints_and_tokens_per_step():
    assert parse_revision(512) == Revision(512, "step512", None, None)
    assert parse_revision("step3", tokens_per_step=PYTHIA_TOKENS_PER_STEP).tokens == 3 * 2_097_152
    # a token count in the name wins over tokens_per_step
    assert parse_revision("step1000-tokens4B", tokens_per_step=7).tokens == 4_000_000_000
    for bad in ("main", "tokens4B", "v0", "steps", True, -1):
        with pytest.raises(ValueError):
            parse_revision(bad)


def test_log_spaced_on_pythia():
    picked = log_spaced(PYTHIA_REVISIONS, 10)
    assert picked == ["step0", "step2", "step16", "step64", "step256", "step1000", "step3000", "step10000",
                      "step38000", "step143000"]
    steps = [parse_revision(p).step for p in picked]
    assert steps == sorted(set(steps)) and len(steps) == 10
    # targets are exp(linspace(0, log 143001, 10)) - 1: each pick is the nearest in log(1 + step)
    u = np.log1p([parse_revision(r).step for r in PYTHIA_REVISIONS])
    targets = np.linspace(0, np.log1p(143000), 10)
    for s, t in zip(steps, targets):
        assert abs(np.log1p(s) - t) == pytest.approx(np.min(np.abs(u - t)))


def test_log_spaced_rules():
    shuffled = ["step100", "step0", "step10", "step1000", "step1", "step5"]
    assert log_spaced(shuffled, 2) == ["step0", "step1000"]
    assert log_spaced(shuffled, 10) == ["step0", "step1", "step5", "step10", "step100", "step1000"]
    # no duplicates even where targets crowd: every pick is distinct
    # targets crowd near the start: u = log1p(step) targets 0, 2.30, 4.61, 6.91 for [0, 1, 2, 3, 1000];
    # 2.30 and 4.61 both want step 3 (u = 1.39); the second target takes the next nearest free one (step 2)
    assert log_spaced([0, 1, 2, 3, 1000], 4) == [0, 2, 3, 1000]
    revs = [Revision(s, f"step{s}") for s in (1000, 0, 10, 100)]
    assert log_spaced(revs, 3) == [revs[1], revs[2], revs[0]]  # target log1p(1000)/2 = 3.45 -> step 10
    with pytest.raises(ValueError, match="share steps"):
        log_spaced(["step1", "step1-tokens2M"], 2)
    with pytest.raises(ValueError, match="n must be >= 2"):
        log_spaced(shuffled, 1)


def test_revision_table():
    t = revision_table(["step1000-tokens4B", "step0-tokens0B", "stage1-step2-tokens8M"])
    assert list(t["step"]) == [0, 2, 1000]
    assert list(t["tokens"]) == [0, 8_000_000, 4_000_000_000]
    assert t["stage"].isna().tolist() == [True, False, True] and t["stage"].iloc[1] == "stage1"


def test_hub_series_selects_and_loads_lazily():
    calls = []

    def loader(model_name, revision):
        calls.append((model_name, revision.name))
        torch.manual_seed(revision.step)
        return torch.nn.Linear(2, 2)

    series = hub_series("EleutherAI/pythia-1b", PYTHIA_REVISIONS, n=10, loader=loader,
                        tokens_per_step=PYTHIA_TOKENS_PER_STEP)
    assert calls == []  # nothing loaded yet
    assert series.steps == [0, 2, 16, 64, 256, 1000, 3000, 10000, 38000, 143000]
    assert series.snapshot(1000).source == "EleutherAI/pythia-1b@step1000"
    assert series.metadata["model"] == "EleutherAI/pythia-1b"
    model = series[64]
    assert isinstance(model, torch.nn.Linear) and calls == [("EleutherAI/pythia-1b", "step64")]
    olmo = hub_series("allenai/OLMo-1B-0724-hf", ["step1000-tokens4B", "step0-tokens0B", "step20000-tokens84B"],
                      loader=loader)
    assert olmo.steps == [0, 1000, 20000]
    _ = olmo[20000]
    assert calls[-1] == ("allenai/OLMo-1B-0724-hf", "step20000-tokens84B")
    with pytest.raises(ValueError, match="default loader"):
        hub_series("x", [1], loader=loader, device="cpu")


# --------------------------------------------------------------------------------------
# integrity
# --------------------------------------------------------------------------------------
def test_integrity_flags_planted_duplicate_and_corrupted(tmp_path):
    folder = _neox_series(tmp_path / "series", steps=(0, 10, 100, 1000))
    shutil.copytree(folder / "step10", folder / "step50")  # the same weights under another name
    (folder / "step100" / "model.safetensors").write_bytes(b"\x00garbage, not safetensors" * 10)
    report = check_integrity(folder)
    assert list(report.columns) == ["step", "source", "status", "digest"]
    status = dict(zip(report["step"], report["status"]))
    assert status[0] == "ok" and status[10] == "ok" and status[1000] == "ok"
    assert status[50] == "duplicate_of:10"
    assert status[100].startswith("load_failed:")
    assert report.loc[report["step"] == 50, "digest"].item() == report.loc[report["step"] == 10, "digest"].item()
    # sound_revisions leaves both out, with one warning naming them; the rest are screened
    with pytest.warns(UserWarning, match=r"skipping 2 revisions.*step 50.*duplicate_of:10.*step 100.*load_failed"):
        series, checked = sound_revisions(attach(folder))
    assert series.steps == [0, 10, 1000]
    assert {s: st for s, st in zip(checked["step"], checked["status"]) if st != "ok"} == {
        50: "duplicate_of:10", 100: status[100]}
    screen = screen_series(series, n=4, progress=False)
    assert sorted(screen.table["step"].unique()) == [0, 10, 1000]
    assert screen.skipped == {}
    # without the check, the unreadable revision fails to load and is skipped by the screen itself
    with pytest.warns(UserWarning, match=r"skipping step 100"):
        raw = screen_series(attach(folder).select([0, 100]), n=4, progress=False)
    assert sorted(raw.table["step"].unique()) == [0] and list(raw.skipped) == [100]
    assert raw.skipped[100].startswith("load_failed:")


def test_integrity_digest_ignores_file_metadata_and_sees_one_changed_weight(tmp_path):
    from safetensors.torch import save_file

    sd = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(2, dtype=torch.bfloat16)}
    save_file(sd, tmp_path / "x.safetensors", metadata={"step": "1"})
    save_file(sd, tmp_path / "y.safetensors", metadata={"step": "2"})
    torch.save(sd, tmp_path / "z.pt")
    d = weights_digest(tmp_path / "x.safetensors")
    assert d == weights_digest(tmp_path / "y.safetensors") == weights_digest(tmp_path / "z.pt") == weights_digest(sd)
    sd2 = dict(sd, b=sd["b"].clone())
    sd2["b"][1, 2] += 1e-3
    assert weights_digest(sd2) != d


def test_integrity_of_state_dict_folder_with_a_bad_file(tmp_path):
    fields = dict(n_layers=1, d_model=8, n_ctx=8, d_head=4, n_heads=2, d_vocab=10, attn_only=True, act_fn="relu")
    (tmp_path / "config.json").write_text(json.dumps(fields))
    for s in (1, 2):
        torch.manual_seed(s)
        model = compat.plain_model(dict(fields, seed=s))
        torch.save(model.state_dict(), tmp_path / f"ckpt_{s}.pt")
    shutil.copy(tmp_path / "ckpt_1.pt", tmp_path / "ckpt_3.pt")
    (tmp_path / "ckpt_4.pt").write_bytes(b"not a checkpoint")
    report = check_integrity(tmp_path)  # attach() refuses the folder; entries are checked one by one
    status = dict(zip(report["step"], report["status"]))
    assert status[1] == "ok" and status[2] == "ok" and status[3] == "duplicate_of:1"
    assert status[4].startswith("load_failed:CheckpointError")


def test_integrity_in_memory_models():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    report = check_integrity(attach({0: a, 5: b, 9: a}))
    assert list(report["status"]) == ["ok", "ok", "duplicate_of:0"]


# --------------------------------------------------------------------------------------
# series-level tables on planted screens
# --------------------------------------------------------------------------------------
STEPS = [0, 10, 100, 1000, 10000, 100000]


def _planted(n_layers=2, n_heads=4, **per_head_series) -> pd.DataFrame:
    """A wide screen table; ``per_head_series[(layer, head)] = {column: [value per step]}``."""
    rows = []
    for i, s in enumerate(STEPS):
        for layer in range(n_layers):
            for head in range(n_heads):
                spec = per_head_series.get(f"L{layer}H{head}", {})
                row = {"step": s, "layer": layer, "head": head, "induction_selectivity": 0.0,
                       "previous_token_selectivity": 0.0, "bos_capability": 0.05, PR_METRIC: 2.0}
                row.update({k: v[i] for k, v in spec.items()})
                rows.append(row)
    return pd.DataFrame(rows)


def test_class_fractions_and_sharp_vs_gradual():
    # BOS: L1H0 always; a sharp transition as five more heads (L0H0, L0H1, L1H1-3) cross between steps
    # 1000 and 10000: 1 of 8 heads (12.5%) -> 6 of 8 (75%). Previous-token: a gradual ramp, one more head
    # per revision from step 10 (L0H0 .. L0H3, then L1H0).
    spec: dict = {"L1H0": {"bos_capability": [0.9] * 6, "previous_token_selectivity": [0.0] * 5 + [0.8]}}
    for name in ("L0H0", "L0H1", "L1H1", "L1H2", "L1H3"):
        spec.setdefault(name, {})["bos_capability"] = [0.05, 0.05, 0.05, 0.05, 0.9, 0.9]
    for h in range(4):
        spec.setdefault(f"L0H{h}", {})["previous_token_selectivity"] = [0.0] * (h + 1) + [0.8] * (5 - h)
    screen = _planted(**spec)
    fr = class_fractions(screen)
    bos = fr[fr["class"] == "bos"].set_index("step")["fraction"]
    assert list(bos) == [1 / 8, 1 / 8, 1 / 8, 1 / 8, 6 / 8, 6 / 8]
    prev = fr[fr["class"] == "previous_token"].set_index("step")["count"]
    assert list(prev) == [0, 1, 2, 3, 4, 5]
    assert (fr["n_heads"] == 8).all()
    shapes = emergence_shape(fr).set_index("class")
    assert shapes.loc["bos", "shape"] == "sharp"
    assert shapes.loc["bos", "jump_from_step"] == 1000 and shapes.loc["bos", "jump_to_step"] == 10000
    assert shapes.loc["bos", "jump_share"] == pytest.approx(1.0)
    assert shapes.loc["bos", "total_change"] == pytest.approx(5 / 8)
    assert shapes.loc["previous_token", "shape"] == "gradual"
    assert shapes.loc["previous_token", "jump_share"] == pytest.approx(0.2)
    assert shapes.loc["induction", "shape"] == "flat"
    # the rule's threshold: at sharp_share=0.2 a ramp of five equal steps counts as sharp
    assert emergence_shape(fr, sharp_share=0.2).set_index("class").loc["previous_token", "shape"] == "sharp"


def test_emergence_shape_overshoot_and_errors():
    fr = pd.DataFrame({"step": [0, 1, 2, 3], "class": "bos", "fraction": [0.0, 0.5, 0.1, 0.2]})
    row = emergence_shape(fr).iloc[0]
    assert row["shape"] == "sharp" and row["jump_share"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="at least 2 revisions"):
        emergence_shape(fr.iloc[:1])
    with pytest.raises(ValueError, match="columns"):
        emergence_shape(fr.drop(columns="fraction"))


def test_thresholds_reclassify_and_long_frames():
    screen = _planted(L0H0={"induction_selectivity": [0.0, 0.1, 0.2, 0.35, 0.5, 0.6]})
    assert class_fractions(screen, classes=["induction"])["count"].tolist() == [0, 0, 0, 1, 1, 1]
    assert class_fractions(screen, classes=["induction"], thresholds={"induction": 0.15})["count"].tolist() == \
        [0, 0, 1, 1, 1, 1]
    # a long step/layer/head/metric/value frame gives the same table
    long = screen.melt(id_vars=["step", "layer", "head"], var_name="metric", value_name="value")
    long = pd.concat([long, long[long["metric"] == "induction_selectivity"].assign(metric="induction_capability")])
    long = pd.concat([long] + [long[long["metric"] == "induction_selectivity"].assign(metric=m)
                               for m in ("induction_control", "previous_token_capability", "previous_token_control",
                                         "bos_control", "bos_selectivity")])
    pd.testing.assert_frame_equal(class_fractions(long), class_fractions(screen))
    with pytest.raises(ValueError, match="unknown threshold"):
        class_fractions(screen, thresholds={"copying": 0.1})
    with pytest.raises(ValueError, match="missing"):
        class_fractions(screen.drop(columns="layer"))


def test_layer_counts_and_zero_layers():
    screen = _planted(L1H2={"bos_capability": [0.05, 0.6, 0.7, 0.8, 0.9, 0.9]},
                      L1H3={"bos_capability": [0.05, 0.05, 0.05, 0.8, 0.9, 0.9]})
    counts = layer_counts(screen, classes=["bos"])
    l1 = counts[counts["layer"] == 1].set_index("step")["count"]
    assert list(l1) == [0, 1, 1, 2, 2, 2]
    assert (counts[counts["layer"] == 0]["count"] == 0).all()
    assert (counts["n_heads"] == 4).all()
    z = zero_layers(counts).set_index("layer")
    assert bool(z.loc[0, "zero_at_every_revision"]) and not bool(z.loc[1, "zero_at_every_revision"])
    assert z.loc[1, "max_count"] == 2 and z.loc[0, "n_revisions"] == 6


def test_set_convergence_exact_and_jaccard():
    # final induction set {L1H0, L1H1, L1H2}; L1H3 is in the set transiently at step 100
    screen = _planted(
        L1H0={"induction_selectivity": [0, 0.5, 0.5, 0.5, 0.5, 0.5]},
        L1H1={"induction_selectivity": [0, 0, 0.5, 0.5, 0.5, 0.5]},
        L1H2={"induction_selectivity": [0, 0, 0.5, 0, 0.5, 0.5]},
        L1H3={"induction_selectivity": [0, 0, 0.5, 0, 0, 0]},
    )
    conv = set_convergence(screen, jaccard_threshold=0.6).set_index("step")
    assert list(conv["n_set"]) == [0, 1, 4, 2, 3, 3]
    assert conv["jaccard"].tolist() == pytest.approx([0, 1 / 3, 3 / 4, 2 / 3, 1, 1])
    assert conv["exact"].tolist() == [False, False, False, False, True, True]
    s = convergence_summary(conv.reset_index()).iloc[0]
    assert s["first_exact_step"] == 10000 and s["stable_exact_step"] == 10000
    assert s["first_close_step"] == 100 and s["stable_close_step"] == 100  # jaccard >= 0.6 from step 100 on
    assert s["first_exact_fraction"] == pytest.approx(0.1)
    s2 = convergence_summary(conv.reset_index(), jaccard_threshold=0.7).iloc[0]
    assert s2["first_close_step"] == 100 and s2["stable_close_step"] == 10000  # 2/3 < 0.7 at step 1000
    # nothing ever in the class: both sets empty, jaccard 1 everywhere
    empty = set_convergence(_planted())
    assert (empty["jaccard"] == 1).all() and (empty["n_final"] == 0).all()


def test_pr_lead_test_planted():
    screen = _planted(
        # PR rises one revision before selectivity crosses 0.3: a lead of one revision
        L1H0={"induction_selectivity": [0, 0, 0, 0.1, 0.5, 0.6], PR_METRIC: [1, 1, 1, 3, 3, 3]},
        # PR rises at the crossing revision itself: lead 0
        L1H1={"induction_selectivity": [0, 0, 0, 0.4, 0.5, 0.6], PR_METRIC: [1.0, 1.02, 0.98, 4, 4, 4]},
        # PR never moves: not elevated
        L1H2={"induction_selectivity": [0, 0, 0.35, 0.5, 0.5, 0.6], PR_METRIC: [2, 2, 2, 2, 2, 2]},
        # already an induction head at the first revision: no history, so False
        L1H3={"induction_selectivity": [0.5] * 6, PR_METRIC: [1, 2, 3, 4, 5, 6]},
        # PR elevated but the head is not a final induction head: not tested
        L0H0={"induction_selectivity": [0, 0.5, 0.5, 0.5, 0.1, 0.1], PR_METRIC: [1, 5, 5, 5, 5, 5]},
    )
    lead = pr_lead_test(screen).set_index(["layer", "head"])
    assert list(lead.index) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert lead.loc[(1, 0), "cross_step"] == 10000 and lead.loc[(1, 0), "first_elevated_step"] == 1000
    assert bool(lead.loc[(1, 0), "elevated_by_cross"]) and lead.loc[(1, 0), "lead_revisions"] == 1
    assert bool(lead.loc[(1, 1), "elevated_by_cross"]) and lead.loc[(1, 1), "lead_revisions"] == 0
    assert not bool(lead.loc[(1, 2), "elevated_by_cross"]) and pd.isna(lead.loc[(1, 2), "lead_revisions"])
    assert pd.isna(lead.loc[(1, 2), "first_elevated_step"])
    assert lead.loc[(1, 3), "cross_step"] == 0 and not bool(lead.loc[(1, 3), "elevated_by_cross"])
    assert lead.loc[(1, 0), "selectivity_at_cross"] == pytest.approx(0.5)
    assert lead.loc[(1, 0), "pr_at_cross"] == 3 and lead.loc[(1, 0), "baseline_at_cross"] == pytest.approx(1.5)
    # lookback: only elevation within k revisions before the crossing counts
    short = pr_lead_test(screen, lookback=0).set_index(["layer", "head"])
    assert not bool(short.loc[(1, 0), "elevated_by_cross"]) and bool(short.loc[(1, 1), "elevated_by_cross"])
    assert bool(pr_lead_test(screen, lookback=1).set_index(["layer", "head"]).loc[(1, 0), "elevated_by_cross"])
    with pytest.raises(ValueError, match="lookback"):
        pr_lead_test(screen, lookback=-1)
    # no final induction head: an empty table with the same columns
    none = pr_lead_test(_planted())
    assert len(none) == 0 and "elevated_by_cross" in none.columns
    with pytest.raises(ValueError, match="no 'head_output_pr'"):
        pr_lead_test(screen.drop(columns=PR_METRIC))


# --------------------------------------------------------------------------------------
# screens end to end on a local series
# --------------------------------------------------------------------------------------
def test_screen_series_on_local_neox(neox):
    series = attach(neox)
    result = screen_series(series, n=8, progress=False)
    screen = result.table
    assert sorted(screen["step"].unique()) == [0, 10, 100]
    assert len(screen) == 3 * 2 * 4
    for col in ("induction_selectivity", "bos_capability", PR_METRIC, "induction", "label", "architecture"):
        assert col in screen.columns
    assert result.skipped == {}
    # the same as screening each revision on its own
    one = screen_model(series[10], n=8)
    got = screen[screen["step"] == 10].reset_index(drop=True)
    np.testing.assert_allclose(got["induction_selectivity"], one["induction_selectivity"], atol=1e-6)
    np.testing.assert_allclose(got[PR_METRIC], one[PR_METRIC], rtol=1e-6)
    # the screen metrics are capability_selectivity's
    cs = capability_selectivity(series[10], n=8).pivot(index=["layer", "head"], columns="metric", values="value")
    np.testing.assert_allclose(got["bos_capability"], cs["bos_capability"].to_numpy(), atol=1e-6)
    # head-output PR lies in [1, d_model]
    assert screen[PR_METRIC].between(1 - 1e-9, 32 + 1e-9).all()
    # and the series tables run on it (with token counts carried along)
    with_tokens = screen_series(series, n=8, progress=False, tokens={0: 0, 10: 5e6, 100: 5e7}).table
    assert with_tokens.groupby("step")["tokens"].first().tolist() == [0, 5e6, 5e7]
    assert class_fractions(with_tokens).groupby("step")["tokens"].first().tolist() == [0, 5e6, 5e7]
    assert set(class_fractions(screen)["step"]) == {0, 10, 100}
    assert len(pr_lead_test(screen)) == int(screen.query("step == 100")["induction"].sum())


def test_screen_model_pr_is_on_the_repeated_input(neox):
    from circuitfade.analysis.screens import repeated_tokens
    from circuitfade.analysis.spectra import head_output_pr

    model = attach(neox)[0]
    got = screen_model(model, n=6, seq_len=10, seed=3, pr_positions="all")
    rep = repeated_tokens(32, 6, 10, torch.Generator().manual_seed(3))
    want = head_output_pr(model, rep)
    np.testing.assert_allclose(got[PR_METRIC], want.reshape(-1).numpy(), rtol=1e-6)
    copy = screen_model(model, n=6, seq_len=10, seed=3)
    np.testing.assert_allclose(copy[PR_METRIC], head_output_pr(model, rep, positions=slice(10, 20)).reshape(-1),
                               rtol=1e-6)


def test_bridge_backend_screens_like_hookedtransformer(neox):
    """load_revision's "bridge" backend (for OLMo revisions) gives the same screen as load_hf_local."""
    from transformer_lens.model_bridge import TransformerBridge

    from circuitfade.store import load_hf_local

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(neox / "step10"), device="cpu")
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    got, want = screen_model(bridge, n=4), screen_model(load_hf_local(neox / "step10"), n=4)
    np.testing.assert_allclose(got["induction_selectivity"], want["induction_selectivity"], atol=1e-6)
    np.testing.assert_allclose(got[PR_METRIC], want[PR_METRIC], rtol=1e-5)


def test_cli_on_local_series(neox, tmp_path, capsys):
    from circuitfade.commands.screen import main

    out = tmp_path / "rep" / "report.html"
    assert main([str(neox), "--out", str(out), "--n", "4", "--quiet"]) == 0
    text = capsys.readouterr().out
    for title in ("## Integrity", "## Class fractions", "## Emergence shape", "## Induction-set convergence",
                  "## PR lead test"):
        assert title in text
    page = out.read_text()
    assert "Heads in each class" in page and "sliders" in page and page.count("plotly.js v") <= 1
    assert page.index("Heads in each class (of") < page.index("<table")  # figures before tables, as counts
    for name in ("integrity", "screen", "class_fractions", "emergence_shape", "set_convergence", "pr_lead"):
        assert (out.parent / f"{name}.csv").is_file()
    assert main([str(tmp_path / "nowhere")]) == 2


# --------------------------------------------------------------------------------------
# the repeats task
# --------------------------------------------------------------------------------------
def test_repeats_targets_and_spans():
    task = make_task("repeats", d_vocab=16, seq_len=24, min_span=3, max_span=6, skip_p=0.5)
    batch, spans = task.sample_with_spans(64, torch.Generator().manual_seed(0))
    x = batch.tokens
    assert task.d_vocab == 17 and task.bos_token == 16 and (x[:, 0] == 16).all() and (x[:, 1:] < 16).all()
    assert task.model_overrides == {"d_vocab": 17, "n_ctx": 24}
    # targets are the next tokens, at every position but the last
    assert torch.equal(batch.targets[:, :-1], x[:, 1:]) and (batch.targets[:, -1] == IGNORE_INDEX).all()
    assert batch.answer_mask[:, :-1].all() and not batch.answer_mask[:, -1].any()
    for b, (s, c, L) in enumerate(spans.tolist()):
        assert 3 <= L <= 6 and 1 <= s and s + L <= c and c + L <= 24
        assert torch.equal(x[b, c:c + L], x[b, s:s + L])  # the copy repeats the source
        rows, cols = batch.answer_sources[b].nonzero(as_tuple=True)
        assert rows.tolist() == list(range(c, c + L - 1))  # repeat positions c..c+L-2
        assert cols.tolist() == [s + (i + 1 - c) for i in rows.tolist()]  # just after the earlier x_i
        assert all(x[b, j] == x[b, i + 1] for i, j in zip(rows.tolist(), cols.tolist()))
    # the skip-bigram rule: outside the spans, x_t == perm[x_{t-2}] about half the time
    hits = total = 0
    for b, (s, c, L) in enumerate(spans.tolist()):
        inside = set(range(s, s + L)) | set(range(c, c + L))
        for t in range(3, 24):
            if t not in inside and t - 2 not in inside:
                total += 1
                hits += int(x[b, t] == task.perm[x[b, t - 2]])
    assert 0.45 < hits / total < 0.6  # 0.5 + 0.5/16 expected


def test_repeats_bigram_copies():
    task = make_task("repeats", d_vocab=12, seq_len=24, min_span=2, max_span=4, copy_p=0.6)
    batch, spans = task.sample_with_spans(64, torch.Generator().manual_seed(3))
    x, src = batch.tokens, batch.answer_sources
    n_bigram = 0
    for b, (s, c, L) in enumerate(spans.tolist()):
        span_rows = set(range(c, c + L - 1))
        for i, j in zip(*[t.tolist() for t in src[b].nonzero(as_tuple=True)]):
            assert x[b, j] == x[b, i + 1]  # the source holds the answer
            if i not in span_rows:  # a bigram copy: x_i occurred at j-1, the latest earlier occurrence
                n_bigram += 1
                assert x[b, j - 1] == x[b, i] and 1 <= j - 1 < i
                assert not (x[b, j:i] == x[b, i]).any()
    assert n_bigram > 64 * 3  # about copy_p of the filler positions whose token occurred before
    assert (src.sum(-1) <= 1).all()
    rep = make_task("repeats", d_vocab=12, seq_len=24, min_span=2, max_span=4, copy_p=0.6, score="repeat")
    b2 = rep.sample(64, torch.Generator().manual_seed(3))
    assert torch.equal(b2.tokens, x) and torch.equal(b2.answer_mask, src.any(-1))


def test_repeats_score_repeat_and_no_bos_and_validation():
    task = make_task("repeats", d_vocab=10, seq_len=12, min_span=2, max_span=4, score="repeat", bos=False)
    batch, spans = task.sample_with_spans(32, torch.Generator().manual_seed(1))
    assert task.d_vocab == 10 and task.bos_token is None
    assert torch.equal(batch.answer_mask, batch.answer_sources.any(-1))
    assert (batch.tokens < 10).all() and (spans[:, 0] >= 0).all()
    same = make_task("repeats", d_vocab=10, seq_len=12, min_span=2, max_span=4, score="repeat", bos=False)
    assert same.sample(8, torch.Generator().manual_seed(5)).equal(task.sample(8, torch.Generator().manual_seed(5)))
    g = make_task("repeats", max_gap=0).sample_with_spans(16, torch.Generator().manual_seed(2))[1]
    assert torch.equal(g[:, 1], g[:, 0] + g[:, 2])  # max_gap=0: the copy follows the source directly
    for bad in ({"max_span": 40}, {"min_span": 5, "max_span": 4}, {"score": "some"}, {"skip_p": 2}, {"copy_p": -0.1},
                {"max_gap": -1}, {"nope": 1}):
        with pytest.raises(ValueError):
            make_task("repeats", **bad)


def test_run_on_a_small_local_run(tmp_path):
    from circuitfade.train.recipes import build_local_series
    from circuitfade.commands.screen import run

    torch.manual_seed(0)
    run_dir = build_local_series(tmp_path / "run", steps=40, n_checkpoints=3)
    tables = run(run_dir, tmp_path / "out", n=4, progress=False)
    assert list(tables["integrity"]["step"]) == [0, 10, 20, 40]  # 0 and geomspace(10, 40, 3)
    assert list(tables["integrity"]["status"]) == ["ok"] * 4
    screen = tables["screen"]
    assert sorted(screen["step"].unique()) == sorted(tables["integrity"]["step"])
    assert screen["task"].iloc[0] == "repeats" and screen["path"].iloc[0] == "unforced"
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "pr_lead_all.csv").is_file()
    assert set(tables) >= {"class_fractions", "emergence_shape", "zero_layers", "convergence_summary", "pr_lead"}


def test_local_run_config_checkpoints():
    from circuitfade.train.recipes import local_run_config, log_checkpoints
    from circuitfade.train.config import checkpoint_steps

    assert log_checkpoints(1000, 4) == (10, 46, 215, 1000)
    cfg = local_run_config(300)
    assert checkpoint_steps(cfg.train) == [0, 10, 14, 19, 25, 34, 47, 64, 87, 119, 162, 220, 300]
    mc = cfg.model_config()
    assert (mc.d_vocab, mc.n_ctx, mc.priors, mc.attn_only, mc.positional_embedding_type, mc.normalization_type) == \
        (65, 32, (), False, "standard", None)


# --------------------------------------------------------------------------------------
# the tutorial notebook
# --------------------------------------------------------------------------------------
NOTEBOOK = REPO / "tutorials" / "04_developmental_screens.ipynb"


def test_notebook_is_clean():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "torch.set_num_threads(1)" in code[0].source
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.slow
def test_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    # make the "python3" kernel run this interpreter (the venv with circuitfade installed)
    try:
        argv = KernelSpecManager().get_kernel_spec("python3").argv
        exe = sys.executable if argv[0] in {"python", "python3"} else shutil.which(argv[0]) or argv[0]
    except NoSuchKernel:
        exe = None
    if exe is None or Path(exe).resolve() != Path(sys.executable).resolve():
        spec = tmp_path / "jupyter" / "kernels" / "python3"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (circuitfade tests)", "language": "python"}))
        monkeypatch.setenv("JUPYTER_PATH", str(spec.parent.parent))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    mark = "NOTEBOOK-CHECK "
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json as _j, sys as _s\n"
        f"print({mark!r} + _j.dumps({{'python': _s.executable, "
        "'steps': sorted(int(s) for s in screen['step'].unique()), "
        "'classes': sorted(fractions['class'].unique()), 'n_figures': len(figs)}))"))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{out.get('ename')}: {out.get('evalue')}"
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    report = json.loads(next(l for l in text.splitlines() if l.startswith(mark))[len(mark):])
    assert Path(report["python"]).resolve() == Path(sys.executable).resolve()
    assert report["steps"][0] == 0 and len(report["steps"]) >= 8
    assert report["classes"] == ["bos", "induction", "previous_token"]
    assert report["n_figures"] >= 3


def test_committed_results_rebuild_byte_identical_from_their_tables(tmp_path):
    """results/development/results.md is generated: --tables-only on the committed CSVs writes it again, byte for byte."""
    import shutil

    from studies.development.study import main as study_main
    from circuitfade.commands.screen import TABLES

    committed = REPO / "results" / "development"
    for t in TABLES:
        shutil.copy(committed / f"{t}.csv", tmp_path / f"{t}.csv")
    assert study_main(["--tables-only", "--no-png", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    expected = (committed / "results.md").read_text()
    assert text.replace(f" --out {tmp_path}", "") == expected
    assert "| 633 | 4 | 4 | 3 |" in expected  # the class counts table, not only headings
    with pytest.raises(ValueError, match="exists; pass --force"):  # results.md exists: --force needed
        study_main(["--tables-only", "--no-png", "--out", str(tmp_path)])
    (tmp_path / "pr_lead.csv").unlink()
    with pytest.raises(FileNotFoundError, match="pr_lead.csv"):
        study_main(["--tables-only", "--force", "--no-png", "--out", str(tmp_path)])
