"""Associative recall (key-value lookup in context)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from .base import IGNORE_INDEX, Batch, Task, check_sample_args


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name}: expected {kind}, got {value!r}")


QUERY_POSITIONS = ("last",)


@dataclass(frozen=True)
class AssocRecallConfig:
    """Configuration of :class:`AssocRecall`.

    * ``n_pairs``: key-value pairs per sequence (``<= n_keys``; ``<= d_vocab`` if shared).
    * ``n_keys``: keys are tokens ``0 .. n_keys-1`` (ignored if ``shared_vocab``).
    * ``n_values``: values are tokens ``n_keys .. n_keys+n_values-1`` (ignored if
      ``shared_vocab``).  Requires ``n_keys + n_values <= d_vocab``.
    * ``shared_vocab``: if True, keys (distinct) and values are both drawn from the
      whole vocabulary ``0 .. d_vocab-1``.
    * ``query_position``: where the query goes; only ``"last"`` is supported.
    * ``d_vocab``: vocabulary size.
    * ``n_distractors``: filler tokens inserted at random places between pairs;
      drawn uniformly from the tokens ``n_keys+n_values .. d_vocab-1`` that are
      neither keys nor values (there must be at least one such token).
    * ``max_len``: upper bound on the sequence length ``2*n_pairs + n_distractors + 1``.
    """

    n_pairs: int = 15
    n_keys: int = 16
    n_values: int = 16
    shared_vocab: bool = False
    query_position: str = "last"
    d_vocab: int = 32
    n_distractors: int = 0
    max_len: int = 32

    def __post_init__(self) -> None:
        for name in ("n_pairs", "n_keys", "n_values", "d_vocab", "max_len"):
            _check_int(name, getattr(self, name), 1)
        _check_int("n_distractors", self.n_distractors, 0)
        if not isinstance(self.shared_vocab, bool):
            raise ValueError(f"shared_vocab: expected a bool, got {self.shared_vocab!r}")
        if self.query_position not in QUERY_POSITIONS:
            raise ValueError(
                f"query_position: expected one of {QUERY_POSITIONS}, got {self.query_position!r}"
            )
        if self.shared_vocab:
            if self.n_pairs > self.d_vocab:
                raise ValueError(
                    f"n_pairs={self.n_pairs} distinct keys need n_pairs <= d_vocab={self.d_vocab}"
                )
            if self.n_distractors > 0:
                raise ValueError(
                    "n_distractors > 0 needs filler tokens outside keys/values, but with "
                    "shared_vocab=True keys and values use the whole vocabulary"
                )
        else:
            if self.n_pairs > self.n_keys:
                raise ValueError(
                    f"n_pairs={self.n_pairs} distinct keys need n_pairs <= n_keys={self.n_keys}"
                )
            if self.n_keys + self.n_values > self.d_vocab:
                raise ValueError(
                    f"keys and values need n_keys + n_values = {self.n_keys + self.n_values} "
                    f"<= d_vocab={self.d_vocab} (or shared_vocab=True)"
                )
            if self.n_distractors > 0 and self.n_keys + self.n_values == self.d_vocab:
                raise ValueError(
                    f"n_distractors={self.n_distractors} needs filler tokens outside keys/values, "
                    f"but n_keys + n_values = d_vocab = {self.d_vocab}; enlarge d_vocab"
                )
        if self.seq_len > self.max_len:
            raise ValueError(
                f"sequence length 2*n_pairs + n_distractors + 1 = {self.seq_len} exceeds "
                f"max_len={self.max_len}"
            )

    @property
    def seq_len(self) -> int:
        """Length of each sequence: ``2*n_pairs + n_distractors + 1``."""
        return 2 * self.n_pairs + self.n_distractors + 1

    @property
    def key_range(self) -> tuple[int, int]:
        """Half-open token range ``[lo, hi)`` keys are drawn from."""
        return (0, self.d_vocab) if self.shared_vocab else (0, self.n_keys)

    @property
    def value_range(self) -> tuple[int, int]:
        """Half-open token range ``[lo, hi)`` values are drawn from."""
        if self.shared_vocab:
            return (0, self.d_vocab)
        return (self.n_keys, self.n_keys + self.n_values)

    @property
    def filler_range(self) -> tuple[int, int]:
        """Half-open token range ``[lo, hi)`` distractors are drawn from (may be empty)."""
        if self.shared_vocab:
            return (self.d_vocab, self.d_vocab)
        return (self.n_keys + self.n_values, self.d_vocab)


class AssocRecall(Task):
    """Associative recall: ``k1 v1 k2 v2 ... kN vN q`` -> predict the value paired with ``q``.

    Default format (``AssocRecallConfig()``): keys are tokens 0..15, values tokens
    16..31; a sequence is ``k1 v1 ... k15 v15 q`` (31 tokens).  The 15 keys are
    distinct (sampled without replacement from the key range), each value is drawn
    uniformly with replacement from the value range, and the query ``q`` is one of
    the 15 keys chosen uniformly.  The only answer position is the last one (the
    query); its target is the value paired with ``q`` and ``answer_sources`` marks the
    position of that value token (``2*idx + 1`` for pair ``idx`` without distractors).

    With ``shared_vocab=True`` keys (distinct) and values are drawn from the whole
    vocabulary, so a value token may coincide with a key token; the answer is still
    defined by construction (the value adjacent to the queried key).

    With ``n_distractors = D > 0`` the ``N`` pairs and ``D`` single filler tokens are
    arranged in a uniformly random interleaving (pairs stay adjacent ``k v``), then
    the query is appended; the length is ``2N + D + 1``.

    Chance accuracy: ``1 / n_values`` (``1 / d_vocab`` with ``shared_vocab``), i.e.
    guessing uniformly among the tokens a value can be.
    """

    name = "assoc"

    def __init__(self, config: AssocRecallConfig | None = None) -> None:
        self.config = config if config is not None else AssocRecallConfig()
        if not isinstance(self.config, AssocRecallConfig):
            raise ValueError(f"config: expected an AssocRecallConfig, got {type(self.config).__name__}")
        c = self.config
        self.d_vocab = c.d_vocab
        self.n_ctx = c.seq_len
        lo, hi = c.value_range
        self.chance = 1.0 / (hi - lo)

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Draw ``n`` sequences of length ``n_ctx`` (see class docstring for the format).

        Randomness is consumed in a fixed order (keys, values, query index, then the
        distractor layout and tokens if ``n_distractors > 0``).
        """
        check_sample_args(n, generator)
        c = self.config
        P, D, L = c.n_pairs, c.n_distractors, c.seq_len
        k_lo, k_hi = c.key_range
        v_lo, v_hi = c.value_range

        keys = torch.rand(n, k_hi - k_lo, generator=generator).argsort(dim=1)[:, :P] + k_lo
        values = torch.randint(v_lo, v_hi, (n, P), generator=generator)
        q_idx = torch.randint(0, P, (n,), generator=generator)
        rows = torch.arange(n)

        pair_starts: Int[Tensor, "batch n_pairs"]
        tokens = torch.empty(n, L, dtype=torch.long)
        if D == 0:
            pair_starts = (2 * torch.arange(P)).expand(n, P)
        else:
            U = P + D
            d_slots = torch.rand(n, U, generator=generator).argsort(dim=1)[:, :D]
            is_d = torch.zeros(n, U, dtype=torch.bool).scatter_(1, d_slots, True)
            lengths = torch.where(is_d, 1, 2)
            starts = lengths.cumsum(dim=1) - lengths
            # Boolean indexing is row-major and every row has exactly P (resp. D) hits.
            pair_starts = starts[~is_d].view(n, P)
            d_starts = starts[is_d].view(n, D)
            f_lo, f_hi = c.filler_range
            fillers = torch.randint(f_lo, f_hi, (n, D), generator=generator)
            tokens.scatter_(1, d_starts, fillers)
        tokens.scatter_(1, pair_starts, keys)
        tokens.scatter_(1, pair_starts + 1, values)
        tokens[:, L - 1] = keys[rows, q_idx]

        targets = torch.full((n, L), IGNORE_INDEX, dtype=torch.long)
        targets[:, L - 1] = values[rows, q_idx]
        answer_mask = torch.zeros(n, L, dtype=torch.bool)
        answer_mask[:, L - 1] = True
        answer_sources = torch.zeros(n, L, L, dtype=torch.bool)
        answer_sources[rows, L - 1, pair_starts[rows, q_idx] + 1] = True
        return Batch(tokens, targets, answer_mask, answer_sources)
