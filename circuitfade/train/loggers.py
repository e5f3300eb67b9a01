"""Optional metric loggers for training: ``train(cfg, out, logger=...)``.

A logger is any callable ``logger(step, metrics)``; the trainer calls it with each
evaluation row (the same dict that becomes a ``metrics.csv`` row: ``step``, gates,
``train_loss``, ``acc_<condition>`` / ``loss_<condition>`` / ``mse_<condition>``).
Nothing here is required: the classes import their backend only when constructed and
raise ``ImportError`` naming the package to install.

* :class:`TensorBoardLogger` - ``torch.utils.tensorboard`` (``pip install tensorboard``);
* :class:`WandbLogger` - Weights & Biases, offline by default (``pip install wandb``;
  ``wandb sync`` uploads later);
* :class:`JSONLinesLogger` - one JSON object per line, no dependency.

Each has ``close()`` and works as a context manager::

    with TensorBoardLogger("runs/tb/fade0") as log:
        train(cfg, "runs/fade0", logger=log)
"""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path

__all__ = ["scalars", "JSONLinesLogger", "TensorBoardLogger", "WandbLogger"]


def scalars(metrics: dict) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` (``step`` left out), as floats."""
    out = {}
    for k, v in metrics.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, numbers.Real):
            continue
        v = float(v)
        if math.isfinite(v):
            out[str(k)] = v
    return out


class _Base:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        pass


class JSONLinesLogger(_Base):
    """Append ``{"step": s, **scalars}`` per evaluation to ``path`` (one JSON object a line)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def __call__(self, step: int, metrics: dict) -> None:
        self._f.write(json.dumps({"step": int(step), **scalars(metrics)}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardLogger(_Base):
    """Scalars to TensorBoard event files in ``log_dir`` (``tensorboard --logdir`` to view)."""

    def __init__(self, log_dir: str | os.PathLike, **kwargs):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"TensorBoardLogger needs tensorboard: pip install tensorboard ({e})") from None
        self.writer = SummaryWriter(log_dir=str(log_dir), **kwargs)

    def __call__(self, step: int, metrics: dict) -> None:
        for k, v in scalars(metrics).items():
            self.writer.add_scalar(k, v, global_step=int(step))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger(_Base):
    """Scalars to Weights & Biases; ``mode="offline"`` by default (nothing leaves the machine
    until ``wandb sync``). Other keyword arguments go to ``wandb.init`` (``project``, ``name``,
    ``config``, ``dir``...)."""

    def __init__(self, *, mode: str = "offline", **init_kwargs):
        try:
            import wandb
        except ImportError as e:
            raise ImportError(f"WandbLogger needs wandb: pip install wandb ({e})") from None
        self.run = wandb.init(mode=mode, **init_kwargs)

    def __call__(self, step: int, metrics: dict) -> None:
        self.run.log(scalars(metrics), step=int(step))

    def close(self) -> None:
        self.run.finish()
