"""The run directory on disk: checkpoints (weights + optimizer/RNG state), ``metrics.csv``,
``done.json`` / ``failed.json``, and the rules for what a directory may hold.

::

    RUN/
      config.json                        everything needed to rebuild the run
      metrics.csv                        step, gates, train loss, eval under each gate condition
      checkpoints/step_000300.safetensors            model weights
      checkpoints/step_000300.state.safetensors      optimizer + RNG state (to resume)
      done.json                          written last, when the run has finished

Every file is written atomically (:mod:`circuitfade.io`).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from safetensors import safe_open

from circuitfade.io import CheckpointError, atomic_write, read_json, save_tensors, write_json
from circuitfade.train.config import RunConfig, TrainingDiverged
from circuitfade.train.lock import pid_alive
from circuitfade.train.state import Run, apply_hparams, optimizer_from_tensors, optimizer_to_tensors

__all__ = ["CKPT_DIR", "save_checkpoint", "complete_checkpoints", "load_checkpoint", "write_metrics",
           "read_metrics", "run_steps", "dir_state", "clean_scratch", "raise_recorded_failure", "finish_run"]

CKPT_DIR = "checkpoints"


def save_checkpoint(run: Run, run_dir: Path) -> Path:
    """Write ``step_XXXXXX.state.safetensors`` then ``step_XXXXXX.safetensors`` (each atomic)."""
    ck = Path(run_dir) / CKPT_DIR
    stem = f"step_{run.step:06d}"
    tensors, meta = optimizer_to_tensors(run.optimizer)
    tensors["rng.data"] = run.data_gen.get_state()
    tensors["rng.dropout"] = run.dropout_gen.get_state()
    meta.update(step=str(run.step), metrics=json.dumps(run.metrics), format="circuitfade-state")
    save_tensors(ck / f"{stem}.state.safetensors", tensors, metadata=meta)
    save_tensors(ck / f"{stem}.safetensors", run.model.state_dict(), metadata={"step": str(run.step)})
    return ck / f"{stem}.safetensors"


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps whose weights and state files both exist."""
    ck = Path(run_dir) / CKPT_DIR
    if not ck.is_dir():
        return []
    steps = []
    for f in ck.glob("step_*.safetensors"):
        if f.name.endswith(".state.safetensors"):
            continue
        stem = f.name[: -len(".safetensors")]
        try:
            s = int(stem.split("_", 1)[1])
        except ValueError:
            continue
        if (ck / f"{stem}.state.safetensors").is_file():
            steps.append(s)
    return sorted(steps)


def load_checkpoint(run: Run, run_dir: Path, step: int) -> Run:
    """Restore model, optimizer, generators and metrics of ``run`` from ``step``."""
    ck = Path(run_dir) / CKPT_DIR
    run.model.load_weights(ck / f"step_{step:06d}.safetensors")
    state_file = ck / f"step_{step:06d}.state.safetensors"
    if not state_file.is_file():
        raise CheckpointError(f"{state_file}: missing optimizer/RNG state")
    try:
        with safe_open(str(state_file), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise CheckpointError(f"{state_file}: unreadable state file: {e}") from None
    if meta.get("format") != "circuitfade-state":
        raise CheckpointError(f"{state_file}: not a circuitfade state file")
    optimizer_from_tensors(run.optimizer, tensors, meta)
    apply_hparams(run.optimizer, run.config.train)
    run.data_gen.set_state(tensors["rng.data"])
    run.dropout_gen.set_state(tensors["rng.dropout"])
    run.step = int(meta["step"])
    run.metrics = json.loads(meta["metrics"])
    return run


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(Path(run_dir) / "metrics.csv", buf.getvalue().encode())


_TMP_SUFFIX = ".tmp"


def _is_scratch(name: str) -> bool:
    """Files that do not make a directory "not empty": the lock and atomic_write's temp files."""
    return name == ".lock" or name.startswith(".lock.") or (name.startswith(".") and name.endswith(_TMP_SUFFIX))


def clean_scratch(run_dir: Path) -> None:
    """Remove temp files left by a killed writer (call with the run lock held)."""
    for folder in (run_dir, run_dir / CKPT_DIR):
        if folder.is_dir():
            for f in folder.iterdir():
                if f.is_file() and f.name.startswith(".") and f.name.endswith(_TMP_SUFFIX) \
                        and not f.name.startswith(".lock."):
                    f.unlink(missing_ok=True)
    for f in run_dir.glob(".lock.*.pid"):  # a pid file of a process that died while locking
        pid = f.name.split(".")[2]
        if not (pid.isdigit() and pid_alive(int(pid))):
            f.unlink(missing_ok=True)


def dir_state(cfg: RunConfig, run_dir: Path) -> str:
    """'new', 'resume', 'done' or 'failed', reading only; refuses a directory holding something else."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir}: exists and is not a directory (a run directory is a folder)")
    cfg_file = run_dir / "config.json"
    if cfg_file.is_file():
        try:
            existing = RunConfig.from_dict(read_json(cfg_file))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{cfg_file}: not a circuitfade run config ({e})") from None
        if not existing.same_run(cfg):
            raise ValueError(f"{run_dir} already holds a different run; choose another --out or delete it")
        if (run_dir / "done.json").is_file():
            return "done"
        return "failed" if (run_dir / "failed.json").is_file() else "resume"
    if run_dir.is_dir() and any(not _is_scratch(f.name) for f in run_dir.iterdir()):
        raise ValueError(f"{run_dir} exists, is not empty and has no config.json; refusing to write into it")
    return "new"


def raise_recorded_failure(run_dir: Path) -> None:
    rec = read_json(run_dir / "failed.json")
    err = TrainingDiverged(int(rec.get("step", -1)), str(rec.get("error", "?")))
    err.args = (f"{err} (recorded in {run_dir / 'failed.json'}; delete that file to try again)",)
    raise err


def finish_run(run: Run, run_dir: Path) -> None:
    final = run.metrics[-1] if run.metrics else {}
    write_json(Path(run_dir) / "done.json", {"step": run.step, "final": final})


def read_metrics(run_dir: str | Path):
    """``metrics.csv`` as a pandas DataFrame."""
    import pandas as pd

    return pd.read_csv(Path(run_dir) / "metrics.csv")


def run_steps(run_dir: str | Path) -> list[int]:
    """Checkpoint steps present (complete) in a run directory."""
    return complete_checkpoints(Path(run_dir))

