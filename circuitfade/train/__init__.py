"""Training along gate and data-mix schedules, checkpoint series, and sweeps.

Layer 3, one module per job:

* :mod:`~circuitfade.train.config` - :class:`TrainConfig`, :class:`RunConfig` (validated at construction)
* :mod:`~circuitfade.train.state` - :class:`Run` (live model/optimizer/generators), :func:`new_run`, :func:`clone_run`
* :mod:`~circuitfade.train.rundir` - :class:`RunDir`, the run directory: file names, config, metrics, checkpoints,
  optimizer state, done/failed records
* :mod:`~circuitfade.train.checkpoints` - the same as functions (:func:`save_checkpoint`, :func:`load_checkpoint`, ...)
* :mod:`~circuitfade.train.lock` - one trainer per run directory
* :mod:`~circuitfade.train.loop` - :func:`fit` (the loop), :func:`train`, :func:`branch`
* :mod:`~circuitfade.train.jobs` - :func:`run_jobs`, the one process pool (sweeps, the demo, the studies)
* :mod:`~circuitfade.train.sweep` - many runs keyed by config hash
* :mod:`~circuitfade.train.langevin` (Langevin noise on any optimizer), :mod:`~circuitfade.train.surgery`
  (re-initialising heads' weight slices)
"""

from circuitfade.tasks import EVAL_SEED
import sys
import types

from circuitfade.train.checkpoints import (
                                           CKPT_DIR,
                                           complete_checkpoints,
                                           load_checkpoint,
                                           read_metrics,
                                           run_steps,
                                           save_checkpoint,
                                           write_metrics,
)
from circuitfade.train.config import RunConfig, TrainConfig, TrainingDiverged, checkpoint_steps, is_checkpoint_step
from circuitfade.train.langevin import LangevinNoise
from circuitfade.train.lock import RunLocked
from circuitfade.train.loop import branch, branch_config, fit, train
from circuitfade.train.state import Run, clone_run, new_run
from circuitfade.train.surgery import reinit_slices, reset_slice_moments

__all__ = [
    "CKPT_DIR", "EVAL_SEED", "LangevinNoise", "Run", "RunConfig", "RunLocked", "TrainConfig", "TrainingDiverged",
    "branch", "branch_config", "checkpoint_steps", "clone_run", "complete_checkpoints", "fit", "is_checkpoint_step",
    "load_checkpoint", "new_run", "read_metrics", "reinit_slices", "reset_slice_moments", "run_steps",
    "save_checkpoint", "train", "write_metrics",
]


class _TrainPackage(types.ModuleType):
    """This package, callable as its :func:`train`: importing ``circuitfade.train`` makes it the
    attribute ``circuitfade.train`` (Python sets a subpackage on its parent), so the front door's
    ``cf.train(cfg, run_dir)`` trains whichever of the two ``cf.train`` is."""

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
