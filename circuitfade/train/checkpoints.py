"""The run directory as functions: each is a thin call of :class:`~circuitfade.train.rundir.RunDir`
(which owns the folder's file names, the checkpoint-name pattern and every file's reading and
writing); kept so code written against them keeps working.

::

    RUN/
      config.json                        everything needed to rebuild the run
      metrics.csv                        step, gates, train loss, eval under each gate condition
      checkpoints/step_000300.safetensors            model weights
      checkpoints/step_000300.state.safetensors      optimizer + RNG state (to resume)
      done.json                          written last, when the run has finished
"""

from __future__ import annotations

from pathlib import Path

from circuitfade.train.config import RunConfig
from circuitfade.train.rundir import CKPT_DIR, STATE_FORMAT, RunDir, checkpoint_name, parse_checkpoint_name
from circuitfade.train.state import Run

__all__ = ["CKPT_DIR", "STATE_FORMAT", "checkpoint_name", "parse_checkpoint_name", "save_checkpoint",
           "complete_checkpoints", "load_checkpoint", "resume_steps", "write_metrics", "read_metrics", "run_steps", "dir_state", "clean_scratch",
           "raise_recorded_failure", "finish_run"]


def save_checkpoint(run: Run, run_dir: Path) -> Path:
    """:meth:`RunDir.save_checkpoint`: write step ``run.step``'s state then weights file; returns the weights file."""
    return RunDir(run_dir).save_checkpoint(run)


def complete_checkpoints(run_dir: Path) -> list[int]:
    """:meth:`RunDir.complete_checkpoints`: steps whose weights and state files both exist."""
    return RunDir(run_dir).complete_checkpoints()


def resume_steps(cfg: RunConfig, run_dir: Path) -> list[int]:
    """:meth:`RunDir.resume_steps`: complete checkpoints of a run about to be resumed under ``cfg``."""
    return RunDir(run_dir).resume_steps(cfg)


def load_checkpoint(run: Run, run_dir: Path, step: int) -> Run:
    """:meth:`RunDir.load_checkpoint`: restore ``run`` from ``step``'s checkpoint, checked."""
    return RunDir(run_dir).load_checkpoint(run, step)


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    """:meth:`RunDir.write_metrics`: (re)write ``metrics.csv``."""
    RunDir(run_dir).write_metrics(rows)


def clean_scratch(run_dir: Path) -> None:
    """:meth:`RunDir.clean_scratch`: remove temp files left by a killed writer."""
    RunDir(run_dir).clean_scratch()


def dir_state(cfg: RunConfig, run_dir: Path) -> str:
    """:meth:`RunDir.state`: 'new', 'resume', 'done' or 'failed'."""
    return RunDir(run_dir).state(cfg)


def raise_recorded_failure(run_dir: Path) -> None:
    """:meth:`RunDir.raise_recorded_failure`: raise the divergence recorded in ``failed.json``."""
    RunDir(run_dir).raise_recorded_failure()


def finish_run(run: Run, run_dir: Path) -> None:
    """:meth:`RunDir.finish`: write ``done.json``."""
    RunDir(run_dir).finish(run)


def read_metrics(run_dir: str | Path):
    """``metrics.csv`` as a pandas DataFrame (:meth:`RunDir.read_metrics`)."""
    return RunDir(run_dir).read_metrics()


def run_steps(run_dir: str | Path) -> list[int]:
    """Checkpoint steps present (complete) in a run directory."""
    return RunDir(run_dir).complete_checkpoints()
