"""Training along gate and data-mix schedules, checkpoint series, and sweeps.

Layer 3: :mod:`circuitfade.train.loop` (configs, the loop, checkpoints, branches)
and :mod:`circuitfade.train.sweep` (many runs keyed by config hash).
"""

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

__all__ = [
    "EVAL_SEED", "Run", "RunConfig", "RunLocked", "TrainConfig", "TrainingDiverged", "branch", "branch_config",
    "checkpoint_steps", "clone_run", "fit",
    "load_checkpoint", "read_metrics", "train",
]
