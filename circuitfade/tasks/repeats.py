"""Repeated spans: random text in which one earlier span is repeated verbatim (induction helps).

A language-modelling corpus on which in-context copying pays off: each sequence
is ``[BOS]`` followed by random tokens, except that one span of the text is
copied, later in the same sequence, token for token. Inside the copy every next
token is predictable by looking up the previous occurrence of the current token
and reading the token after it (the induction rule). Two optional ingredients make
the text more like language: single-token ("bigram") copies anywhere (``copy_p``)
and a skip-bigram rule ``x_t = perm[x_{t-2}]`` (``skip_p``) that rewards a
previous-token head on its own. Used by :mod:`circuitfade.commands.screen`
to grow a small model whose heads develop during training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from .base import IGNORE_INDEX, Batch, Task, check_sample_args

SCORES = ("all", "repeat")


@dataclass(frozen=True)
class RepeatsConfig:
    """Configuration of :class:`Repeats`.

    * ``d_vocab``: number of ordinary tokens ``0 .. d_vocab-1`` (>= 2). With ``bos``
      the BOS token is ``d_vocab`` and the task's vocabulary has ``d_vocab + 1`` ids.
    * ``seq_len``: total sequence length, BOS included.
    * ``min_span``, ``max_span``: the repeated span's length ``L`` is uniform on
      ``[min_span, max_span]`` (``2 <= min_span <= max_span``, and two copies must fit:
      ``2 * max_span <= seq_len - (1 if bos else 0)``).
    * ``max_gap``: largest number of random tokens between the source span and its
      copy (``None``: as many as fit; ``0``: the copy follows the source directly).
    * ``skip_p``: probability that a filler token (one outside the copy) follows the
      skip-bigram rule ``x_t = perm[x_{t-2}]`` instead of being uniform (0: pure random
      filler). The rule makes a previous-token head useful on its own (to predict
      ``x_{t+1}`` at position ``t`` a head must read ``x_{t-1}``), as n-gram statistics do in
      natural text; with a previous-token head in place, the induction head that builds
      on it forms much sooner.
    * ``copy_p``: probability of a bigram copy at a filler position ``t`` whose previous
      token ``x_{t-1}`` occurred before: ``x_t`` repeats the token that followed that
      earlier occurrence (the induction rule on a single token, as in
      :class:`~circuitfade.tasks.markov.MarkovInduction`). Short copies make the
      induction head (which needs only the current token) pay off where longer-range
      shortcuts that need the previous token to be a copy too do not.
    * ``perm_seed``: seed of the fixed random permutation ``perm`` of ``0..d_vocab-1``.
    * ``bos``: put a BOS token at position 0.
    * ``score``: which positions are answer positions (scored by ``loss``/``accuracy``):
      ``"all"`` (every position that has a next token, the usual language-modelling
      objective) or ``"repeat"`` (only the induction positions: inside the span copy where
      the next token is also in the copy, and before each bigram copy).
    """

    d_vocab: int = 64
    seq_len: int = 64
    min_span: int = 8
    max_span: int = 24
    max_gap: int | None = None
    skip_p: float = 0.0
    copy_p: float = 0.0
    perm_seed: int = 0
    bos: bool = True
    score: str = "all"

    def __post_init__(self) -> None:
        for name, minimum in (("d_vocab", 2), ("seq_len", 4), ("min_span", 2), ("max_span", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
        if self.min_span > self.max_span:
            raise ValueError(f"min_span ({self.min_span}) must be <= max_span ({self.max_span})")
        if self.max_gap is not None and (isinstance(self.max_gap, bool) or not isinstance(self.max_gap, int)
                                         or self.max_gap < 0):
            raise ValueError(f"max_gap: expected None or an int >= 0, got {self.max_gap!r}")
        if isinstance(self.skip_p, bool) or not isinstance(self.skip_p, (int, float)) or not 0 <= self.skip_p <= 1:
            raise ValueError(f"skip_p: expected a number in [0, 1], got {self.skip_p!r}")
        if isinstance(self.copy_p, bool) or not isinstance(self.copy_p, (int, float)) or not 0 <= self.copy_p <= 1:
            raise ValueError(f"copy_p: expected a number in [0, 1], got {self.copy_p!r}")
        if isinstance(self.perm_seed, bool) or not isinstance(self.perm_seed, int) or self.perm_seed < 0:
            raise ValueError(f"perm_seed: expected an int >= 0, got {self.perm_seed!r}")
        if not isinstance(self.bos, bool):
            raise ValueError(f"bos: expected a bool, got {self.bos!r}")
        body = self.seq_len - int(self.bos)
        if 2 * self.max_span > body:
            raise ValueError(
                f"two copies of a span of max_span={self.max_span} tokens must fit in the "
                f"{body} non-BOS positions (seq_len={self.seq_len}); lower max_span or raise seq_len"
            )
        if self.score not in SCORES:
            raise ValueError(f"score: expected one of {SCORES}, got {self.score!r}")


class Repeats(Task):
    """Random text with one repeated span, scored as next-token prediction.

    Generative process per sequence (``T = seq_len``, ``o = 1`` with BOS else 0):

    * ``L ~ Uniform{min_span..max_span}``; the gap between source and copy
      ``g ~ Uniform{0..min(max_gap, T-o-2L)}`` (``max_gap=None``: no cap); the source's
      start ``s ~ Uniform{o .. T-2L-g}``; the copy's start ``c = s + L + g`` (so the source
      ``[s, s+L)`` ends ``g`` tokens before the copy ``[c, c+L)`` begins, and both lie
      anywhere in the sequence: the distance ``c - s`` between an occurrence and its
      repeat varies from ``L`` to ``T-o-L`` and no fixed positional offset finds it);
    * ``x_0 = BOS = d_vocab`` (if ``bos``); then, left to right for ``t >= o``: in the copy
      (``c <= t < c+L``) ``x_t = x_{s+(t-c)}``; otherwise, if ``t-2 >= o``, neither ``t``
      nor ``t-2`` lies in the source or the copy, and a Bernoulli(``skip_p``) draw
      succeeds, ``x_t = perm[x_{t-2}]``; otherwise ``x_t ~ Uniform{0..d_vocab-1}``; and
      then, if ``x_{t-1}`` occurred at an earlier position ``t-1 > j >= o`` (the latest
      such ``j``) and a Bernoulli(``copy_p``) draw succeeds, ``x_t = x_{j+1}`` instead
      (a bigram copy; never inside the span copy). (The
      spans are kept free of the rule: a rule inside the source would let a head find
      the answer by matching ``perm[x_i]`` two positions after the earlier ``x_i``, a
      shortcut that skips the induction mechanism.)

    Annotations:

    * ``targets[i] = x_{i+1}`` at every answer position ``i``;
    * repeat positions: ``c <= i <= c+L-2`` (the current token and the next token are
      both in the copy); for those ``answer_sources[i, s + (i+1-c)] = True``: the key
      holding the next token's first occurrence, i.e. ``i - (c - s) + 1``, the position
      just after the earlier occurrence of ``x_i`` (the induction target). All other rows
      of ``answer_sources`` are False except for bigram copies (position ``c-1``'s target
      ``x_c`` is also at ``s``, but nothing in the context says the copy starts there);
    * bigram copies: a copy at ``t`` from ``j`` makes ``i = t-1`` an induction position
      with ``answer_sources[t-1, j+1] = True``;
    * ``answer_mask``: every ``i <= T-2`` with ``score="all"``; with ``score="repeat"`` the
      induction positions (rows of ``answer_sources`` with a source).

    Random numbers are drawn in a fixed order: ``L``, ``g``, ``s``, then per position ``t``
    (whatever the outcome) one uniform for the bigram copy (only if ``copy_p > 0``), one
    for the skip rule and one uniform token.
    Chance accuracy: ``1 / d_vocab``. ``model_overrides`` sets the model's ``d_vocab``
    (``d_vocab + 1`` with BOS) and ``n_ctx`` (``seq_len``).
    """

    name = "repeats"

    def __init__(self, config: RepeatsConfig | None = None) -> None:
        self.config = config if config is not None else RepeatsConfig()
        if not isinstance(self.config, RepeatsConfig):
            raise ValueError(f"config: expected a RepeatsConfig, got {type(self.config).__name__}")
        cfg = self.config
        self.bos_token: int | None = cfg.d_vocab if cfg.bos else None
        self.d_vocab = cfg.d_vocab + int(cfg.bos)
        self.n_ctx = cfg.seq_len
        self.chance = 1.0 / cfg.d_vocab
        self.model_overrides = {"d_vocab": self.d_vocab, "n_ctx": cfg.seq_len}
        self.perm: Int[Tensor, "d_vocab"] = torch.randperm(
            cfg.d_vocab, generator=torch.Generator().manual_seed(cfg.perm_seed)
        )

    def sample_with_spans(self, n: int, generator: torch.Generator) -> tuple[Batch, Int[Tensor, "n 3"]]:
        """A batch and its spans: ``spans[b] = (s, c, L)`` (source start, copy start, length)."""
        check_sample_args(n, generator)
        cfg = self.config
        T, o = cfg.seq_len, int(cfg.bos)
        length = torch.randint(cfg.min_span, cfg.max_span + 1, (n,), generator=generator)
        room = T - o - 2 * length  # random tokens not in the source or the copy
        gap_max = room if cfg.max_gap is None else room.clamp(max=cfg.max_gap)
        gap = (torch.rand(n, generator=generator) * (gap_max + 1)).long()  # g ~ U{0..gap_max}
        s = o + (torch.rand(n, generator=generator) * (room - gap + 1)).long()  # s ~ U{o..T-2L-g}
        c = s + length + gap
        k = torch.arange(T)[None, :] - c[:, None]  # offset into the copy
        x = torch.zeros(n, T, dtype=torch.long)
        if cfg.bos:
            x[:, 0] = cfg.d_vocab
        rows = torch.arange(n)
        pos = torch.arange(T)[None, :]
        spans = ((pos >= s[:, None]) & (pos < (s + length)[:, None])) | ((k >= 0) & (k < length[:, None]))
        sources = torch.zeros(n, T, T, dtype=torch.bool)
        last = torch.full((n, cfg.d_vocab), -1, dtype=torch.long)  # most recent position < t-1 of each token
        for t in range(o, T):
            if cfg.copy_p > 0:
                v = torch.rand(n, generator=generator)
            u = torch.rand(n, generator=generator)
            fresh = torch.randint(0, cfg.d_vocab, (n,), generator=generator)
            if t - 2 >= o:
                rule = (u < cfg.skip_p) & ~spans[:, t] & ~spans[:, t - 2]
                fresh = torch.where(rule, self.perm[x[:, t - 2]], fresh)
            in_copy = (k[:, t] >= 0) & (k[:, t] < length)
            if cfg.copy_p > 0 and t - 1 >= o:
                prev = x[:, t - 1]
                j = last[rows, prev]  # earlier occurrence of x_{t-1} (before t-1), or -1
                event = (j >= 0) & (v < cfg.copy_p) & ~in_copy
                fresh = torch.where(event, x[rows, (j + 1).clamp(0, T - 1)], fresh)
                sources[rows[event], t - 1, (j + 1)[event]] = True
                last[rows, prev] = t - 1
            copied = x[rows, (s + k[:, t]).clamp(0, T - 1)]
            x[:, t] = torch.where(in_copy, copied, fresh)

        repeat = (k >= 0) & (k <= length[:, None] - 2)  # c <= i <= c+L-2
        b_idx, i_idx = repeat.nonzero(as_tuple=True)
        sources[b_idx, i_idx, s[b_idx] + (i_idx + 1 - c[b_idx])] = True
        if cfg.score == "all":
            mask = torch.zeros(n, T, dtype=torch.bool)
            mask[:, : T - 1] = True
        else:
            mask = sources.any(-1)
        targets = torch.full((n, T), IGNORE_INDEX, dtype=torch.long)
        targets[:, : T - 1] = x[:, 1:]
        targets = torch.where(mask, targets, torch.full_like(targets, IGNORE_INDEX))
        return Batch(x, targets, mask, sources), torch.stack([s, c, length], dim=1)

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """Draw ``n`` sequences following the process in the class docstring."""
        return self.sample_with_spans(n, generator)[0]
