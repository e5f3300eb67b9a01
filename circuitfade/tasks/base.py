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

EVAL_SEED = 1_000_003
"""THE evaluation seed: every entry point (training logs, ``evaluate``,
``gate_intervention_table``, ``trace``, ``analyze``, screens, history, assets,
tutorials) evaluates on ``eval_set(task, EVAL_SIZE, EVAL_SEED)`` unless told otherwise.
It is the trainer's historical eval seed, so every shipped ``metrics.csv`` was
recorded on exactly this set."""

EVAL_SIZE = 512
"""THE default number of evaluation examples (see :data:`EVAL_SEED`)."""

def eval_label(n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> str:
    """``"eval: 512 examples, seed 1000003"``: the line every table and report prints."""
    return f"eval: {int(n)} examples, seed {int(seed)}"


@dataclass(frozen=True)
class PrimaryMetric:
    """The one number that says how well a model does a task.

    * ``name``: the key in :meth:`Task.metrics` (``"accuracy"``, ``"mse"``);
    * ``column``: its prefix in ``metrics.csv`` (``"acc"`` -> ``acc_normal``, ``acc_zero``);
    * ``direction``: ``"higher"`` or ``"lower"`` is better;
    * ``chance``: the value of a model that ignores the context (uniform guessing among
      the admissible answers for accuracy; predicting 0 for regression), NaN if unknown.
    """

    name: str
    column: str
    direction: str
    chance: float

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower"):
            raise ValueError(f"PrimaryMetric.direction: expected 'higher' or 'lower', got {self.direction!r}")

    def key(self, condition: str = "normal") -> str:
        """Column of ``metrics.csv`` under an evaluation condition (``acc_zero``)."""
        return f"{self.column}_{condition}"

    def better(self, a: float, b: float) -> bool:
        """True iff ``a`` is strictly better than ``b``."""
        return a > b if self.direction == "higher" else a < b


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
        # the sources' rows at the answer positions hold every True entry (counted: cheaper than
        # listing the few entries of a [batch, pos, pos] tensor), and none of them lies after its row
        where = mask.nonzero()  # [n, 2]: (example, answer row i)
        on_rows = self.answer_sources[where[:, 0], where[:, 1]]  # [n, pos]
        if int(torch.count_nonzero(on_rows)) != int(torch.count_nonzero(self.answer_sources)):
            raise ValueError("Batch.answer_sources: expected all-False rows at non-answer positions")
        if bool((on_rows & (torch.arange(p, device=tok.device) > where[:, 1:])).any()):
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
    def from_answers(
        cls,
        tokens: Int[Tensor, "batch pos"],
        answer_positions: Bool[Tensor, "batch pos"] | Sequence[Sequence[int]],
        *,
        targets: Int[Tensor, "batch pos"] | None = None,
        answer_sources: Bool[Tensor, "batch pos pos"] | None = None,
    ) -> Batch:
        """A batch from a user's own token sequences.

        ``answer_positions``: a bool mask ``[batch, pos]`` or, per sequence, the list of
        positions ``i`` whose next-token prediction is scored. ``targets``: the correct
        next token at those positions (default: ``tokens[b, i + 1]``, so the last
        position cannot be an answer). ``answer_sources``: which earlier positions hold
        the answer (default: every earlier position ``j <= i`` whose token equals the
        target, so successor mass is "attention on earlier copies of the answer").
        """
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected shape [batch, pos], got {tuple(tokens.shape)}")
        b, p = tokens.shape
        if isinstance(answer_positions, Tensor) and answer_positions.dtype == torch.bool:
            mask = answer_positions.clone()
        else:
            rows = list(answer_positions)
            if len(rows) != b:
                raise ValueError(f"answer_positions: expected one list per sequence ({b}), got {len(rows)}")
            mask = torch.zeros(b, p, dtype=torch.bool)
            for i, row in enumerate(rows):
                for j in row:
                    if not 0 <= int(j) < p:
                        raise ValueError(f"answer_positions[{i}]: position {j} outside [0, {p})")
                    mask[i, int(j)] = True
        if tuple(mask.shape) != (b, p):
            raise ValueError(f"answer_positions: expected a mask of shape {(b, p)}, got {tuple(mask.shape)}")
        if targets is None:
            if bool(mask[:, -1].any()):
                raise ValueError("answer_positions: the last position has no next token; pass targets=")
            nxt = torch.cat([tokens[:, 1:], torch.zeros(b, 1, dtype=torch.long)], dim=1)
            targets = torch.where(mask, nxt, torch.full_like(tokens, IGNORE_INDEX))
        else:
            targets = torch.where(mask, torch.as_tensor(targets, dtype=torch.long), torch.full_like(tokens, IGNORE_INDEX))
        if answer_sources is None:
            causal = torch.ones(p, p, dtype=torch.bool).tril()
            answer_sources = (tokens[:, None, :] == targets[:, :, None]) & causal & mask[:, :, None]
        return cls(tokens=tokens, targets=targets, answer_mask=mask, answer_sources=answer_sources)

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

    @property
    def primary_metric(self) -> PrimaryMetric:
        """The task's headline metric (token tasks: accuracy, higher is better, chance
        ``self.chance``); regression tasks override it. Progress bars, CLI summaries,
        ``reproduce``, the static baselines and the plots read this instead of guessing
        from key names."""
        return PrimaryMetric("accuracy", "acc", "higher", float(self.chance))

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


def eval_set(task: Task, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> Batch:
    """A fixed evaluation batch: ``task.sample(n, torch.Generator().manual_seed(seed))``.

    Uses its own generator, so it is unaffected by (and does not affect) any other
    random state; the same ``(task config, n, seed)`` always gives the same batch.
    Defaults: the package's one evaluation convention (:data:`EVAL_SIZE` examples,
    :data:`EVAL_SEED`). A :class:`BatchTask` (a user's own batch) returns its batch
    (its first ``n`` examples when it has more).
    """
    if isinstance(task, BatchTask):
        return task.batch if n >= len(task.batch) else task.batch[:n]
    return task.sample(n, torch.Generator().manual_seed(seed))


class BatchTask(Task):
    """A user's own evaluation batch used where a task is expected.

    ``batch``: a :class:`Batch` (tokens with ``targets`` / ``answer_mask`` at the answer
    positions, and ``answer_sources`` for successor mass; see
    :meth:`Batch.from_answers`). Scoring is :class:`Task`'s (argmax accuracy and
    cross-entropy at answer positions); :func:`eval_set` returns the batch itself, and
    :meth:`sample` draws examples from it (with replacement) for code that resamples.
    ``chance`` defaults to NaN (unknown) unless given.
    """

    def __init__(self, batch: Batch, *, d_vocab: int | None = None, chance: float = float("nan"),
                 name: str = "batch"):
        if not isinstance(batch, Batch):
            raise ValueError(f"batch: expected a circuitfade.tasks.Batch, got {type(batch).__name__}")
        self.batch = batch
        self.name = name
        self.n_ctx = batch.n_pos
        hi = int(torch.maximum(batch.tokens.max(), batch.targets.max()).item()) + 1 if len(batch) else 1
        self.d_vocab = int(d_vocab) if d_vocab is not None else hi
        self.chance = float(chance)

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        check_sample_args(n, generator)
        return self.batch[torch.randint(0, len(self.batch), (n,), generator=generator)]

    def __repr__(self) -> str:
        return f"BatchTask({len(self.batch)} examples x {self.batch.n_pos} positions)"
