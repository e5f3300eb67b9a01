"""Core data structures shared by all synthetic tasks.

A task produces :class:`Batch` objects: token sequences plus, for every position,
whether the model's next-token prediction there is scored (``answer_mask``), what
the correct next token is (``targets``), and which earlier positions hold that
correct token by construction of the task (``answer_sources``).  Models emit
logits ``[batch, pos, d_vocab_out]`` and are scored only at answer positions.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

IGNORE_INDEX = -100
"""Value of ``Batch.targets`` at positions that are not scored."""

DEFAULT_EVAL_SEED = 20_240_601
"""Seed of the dedicated generator used by :func:`eval_set` unless told otherwise."""


@dataclass(frozen=True, eq=False)
class Batch:
    """A batch of task sequences with answer annotations.

    Fields (``B`` = batch size, ``P`` = sequence length):

    * ``tokens``: ``int64 [B, P]`` input tokens.
    * ``targets``: ``int64 [B, P]``; at an answer position ``i`` the correct *next*
      token (the token the model should predict from position ``i``), and
      ``IGNORE_INDEX`` (-100) everywhere else.
    * ``answer_mask``: ``bool [B, P]``; True at positions whose prediction is scored.
    * ``answer_sources``: ``bool [B, P, P]``; ``answer_sources[b, i, j]`` is True iff key
      position ``j <= i`` holds the correct answer token for answer position ``i`` by
      construction of the task (e.g. the value paired with the queried key).  Rows
      ``i`` that are not answer positions are all False.  The attention mass a head
      at query ``i`` puts on these key positions is the "successor-value mass".

    Construction validates shapes, dtypes, devices and the consistency of the
    annotations (targets are -100 exactly off the mask, sources are causal and only
    on answer rows); violations raise ``ValueError`` naming the field.

    ``eq=False``: batches compare by identity (tensor ``==`` is elementwise); use
    :meth:`equal` for value equality.
    """

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    answer_mask: Bool[Tensor, "batch pos"]
    answer_sources: Bool[Tensor, "batch pos pos"]

    def __post_init__(self) -> None:
        for name in ("tokens", "targets", "answer_mask", "answer_sources"):
            if not isinstance(getattr(self, name), Tensor):
                raise ValueError(
                    f"Batch.{name}: expected a torch.Tensor, got {type(getattr(self, name)).__name__}"
                )
        tok = self.tokens
        if tok.ndim != 2:
            raise ValueError(f"Batch.tokens: expected shape [batch, pos], got {tuple(tok.shape)}")
        if tok.dtype != torch.long:
            raise ValueError(f"Batch.tokens: expected dtype torch.int64, got {tok.dtype}")
        b, p = tok.shape
        expected = {
            "targets": ((b, p), torch.long),
            "answer_mask": ((b, p), torch.bool),
            "answer_sources": ((b, p, p), torch.bool),
        }
        for name, (shape, dtype) in expected.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape:
                raise ValueError(
                    f"Batch.{name}: expected shape {shape} (from tokens {tuple(tok.shape)}), "
                    f"got {tuple(t.shape)}"
                )
            if t.dtype != dtype:
                raise ValueError(f"Batch.{name}: expected dtype {dtype}, got {t.dtype}")
            if t.device != tok.device:
                raise ValueError(
                    f"Batch.{name}: expected device {tok.device} (same as tokens), got {t.device}"
                )
        mask = self.answer_mask
        if bool(((self.targets == IGNORE_INDEX) == mask).any()):
            raise ValueError(
                f"Batch.targets: expected a real token (!= {IGNORE_INDEX}) exactly at answer_mask "
                f"positions and {IGNORE_INDEX} elsewhere"
            )
        if bool((self.answer_sources & ~mask[:, :, None]).any()):
            raise ValueError("Batch.answer_sources: expected all-False rows at non-answer positions")
        if p > 0 and bool(torch.triu(self.answer_sources, diagonal=1).any()):
            raise ValueError("Batch.answer_sources: expected only key positions j <= i (causal)")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_pos(self) -> int:
        """Sequence length ``P``."""
        return self.tokens.shape[1]

    @property
    def model_input(self) -> Tensor:
        """What the model consumes (token ids here; real-valued inputs for regression tasks)."""
        return self.tokens

    @property
    def n_answers(self) -> int:
        """Total number of answer positions in the batch."""
        return int(self.answer_mask.sum())

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device: torch.device | str) -> Batch:
        """Return a copy of the batch with every tensor on ``device``."""
        return Batch(
            tokens=self.tokens.to(device),
            targets=self.targets.to(device),
            answer_mask=self.answer_mask.to(device),
            answer_sources=self.answer_sources.to(device),
        )

    def __getitem__(self, index: int | slice | Tensor | Sequence[int]) -> Batch:
        """Sub-batch along the batch dimension.

        ``index`` may be a slice, a 1-d int64 index tensor, a 1-d bool mask tensor,
        a list of ints, or a single int (which yields a batch of size 1; the batch
        dimension is always kept).
        """
        if isinstance(index, bool):
            raise TypeError("Batch index must be an int, slice, list of ints or 1-d tensor, not bool")
        if isinstance(index, int):
            n = len(self)
            if not -n <= index < n:
                raise IndexError(f"Batch index {index} out of range for batch of size {n}")
            index = slice(index % n, index % n + 1)
        elif isinstance(index, Tensor):
            if index.ndim != 1:
                raise ValueError(f"Batch index tensor: expected 1-d, got shape {tuple(index.shape)}")
            if index.dtype != torch.bool and (index.dtype.is_floating_point or index.dtype.is_complex):
                raise ValueError(f"Batch index tensor: expected integer or bool dtype, got {index.dtype}")
        elif isinstance(index, (list, tuple)):
            index = torch.as_tensor(index, dtype=torch.long)
        elif not isinstance(index, slice):
            raise TypeError(f"unsupported Batch index type {type(index).__name__}")
        return Batch(
            tokens=self.tokens[index],
            targets=self.targets[index],
            answer_mask=self.answer_mask[index],
            answer_sources=self.answer_sources[index],
        )

    @classmethod
    def concat(cls, batches: Iterable[Batch]) -> Batch:
        """Concatenate batches along the batch dimension (all must share ``pos``)."""
        batches = list(batches)
        if not batches:
            raise ValueError("Batch.concat: expected at least one batch, got none")
        lengths = {b.n_pos for b in batches}
        if len(lengths) != 1:
            raise ValueError(f"Batch.concat: expected equal sequence lengths, got {sorted(lengths)}")
        return cls(
            tokens=torch.cat([b.tokens for b in batches]),
            targets=torch.cat([b.targets for b in batches]),
            answer_mask=torch.cat([b.answer_mask for b in batches]),
            answer_sources=torch.cat([b.answer_sources for b in batches]),
        )

    def equal(self, other: Batch) -> bool:
        """True iff every field of ``other`` is bit-identical to this batch's."""
        return all(
            torch.equal(getattr(self, f), getattr(other, f))
            for f in ("tokens", "targets", "answer_mask", "answer_sources")
        )


