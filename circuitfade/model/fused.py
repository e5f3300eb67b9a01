"""The fused forward, written once: functions over weights with an optional leading member axis.

The single soft-prior model (:class:`~circuitfade.model.core.SoftPriorCore`) calls them on its own
weights, the stacked model of :mod:`circuitfade.train.stacked` on E members' weights stacked
``[E, *shape]``. :func:`prior_attention` is one attention layer with its gated priors (main paper,
Eq. 1; at every position, or by :func:`rows_attention` at a few query positions with no key or
value product), :func:`fused_block` a block, :func:`fused_logits` the whole forward from the token
embeddings; :func:`fused_path_refusal` says which configs have no fused path.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from circuitfade.model.priors import AttentionPrior, PriorInputs, lookup

__all__ = ["ATTENTION_WEIGHTS", "PriorTerm", "PriorWeights", "ZeroGradient", "causal_mask", "fused_block",
           "fused_logits", "fused_path_refusal", "member_linear", "module_prior_term", "module_prior_weights",
           "prior_attention", "rows_attention", "softcap", "table_qkv", "token_position_table", "zero_gated"]


def fused_path_refusal(cfg) -> str | None:
    """Why a model of ``cfg`` has no fused path (one line; it then runs the hooked path), or ``None``."""
    if cfg.positional_embedding_type == "rotary":
        return "rotary positions have no fused path"
    if getattr(cfg, "attn_scores_soft_cap", -1.0) > 0:
        return "attn_scores_soft_cap caps the query-key scores alone, which the fused path adds to the priors'"
    return None


def softcap(x: Tensor, cap) -> Tensor:
    """``cap · tanh(x / cap)`` for ``cap > 0``, else ``x``."""
    if cap is None or not cap > 0:
        return x
    return cap * torch.tanh(x / cap)


# --------------------------------------------------------------------------------------
# the fused forward, once: weights with or without a leading member axis
# --------------------------------------------------------------------------------------
ATTENTION_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
"""The names of an attention module's weights, the keys :func:`prior_attention` reads."""

PriorTerm = Callable[[str, nn.Module, PriorInputs], "tuple[Tensor, Tensor] | Tensor"]
"""``(name, prior, inputs) ->`` the prior's low-rank factors ``(a, b)`` (``B = a b^T``) or its bias."""


def causal_mask(n: int, device=None) -> Float[Tensor, "pos pos"]:
    """The additive causal mask ``[n, n]``: 0 on and below the diagonal, -inf above."""
    return torch.full((n, n), float("-inf"), device=device).triu(1)


def member_linear(x: Float[Tensor, "*lead rows d_in"], w: Float[Tensor, "*members d_in d_out"],
                  b: Float[Tensor, "*members d_out"]) -> Float[Tensor, "*lead rows d_out"]:
    """``x @ w + b`` with the bias inside the kernel. Without a member axis (``w``
    ``[d_in, d_out]``): one ``F.linear``. With one (``w`` ``[E, d_in, d_out]``, ``b`` ``[E, d_out]``,
    ``x`` ``[E, ..., d_in]``): one ``baddbmm``, the bias added to each member's finished product, as
    the single model's kernel does. Where the product is one block of the BLAS kernel (``d_in``
    up to 64 on every CPU kind the tests emulate) the values equal ``x @ w`` then ``+ b`` bit for
    bit; for wider inputs they may differ by float rounding. The separate add costs more than
    the product's own time on small layers (measured: about a tenth of a training step of the
    default model)."""
    if w.dim() == 2:
        return F.linear(x, w.T, b)
    E = w.shape[0]
    out = torch.baddbmm(b.reshape(E, 1, -1), x.reshape(E, -1, x.shape[-1]), w)
    return out.view(*x.shape[:-1], w.shape[-1])


