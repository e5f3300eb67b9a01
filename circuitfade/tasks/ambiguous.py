"""Ambiguous associative recall: a context rule and a fixed (in-weights) rule compete.

Format (defaults: 16 keys ``0..15``, 16 values ``16..31``, 15 pairs)::

    k1 v1 k2 v2 ... kN vN q        -> predict the next token at the last position

exactly as :class:`~circuitfade.tasks.assoc.AssocRecall`: the ``N`` keys are distinct,
the values are drawn uniformly with replacement, and the query ``q`` is one of the
keys. Two rules give an answer for the query:

* the **context rule**: the value paired with ``q`` in *this* prompt
  (``context_answer``) - solvable only by reading the context (in-context learning);
* the **fixed rule**: ``table[q]``, a global key -> value table that is the same for
  every prompt (``fixed_answer``) - solvable only from the weights (in-weights
  learning). The table is an injective map keys -> values drawn once from
  ``table_seed`` (``table = v_lo + randperm(n_values)[:n_keys]``; with
  ``n_keys == n_values`` a random permutation of the value vocabulary indexed by
  key, the study's "global permutation"). Context values are drawn independently
  of the table, so the prompt carries no information about it.

With probability ``p_icl`` the training target is the context answer, otherwise the
fixed answer. **The input distribution does not depend on ``p_icl``**: :meth:`sample`
first draws the whole input (keys, values, query index) from the generator, then
exactly one uniform ``u`` per example; the target follows the context rule iff
``u < p_icl``. So for the same generator state the tokens (and both candidate
answers) are bit-identical for every ``p_icl``, and only the targets differ.

A **conflict trial** is one where the two rules disagree
(``context_answer != fixed_answer``, probability ``1 - 1/n_values`` for the
defaults' uniform values). On agreement trials the target is the same under both
rules.

Chance accuracy: ``1 / n_values``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .base import IGNORE_INDEX, Batch, Task, check_sample_args

__all__ = ["AmbiguousRecallConfig", "AmbiguousRecall", "AmbiguousBatch"]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def _check_p(name: str, p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {p!r}")
    return float(p)


_EXTRA = ("context_answer", "fixed_answer", "conflict", "uses_context")


@dataclass(frozen=True, eq=False, kw_only=True)
class AmbiguousBatch(Batch):
    """A :class:`Batch` with both rules' answers for the query (the last position).

    Extra fields (``B`` = batch size):

    * ``context_answer``: ``int64 [B]``, the value paired with the query in the prompt;
    * ``fixed_answer``: ``int64 [B]``, ``table[query]`` of the task's fixed rule;
    * ``conflict``: ``bool [B]``, ``context_answer != fixed_answer``;
    * ``uses_context``: ``bool [B]``, True iff the target was drawn from the context rule
      (on agreement trials both rules give the same target).

    ``targets[:, -1]`` equals ``where(uses_context, context_answer, fixed_answer)``.
    Indexing, :meth:`to`, :meth:`concat` and :meth:`equal` keep the extra fields.
    """

    context_answer: Int[Tensor, "batch"]
    fixed_answer: Int[Tensor, "batch"]
    conflict: Bool[Tensor, "batch"]
    uses_context: Bool[Tensor, "batch"]

    def __post_init__(self) -> None:
        super().__post_init__()
        b = self.tokens.shape[0]
        for name, dtype in zip(_EXTRA, (torch.long, torch.long, torch.bool, torch.bool)):
            t = getattr(self, name)
            if not isinstance(t, Tensor):
                raise ValueError(f"AmbiguousBatch.{name}: expected a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != (b,) or t.dtype != dtype:
                raise ValueError(
                    f"AmbiguousBatch.{name}: expected {dtype} of shape ({b},), got {t.dtype} {tuple(t.shape)}"
                )
            if t.device != self.tokens.device:
                raise ValueError(f"AmbiguousBatch.{name}: expected device {self.tokens.device}, got {t.device}")
        if b and not torch.equal(self.conflict, self.context_answer != self.fixed_answer):
            raise ValueError("AmbiguousBatch.conflict: expected context_answer != fixed_answer")
        if b and not torch.equal(
            self.targets[:, -1], torch.where(self.uses_context, self.context_answer, self.fixed_answer)
        ):
            raise ValueError("AmbiguousBatch.targets[:, -1]: expected the answer of the rule named by uses_context")

    @property
    def base(self) -> Batch:
        """The plain :class:`Batch` (without the extra fields)."""
        return Batch(self.tokens, self.targets, self.answer_mask, self.answer_sources)

    def _with(self, base: Batch, extras: dict) -> "AmbiguousBatch":
        return AmbiguousBatch(base.tokens, base.targets, base.answer_mask, base.answer_sources, **extras)

    def to(self, device: torch.device | str) -> "AmbiguousBatch":
        return self._with(self.base.to(device), {f: getattr(self, f).to(device) for f in _EXTRA})

    def __getitem__(self, index: int | slice | Tensor | Sequence[int]) -> "AmbiguousBatch":
        base = self.base[index]  # validates the index (and turns an int into a size-1 batch)
        if isinstance(index, int):
            index = slice(index % len(self), index % len(self) + 1)
        elif isinstance(index, (list, tuple)):
            index = torch.as_tensor(index, dtype=torch.long)
        return self._with(base, {f: getattr(self, f)[index] for f in _EXTRA})

    @classmethod
    def concat(cls, batches: Iterable["AmbiguousBatch"]) -> "AmbiguousBatch":
        batches = list(batches)
        if not batches or not all(isinstance(b, AmbiguousBatch) for b in batches):
            raise ValueError("AmbiguousBatch.concat: expected a non-empty list of AmbiguousBatch")
        base = Batch.concat([b.base for b in batches])
        return cls(base.tokens, base.targets, base.answer_mask, base.answer_sources,
                   **{f: torch.cat([getattr(b, f) for b in batches]) for f in _EXTRA})

    def equal(self, other: Batch) -> bool:
        return (isinstance(other, AmbiguousBatch) and super().equal(other)
                and all(torch.equal(getattr(self, f), getattr(other, f)) for f in _EXTRA))


@dataclass(frozen=True)
class AmbiguousRecallConfig:
    """Configuration of :class:`AmbiguousRecall`.

    * ``n_pairs``: key-value pairs per prompt (``<= n_keys``); length ``2*n_pairs + 1``.
    * ``n_keys``: keys are tokens ``0 .. n_keys-1``.
    * ``n_values``: values are tokens ``n_keys .. n_keys+n_values-1``; ``n_keys <= n_values``
      (the fixed table is injective).
    * ``d_vocab``: vocabulary size, ``>= n_keys + n_values``.
    * ``p_icl``: default probability that a target follows the context rule.
    * ``table_seed``: seed of the fixed key -> value table.
    """

    n_pairs: int = 15
    n_keys: int = 16
    n_values: int = 16
    d_vocab: int = 32
    p_icl: float = 0.5
    table_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_pairs", "n_keys", "n_values", "d_vocab"):
            _check_int(name, getattr(self, name), 1)
        _check_int("table_seed", self.table_seed, 0)
        object.__setattr__(self, "p_icl", _check_p("p_icl", self.p_icl))
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} distinct keys need n_pairs <= n_keys={self.n_keys}")
        if self.n_keys > self.n_values:
            raise ValueError(f"the fixed table is injective: expected n_keys={self.n_keys} <= n_values={self.n_values}")
        if self.n_keys + self.n_values > self.d_vocab:
            raise ValueError(f"expected n_keys + n_values = {self.n_keys + self.n_values} <= d_vocab={self.d_vocab}")

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 1


class AmbiguousRecall(Task):
    """See the module docstring. ``sample(n, generator, p_icl=None)`` returns an :class:`AmbiguousBatch`."""

    name = "ambiguous"

    def __init__(self, config: AmbiguousRecallConfig | None = None) -> None:
        self.config = config if config is not None else AmbiguousRecallConfig()
        if not isinstance(self.config, AmbiguousRecallConfig):
            raise ValueError(f"config: expected an AmbiguousRecallConfig, got {type(self.config).__name__}")
        c = self.config
        self.d_vocab = c.d_vocab
        self.n_ctx = c.seq_len
        self.chance = 1.0 / c.n_values
        g = torch.Generator().manual_seed(c.table_seed)
        self.table: Int[Tensor, "n_keys"] = c.n_keys + torch.randperm(c.n_values, generator=g)[: c.n_keys]

    def sample(self, n: int, generator: torch.Generator, p_icl: float | None = None) -> AmbiguousBatch:
        """Draw ``n`` prompts; targets follow the context rule with probability ``p_icl``
        (default ``config.p_icl``).

        Randomness is consumed in a fixed order that does not depend on ``p_icl``:
        keys (``rand(n, n_keys)``), values, query index, then one ``rand(n)`` deciding
        the rule (context iff ``u < p_icl``).
        """
        check_sample_args(n, generator)
        c = self.config
        p = c.p_icl if p_icl is None else _check_p("p_icl", p_icl)
        P, L = c.n_pairs, c.seq_len
        keys = torch.rand(n, c.n_keys, generator=generator).argsort(dim=1)[:, :P]
        values = torch.randint(c.n_keys, c.n_keys + c.n_values, (n, P), generator=generator)
        q_idx = torch.randint(0, P, (n,), generator=generator)
        u = torch.rand(n, generator=generator)
        rows = torch.arange(n)

        tokens = torch.empty(n, L, dtype=torch.long)
        tokens[:, 0 : 2 * P : 2] = keys
        tokens[:, 1 : 2 * P : 2] = values
        query = keys[rows, q_idx]
        tokens[:, L - 1] = query
        ctx = values[rows, q_idx]
        fixed = self.table[query]
        uses_context = u < p
        answer = torch.where(uses_context, ctx, fixed)

        targets = torch.full((n, L), IGNORE_INDEX, dtype=torch.long)
        targets[:, L - 1] = answer
        answer_mask = torch.zeros(n, L, dtype=torch.bool)
        answer_mask[:, L - 1] = True
        answer_sources = torch.zeros(n, L, L, dtype=torch.bool)
        # the prompt holds the correct token by construction iff the target is the context answer
        hit = answer == ctx
        answer_sources[rows[hit], L - 1, 2 * q_idx[hit] + 1] = True
        return AmbiguousBatch(tokens, targets, answer_mask, answer_sources, context_answer=ctx,
                              fixed_answer=fixed, conflict=ctx != fixed, uses_context=uses_context)

    # ------------------------------------------------------------ rule read-outs
    def _check(self, logits: Tensor, batch: Batch) -> None:
        if not isinstance(batch, AmbiguousBatch):
            raise ValueError(f"batch: expected an AmbiguousBatch, got {type(batch).__name__}")
        self._check_logits(logits, batch)

    def margin(self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: AmbiguousBatch) -> Float[Tensor, "batch"]:
        """Per-example logit margin at the query (last) position:
        ``logits[b, -1, context_answer[b]] - logits[b, -1, fixed_answer[b]]`` (0 on agreement trials)."""
        self._check(logits, batch)
        last = logits[:, -1, :].float()
        return last.gather(1, batch.context_answer[:, None])[:, 0] - last.gather(1, batch.fixed_answer[:, None])[:, 0]

    def rule_accuracy(self, logits: Float[Tensor, "batch pos d_vocab_out"], batch: AmbiguousBatch) -> dict[str, float]:
        """Accuracy of the argmax at the query position under each rule, on conflict trials:
        ``{"acc_context", "acc_fixed", "acc_either"}`` (NaN without conflict trials)."""
        self._check(logits, batch)
        pred = logits[:, -1, :].argmax(-1)
        m = batch.conflict
        if not bool(m.any()):
            return {"acc_context": float("nan"), "acc_fixed": float("nan"), "acc_either": float("nan")}
        ctx = (pred == batch.context_answer)[m].float().mean()
        fix = (pred == batch.fixed_answer)[m].float().mean()
        return {"acc_context": float(ctx), "acc_fixed": float(fix), "acc_either": float(ctx + fix)}

    @staticmethod
    def bayes_loss(p_icl: float, conflict_rate: float) -> float:
        """Lowest achievable mean cross-entropy (nats) at mix ``p_icl``: the binary entropy
        ``H(p) = -p ln p - (1-p) ln(1-p)`` on conflict trials, 0 on agreement trials."""
        import math

        p = _check_p("p_icl", p_icl)
        h = 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))
        return conflict_rate * h
