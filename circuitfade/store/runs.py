"""circuitfade run directories as checkpoint series: :func:`open_run`, :func:`is_run_dir`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from circuitfade.io import CheckpointError, check_header
from circuitfade.model import SoftPriorTransformer
from circuitfade.train import RunConfig
from circuitfade.train.rundir import CKPT_DIR, RunDir

from .series import CheckpointSeries, Snapshot

RUN_KEYS = frozenset({"path", "task", "model", "train", "seed"})


# --------------------------------------------------------------------------------------
# circuitfade runs
# --------------------------------------------------------------------------------------
def read_config_json(folder: Path):
    """The parsed ``folder/config.json``, or ``None`` if it is missing or unreadable."""
    return RunDir(folder).read_config_dict()


def _read_run_config(run_dir: Path) -> RunConfig | None:
    rd = RunDir(run_dir)
    d = rd.read_config_dict()
    if not isinstance(d, dict) or not RUN_KEYS <= set(d):
        return None
    try:
        return RunConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{rd.config_file}: looks like a circuitfade run config but is invalid: {e}") from None


def is_run_dir(path: str | Path) -> bool:
    """True if ``path`` is a directory with a circuitfade run ``config.json``."""
    path = Path(path)
    return path.is_dir() and _read_run_config(path) is not None


def open_run(run_dir: str | Path, *, device: str | None = None) -> CheckpointSeries:
    """The checkpoints of a circuitfade run directory as a :class:`CheckpointSeries`.

    The snapshots are the weight files ``checkpoints/step_XXXXXX.safetensors`` (the
    ``.state.safetensors`` optimizer/RNG files beside them are not needed, so a
    weights-only copy of a run - such as the shipped example series - opens too;
    training writes the state file first, so every weight file of a run in progress
    is a finished checkpoint). Resuming training still needs both files
    (:func:`circuitfade.train.checkpoints.complete_checkpoints`).

    Each model is rebuilt from ``config.json`` (``RunConfig.model_config()``) and its
    weights loaded with ``SoftPriorTransformer.load_weights`` (checked keys/shapes/dtypes).
    Every weight file's header (tensor names, shapes and dtypes, and the step the trainer
    records in it) is checked when the run is opened, so a truncated, foreign, re-typed
    (``int64``/``bool``) or renamed checkpoint fails here, naming the file; so do two files
    for one step and weight-file names that are not readable files.
    Metadata: ``run`` (directory name), ``run_dir`` (absolute path), ``path`` (gate
    path name), ``seed``, ``task`` (task name); ``series.task`` is the run's task and
    ``series.gate_path`` its gate path. Raises :class:`CheckpointError` if
    ``run_dir`` is not a run or holds no complete checkpoint.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a directory; expected a circuitfade run directory")
    cfg = _read_run_config(run_dir)
    if cfg is None:
        raise CheckpointError(
            f"{run_dir}: not a circuitfade run directory (expected config.json with keys {sorted(RUN_KEYS)} "
            f"and a {CKPT_DIR}/ folder)"
        )
    files = RunDir(run_dir).weight_files()
    if not files:
        raise CheckpointError(
            f"{run_dir}: circuitfade run without complete checkpoints (no step_XXXXXX.safetensors weight files "
            f"in {CKPT_DIR}/)"
        )
    model_cfg = dataclasses.replace(cfg.model_config(), device=device or "cpu")
    with torch.device("meta"):  # shapes only, no memory
        expected = SoftPriorTransformer(dataclasses.replace(model_cfg, device="meta")).state_dict()
    for step, f in files.items():  # every header now, so a truncated file fails here and not mid-trace
        header = check_header(f, expected)  # names, shapes and dtypes
        if header.step is not None and header.step != step:
            raise CheckpointError(f"{f}: the name says step {step} but the file records step {header.step} "
                                  "(a checkpoint copied under another step's name?)")

    def loader(file: Path) -> Callable[[], nn.Module]:
        def load() -> nn.Module:
            model = SoftPriorTransformer(model_cfg)
            model.load_weights(file)
            return model.to(device or "cpu", print_details=False)
        return load

    snaps = [Snapshot(s, loader(f), str(f)) for s, f in files.items()]
    path = cfg.gate_path()
    start = int((cfg.parent or {}).get("step", 0))
    meta = {
        "run": run_dir.resolve().name,
        "run_dir": str(run_dir.resolve()),
        "path": path.name,
        "seed": cfg.seed,
        "task": cfg.task["name"],
    }
    return CheckpointSeries(snaps, meta, task=cfg.make_task(), gate_path=path,
                            gate_span=(start, cfg.train.steps), source=str(run_dir))