def token_position_table(
    tokens: Int[Tensor, "*members batch pos"],
    W_E: Float[Tensor, "*members d_vocab d_model"],
    W_pos: Float[Tensor, "*members n_ctx d_model"] | None,
) -> tuple[Tensor, Tensor] | None:
    """The first block's input of token inputs as a table over (token, position), where that is
    less work than the batch: ``(table, index)`` with ``table [*E, d_vocab · pos, d_model]``
    (``W_E[v] + W_pos[p]``; ``W_E`` alone without learned positions) and ``index [*E, batch, pos]``,
    so that ``lookup(table, index) == W_E[tokens] + W_pos[:pos]`` bit for bit; ``None`` where
    the table has no fewer rows than the batch has (token, position) pairs (with learned positions:
    ``d_vocab >= batch``). The first block's LayerNorm and query-key-value product then run once
    per table row (:func:`fused_block`)."""
    V, (B, n) = W_E.shape[-2], tokens.shape[-2:]
    if (V if W_pos is None else V * n) >= B * n:
        return None
    if W_pos is None:
        return W_E, tokens
    table = (W_E.unsqueeze(-2) + W_pos[..., None, :n, :]).flatten(-3, -2)  # [*E, V * n, d_model]
    return table, tokens * n + torch.arange(n, device=tokens.device)


def module_prior_term(name: str, prior: nn.Module, inputs: PriorInputs) -> tuple[Tensor, Tensor] | Tensor:
    """A prior module's own term: its factors where it has them, else its bias (:data:`PriorTerm`)."""
    ab = prior.factors(inputs)
    return prior(inputs) if ab is None else ab


PriorWeights = Callable[[str, nn.Module], Sequence[Tensor]]
"""``(name, prior) ->`` the tensors a prior's term is computed from (its trainable weights)."""


def module_prior_weights(name: str, prior: nn.Module) -> list[Tensor]:
    """A prior module's trainable parameters (:data:`PriorWeights`)."""
    return [w for w in prior.parameters() if w.requires_grad]


def zero_gated(gates: Mapping[str, Tensor]) -> frozenset:
    """The priors whose gate is exactly zero for every head (and member), read where that costs
    nothing: a CPU tensor that takes no gradient (a fixed or scheduled gate's buffer, or an
    override such as ``model.gates(pos=0)``). The fused forward leaves their gated term ``0 · B``
    out where it would only be added: a bias prior's bias, and a low-rank prior's product in the
    last block (:func:`rows_attention`); a low-rank prior keeps its zero columns in the other
    blocks' query-key product, whose columns then do not depend on the gates. The scores are the
    same values bit for bit (a zero term adds nothing; a prior whose values are not finite no
    longer turns them into NaN), and the weights left out get the zero gradient autograd would give
    them (:class:`ZeroGradient`), so an optimizer updates them as before. A learned gate
    (``sigmoid(logit)``) is never exactly zero and is never left out. Under ``torch.compile`` none
    is (reading a gate would break the graph)."""
    if torch.compiler.is_compiling():
        return frozenset()
    return frozenset(n for n, g in gates.items()
                     if g.device.type == "cpu" and not g.requires_grad and not bool(g.any()))


class ZeroGradient(torch.autograd.Function):
    """``ZeroGradient.apply(x, *weights)``: ``x`` (a copy), and in the backward ``x``'s gradient
    passed on and a zero gradient for each of ``weights`` (what ``0 · B(weights)`` would give them,
    so that an optimizer updates them exactly as when the zero-gated term is computed)."""

    @staticmethod
    def forward(ctx, x, *weights):
        ctx.like = [(w.shape, w.dtype, w.device) for w in weights]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.like))


def _low_rank(prior: nn.Module) -> bool:
    """Whether ``prior`` may give low-rank factors (its class has a ``factors`` of its own)."""
    return getattr(type(prior), "factors", None) is not AttentionPrior.factors


def _with_zero_gradient(b_O: Tensor, attn: nn.Module, zero: frozenset, prior_weights: PriorWeights) -> Tensor:
    """``b_O``, carrying the zero gradient of the left-out priors' weights (see :func:`zero_gated`)."""
    weights = [w for n in zero for w in prior_weights(n, attn.priors[n]) if w.requires_grad]
    return ZeroGradient.apply(b_O, *weights) if weights and torch.is_grad_enabled() else b_O


def _head_gate(g: Float[Tensor, "*members head"]) -> Tensor:
    """A gate ``[head]`` as ``[head, 1, 1]``; ``[E, head]`` as ``[E, 1, head, 1, 1]`` (against ``[.., batch, head, q, k]``)."""
    g = g[..., None, None]
    return g if g.dim() == 3 else g.unsqueeze(1)


