"""Training along gate and data-mix schedules, checkpoint series, and sweeps.

Layer 3: :mod:`circuitfade.train.loop` (configs, the loop, checkpoints, branches)
and :mod:`circuitfade.train.sweep` (many runs keyed by config hash); :mod:`circuitfade.train.langevin`
(Langevin noise on any optimizer, at a scheduled temperature); :mod:`circuitfade.train.surgery`
(re-initialising heads' weight slices).
"""

from circuitfade.train.langevin import LangevinNoise
from circuitfade.train.loop import (
    EVAL_SEED,
    Run,
    RunConfig,
    RunLocked,
    TrainConfig,
    TrainingDiverged,
    branch,
    branch_config,
    checkpoint_steps,
    clone_run,
    fit,
    load_checkpoint,
    read_metrics,
    train,
)
from circuitfade.train.surgery import reinit_slices, reset_slice_moments

__all__ = [
    "EVAL_SEED", "LangevinNoise", "Run", "RunConfig", "RunLocked", "TrainConfig", "TrainingDiverged", "branch", "branch_config",
    "checkpoint_steps", "clone_run", "fit",
    "load_checkpoint", "read_metrics", "reinit_slices", "reset_slice_moments", "train",
]
