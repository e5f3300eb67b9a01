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

import sys
import types

from circuitfade.compat import deprecated_names
from circuitfade.train.checkpoints import load_checkpoint, read_metrics, save_checkpoint
from circuitfade.train.config import RunConfig, TrainConfig, TrainingDiverged
from circuitfade.train.langevin import LangevinNoise
from circuitfade.train.lock import RunLocked
from circuitfade.train.loop import branch, fit, train
from circuitfade.train.state import Run, clone_run, new_run
from circuitfade.train.surgery import reinit_slices, reset_slice_moments

__all__ = [
    "LangevinNoise", "Run", "RunConfig", "RunLocked", "TrainConfig", "TrainingDiverged", "branch", "clone_run",
    "fit", "load_checkpoint", "new_run", "read_metrics", "reinit_slices", "reset_slice_moments", "save_checkpoint",
    "train",
]

__getattr__ = deprecated_names(__name__, {
    "EVAL_SEED": ("circuitfade.tasks", "EVAL_SEED"),
    "complete_checkpoints": ("circuitfade.train.checkpoints", "complete_checkpoints"),
    "write_metrics": ("circuitfade.train.checkpoints", "write_metrics"),
})
"""Names of the previous release (a ``DeprecationWarning`` names the replacement). The other
checkpoint and schedule helpers (``circuitfade.train.checkpoints``, ``circuitfade.train.config``)
are importable from their modules."""


class _TrainPackage(types.ModuleType):
    """This package, callable as its :func:`train`: importing ``circuitfade.train`` makes it the
    attribute ``circuitfade.train`` (Python sets a subpackage on its parent), so the front door's
    ``cf.train(cfg, run_dir)`` trains whichever of the two ``cf.train`` is."""

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
