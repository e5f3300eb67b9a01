"""All-head attention screens: induction, previous-token and BOS-attractor heads.

These work on any TransformerLens ``HookedTransformer`` (including
``SoftPriorTransformer``): every head of every layer is scored at once from a
single ``run_with_cache`` per input that keeps only the ``hook_pattern``
activations. This is the "capability-specific selectivity screen" of the
developmental-trajectory paper ("When Do Attention Circuits Form?"): each head is scored on the input
that elicits the capability and on a matched control input, and the head is
classified by the difference (the selectivity), so a head that attends to the
right place only by positional accident is not counted.

Notation. ``A[b, h, t, j]`` is the attention pattern (softmax probabilities,
after the causal mask) of head ``h`` from query position ``t`` to key position
``j`` in sequence ``b``; rows sum to one over the visible keys ``j <= t``.
``T`` is the number of positions. Every score is a mean over the batch and
over the query positions it names, giving one number per ``[layer, head]``.

Inputs (built with an explicit ``torch.Generator``, so screens are
reproducible):

* ``repeated_tokens``: ``[BOS] s s`` with ``s`` ``L`` distinct random tokens;
* ``control_tokens``: ``[BOS] s u`` of the same length with no repeated span;
* ``ordinary_tokens``: ``[BOS]`` followed by i.i.d. uniform random tokens.

Scores (``prefix`` is the number of tokens before the first copy, 1 with a
BOS token and 0 without):

* induction score: mean of ``A[t, t - L + 1]`` over ``t`` in
  ``[prefix + L, prefix + 2L)``, i.e. attention from each second-copy token to
  the position just after that token's first occurrence;
* previous-token score: mean of ``A[t, t - 1]`` over ``t >= 1``;
* BOS score: mean of ``A[t, 0]`` over ``t >= 1`` (the attention mass on
  position 0, whether or not it holds a BOS token).

``capability_selectivity`` defines capability, control and selectivity for each
score; ``classify_heads`` thresholds them (``DEFAULT_THRESHOLDS``).

Relation to TransformerLens's ``head_detector.detect_head`` (``error_measure="mul"``,
no exclusions), which divides the attention on the detection pattern by the total
attention ``T`` of the sequence: on the same tokens,
``detect_head(..., "previous_token_head") == previous_token_score * (T - 1) / T`` and,
on ``repeated_tokens`` (distinct first copy), ``detect_head(..., "induction_head") ==
induction_score * L / T`` (checked in ``tests/library/analysis/test_screens.py``). Our scores are
per-query means, so they do not shrink with the prefix or the first copy.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitfade.store.tracing import per_head_frame
from circuitfade.tasks import Batch

SCORES = ("induction", "previous_token", "bos")
"""The three head classes, in the order used for labels."""

KINDS = ("capability", "control", "selectivity")
"""For each score: its value on the capability input, on the control, and the difference."""

METRICS = tuple(f"{score}_{kind}" for score in SCORES for kind in KINDS)
"""Metric names in ``capability_selectivity`` frames, e.g. ``"induction_selectivity"``."""

CLASS_METRICS = {
    "induction": "induction_selectivity",
    "previous_token": "previous_token_selectivity",
    "bos": "bos_capability",
}
"""The metric each class is thresholded on (a head is in the class iff metric >= threshold)."""

DEFAULT_THRESHOLDS = {"induction": 0.3, "previous_token": 0.3, "bos": 0.5}
"""Default class thresholds.

* ``induction``: induction selectivity >= 0.3, i.e. on repeated sequences the head
  puts at least 0.3 more attention on the induction target ``t - L + 1`` than it puts
  on that same relative position in a matched sequence without repeats;
* ``previous_token``: previous-token selectivity >= 0.3, i.e. at least 0.3 more
  attention on ``t - 1`` than on a typical other visible position;
* ``bos``: BOS mass >= 0.5, i.e. at least half of the attention of the average
  query (``t >= 1``) goes to position 0 (a BOS attractor / attention sink).
