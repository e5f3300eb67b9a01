"""Linear-regression in-context learning (Garg et al. 2022), the main paper's boundary case.

Format (``n_points`` = k, ``d_x`` = d; inputs live in ``R^(d+1)``)::

    position:  0     1     2     3    ...  2k-2   2k-1   2k
    input:    [x1,0] [0,y1] [x2,0] [0,y2] ... [xk,0] [0,yk] [xq,0]

with ``w ~ N(0, I_d)`` drawn per sequence, ``x ~ N(0, I_d)`` and
``y = w·x / √d + noise·ε`` (so ``Var y = 1 + noise²``). The model (``input_mode="real"``,
``d_vocab = d + 1``, ``d_vocab_out = 1``) predicts, at every x position ``2i``,
the y that follows; all k+1 x positions are scored (the first has no context,
so its best prediction is 0 with MSE 1). Chance level: MSE 1 (predict 0).
Least squares on the context reaches MSE → 0 once k ≥ d (noise-free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from .base import PrimaryMetric, Task, check_sample_args


@dataclass(frozen=True, eq=False)
class RegressionBatch:
    """Real-valued inputs ``[batch, pos, d_in]``, float targets (NaN off the mask), answer mask."""

    inputs: Float[Tensor, "batch pos d_in"]
    targets: Float[Tensor, "batch pos"]
    answer_mask: Bool[Tensor, "batch pos"]

    def __post_init__(self):
        b, p = self.inputs.shape[:2]
        if self.inputs.dim() != 3 or tuple(self.targets.shape) != (b, p) or tuple(self.answer_mask.shape) != (b, p):
            raise ValueError(
                f"RegressionBatch: expected inputs [B,P,d], targets [B,P], answer_mask [B,P]; got "
                f"{tuple(self.inputs.shape)}, {tuple(self.targets.shape)}, {tuple(self.answer_mask.shape)}"
            )

    @property
    def model_input(self) -> Tensor:
        return self.inputs

    @property
    def answer_sources(self) -> Tensor:
        b, p = self.targets.shape
        return torch.zeros(b, p, p, dtype=torch.bool)

    @property
    def n_answers(self) -> int:
        return int(self.answer_mask.sum())

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def device(self) -> torch.device:
        return self.inputs.device

    def to(self, device) -> "RegressionBatch":
        """A copy with every tensor on ``device``."""
        return RegressionBatch(self.inputs.to(device), self.targets.to(device), self.answer_mask.to(device))

    def __getitem__(self, index) -> "RegressionBatch":
        if isinstance(index, int):
            index = slice(index, index + 1)
        return RegressionBatch(self.inputs[index], self.targets[index], self.answer_mask[index])


@dataclass(frozen=True)
class LinRegConfig:
    n_points: int = 15
    d_x: int = 4
    noise: float = 0.0

    def __post_init__(self):
        if not isinstance(self.n_points, int) or self.n_points < 1:
            raise ValueError(f"n_points must be a positive int, got {self.n_points!r}")
        if not isinstance(self.d_x, int) or self.d_x < 1:
            raise ValueError(f"d_x must be a positive int, got {self.d_x!r}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")


class LinearRegressionICL(Task):
    """See the module docstring for the exact format. ``d_vocab`` is the input width ``d_x + 1``."""

    name = "linreg"

    def __init__(self, config: LinRegConfig | None = None):
        self.config = config or LinRegConfig()
        self.d_vocab = self.config.d_x + 1
        self.n_ctx = 2 * self.config.n_points + 1
        self.chance = float("nan")  # regression: chance is MSE 1, not an accuracy
        self.model_overrides = {"input_mode": "real", "d_vocab": self.d_vocab, "d_vocab_out": 1}

    @property
    def primary_metric(self) -> PrimaryMetric:
        """Mean squared error, lower is better; chance = predicting 0, MSE ``1 + noise²``
        (the targets have unit variance by construction)."""
        return PrimaryMetric("mse", "mse", "lower", 1.0 + float(self.config.noise) ** 2)

    def sample(self, n: int, generator: torch.Generator) -> RegressionBatch:
        check_sample_args(n, generator)
        k, d = self.config.n_points, self.config.d_x
        w = torch.randn(n, d, generator=generator)
        xs = torch.randn(n, k + 1, d, generator=generator)  # k context points + the query
        ys = (xs @ w.unsqueeze(-1)).squeeze(-1) / math.sqrt(d)
        if self.config.noise:
            ys = ys + self.config.noise * torch.randn(n, k + 1, generator=generator)
        P = 2 * k + 1
        inputs = torch.zeros(n, P, d + 1)
        inputs[:, 0::2, :d] = xs  # x positions 0, 2, ..., 2k
        inputs[:, 1::2, d] = ys[:, :k]  # y positions 1, 3, ..., 2k-1
        targets = torch.full((n, P), float("nan"))
        targets[:, 0::2] = ys
        mask = torch.zeros(n, P, dtype=torch.bool)
        mask[:, 0::2] = True
        return RegressionBatch(inputs, targets, mask)

    def _pred(self, logits: Tensor, batch: RegressionBatch) -> Tensor:
        if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(batch.targets.shape):
            raise ValueError(f"logits: expected [batch, pos, 1] matching {tuple(batch.targets.shape)}, got {tuple(logits.shape)}")
        return logits[..., 0]

    def loss(self, logits, batch: RegressionBatch) -> Tensor:
        """Mean squared error over answer (x) positions."""
        m = batch.answer_mask
        return ((self._pred(logits, batch)[m].float() - batch.targets[m]) ** 2).mean()

    def accuracy(self, logits, batch):  # pragma: no cover - regression has no accuracy
        raise ValueError("linreg is a regression task: use loss()/metrics() (MSE), not accuracy")

    def per_example_accuracy(self, logits, batch):  # pragma: no cover
        raise ValueError("linreg is a regression task: use loss()/metrics() (MSE), not accuracy")

    def query_mse(self, logits, batch: RegressionBatch) -> Tensor:
        """MSE at the final query position only (k in-context examples)."""
        return ((self._pred(logits, batch)[:, -1].float() - batch.targets[:, -1]) ** 2).mean()

    def metrics(self, logits, batch) -> dict[str, float]:
        mse = float(self.loss(logits, batch))
        return {"mse": mse, "loss": mse, "query_mse": float(self.query_mse(logits, batch))}
