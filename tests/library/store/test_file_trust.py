"""Files that lie about themselves: a checkpoint's name, step, dtype and keys agree, or nothing is
analysed on it; no interval from one example or one resample; refusals name the file.

Each case plants a lie in a temporary copy of a finished tiny run (or in a folder of state
dicts) and checks that it is refused with a message naming the file, never analysed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from circuitfade.compat import make_config, plain_model

from circuitfade import stats
from circuitfade.analysis import head_diagnostics, successor_mass
from circuitfade.analysis.heads import NO_SOURCES_NOTE
from circuitfade.analysis.parts import pool_cells
from circuitfade.analysis.precursor import median_interval
from circuitfade.io import CheckpointError, load_tensors, read_json
from circuitfade.store import attach, check_series_weights, open_run, step_from_name, trace
from circuitfade.tasks import Batch, eval_set
from circuitfade.train import RunConfig, TrainConfig, train
from circuitfade.commands.analyze import analyze, analyze_main
from planted import CopyTask

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("runs") / "R"
    train(RunConfig(path="fade2+2->0", train=TrainConfig(steps=6, eval_every=2, checkpoint_every=2, eval_size=32,
                                                         batch_size=8)), d, progress=False)
    return d


@pytest.fixture()
def run(finished_run, tmp_path) -> Path:
    """A fresh copy of the finished run (steps 0, 2, 4, 6) to plant a lie in."""
    return Path(shutil.copytree(finished_run, tmp_path / "R"))


def ckpt(run: Path, step: int, state: bool = False) -> Path:
    return run / "checkpoints" / f"step_{step:06d}{'.state' if state else ''}.safetensors"


def one_line(capsys, *must) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for m in must:
        assert m in err, err
    return err


def plain_cfg(**kw):
    """A plain TransformerLens config of the installed line (3.9 or 4.x)."""
    base = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=32, attn_only=True, act_fn=None, seed=0)
    return make_config({**base, **kw})


def state_dict_folder(folder: Path, steps=(0, 1), **cfg) -> Path:
    folder.mkdir(parents=True)
    c = plain_cfg(**cfg)
    (folder / "config.json").write_text(json.dumps(c.to_dict(), default=str))
    for s in steps:
        torch.manual_seed(s)
        torch.save(plain_model(c).state_dict(), folder / f"step_{s}.pt")
    return folder


# --------------------------------------------------------------------------------------
# 2. two files for one step in a run folder; a checkpoint copied under another step's name
# --------------------------------------------------------------------------------------
def test_a_second_file_for_a_step_in_a_run_folder_is_refused(run, capsys):
    shutil.copy(ckpt(run, 6), run / "checkpoints" / "step_2.safetensors")  # step 2 again, with step-6 weights
    with pytest.raises(CheckpointError, match=r"two weight files for step 2: step_000002\.safetensors and "
                                              r"step_2\.safetensors"):
        open_run(run)
    assert analyze_main([str(run), "--quiet", "--n", "8", "--out", str(run.parent / "a.html")]) == 2
    one_line(capsys, "step_2.safetensors")


def test_weights_under_another_steps_name_are_refused(run):
    shutil.copy(ckpt(run, 0), ckpt(run, 4))  # step-0 weights (recorded step 0) as step 4
    with pytest.raises(CheckpointError, match=r"step_000004\.safetensors: the name says step 4 but the file records "
                                              r"step 0"):
        attach(run)


# --------------------------------------------------------------------------------------
# 3. dtype checked with names and shapes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_run_checkpoint_resaved_as_integers_is_refused(run, dtype):
    sd = load_tensors(ckpt(run, 4))
    save_file({k: v.to(dtype) for k, v in sd.items()}, str(ckpt(run, 4)), metadata={"step": "4"})
    with pytest.raises(CheckpointError, match=rf"step_000004\.safetensors: .*dtype mismatch .*file {dtype} vs "
                                              r"model torch\.float32"):
        open_run(run)


def test_an_int64_state_dict_in_a_folder_is_refused(tmp_path):
    folder = state_dict_folder(tmp_path / "c")
    sd = torch.load(folder / "step_1.pt", weights_only=True)
    torch.save({k: (v * 100).to(torch.int64) if v.is_floating_point() else v for k, v in sd.items()},
               folder / "step_1.pt")
    with pytest.raises(CheckpointError, match=r"step_1\.pt: weights do not fit the config: dtype mismatch"):
        attach(folder)
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, folder / "step_1.pt")
    with pytest.raises(CheckpointError, match=r"step_1\.pt: the weights are stored as float16 .* config's dtype is "
                                              r"float32; they are not converted"):
        attach(folder)  # another floating dtype is refused, not silently upcast


# --------------------------------------------------------------------------------------
# 3b. NaN or inf weights: refused when loaded, naming the file and the tensor
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, words", [(float("nan"), "1 NaN values"), (float("inf"), "1 inf values")])
def test_non_finite_weights_are_refused_at_load_naming_file_and_tensor(tmp_path, capsys, value, words):
    folder = state_dict_folder(tmp_path / "c")
    sd = torch.load(folder / "step_1.pt", weights_only=True)
    name = next(k for k in sd if k.endswith((".attn.W_Q", ".attn.q.weight")))
    sd[name].view(-1)[3] = value
    torch.save(sd, folder / "step_1.pt")
    series = attach(folder)
    assert series[0] is not None
    with pytest.raises(CheckpointError, match=rf"step_1\.pt: tensor {re.escape(name)} holds {words}"):
        series[1]
    capsys.readouterr()
    assert analyze_main([str(folder), "--task", "assoc", "--n", "8", "--quiet", "--out", str(tmp_path / "a.html")]) == 2
    one_line(capsys, "step_1.pt", name, words)


def test_a_model_with_nan_parameters_is_refused_whatever_its_source():
    model = plain_model(plain_cfg())
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"in-memory \w+ #0: tensor \S+ holds \d+ NaN values"):
        attach([model])[0]


# --------------------------------------------------------------------------------------
# 4. no interval from one example or one resample
# --------------------------------------------------------------------------------------
def test_analyze_refuses_one_example(run, capsys):
    with pytest.raises(ValueError, match="at least 2 evaluation examples"):
        analyze(run, n=1, progress=False)
    assert analyze_main([str(run), "--n", "1", "--quiet", "--out", str(run.parent / "a.html")]) == 2
    one_line(capsys, "at least 2 evaluation examples")


def test_head_diagnostics_refuse_one_resample_and_one_example():
    model = plain_model(plain_cfg(d_vocab=8, n_ctx=8))
    batch = eval_set(CopyTask(0), 16, seed=1)
    with pytest.raises(ValueError, match=r"resamples: expected 0 \(no intervals\) or an int >= 2, got 1"):
        head_diagnostics(model, batch, CopyTask(0), resamples=1)
    with pytest.raises(ValueError, match="at least 2 examples, got 1"):
        head_diagnostics(model, batch[:1], CopyTask(0))
    no_intervals = head_diagnostics(model, batch, CopyTask(0), resamples=0)
    assert "lo" not in no_intervals.columns and no_intervals["value"].notna().all()


def test_stats_refuse_intervals_from_one():
    for n, r in ((1, 10), (10, 1)):
        with pytest.raises(ValueError, match="expected an int >= 2"):
            stats.bootstrap_weights(n, r)
    with pytest.raises(ValueError, match="at least 2 resamples"):
        stats.percentile_interval(np.array([[0.3, 0.4]]))
    lo, hi = stats.percentile_interval(np.array([0.0, 1.0]), level=0.5)
    assert lo == 0.25 and hi == 0.75


def test_one_cell_or_one_value_gives_no_interval():
    m, lo, hi = median_interval([0.4])
    assert m == 0.4 and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError, match="n_boot must be an int >= 2"):
        median_interval([0.1, 0.2], n_boot=1)
    frame = pd.DataFrame({"cell": [0, 0], "kind": "part", "retained": [0.5, 0.7], "partial_credit": 0.5})
    pooled = pool_cells(frame, ["cell"])
    assert pooled["median"] == pytest.approx(0.6) and math.isnan(pooled["median_lo"]) and math.isnan(pooled["median_hi"])


# --------------------------------------------------------------------------------------
# 10. step names beyond int64
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["step_99999999999999999999999", "step_9223372036854775808"])
def test_steps_beyond_int64_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="beyond int64"):
        step_from_name(name)
    folder = state_dict_folder(tmp_path / "c", steps=(0,))
    os.rename(folder / "step_0.pt", folder / f"{name}.pt")
    with pytest.raises(CheckpointError, match=rf"{name}\.pt: .*beyond int64"):
        attach(folder)
    assert step_from_name("step_9223372036854775807") == 2**63 - 1


def test_a_run_file_beyond_int64_is_refused(run):
    shutil.copy(ckpt(run, 6), run / "checkpoints" / "step_9223372036854775808.safetensors")
    with pytest.raises(CheckpointError, match="beyond int64"):
        open_run(run)


# --------------------------------------------------------------------------------------
# 11. a vocabulary the model does not have
# --------------------------------------------------------------------------------------
def test_a_task_with_a_larger_vocabulary_is_refused_by_name(tmp_path, capsys):
    folder = state_dict_folder(tmp_path / "c", d_vocab=16)  # the assoc task's default vocabulary is 32
    with pytest.raises(ValueError, match=r"token ids up to \d+ but the model's vocabulary has d_vocab=16"):
        analyze(folder, task="assoc", n=8, progress=False)
    assert analyze_main([str(folder), "--task", "assoc", "--n", "8", "--quiet", "--out", str(tmp_path / "a.html")]) == 2
    one_line(capsys, "d_vocab=16")


# --------------------------------------------------------------------------------------
# 12. dangling symlinks, symlink loops and directories under a checkpoint's name
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dangling", "loop", "directory"])
def test_broken_checkpoint_entries_are_refused_not_dropped(tmp_path, kind):
    folder = state_dict_folder(tmp_path / "c", steps=(0, 1, 2))
    bad = folder / "step_3.pt"
    if kind == "dangling":
        bad.symlink_to(folder / "gone.pt")
    elif kind == "loop":
        bad.symlink_to(bad)
    else:
        bad.mkdir()
    why = {"dangling": "dangling symlink", "loop": "symlink loop", "directory": "is a directory"}[kind]
    with pytest.raises(CheckpointError, match=rf"step_3\.pt: {why}"):
        attach(folder)
    (folder / "good.pt").symlink_to(folder / "step_2.pt")  # a symlink to a real file is fine
    bad.unlink() if kind != "directory" else bad.rmdir()
    assert attach(folder, pattern="step_*.pt").steps == [0, 1, 2]


@pytest.mark.parametrize("kind", ["dangling", "directory"])
def test_broken_entries_in_a_run_folder_are_refused(run, kind):
    bad = ckpt(run, 8)
    bad.symlink_to(run / "gone") if kind == "dangling" else bad.mkdir()
    with pytest.raises(CheckpointError, match=r"step_000008\.safetensors: (dangling symlink|is a directory)"):
        open_run(run)


# --------------------------------------------------------------------------------------
# 13. a truncated model.safetensors in one revision of a Hugging Face folder
# --------------------------------------------------------------------------------------
def _neox_revisions(root: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    c = transformers.GPTNeoXConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                   vocab_size=32, max_position_embeddings=32)
    for step in (0, 1000, 2000):
        torch.manual_seed(step)
        transformers.GPTNeoXForCausalLM(c).save_pretrained(root / f"step{step}")
    return root


def test_a_truncated_revision_is_named_before_any_work(tmp_path, capsys):
    root = _neox_revisions(tmp_path / "pythia-tiny")
    weights = root / "step1000" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    series = attach(root)  # documented: revisions are read when loaded, so sound_revisions can skip broken ones
    assert series.steps == [0, 1000, 2000]
    with pytest.raises(CheckpointError, match=r"step1000/model\.safetensors: not a readable safetensors file"):
        check_series_weights(series)
    capsys.readouterr()
    assert analyze_main([str(root), "--task", "assoc", "--n", "8", "--quiet", "--out", str(tmp_path / "a.html")]) == 2
    one_line(capsys, "step1000/model.safetensors")


def test_a_hugging_face_config_that_does_not_fit_its_weights_says_which_tensors(tmp_path):
    root = _neox_revisions(tmp_path / "revs")
    cfg = root / "step0" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "intermediate_size": 64}))
    with pytest.raises(CheckpointError, match=r"step0: the weights do not fit its config\.json: 3 tensors do not fit "
                                              r"config\.json \(gpt_neox\.layers\.0\.mlp\.dense_.*weights \("):
        attach(root)[0]


# --------------------------------------------------------------------------------------
# 14. messages that name the file
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [("", "empty file"), ("{not json", "not valid JSON")])
def test_an_empty_or_garbled_config_json_is_named(tmp_path, text, words):
    folder = state_dict_folder(tmp_path / "c")
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=rf"c/config\.json: {words}"):
        attach(folder)
    with pytest.raises(CheckpointError, match=rf"config\.json: {words}"):
        read_json(folder / "config.json")


def test_a_garbled_revision_config_is_named_not_skipped(tmp_path):
    root = _neox_revisions(tmp_path / "revs")
    (root / "step2000" / "config.json").write_text("")
    with pytest.raises(CheckpointError, match=r"step2000/config\.json: empty file"):
        attach(root)


@pytest.mark.parametrize("text", ["", "garbage\x00\x01,,\n\"unclosed"])
def test_an_unreadable_metrics_csv_is_a_note_naming_it(run, text):
    (run / "metrics.csv").write_text(text)
    res = analyze(run, n=8, progress=False)
    assert any(str(run / "metrics.csv") in n and "no training curves" in n for n in res["notes"]), res["notes"]
    assert res["metrics"] is None and "training_curves" not in res["figures"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_a_permission_denied_checkpoint_says_so(tmp_path):
    folder = state_dict_folder(tmp_path / "c")
    (folder / "step_1.pt").chmod(0)
    try:
        with pytest.raises(CheckpointError, match=r"step_1\.pt: permission denied"):
            attach(folder)
    finally:
        (folder / "step_1.pt").chmod(0o644)


def test_ctrl_c_during_analyze_does_not_promise_a_resume(tmp_path, monkeypatch, capsys):
    import circuitfade.commands.analyze as report

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "analyze", interrupted)
    assert analyze_main([str(tmp_path), "--quiet", "--out", str(tmp_path / "a.html")]) == 130
    err = one_line(capsys, "interrupted", "does not resume")
    assert "to resume" not in err


# --------------------------------------------------------------------------------------
# 16. a batch with no answer sources: successor mass is undefined, not 0
# --------------------------------------------------------------------------------------
def test_no_answer_sources_give_nan_successor_mass_with_a_note():
    model = plain_model(plain_cfg(d_vocab=8, n_ctx=8))
    b = eval_set(CopyTask(0), 16, seed=1)
    blind = Batch(b.tokens, b.targets, b.answer_mask, torch.zeros_like(b.answer_sources))
    assert torch.isnan(successor_mass(model, blind)).all()
    assert torch.isfinite(successor_mass(model, b)).all()
    df = head_diagnostics(model, blind, CopyTask(0))
    mass = df[df["metric"] == "successor_mass"]
    assert mass[["value", "se", "lo", "hi"]].isna().all().all() and (mass["note"] == NO_SOURCES_NOTE).all()
    other = df[df["metric"] != "successor_mass"]
    assert other["value"].notna().all() and other["note"].isna().all()
    traced = trace(attach([model]), [head_diagnostics], batch=blind, progress=False)
    assert traced.loc[traced["metric"] == "successor_mass", "note"].eq(NO_SOURCES_NOTE).all()