"""

DEFAULT_SEQ_LEN = 50
"""Default half-length ``L`` of the screen inputs (capped by ``n_ctx`` and the vocabulary)."""


# -- inputs ------------------------------------------------------------------------------


def _token_pool(d_vocab: int, bos: int | None) -> Tensor:
    """The token ids the builders draw from: ``0 .. d_vocab-1`` without ``bos``."""
    if not isinstance(d_vocab, int) or d_vocab < 2:
        raise ValueError(f"d_vocab must be an int >= 2, got {d_vocab!r}")
    if bos is not None and not (isinstance(bos, int) and 0 <= bos < d_vocab):
        raise ValueError(f"bos must be None or a token id in [0, {d_vocab}), got {bos!r}")
    pool = torch.arange(d_vocab)
    return pool if bos is None else pool[pool != bos]


def _check_counts(n: int, seq_len: int, minimum: int = 1) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n (number of sequences) must be an int >= 1, got {n!r}")
    if not isinstance(seq_len, int) or seq_len < minimum:
        raise ValueError(f"seq_len must be an int >= {minimum}, got {seq_len!r}")


def _distinct_rows(pool: Tensor, n: int, k: int, generator: torch.Generator) -> Int[Tensor, "n k"]:
    """``n`` rows of ``k`` distinct tokens drawn uniformly without replacement from ``pool``."""
    if k > len(pool):
        raise ValueError(f"cannot draw {k} distinct tokens from a vocabulary of {len(pool)} usable tokens")
    keys = torch.rand(n, len(pool), generator=generator)
    return pool[keys.argsort(dim=1)[:, :k]]


def _with_bos(tokens: Int[Tensor, "n pos"], bos: int | None) -> Int[Tensor, "n pos_out"]:
    if bos is None:
        return tokens
    return torch.cat([torch.full((tokens.shape[0], 1), bos, dtype=tokens.dtype), tokens], dim=1)


def repeated_tokens(
    d_vocab: int, n: int, seq_len: int, generator: torch.Generator, bos: int | None = None
) -> Int[Tensor, "n pos"]:
    """The induction capability input: ``[BOS] s s``, shape ``[n, 2*seq_len (+1 with BOS)]``.

    ``s`` holds ``seq_len`` distinct tokens drawn uniformly without replacement from
    ``range(d_vocab)`` minus ``bos`` (distinct so that every second-copy token has
    exactly one earlier occurrence, and the induction target is unique). Raises
    ValueError when the vocabulary has fewer than ``seq_len`` usable tokens.
    """
    _check_counts(n, seq_len, minimum=2)
    first = _distinct_rows(_token_pool(d_vocab, bos), n, seq_len, generator)
    return _with_bos(torch.cat([first, first], dim=1), bos)


def control_tokens(
    d_vocab: int, n: int, seq_len: int, generator: torch.Generator, bos: int | None = None
) -> Int[Tensor, "n pos"]:
    """The matched induction control: ``[BOS] s u``, same shape as ``repeated_tokens``.

    If the vocabulary has at least ``2*seq_len`` usable tokens, all ``2*seq_len``
    tokens are distinct (no token repeats, so there is nothing to induct from).
    Otherwise ``s`` and ``u`` are each ``seq_len`` distinct tokens drawn
    independently (the second half drawn fresh), so no span of ``s`` is repeated
    except by chance.
    """
    _check_counts(n, seq_len, minimum=2)
    pool = _token_pool(d_vocab, bos)
    if 2 * seq_len <= len(pool):
        body = _distinct_rows(pool, n, 2 * seq_len, generator)
    else:
        body = torch.cat([_distinct_rows(pool, n, seq_len, generator), _distinct_rows(pool, n, seq_len, generator)], 1)
    return _with_bos(body, bos)


def ordinary_tokens(
    d_vocab: int, n: int, seq_len: int, generator: torch.Generator, bos: int | None = None
) -> Int[Tensor, "n pos"]:
    """Plain random text: ``[BOS]`` then ``seq_len`` i.i.d. uniform tokens (``bos`` excluded).

    Shape ``[n, seq_len (+1 with BOS)]``.
    """
    _check_counts(n, seq_len)
    pool = _token_pool(d_vocab, bos)
    idx = torch.randint(len(pool), (n, seq_len), generator=generator)
    return _with_bos(pool[idx], bos)


# -- attention patterns and scores -------------------------------------------------------


def _check_tokens(model, tokens) -> Tensor:
    if isinstance(tokens, Batch):
        tokens = tokens.tokens
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise ValueError(f"tokens must be an integer tensor [batch, pos], got {getattr(tokens, 'shape', tokens)!r}")
    if tokens.shape[1] < 2:
        raise ValueError(f"tokens need at least 2 positions, got {tokens.shape[1]}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"tokens have {tokens.shape[1]} positions but the model's n_ctx is {model.cfg.n_ctx}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= model.cfg.d_vocab):
        raise ValueError(f"token ids must lie in [0, {model.cfg.d_vocab}), got [{tokens.min()}, {tokens.max()}]")
    return tokens


def layer_activations(model, tokens: Int[Tensor, "batch pos"], hook: str) -> list[Tensor]:
    """The activation ``blocks.{l}.attn.{hook}`` of every layer on ``tokens``, as a list.

    One ``run_with_cache`` with a ``names_filter`` that keeps only those hook points
    (logits are not computed). Tensors are detached, float32 or wider, on the CPU;
    the model is not modified. Raises ValueError for malformed tokens or a hook the
    model does not have.
    """
    tokens = _check_tokens(model, tokens)
    names = [f"blocks.{layer}.attn.{hook}" for layer in range(model.cfg.n_layers)]
    missing = [name for name in names if name not in model.hook_dict]
    if missing:
        raise ValueError(f"model has no hook points {missing[:3]}{'...' if len(missing) > 3 else ''}")
    wanted = set(names)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens.to(model.cfg.device), names_filter=lambda name: name in wanted, return_type=None
        )
    out = []
    for name in names:
        act = cache[name].detach().cpu()
        out.append(act if act.dtype == torch.float64 else act.float())
    return out


def attention_patterns(model, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer batch head q k"]:
    """Every head's attention pattern (``hook_pattern``) on ``tokens``, stacked over layers.

    From one ``run_with_cache`` that keeps only ``blocks.{l}.attn.hook_pattern``.
    """
    return torch.stack(layer_activations(model, tokens, "hook_pattern"))


def _induction(pattern: Tensor, half_len: int | None, prefix: int | None) -> Tensor:
    """Mean ``A[t, t-L+1]`` over ``t in [prefix+L, prefix+2L)`` -> ``[layer, head]``."""
    n_pos = pattern.shape[-1]
    if prefix is None:
        prefix = n_pos % 2
    if half_len is None:
        half_len = (n_pos - prefix) // 2
    if prefix < 0 or half_len < 2 or prefix + 2 * half_len > n_pos:
        raise ValueError(
            f"need prefix >= 0 and half_len >= 2 with prefix + 2*half_len <= {n_pos} positions, "
            f"got prefix={prefix}, half_len={half_len}"
        )
    queries = torch.arange(prefix + half_len, prefix + 2 * half_len)
    keys = queries - half_len + 1
    return pattern[..., queries, keys].mean(dim=(1, 3))


def _to_position(pattern: Tensor, key_of_query) -> tuple[Tensor, Tensor]:
    """(mean attention on the named key, mean attention on a typical other visible key).

    Over queries ``t >= 1``; the control for query ``t`` is
    ``(sum_{j<=t} A[t, j] - A[t, key]) / t``, the mean over the ``t`` other visible keys.
    """
    n_pos = pattern.shape[-1]
    queries = torch.arange(1, n_pos)
    keys = key_of_query(queries)
    target = pattern[..., queries, keys]  # [layer batch head q]
    visible = torch.tril(torch.ones(n_pos, n_pos, dtype=pattern.dtype))[queries]  # [q k]
    row_mass = (pattern[..., queries, :] * visible).sum(-1)
    other = (row_mass - target) / queries.to(pattern.dtype)
    return target.mean(dim=(1, 3)), other.mean(dim=(1, 3))


def induction_score(
    model, batch: Int[Tensor, "batch pos"] | Batch, *, half_len: int | None = None, prefix: int | None = None
) -> Float[Tensor, "layer head"]:
    """Mean attention from each second-copy position ``t`` to ``t - L + 1``.

    ``batch``: token ids ``[batch, pos]`` (or a :class:`~circuitfade.tasks.Batch`: its
    ``tokens``), as every screen takes them. For ``batch = [prefix tokens] s s`` with ``len(s) = L``: the mean over the batch
    and over ``t in [prefix + L, prefix + 2L)`` of ``A[t, t - L + 1]``, the position just
    after the first occurrence of the token at ``t``. ``prefix`` defaults to
    ``pos % 2`` (1 for ``[BOS] s s``, 0 for ``s s``) and ``half_len`` to
    ``(pos - prefix) // 2``. The token content is not checked, so the same positional
    score on ``control_tokens`` gives the induction control.
    """
    return _induction(attention_patterns(model, batch), half_len, prefix)


def previous_token_score(model, batch: Int[Tensor, "batch pos"] | Batch) -> Float[Tensor, "layer head"]:
    """Mean attention from ``t`` to ``t - 1`` over the batch and all ``t >= 1`` (``batch``: token ids
    ``[batch, pos]`` or a :class:`~circuitfade.tasks.Batch`)."""
    return _to_position(attention_patterns(model, batch), lambda q: q - 1)[0]


def bos_score(model, batch: Int[Tensor, "batch pos"] | Batch) -> Float[Tensor, "layer head"]:
    """Mean attention mass on position 0 over the batch and all query positions ``t >= 1`` (``batch``:
    token ids ``[batch, pos]`` or a :class:`~circuitfade.tasks.Batch`)."""
    return _to_position(attention_patterns(model, batch), lambda q: torch.zeros_like(q))[0]


def head_frame(values: Float[Tensor, "layer head"], metric: str) -> pd.DataFrame:
    """A ``[layer, head]`` tensor as tidy rows ``(layer, head, metric, value)``
    (:func:`circuitfade.store.tracing.per_head_frame`, the one helper)."""
    if not isinstance(values, Tensor) or values.ndim != 2:
        raise ValueError(f"values must be a [layer, head] tensor, got {getattr(values, 'shape', values)!r}")
    return per_head_frame(values, metric)


def capability_selectivity(
    model,
    *,
    d_vocab: int | None = None,
    n: int = 32,
    seq_len: int | None = None,
    seed: int = 0,
    bos: int | None = None,
) -> pd.DataFrame:
    """The all-head capability-specific selectivity screen, as tidy rows.

    Columns ``layer, head, metric, value`` with ``metric`` in ``METRICS``
    (``f"{score}_{kind}"``). Three inputs of ``n`` sequences each, from one
    ``torch.Generator`` seeded with ``seed`` (drawn in this order): ``repeated_tokens``,
    ``control_tokens`` (both ``[BOS] s s`` / ``[BOS] s u`` with half-length
    ``L = seq_len``) and ``ordinary_tokens`` of the same total length ``2L``
    (+ BOS). Tokens are drawn from ``range(d_vocab)`` minus ``bos`` (``d_vocab``
    defaults to ``model.cfg.d_vocab``; ``seq_len`` to
    ``min(DEFAULT_SEQ_LEN, (n_ctx - prefix) // 2, usable vocabulary)``).

    * ``induction``: capability = induction score on the repeated input; control =
      the same positional score (attention from ``t`` to ``t - L + 1``) on the control
      input; selectivity = capability - control.
    * ``previous_token``: on the ordinary input, capability = mean ``A[t, t-1]`` and
      control = mean over ``t >= 1`` of the attention on a typical other visible key,
      ``(sum_{j<=t} A[t,j] - A[t,t-1]) / t``; selectivity = capability - control
      (exactly 0 for a uniform head, about 1 for a perfect previous-token head).
    * ``bos``: on the ordinary input, capability = mean ``A[t, 0]`` (BOS mass) and
      control = mean over ``t >= 1`` of ``(sum_{j<=t} A[t,j] - A[t,0]) / t``;
      selectivity = capability - control.
    """
    d_vocab = model.cfg.d_vocab if d_vocab is None else d_vocab
    if d_vocab > model.cfg.d_vocab:
        raise ValueError(f"d_vocab={d_vocab} exceeds the model's vocabulary {model.cfg.d_vocab}")
    prefix = 0 if bos is None else 1
    usable = len(_token_pool(d_vocab, bos))
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, (model.cfg.n_ctx - prefix) // 2, usable)
    if 2 * seq_len + prefix > model.cfg.n_ctx:
        raise ValueError(f"2*seq_len + prefix = {2 * seq_len + prefix} exceeds the model's n_ctx {model.cfg.n_ctx}")
    generator = torch.Generator().manual_seed(seed)
    rep = repeated_tokens(d_vocab, n, seq_len, generator, bos)
    ctl = control_tokens(d_vocab, n, seq_len, generator, bos)
    ordinary = ordinary_tokens(d_vocab, n, 2 * seq_len, generator, bos)

    values: dict[str, Tensor] = {}
    values["induction_capability"] = _induction(attention_patterns(model, rep), seq_len, prefix)
    values["induction_control"] = _induction(attention_patterns(model, ctl), seq_len, prefix)
    ordinary_pattern = attention_patterns(model, ordinary)
    values["previous_token_capability"], values["previous_token_control"] = _to_position(
        ordinary_pattern, lambda q: q - 1
    )
    values["bos_capability"], values["bos_control"] = _to_position(ordinary_pattern, lambda q: torch.zeros_like(q))
    for score in SCORES:
        values[f"{score}_selectivity"] = values[f"{score}_capability"] - values[f"{score}_control"]
    return pd.concat([head_frame(values[m], m) for m in METRICS], ignore_index=True)


# -- classification ----------------------------------------------------------------------


def _merge_thresholds(thresholds: Mapping[str, float] | None) -> dict[str, float]:
    merged = dict(DEFAULT_THRESHOLDS)
    if thresholds is not None:
        unknown = set(thresholds) - set(DEFAULT_THRESHOLDS)
        if unknown:
            raise ValueError(f"unknown threshold names {sorted(unknown)}; expected a subset of {list(SCORES)}")
        merged.update({k: float(v) for k, v in thresholds.items()})
    return merged


def classify_heads(
    model_or_scores,
    thresholds: Mapping[str, float] | None = None,
    **screen_kwargs,
) -> pd.DataFrame:
    """Classify every head as induction / previous-token / BOS attractor.

    ``model_or_scores`` is a model (screened with
    ``capability_selectivity(model, **screen_kwargs)``) or a tidy frame from
    ``capability_selectivity`` (columns ``metric, value`` plus identifying columns
    such as ``layer, head`` and optionally ``step`` or run metadata; every column
    other than ``metric`` and ``value`` identifies a row of the result).

    A head is in class ``c`` iff ``CLASS_METRICS[c] >= thresholds[c]``;
    ``thresholds`` overrides ``DEFAULT_THRESHOLDS`` key by key. Returns one row per
    head with the identifying columns, one column per metric, boolean columns
    ``induction``, ``previous_token``, ``bos`` and ``label``: the names of the classes
    the head is in, joined by ``"+"`` in the order of ``SCORES``, or ``"none"``.
    """
    limits = _merge_thresholds(thresholds)
    if isinstance(model_or_scores, pd.DataFrame):
        if screen_kwargs:
            raise ValueError(f"screen options {sorted(screen_kwargs)} only apply when a model is given")
        scores = model_or_scores
    else:
        scores = capability_selectivity(model_or_scores, **screen_kwargs)
    needed = {"metric", "value", "layer", "head"}
    if not needed <= set(scores.columns):
        raise ValueError(f"scores frame needs columns {sorted(needed)}, got {list(scores.columns)}")
    missing = set(CLASS_METRICS.values()) - set(scores["metric"])
    if missing:
        raise ValueError(f"scores frame lacks metrics {sorted(missing)}; expected the output of capability_selectivity")
    index = [c for c in scores.columns if c not in ("metric", "value")]
    if scores.duplicated(index + ["metric"]).any():
        raise ValueError(f"scores frame has several values per ({', '.join(index)}, metric)")
    wide = scores.pivot(index=index, columns="metric", values="value").reset_index()
    wide.columns.name = None
    metric_columns = [m for m in METRICS if m in wide.columns]
    wide = wide[index + metric_columns + [c for c in wide.columns if c not in index + metric_columns]]
    for name in SCORES:
        wide[name] = wide[CLASS_METRICS[name]] >= limits[name]
    wide["label"] = [
        "+".join(name for name in SCORES if row[name]) or "none" for row in wide[list(SCORES)].to_dict("records")
    ]
    return wide