class Task(abc.ABC):
    """A synthetic next-token task.

    Subclasses set these attributes in ``__init__``:

    * ``name``: registry name (e.g. ``"assoc"``).
    * ``d_vocab``: size of the token vocabulary; all tokens and targets lie in
      ``[0, d_vocab)``.
    * ``n_ctx``: length of the sequences ``sample`` produces.
    * ``chance``: accuracy of guessing uniformly among the admissible answers
      (each subclass documents its value).

    and implement :meth:`sample`.  Scoring only looks at answer positions.
    Models may have ``d_vocab_out >= d_vocab``; the argmax / cross-entropy are taken
    over the whole last dimension of the logits.
    """

    name: str
    d_vocab: int
    n_ctx: int
    chance: float

    @abc.abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Draw ``n`` sequences (on CPU).

        All randomness comes from ``generator``, so a generator seeded the same way
        yields a bit-identical batch.
        """

    # ---------------------------------------------------------------- scoring
    def _check_logits(self, logits: Tensor, batch: Batch) -> None:
        if not isinstance(logits, Tensor) or logits.ndim != 3:
            shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(f"logits: expected shape [batch, pos, d_vocab_out], got {shape}")
        b, p = batch.tokens.shape
        if tuple(logits.shape[:2]) != (b, p) or logits.shape[2] < self.d_vocab:
            raise ValueError(
                f"logits: expected shape [{b}, {p}, >={self.d_vocab}] to match batch tokens "
                f"{(b, p)}, got {tuple(logits.shape)}"
            )
        if logits.device != batch.device:
            raise ValueError(f"logits on {logits.device} but batch on {batch.device}")

    def loss(self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: Batch) -> Float[Tensor, ""]:
        """Mean cross-entropy over all answer positions of the batch (computed in float32).

        NaN if the batch has no answer positions.
        """
        self._check_logits(logits, batch)
        mask = batch.answer_mask
        return F.cross_entropy(logits[mask].float(), batch.targets[mask], reduction="mean")

    def _correct(self, logits: Tensor, batch: Batch) -> Bool[Tensor, "batch pos"]:
        self._check_logits(logits, batch)
        return (logits.argmax(dim=-1) == batch.targets) & batch.answer_mask

    def accuracy(self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: Batch) -> Float[Tensor, ""]:
        """Fraction of answer positions (pooled over the batch) whose argmax equals the target.

        A 0-dim float tensor; NaN if the batch has no answer positions.
        """
        correct = self._correct(logits, batch)
        return correct.sum().float() / batch.answer_mask.sum().float()

    def per_example_accuracy(
        self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: Batch
    ) -> Float[Tensor, "batch"]:
        """For each example, the fraction of its answer positions predicted correctly.

        NaN for an example with no answer positions.
        """
        correct = self._correct(logits, batch)
        return correct.sum(dim=1).float() / batch.answer_mask.sum(dim=1).float()

    def metrics(self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: Batch) -> dict[str, float]:
        """Scalar scores of ``logits`` on ``batch``: ``{"accuracy", "loss"}`` for token tasks
        (regression tasks return ``{"mse", "loss"}``)."""
        return {"accuracy": float(self.accuracy(logits, batch)), "loss": float(self.loss(logits, batch))}

    def __repr__(self) -> str:
        cfg = getattr(self, "config", None)
        return f"{type(self).__name__}({cfg!r})" if cfg is not None else f"{type(self).__name__}()"


def check_sample_args(n: int, generator: torch.Generator) -> None:
    """Validate the arguments of :meth:`Task.sample` (shared by implementations)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive int, got {n!r}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator: expected a CPU generator, got one on {generator.device}")


def eval_set(task: Task, n: int = 512, seed: int = DEFAULT_EVAL_SEED) -> Batch:
    """A fixed evaluation batch: ``task.sample(n, torch.Generator().manual_seed(seed))``.

    Uses its own generator, so it is unaffected by (and does not affect) any other
    random state; the same ``(task config, n, seed)`` always gives the same batch.
    """
    return task.sample(n, torch.Generator().manual_seed(seed))
