"""Markov induction: sequences where tokens are sometimes copied by an induction rule."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .base import IGNORE_INDEX, Batch, Task, check_sample_args


@dataclass(frozen=True)
class MarkovInductionConfig:
    """Configuration of :class:`MarkovInduction`.

    * ``p``: probability of an induction copy at an eligible step, in ``(0, 1]``
      (the paper uses 0.2, 0.5, 0.8).
    * ``d_vocab``: vocabulary size (>= 2).
    * ``seq_len``: sequence length (>= 2).
    """

    p: float = 0.5
    d_vocab: int = 32
    seq_len: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0.0 < self.p <= 1.0:
            raise ValueError(f"p: expected a real number in (0, 1], got {self.p!r}")
        for name in ("d_vocab", "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"{name}: expected an int >= 2, got {v!r}")


class MarkovInduction(Task):
    """Random sequences with stochastic induction copies.

    Generative process (per sequence, vocabulary ``V = d_vocab``, length ``T = seq_len``):

    * ``x_0 ~ Uniform{0..V-1}``.
    * for ``t = 1 .. T-1``: let ``s`` be the most recent earlier position ``s < t-1``
      with ``x_s == x_{t-1}`` (if any).  If such ``s`` exists *and* a Bernoulli(p)
      draw succeeds, ``x_t = x_{s+1}`` (an induction "copy" event); then position
      ``t-1`` is an answer position with target ``x_t`` and
      ``answer_sources[t-1, s+1] = True``.  Otherwise ``x_t ~ Uniform{0..V-1}`` and
      position ``t-1`` is not scored (even if the draw happens to equal ``x_{s+1}``).

    The last position is never an answer position.  A sequence may have no answer
    positions at all; ``accuracy``/``loss`` pool over all answer positions in the
    batch, and ``per_example_accuracy`` is NaN for such a sequence.

    Per step, randomness is consumed in a fixed order regardless of outcome (one
    uniform for the Bernoulli, one uniform token), after one token for ``x_0``.

    Chance accuracy: ``1 / d_vocab`` (uniform guessing over the vocabulary).
    """

    name = "markov"

    def __init__(self, config: MarkovInductionConfig | None = None) -> None:
        self.config = config if config is not None else MarkovInductionConfig()
        if not isinstance(self.config, MarkovInductionConfig):
            raise ValueError(
                f"config: expected a MarkovInductionConfig, got {type(self.config).__name__}"
            )
        self.d_vocab = self.config.d_vocab
        self.n_ctx = self.config.seq_len
        self.chance = 1.0 / self.config.d_vocab

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Draw ``n`` sequences following the process in the class docstring (vectorised)."""
        check_sample_args(n, generator)
        V, T, p = self.config.d_vocab, self.config.seq_len, float(self.config.p)
        rows = torch.arange(n)
        x = torch.empty(n, T, dtype=torch.long)
        x[:, 0] = torch.randint(0, V, (n,), generator=generator)
        # last_pos[b, v]: most recent position < t-1 holding token v (-1 if none).
        last_pos = torch.full((n, V), -1, dtype=torch.long)
        targets = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
        answer_mask = torch.zeros(n, T, dtype=torch.bool)
        answer_sources = torch.zeros(n, T, T, dtype=torch.bool)
        for t in range(1, T):
            prev = x[:, t - 1]
            s = last_pos[rows, prev]
            u = torch.rand(n, generator=generator)
            fresh = torch.randint(0, V, (n,), generator=generator)
            copy = (s >= 0) & (u < p)
            src = (s + 1).clamp(min=0)
            x[:, t] = torch.where(copy, x[rows, src], fresh)
            last_pos[rows, prev] = t - 1
            answer_mask[:, t - 1] = copy
            targets[:, t - 1] = torch.where(copy, x[:, t], IGNORE_INDEX)
            answer_sources[rows[copy], t - 1, src[copy]] = True
        return Batch(x, targets, answer_mask, answer_sources)
