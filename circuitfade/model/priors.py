"""Attention priors: additive biases on the attention scores that a gate can fade.

A prior is a small module that, given what an attention layer sees, returns a
bias ``[batch or 1, head, query_pos, key_pos]``. The attention layer multiplies
it by the prior's gate ``g[head]`` and adds it to ``Q·K/√d_head`` *before* the
causal mask, so no prior can ever let a query see the future.

Two priors ship with the paper's model (Section 3.1 of the main paper):

* ``pos`` - :class:`RelativePositionBias`, a learned per-head table over the
  relative distance ``i - j`` (``B^pos_ij = b[h, i - j]``).
* ``content`` - :class:`BilinearContentBias`, a learned per-head rank-``r``
  bilinear form of the query and key *token embeddings*
  (``B^content_ij = (e_i U_h)·(e_j V_h) / √r``).

Published biases live in :mod:`circuitfade.model.zoo` and are registered when
:mod:`circuitfade.model` is imported: ``alibi``, ``t5``, ``kerple_log``, ``kerple_power``,
``fire``, ``cope``, ``dape``, ``gpsa``. Schemes that are not additive biases
(learned absolute positions, NoPE, RoPE) are backbone options
(``positional_embedding_type``); the paper's thirteen static baselines are
configs of this model, listed in :mod:`studies.paper.static_baselines`.

New priors register with :func:`register_prior`; the model then gives each one
a gate (learned / fixed / scheduled), a hook ``hook_<name>_bias`` and a hook
``hook_gate_<name>``, with no change to the model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor


@dataclass(frozen=True)
class PriorInputs:
    """What a prior may look at in one attention layer's forward pass.

    ``token_embed`` is the output of ``hook_embed`` (the token embeddings, shared by
    all layers); ``resid`` is the normalised layer input that feeds Q and K;
    ``scores`` are the raw ``Q·K/√d_head`` scores (only priors that declare
    ``needs_scores = True`` get them; otherwise ``None``). ``query_index`` (the
    answer-position fast path) names the only query rows the layer needs: a prior
    may return just those rows, ``[..., len(query_index), key_pos]``, or all rows
    (the layer then keeps the ones asked for).

    On the fused path with token inputs, ``tokens`` and ``W_E`` are the token ids and the
    embedding matrix (``token_embed == W_E[tokens]``; with a member axis ``[E, batch, pos]`` and
    ``[E, d_vocab, d_model]``): a prior that is linear in the token embedding may compute its
    values once per vocabulary entry and look them up (:func:`per_token`). Elsewhere ``None``.
    """

    token_embed: Float[Tensor, "batch pos d_model"]
    resid: Float[Tensor, "batch pos d_model"]
    scores: Float[Tensor, "batch head query_pos key_pos"] | None = None
    query_index: Tensor | None = None
    tokens: Int[Tensor, "batch pos"] | None = None
    W_E: Float[Tensor, "d_vocab d_model"] | None = None


def lookup(table: Float[Tensor, "*members rows d"], index: Int[Tensor, "*members ..."]) -> Float[Tensor, "*members ... d"]:
    """``table[index]``: the rows of ``table`` named by ``index`` (any shape), as one ``index_select``
    (on one CPU thread several times faster than advanced indexing, forward and backward, with the
    same values and the same gradients: both sum a row's gradients in the order of ``index``). With
    a member axis (``table [E, rows, d]``, ``index [E, ...]``) each member's rows come from its own
    table, in the same one lookup."""
    if table.dim() == 2:
        return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[-1])
    E, R = table.shape[:2]
    offset = (torch.arange(E, device=index.device) * R).view(E, *(1,) * (index.dim() - 1))
    return table.reshape(E * R, table.shape[-1]).index_select(0, (index + offset).reshape(-1)).view(
        *index.shape, table.shape[-1])


def per_token(inputs: PriorInputs, w: Float[Tensor, "*members d_model n"]) -> Float[Tensor, "*members batch pos n"]:
    """``token_embed @ w``, computed once per vocabulary entry and looked up where that is less
    work (``inputs.tokens`` known and ``d_vocab < batch * pos``): ``(W_E @ w)[tokens]``, the same
    values (each row is the same dot products), gradients equal up to float rounding (summed
    per token instead of per position). With a member axis ``w [E, d_model, n]``: one ``bmm``
    and each member's own lookup."""
    e, tokens, W_E = inputs.token_embed, inputs.tokens, inputs.W_E
    if tokens is None or W_E is None or W_E.shape[-2] >= tokens.shape[-2] * tokens.shape[-1]:
        if w.dim() == 2:
            return e @ w
        # [E, batch, pos, d_model] @ [E, d_model, n], one bmm
        return torch.bmm(e.reshape(w.shape[0], -1, e.shape[-1]), w).view(*e.shape[:-1], w.shape[-1])
    return lookup(W_E @ w if w.dim() == 2 else torch.bmm(W_E, w), tokens)  # table [*E, d_vocab, n]


class AttentionPrior(nn.Module):
    """Base class: ``forward(inputs) -> Float[Tensor, "batch_or_1 head query_pos key_pos"]``.

    Subclasses set ``name`` (used for hook and gate names) and may set
    ``needs_scores``. The returned bias is *before* gating; values above the
    diagonal (``key_pos > query_pos``) are ignored because the causal mask is
    applied after the prior is added.
    """

    name: str = "prior"
    needs_scores: bool = False
    token_factors: bool = False
    """``True`` where :meth:`factors` at each position is a function of that position's token
    embedding alone (not of its position, the residual stream or other positions): the fused
    path may then compute the factors once per vocabulary entry (on ``token_embed = W_E`` as one
    example of ``d_vocab`` positions, ``resid`` the same tensor, no ``tokens``) and look them up."""
    factor_width: int | None = None
    """The number of columns of each of :meth:`factors`' ``(a, b)`` (the rank of ``B = a b^T``), where
    the prior has per-token factors and knows it without computing them: the fused path then
    fills a prior whose gate is exactly zero with zero columns instead of computing its factors."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_ctx = cfg.n_ctx
        self.layer = layer

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "batch head query_pos key_pos"]:
        raise NotImplementedError

    def factors(self, inputs: PriorInputs) -> tuple[Tensor, Tensor] | None:
        """Optional low-rank form ``(a, b)`` with ``forward(inputs) == a @ b.transpose(-1, -2)``
        (``a``: ``[batch, head, query_pos, r]``, ``b``: ``[batch, head, key_pos, r]``).

        The fused path then folds the prior into the query-key product (one matmul,
        no ``[batch, head, q, k]`` bias tensor). ``None`` (the default): use ``forward``.
        """
        return None

    def member_term(self, inputs: PriorInputs, weights: Mapping[str, Tensor]) -> tuple[Tensor, Tensor] | Tensor | None:
        """This prior for E models of one shape at once: ``weights[name]`` is each of its parameters
        stacked ``[E, *shape]`` and ``inputs`` carry a leading member axis; the result is what
        :meth:`factors` (a tuple) or else :meth:`forward` gives, with that axis in front. ``None``
        (the default): no such form; the stacked model then calls the prior once per member."""
        return None


def relative_distance(n_ctx: int, device=None) -> torch.Tensor:
    """``[n_ctx, n_ctx]`` long tensor with entry ``[i, j] = max(i - j, 0)``.

    Entries above the diagonal are clamped to 0: they are masked anyway, and a
    valid index keeps the gather simple.
    """
    pos = torch.arange(n_ctx, device=device)
    return (pos[:, None] - pos[None, :]).clamp(min=0)


class RelativePositionBias(AttentionPrior):
    """Learned per-head bias over relative position: ``B^pos[h, i, j] = b[h, i - j]``.

    ``b`` has one entry per head and distance ``0 .. n_ctx - 1`` and starts at zero,
    so the prior begins neutral and learns whatever locality helps.
    """

    name = "pos"

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.pos_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.n_ctx, dtype=cfg.dtype))
        self.register_buffer("rel_index", relative_distance(cfg.n_ctx), persistent=False)

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        return self._bias(self.pos_bias, inputs)

    def member_term(self, inputs: PriorInputs, weights: Mapping[str, Tensor]) -> Tensor | None:
        """``[E, 1, head, query_pos, key_pos]`` from ``weights["pos_bias"]`` ``[E, head, n_ctx]``."""
        if type(self).forward is not RelativePositionBias.forward:
            return None  # a subclass with a bias of its own
        return self._bias(weights["pos_bias"], inputs)

    def _bias(self, pos_bias: Float[Tensor, "*members head n_ctx"], inputs: PriorInputs) -> Tensor:
        n = inputs.token_embed.shape[-2]
        index = self.rel_index[:n, :n]
        if inputs.query_index is not None:
            index = index[inputs.query_index]
        return pos_bias[..., index].unsqueeze(-4)


class BilinearContentBias(AttentionPrior):
    """Per-head low-rank bilinear content bias on the token embeddings.

    ``B^content[b, h, i, j] = (e_i W_cq[h]) · (e_j W_ck[h]) / √r`` where ``e_i`` is
    the token embedding at position ``i`` (``hook_embed``), ``W_cq, W_ck`` are
    ``[head, d_model, r]`` and ``r = cfg.content_rank`` (4 by default). It sees
    tokens, not positions, so on a NoPE backbone it carries no position signal.
    """

    name = "content"

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        r = cfg.content_rank
        self.scale = 1.0 / math.sqrt(r)
        # Named W_* so HookedTransformer.init_weights gives them its normal init.
        self.W_cq = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, r, dtype=cfg.dtype))
        self.W_ck = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, r, dtype=cfg.dtype))
        nn.init.normal_(self.W_cq, std=cfg.d_model**-0.5)
        nn.init.normal_(self.W_ck, std=cfg.d_model**-0.5)

    @property
    def token_factors(self) -> bool:
        """Its factors are per-token (``e_i U_h``, ``e_j V_h``), unless a subclass has factors of its own."""
        return type(self).factors is BilinearContentBias.factors and type(self)._factors is BilinearContentBias._factors

    @property
    def factor_width(self) -> int | None:
        """``r`` (``cfg.content_rank``) where its factors are its own (:attr:`token_factors`)."""
        return self.W_cq.shape[-1] if self.token_factors else None

    def factors(self, inputs: PriorInputs) -> tuple[Tensor, Tensor]:
        return self._factors(self.W_cq, self.W_ck, inputs)

    def member_term(self, inputs: PriorInputs, weights: Mapping[str, Tensor]) -> tuple[Tensor, Tensor] | None:
        """The factors ``[E, batch, head, pos, r]`` from ``weights["W_cq"]``, ``weights["W_ck"]`` ``[E, head, d_model, r]``."""
        if type(self).factors is not BilinearContentBias.factors:
            return None  # a subclass with factors of its own
        return self._factors(weights["W_cq"], weights["W_ck"], inputs)

    def _factors(self, W_cq: Tensor, W_ck: Tensor, inputs: PriorInputs) -> tuple[Tensor, Tensor]:
        """Both factors from one matrix product ``e @ [W_cq | W_ck]`` (``[d_model, head * 2r]``; with a
        member axis one ``bmm``; per vocabulary entry where that is less work: :func:`per_token`),
        queries then kept at ``query_index``: fewer, larger kernels than a product per factor."""
        H, D, r = W_cq.shape[-3:]
        w = torch.cat([W_cq, W_ck], -1).movedim(-3, -2).flatten(-2)  # [*E, d_model, head * 2r]
        both = per_token(inputs, w).unflatten(-1, (H, 2 * r)).transpose(-3, -2)  # [*E, batch, head, pos, 2r]
        cq, ck = both[..., :r], both[..., r:]
        if inputs.query_index is not None:
            cq = cq[..., inputs.query_index, :]
        return cq * self.scale, ck  # [*E, batch, head, query_pos, r], [*E, batch, head, pos, r]

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "batch head query_pos key_pos"]:
        cq, ck = self.factors(inputs)
        return cq @ ck.transpose(-1, -2)  # [batch, head, query_pos, key_pos]


PriorFactory = Callable[..., AttentionPrior]
PRIORS: dict[str, PriorFactory] = {
    "pos": RelativePositionBias,
    "content": BilinearContentBias,
}


def register_prior(name: str, factory: PriorFactory) -> None:
    """Make ``factory(cfg, layer)`` available as prior ``name`` in ``SoftPriorConfig.priors``."""
    if not name.isidentifier():
        raise ValueError(f"prior name must be a Python identifier (it names hooks), got {name!r}")
    PRIORS[name] = factory


def build_prior(name: str, cfg, layer: int) -> AttentionPrior:
    if name not in PRIORS:
        raise ValueError(f"unknown prior {name!r}; known priors: {sorted(PRIORS)}")
    prior = PRIORS[name](cfg, layer)
    prior.name = name
    return prior
