"""Weights-only run directories open for analysis; the shipped example series is what it says.

The shipped series (``circuitfade/data/series/``, made by ``assets/make_assets.py``) are copies of
two full training runs without their optimizer-state files. The checks: they open with
``attach``, hold a checkpoint every 300 steps from 0 to 3,600, and their final
checkpoints reproduce the accuracies the trainer logged in ``metrics.csv`` at step
3,600 (same evaluation set), so the copied weights are the trained ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuitfade.analysis import evaluate
from circuitfade.io import CheckpointError, save_tensors
from circuitfade.model import SoftPriorTransformer
from circuitfade.store import attach, open_run
from circuitfade.tasks import eval_set
from circuitfade.train import RunConfig, TrainConfig, read_metrics
from circuitfade.train.rundir import CKPT_DIR
from circuitfade.train.checkpoints import complete_checkpoints
from circuitfade.tasks import EVAL_SEED
from repo_root import REPO

torch.set_num_threads(1)

SERIES = REPO / "circuitfade" / "data" / "series"
SHIPPED = {"unforced": "unforced", "fade600to0": "fade600->0"}
MAX_ASSET_BYTES = 8 * 2**20


# --------------------------------------------------------------------------------------
# open_run on weights-only runs (hand-made directories, no training)
# --------------------------------------------------------------------------------------
def _weights_only_run(root: Path, steps: list[int], *, with_state: tuple[int, ...] = ()) -> dict[int, dict]:
    """A run directory whose checkpoint at step s is a model with every parameter = s / 1000."""
    cfg = RunConfig(path="fade5+5->0", train=TrainConfig(steps=20, checkpoint_every=10), seed=3)
    (root / "config.json").write_text(json.dumps(cfg.to_dict()))
    model = SoftPriorTransformer(cfg.model_config())
    written = {}
    for s in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(s / 1000)
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        save_tensors(root / CKPT_DIR / f"step_{s:06d}.safetensors", sd)
        if s in with_state:
            save_tensors(root / CKPT_DIR / f"step_{s:06d}.state.safetensors", {"x": torch.zeros(1)})
        written[s] = sd
    return written


def test_open_run_reads_weights_only_checkpoints(tmp_path):
    written = _weights_only_run(tmp_path, [0, 10, 20])
    series = open_run(tmp_path)
    assert series.steps == [0, 10, 20]
    assert complete_checkpoints(tmp_path) == []  # training's resume logic still needs state files
    for step, model in series:
        assert isinstance(model, SoftPriorTransformer) and not model.training
        sd = model.state_dict()
        assert sd.keys() == written[step].keys()
        for k, v in written[step].items():
            assert torch.equal(sd[k], v), (step, k)
    assert series.metadata["path"] == "fade5+5->0" and series.metadata["seed"] == 3
    assert series.gate_zero_step() == 10
    assert attach(tmp_path).steps == [0, 10, 20]  # attach dispatches to open_run


def test_open_run_mixes_complete_and_weights_only_and_ignores_lone_state_files(tmp_path):
    _weights_only_run(tmp_path, [0, 10, 20], with_state=(0, 10))
    save_tensors(tmp_path / CKPT_DIR / "step_000030.state.safetensors", {"x": torch.zeros(1)})  # no weights
    (tmp_path / CKPT_DIR / "notes.safetensors.tmp").write_text("partial write")
    assert open_run(tmp_path).steps == [0, 10, 20]
    assert complete_checkpoints(tmp_path) == [0, 10]


def test_open_run_without_weight_files_names_the_folder(tmp_path):
    _weights_only_run(tmp_path, [0])
    (tmp_path / CKPT_DIR / "step_000000.safetensors").unlink()
    save_tensors(tmp_path / CKPT_DIR / "step_000000.state.safetensors", {"x": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=r"without complete checkpoints.*step_XXXXXX\.safetensors"):
        open_run(tmp_path)


# --------------------------------------------------------------------------------------
# the shipped series
# --------------------------------------------------------------------------------------
def test_shipped_series_layout_and_size():
    total = sum(f.stat().st_size for f in (REPO / "assets").rglob("*") if f.is_file())
    assert total < MAX_ASSET_BYTES, f"assets/ is {total / 2**20:.1f} MB"
    for name, path in SHIPPED.items():
        d = SERIES / name
        assert sorted(p.name for p in d.iterdir()) == [CKPT_DIR, "config.json", "done.json", "metrics.csv"]
        files = sorted(p.name for p in (d / CKPT_DIR).iterdir())
        assert files == [f"step_{s:06d}.safetensors" for s in range(0, 3601, 300)], name
        cfg = RunConfig.from_dict(json.loads((d / "config.json").read_text()))
        assert (cfg.path, cfg.seed, cfg.task["name"], cfg.train.steps, cfg.train.checkpoint_every) == (
            path, 0, "assoc", 3600, 300)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_series_final_checkpoint_matches_logged_metrics(name):
    series = attach(SERIES / name)
    assert series.steps == list(range(0, 3601, 300))
    assert series.metadata["path"] == SHIPPED[name]
    metrics = read_metrics(SERIES / name)
    last = metrics[metrics["step"] == 3600].iloc[0]
    cfg = RunConfig.from_dict(json.loads((SERIES / name / "config.json").read_text()))
    batch = eval_set(series.task, n=cfg.train.eval_size, seed=EVAL_SEED)  # the trainer's eval set
    model = series[3600]
    for cond in ("normal", "zero"):
        r = evaluate(model, batch, series.task, gates=cond)
        # same weights, same batch: equal up to float noise (at most one example of 512 flips)
        assert abs(r["accuracy"] - last[f"acc_{cond}"]) <= 1 / cfg.train.eval_size + 1e-9, (name, cond)
        assert r["loss"] == pytest.approx(last[f"loss_{cond}"], abs=1e-4), (name, cond)
    gates = model.gate_values("effective")["pos"]
    assert float(gates.mean()) == pytest.approx(last["gate_pos"], abs=1e-5)
    if name == "fade600to0":
        assert torch.count_nonzero(gates) == 0 and series.gate_zero_step() == 1050