def _prior_terms(attn: nn.Module, inputs: PriorInputs, gates: Mapping[str, Tensor], prior_term: PriorTerm,
                 dtype: torch.dtype, rows: Tensor | None,
                 skip: frozenset = frozenset()) -> tuple[list[tuple[Tensor, Tensor]], Tensor | None]:
    """Each prior's gated term on ``inputs`` (the priors named in ``skip`` left out): low-rank
    priors as factor pairs ``(g·a, b)`` (``B = a b^T``), the others summed into one bias ``Σ g·B``
    (``None`` if there is none)."""
    factors, bias = [], None
    for name, prior in attn.priors.items():
        if name in skip:
            continue
        g = _head_gate(gates[name].to(dtype))
        term = prior_term(name, prior, inputs)
        if isinstance(term, tuple):
            factors.append((term[0] * g, term[1]))
            continue
        if rows is not None and term.shape[-2] != rows.numel():
            term = term[..., rows, :]  # a prior that ignores query_index: keep the rows asked for
        bias = g * term if bias is None else bias + g * term
    return factors, bias


def table_qkv(attn: nn.Module, table: tuple[Tensor, Tensor], w: Tensor, b: Tensor, W_E: Tensor,
              gates: Mapping[str, Tensor], prior_term: PriorTerm,
              zero: frozenset = frozenset()) -> tuple[Tensor, Tensor, Tensor, frozenset, frozenset]:
    """The first block's queries (already divided by the attention scale), keys and values
    ``[*E, batch, head, pos, d]``, each looked up per head from a table over the first block's
    input rows (:func:`token_position_table`), with the gated factors of the priors whose factors
    are per-token (:attr:`~circuitfade.model.priors.AttentionPrior.token_factors`) computed once
    per vocabulary entry and stored beside the queries and keys as extra columns; and the names of
    those priors. The values equal the batch computation's (each entry is the same elementwise
    operation on the same product); the lookups return each head's rows contiguously, so nothing
    is concatenated or copied at batch size. A folded prior named in ``zero`` (its gate exactly zero,
    :func:`zero_gated`) that declares its :attr:`~circuitfade.model.priors.AttentionPrior.factor_width`
    gets zero columns on both sides instead of its computed factors: each product it adds to a
    score is then ``0 · 0`` instead of ``0 · b``, zero either way, so the scores are the same bit
    for bit and nothing of the prior is computed. Returns the names of the folded priors and of
    those filled with zeros (whose weights then need the zero gradient, :class:`ZeroGradient`)."""
    H, Dh = attn.cfg.n_heads, attn.cfg.d_head
    x_table, index = table
    R, V = x_table.shape[-2], W_E.shape[-2]
    qkv = member_linear(x_table, w, b).unflatten(-1, (3, H, Dh)).movedim(-2, -4)  # [*E, head, R, 3, d_head]
    q, k, v = qkv.unbind(-2)  # [*E, head, R, d_head] each
    qs, ks = [q / attn.attn_scale], [k]
    e = W_E.unsqueeze(-3)  # the vocabulary as one example of V positions: [*E, 1, V, d_model]
    rows_of = PriorInputs(e, e, None)
    folded, filled = [], []
    for name, prior in attn.priors.items():
        if not getattr(prior, "token_factors", False):
            continue
        width = getattr(prior, "factor_width", None)
        if name in zero and width is not None:
            a = bk = q.new_zeros(*q.shape[:-1], width)  # [*E, head, R, r]: 0 · b adds what 0 · 0 adds
            filled.append(name)
        else:
            a, bk = prior_term(name, prior, rows_of)  # [*E, 1, head, V, r]
            a, bk = (a * _head_gate(gates[name].to(q.dtype))).squeeze(-4), bk.squeeze(-4)  # [*E, head, V, r]
            if R != V:  # a (token, position) table: row t * n + p has token t
                a, bk = a.repeat_interleave(R // V, -2), bk.repeat_interleave(R // V, -2)
        qs.append(a)
        ks.append(bk)
        folded.append(name)
    # row index per head: head h's rows start at h * R in the flattened [*E, head * R, d] table
    idx = index.unsqueeze(-2) + (torch.arange(H, device=index.device) * R).unsqueeze(-1)  # [*E, batch, head, pos]
    q = lookup((torch.cat(qs, -1) if len(qs) > 1 else qs[0]).flatten(-3, -2), idx)
    k = lookup((torch.cat(ks, -1) if len(ks) > 1 else ks[0]).flatten(-3, -2), idx)
    return q, k, lookup(v.flatten(-3, -2), idx), frozenset(folded), frozenset(filled)


def prior_attention(
    attn: nn.Module,
    x: Float[Tensor, "*members batch pos d_model"],
    token_embed: Float[Tensor, "*members batch pos d_model"],
    causal: Float[Tensor, "pos pos"],
    weights: Mapping[str, Tensor],
    gates: Mapping[str, Tensor],
    rows: Int[Tensor, "n_rows"] | None = None,
    prior_term: PriorTerm = module_prior_term,
    vocab: tuple[Tensor, Tensor] | None = None,
    table: tuple[Tensor, Tensor] | None = None,
    prior_weights: PriorWeights = module_prior_weights,
) -> Float[Tensor, "*members batch pos_or_rows d_model"]:
    """The fused attention with priors (main paper, Eq. 1), per (member,) batch and head::

        softmax(Q K^T / attn_scale + Σ_p g_p B^p + causal) V W_O + b_O

    one QKV matmul, low-rank priors ``B = a b^T`` as extra query-key columns, the other priors
    (gated) plus the causal mask added to the scores. ``attn``: the attention module whose
    ``priors``, ``attn_scale`` and ``cfg`` this layer has; ``weights[name]`` for each name in
    :data:`ATTENTION_WEIGHTS` (TransformerLens's shapes, or with a leading member axis ``E``, then
    ``x``, ``token_embed`` and the gates ``[E, head]`` have it too); ``gates[prior]``: ``[head]``;
    ``prior_term``: each prior's factors or bias on these inputs (:func:`module_prior_term`
    calls the prior module); ``vocab``: ``(tokens, W_E)`` where ``token_embed == W_E[tokens]``
    (token inputs), handed to the priors (:class:`~circuitfade.model.priors.PriorInputs`);
    ``table``: ``(x_table, index)`` with ``x == lookup(x_table, index)`` (the first block, see
    :func:`token_position_table`): the query-key-value product runs on the table's rows and is
    looked up (the same values; the weights' gradients are summed per table row first, so they
    round differently). With token inputs (``vocab``) and no prior that needs the scores, the
    table also holds the per-token priors' factors and is read per head (:func:`table_qkv`): no
    concatenation at batch size. (A prior with factors that are not per-token then adds its
    columns after those: where it comes before a per-token one in ``attn.priors``, the scores
    sum in another order than without a table and may differ by rounding.)

    With ``rows`` (query positions), queries, attention and the output are computed only at
    those positions, by :func:`rows_attention` (no key or value is computed). Not for priors that
    need the scores. Priors whose gate is exactly zero are left out where their term would only be
    added (:func:`zero_gated`; their weights, named by ``prior_weights``, get a zero gradient).
    """
    if rows is not None:
        if table is not None:
            raise ValueError("prior_attention: a table input goes with every query position (rows=None)")
        return rows_attention(attn, x, token_embed, causal, weights, gates, rows, prior_term, vocab, prior_weights)
    H, Dh = attn.cfg.n_heads, attn.cfg.d_head
    scale = attn.attn_scale
    W = weights
    w = torch.stack([W["W_Q"], W["W_K"], W["W_V"]], -4).movedim(-2, -4).flatten(-3)  # [*E, d_model, 3*head*d_head]
    b = torch.stack([W["b_Q"], W["b_K"], W["b_V"]], -3).flatten(-3)
    tokens, W_E = vocab if vocab is not None else (None, None)
    needs = any(p.needs_scores for p in attn.priors.values())
    gated_out = zero_gated(gates)
    folded, filled, on_table = frozenset(), frozenset(), table is not None and W_E is not None and not needs
    if on_table:
        # the first block of token inputs: q (scaled), k with the per-token factors, v, per head
        q, k, v, folded, filled = table_qkv(attn, table, w, b, W_E, gates, prior_term, gated_out)
    else:
        # q, k, v [*E, batch, head, pos, d_head] each (unbind on the q/k/v axis: the backward stacks
        # the three gradients straight into the product's layout)
        qkv = member_linear(x, w, b) if table is None else lookup(member_linear(table[0], w, b), table[1])
        q, k, v = (t.transpose(-3, -2) for t in qkv.unflatten(-1, (3, H, Dh)).unbind(-3))
    scores = (q @ k.transpose(-1, -2)) / scale if needs else None
    inputs = PriorInputs(token_embed, x, scores, tokens=tokens, W_E=W_E)
    # zero-gated priors that add a bias are left out; low-rank ones keep their (zero) columns, so the
    # query-key product has the same columns whatever the gates (and the stacked model's members,
    # whose gates differ, compute what their single runs compute); the table's are filled with zeros
    zero = frozenset(n for n in gated_out if not _low_rank(attn.priors[n])) | filled
    factors, bias = _prior_terms(attn, inputs, gates, prior_term, q.dtype, None, skip=folded | zero)
    mask = causal if bias is None else bias + causal  # [*E, batch_or_1, head, q, k]
    if not on_table:
        q = q / scale
    if factors:  # low-rank priors: extra query-key columns
        q, k = torch.cat([q] + [a for a, _ in factors], -1), torch.cat([k] + [b for _, b in factors], -1)
    # no row is fully masked (the diagonal is always visible), so a plain softmax is exact
    pattern = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
    z = (pattern @ v).transpose(-3, -2).flatten(-2)  # [*E, batch, pos, head*d_head]
    return member_linear(z, W["W_O"].flatten(-3, -2), _with_zero_gradient(W["b_O"], attn, zero, prior_weights))


def _per_head(t: Float[Tensor, "*members batch rows head d"]) -> Float[Tensor, "*members head batch_rows d"]:
    """``[*E, batch, rows, head, d]`` as ``[*E, head, batch * rows, d]`` (one matrix per head)."""
    return t.movedim(-2, -4).flatten(-3, -2)


def rows_attention(
    attn: nn.Module,
    x: Float[Tensor, "*members batch pos d_model"],
    token_embed: Float[Tensor, "*members batch pos d_model"],
    causal: Float[Tensor, "pos pos"],
    weights: Mapping[str, Tensor],
    gates: Mapping[str, Tensor],
    rows: Int[Tensor, "n_rows"],
    prior_term: PriorTerm = module_prior_term,
    vocab: tuple[Tensor, Tensor] | None = None,
    prior_weights: PriorWeights = module_prior_weights,
) -> Float[Tensor, "*members batch rows d_model"]:
    """:func:`prior_attention` at the query positions ``rows`` only (the arguments are its), with
    the key and value products moved onto the few queries (the same function, associated
    differently, so it rounds differently)::

        q_i·k_j = (W_K q_i)·x_j + q_i·b_K          Σ_j p_ij v_j = (Σ_j p_ij x_j) W_V + b_V

    (``Σ_j p_ij = 1``). Keys and values at every position (two products over batch × positions)
    become products over batch × rows; low-rank priors are their own small product. Not for
    priors that need the scores.
    """
    if any(p.needs_scores for p in attn.priors.values()):
        raise ValueError("rows_attention: a prior that needs the attention scores needs every key; use rows=None")
    H, Dh = attn.cfg.n_heads, attn.cfg.d_head
    W = weights
    members = W["W_Q"].shape[:-3]
    B, M = x.shape[-3], rows.numel()
    q = member_linear(x[..., rows, :], W["W_Q"].movedim(-3, -2).flatten(-2), W["b_Q"].flatten(-2))
    q = q.unflatten(-1, (H, Dh)) / attn.attn_scale  # [*E, batch, rows, head, d_head]
    # (W_K q) per head, then against every position's x: [*E, batch, head * rows, pos]
    qk = (_per_head(q) @ W["W_K"].transpose(-1, -2)).unflatten(-2, (B, M)).movedim(-4, -3)  # [*E, B, H, M, D]
    scores = (qk.flatten(-3, -2) @ x.transpose(-1, -2)).unflatten(-2, (H, M))  # [*E, batch, head, rows, pos]
    q_bK = (q * W["b_K"].view(*members, 1, 1, H, Dh)).sum(-1).transpose(-1, -2)  # [*E, batch, head, rows]
    tokens, W_E = vocab if vocab is not None else (None, None)
    inputs = PriorInputs(token_embed, x, None, query_index=rows, tokens=tokens, W_E=W_E)
    zero = zero_gated(gates)
    factors, bias = _prior_terms(attn, inputs, gates, prior_term, q.dtype, rows, skip=zero)
    scores = scores + q_bK.unsqueeze(-1)
    for a, b in factors:
        scores = scores + a @ b.transpose(-1, -2)
    mask = causal[rows] if bias is None else bias + causal[rows]
    # no row is fully masked (the diagonal is always visible), so a plain softmax is exact
    pattern = torch.softmax(scores + mask, dim=-1)  # [*E, batch, head, rows, pos]
    px = (pattern.flatten(-3, -2) @ x).unflatten(-2, (H, M)).movedim(-3, -2)  # [*E, batch, rows, head, d_model]
    z = _per_head(px) @ W["W_V"] + W["b_V"].unsqueeze(-2)  # [*E, head, batch * rows, d_head]
    z = z.unflatten(-2, (B, M)).movedim(-4, -2).flatten(-2)  # [*E, batch, rows, head * d_head]
    return member_linear(z, W["W_O"].flatten(-3, -2), _with_zero_gradient(W["b_O"], attn, zero, prior_weights))


def fused_block(
    resid: Float[Tensor, "*members batch pos d_model"],
    attend: Callable[[Tensor, "tuple[Tensor, Tensor] | None"], Tensor],
    ln1: Callable[[Tensor], Tensor],
    ln2: Callable[[Tensor], Tensor] | None = None,
    mlp: Callable[[Tensor], Tensor] | None = None,
    rows: Int[Tensor, "n_rows"] | None = None,
    table: tuple[Tensor, Tensor] | None = None,
) -> Float[Tensor, "*members batch pos_or_rows d_model"]:
    """A block on the fused path: ``resid + attend(ln1(resid), None)`` then ``+ mlp(ln2(·))`` (no MLP
    when ``mlp`` is None); with ``rows``, the residual is kept at those positions only. With
    ``table`` (``(resid_table, index)``, ``resid == lookup(resid_table, index)``: the first
    block, :func:`token_position_table`) ``ln1`` runs once per table row and the attention gets
    ``attend(h, (ln1(resid_table), index))``."""
    if table is None:
        attn_out = attend(ln1(resid), None)
    else:
        h_table = ln1(table[0])
        attn_out = attend(lookup(h_table, table[1]), (h_table, table[1]))
    resid = (resid if rows is None else resid[..., rows, :]) + attn_out
    if mlp is not None:
        resid = resid + mlp(ln2(resid))
    return resid


def fused_logits(
    embed: Float[Tensor, "*members batch pos d_model"],
    blocks: Sequence[Callable[[Tensor, "Tensor | None", "tuple[Tensor, Tensor] | None"], Tensor]],
    W_U: Float[Tensor, "*members d_model d_vocab_out"],
    b_U: Float[Tensor, "*members d_vocab_out"],
    *,
    W_pos: Float[Tensor, "*members n_ctx d_model"] | None = None,
    ln_final: Callable[[Tensor], Tensor] | None = None,
    rows: Int[Tensor, "n_rows"] | None = None,
    stop_at_layer: int | None = None,
    logit_cap: float | None = None,
    vocab: tuple[Tensor, Tensor] | None = None,
) -> Float[Tensor, "*members batch pos_or_rows d_vocab_out"]:
    """The model's fused forward from token embeddings: ``+ W_pos`` (learned positions), each
    block ``blocks[i](resid, rows_or_None, table_or_None)`` (``rows`` in the last block only;
    ``table`` in the first block where ``vocab = (tokens, W_E)`` is given, ``embed ==
    W_E[tokens]``, and :func:`token_position_table` has one), ``ln_final``,
    unembedding (``F.linear``; with a member axis one ``baddbmm``), then ``logit_cap · tanh(logits /
    logit_cap)`` where ``logit_cap > 0`` (``output_logits_soft_cap``, as TransformerLens applies it).
    With ``stop_at_layer``: the residual stream before that block."""
    n = embed.shape[-2]
    resid = embed
    if W_pos is not None:
        pos = W_pos[..., :n, :]
        resid = embed + (pos if pos.dim() == 2 else pos.unsqueeze(-3))
    blocks = blocks[:stop_at_layer]
    last = len(blocks) - 1
    table = None
    if vocab is not None and blocks and not (last == 0 and rows is not None):
        table = token_position_table(vocab[0], vocab[1], W_pos)
    for i, block in enumerate(blocks):
        resid = block(resid, rows if i == last else None, table if i == 0 else None)
    if stop_at_layer is not None:
        return resid
    if ln_final is not None:
        resid = ln_final(resid)
    return softcap(member_linear(resid, W_U, b_U), logit_cap)
