"""The attention-with-priors computation, once, for both TransformerLens lines.

Each attention head computes (main paper, Eq. 1)::

    S_ij = Q_i·K_j / √d_head + Σ_p g_p[h] · B^p_ij        (then causal mask, softmax)

with one gate ``g_p`` per layer, head and prior ``p`` (see :mod:`circuitfade.model.priors`).
This module holds that computation and the model API around it as mixins that import
neither line's model classes (only ``HookPoint``, which both lines share). The fused path
is :mod:`circuitfade.model.fused` (functions over weights with an optional leading member
axis, which the stacked model of :mod:`circuitfade.train.stacked` calls too). The mixins:

* :class:`PriorAttentionCore` - gates, the gated prior, the hooked path (TransformerLens's
  attention arithmetic, hook for hook), the fused path (one QKV matmul, low-rank priors
  folded into the query-key product) and the answer-position path (queries only at
  ``rows``);
* :class:`PriorBlockCore` - a block's forward on the hooked and the fused path;
* :class:`SoftPriorCore` - the model's forward (token checks, fused/hooked dispatch,
  ``positions=``, ``return_type``), ``gates(...)``, ``gate_hooks(...)``,
  ``set_gate_values``, ``gate_values``, persistence (``save_pretrained``,
  ``from_pretrained``, ``load_weights``) and ``to_plain_model``.

The two shells supply the module tree (parameter names, buffers, hook points) and
nothing else: :mod:`circuitfade.model.hooked` (a ``HookedTransformer`` subclass, on
TransformerLens 3.x) and :mod:`circuitfade.model.native` (a ``HookedRootModule``, on
4.x, also importable on 3.x). Because both run this code on the same parameter
tensors, the same state dict gives bit-identical logits and gradients on both
(``tests/tl4/test_soft_prior_lines.py``).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable, Iterator, Mapping

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from circuitfade import __version__
from circuitfade.io import CheckpointError, check_state_dict, load_tensors, read_json, save_tensors, write_json
from circuitfade.model.backbone import apply_rotary
from circuitfade.model.devices import to_device
from circuitfade.model.files import CONFIG_FILE, WEIGHTS_FILE
from circuitfade.model.fused import (
    ATTENTION_WEIGHTS,
    causal_mask,
    fused_block,
    fused_logits,
    fused_path_refusal,
    prior_attention,
    softcap,
)
from circuitfade.model.priors import PriorInputs, build_prior, lookup

__all__ = ["PriorAttentionCore", "PriorBlockCore", "SoftPriorCore", "check_gate_value", "gate_tensor",
           "logits_at_all_positions", "attention_scale", "next_token_loss", "layer_norm_unhooked"]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def check_gate_value(name: str, value) -> Tensor:
    """``value`` as a float tensor, or ``ValueError`` naming gate ``name`` unless every entry is in [0, 1]."""
    if isinstance(value, (str, bytes)) or (isinstance(value, (list, tuple)) and any(
            isinstance(v, (str, bytes)) for v in value)):
        raise ValueError(f"gate {name!r}: expected a number or an array of numbers in [0, 1], got {value!r}")
    try:
        t = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"gate {name!r}: expected a number or an array of numbers in [0, 1], got {value!r} ({e})") from None
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()) or bool((t > 1).any()):
        raise ValueError(f"gate {name!r}: values must be finite and in [0, 1], got {value!r}")
    return t


def gate_tensor(value, n_layers: int, n_heads: int, layer: int) -> Float[Tensor, "head"]:
    """A float, a ``[head]`` or a ``[layer, head]`` array -> this layer's ``[head]`` tensor."""
    t = torch.as_tensor(value, dtype=torch.float32)
    if t.dim() == 0:
        return t.expand(n_heads).clone()
    if t.shape == (n_heads,):
        return t.clone()
    if t.shape == (n_layers, n_heads):
        return t[layer].clone()
    raise ValueError(
        f"a gate value must be a number, shape [n_heads]=({n_heads},) or "
        f"[n_layers, n_heads]=({n_layers}, {n_heads}); got shape {tuple(t.shape)}"
    )


def attention_scale(cfg, layer: int) -> float:
    """The divisor of ``Q·K``: ``cfg.attn_scale`` (√d_head by default) or 1 without scaling,
    times ``layer + 1`` with ``scale_attn_by_inverse_layer_idx`` (a Python float)."""
    scale = cfg.attn_scale if cfg.use_attn_scale else 1.0
    if cfg.scale_attn_by_inverse_layer_idx:
        scale *= layer + 1
    return float(scale)


def next_token_loss(logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"],
                    per_token: bool = False) -> Float[Tensor, ""] | Float[Tensor, "batch pos_minus_1"]:
    """Next-token cross entropy ``-log p(t_{i+1} | ≤ i)``: per position ``[batch, pos-1]`` or the mean
    (TransformerLens's ``lm_cross_entropy_loss`` without a mask)."""
    log_probs = F.log_softmax(logits, dim=-1)
    predicted = log_probs[..., :-1, :].gather(dim=-1, index=tokens[..., 1:, None])[..., 0]
    if per_token:
        return -predicted
    return -predicted.sum() / predicted.numel()


def logits_at_all_positions(logits: Float[Tensor, "batch rows vocab"], rows: Int[Tensor, "rows"] | None,
                            n: int) -> Float[Tensor, "batch pos vocab"]:
    """Logits ``[batch, n, vocab]`` from those computed at query positions ``rows`` only: NaN at
    every other position (``rows=None``: every position was computed; returned as is)."""
    if rows is None:
        return logits
    full = logits.new_full((logits.shape[0], n, logits.shape[-1]), float("nan"))
    return full.index_copy(1, rows, logits)


def layer_norm_unhooked(module: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm without hooks (the same maths as TransformerLens's ``LayerNorm``, as one
    ``F.layer_norm``); any other normalisation module is called as is."""
    if hasattr(module, "w") and hasattr(module, "b") and type(module).__name__ == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), module.w, module.b, module.eps)
    return module(x)


# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------
class PriorAttentionCore:
    """Gated priors on an attention module with TransformerLens's weights ``W_Q, W_K, W_V
    [head, d_model, d_head]``, ``W_O [head, d_head, d_model]``, biases ``b_Q, b_K, b_V
    [head, d_head]``, ``b_O [d_model]``, buffer ``IGNORE`` (-inf), hook points ``hook_q``,
    ``hook_k``, ``hook_v``, ``hook_z``, ``hook_attn_scores``, ``hook_pattern``,
    ``hook_result`` (and ``hook_rot_q``, ``hook_rot_k``, buffers ``rotary_sin``,
    ``rotary_cos`` for rotary models), ``cfg``, ``attn_scale`` (float) and ``layer_id``.

    :meth:`add_priors` adds, per prior ``p`` of ``cfg.priors``: the prior module
    ``priors[p]``, the parameter ``gate_p_logit [head]`` (trained only in ``learned``
    mode), the buffer ``gate_p_value [head]`` and the hooks ``hook_p_bias``,
    ``hook_gate_p``; and ``hook_prior``.
    """

    cfg: object
    priors: nn.ModuleDict

    def add_priors(self, cfg, layer: int) -> None:
        """Build this layer's priors, gate logits/buffers and prior hooks (in that order)."""
        H = cfg.n_heads
        self.priors = nn.ModuleDict({name: build_prior(name, cfg, layer) for name in cfg.priors})
        g0 = float(cfg.gate_init)
        logit0 = math.log(max(g0, 1e-4) / max(1.0 - g0, 1e-4))
        for name in cfg.priors:
            learned = cfg.gate_mode(name) == "learned"
            logit = nn.Parameter(torch.full((H,), logit0, dtype=cfg.dtype), requires_grad=learned)
            setattr(self, f"gate_{name}_logit", logit)
            self.register_buffer(f"gate_{name}_value", torch.full((H,), g0, dtype=cfg.dtype))
            setattr(self, f"hook_{name}_bias", HookPoint())  # pos: [head, q, k]; others: [batch, head, q, k]
            setattr(self, f"hook_gate_{name}", HookPoint())  # [head] effective gate used in this forward
        self.hook_prior = HookPoint()  # [batch, head, query_pos, key_pos] total gated bias, before the causal mask
        self._gate_override: dict[str, Tensor] = {}

    # -- gates ---------------------------------------------------------------------
    def gate(self, name: str) -> Float[Tensor, "head"]:
        """Effective gate of prior ``name``: override > learned ``sigmoid(logit)`` > buffer."""
        if name in self._gate_override:
            return self._gate_override[name]
        if self.cfg.gate_mode(name) == "learned":
            return torch.sigmoid(getattr(self, f"gate_{name}_logit"))
        return getattr(self, f"gate_{name}_value")

    # -- prior -----------------------------------------------------------------------
    def _prior_terms(self, inputs: PriorInputs, hooked: bool):
        rows = inputs.query_index
        for name, prior in self.priors.items():
            bias = prior(inputs)
            if rows is not None and bias.shape[-2] != rows.numel():
                bias = bias[..., rows, :]  # a prior that ignores query_index: keep the rows asked for
            g = self.gate(name)
            if hooked:
                hp = getattr(self, f"hook_{name}_bias")
                # the pos bias is exposed as [head, q, k] (it does not depend on the batch)
                bias = hp(bias[0]).unsqueeze(0) if bias.shape[0] == 1 else hp(bias)
                g = getattr(self, f"hook_gate_{name}")(g)
            yield g, bias

    def prior(
        self, inputs: PriorInputs, hooked: bool = True
    ) -> Float[Tensor, "batch_or_1 head query_pos key_pos"] | None:
        """``Σ_p g_p[h] · B^p`` (``None`` without priors); ``hooked`` runs the prior hooks."""
        total = None
        for g, bias in self._prior_terms(inputs, hooked):
            term = g.to(bias.dtype)[:, None, None] * bias
            total = term if total is None else total + term
        return total

    # -- hooked path: TransformerLens's attention arithmetic ---------------------------------
    def qkv(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        """``q, k, v [batch, pos, head, d_head] = x W + b`` through ``hook_q``, ``hook_k``, ``hook_v``."""
        def linear(w: Tensor, b: Tensor) -> Tensor:
            if x.device != w.device:
                w = w.to(x.device)
            if x.device != b.device:
                b = b.to(x.device)
            w2 = einops.rearrange(w, "head_index d_model d_head -> (head_index d_head) d_model")
            b2 = einops.rearrange(b, "head_index d_head -> (head_index d_head)")
            return F.linear(x, w2, b2).reshape(x.shape[0], x.shape[1], b.shape[0], b.shape[1])

        q = self.hook_q(linear(self.W_Q, self.b_Q))
        k = self.hook_k(linear(self.W_K, self.b_K))
        v = self.hook_v(linear(self.W_V, self.b_V))
        return q, k, v

    def rotate(self, x: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos head d_head"]:
        """Rotary embedding of ``x`` at positions ``0 .. pos-1`` (GPT-J/NeoX pairing per ``cfg``)."""
        return apply_rotary(x, self.rotary_sin, self.rotary_cos, self.cfg)

    def scores(self, q: Float[Tensor, "batch q head d"], k: Float[Tensor, "batch k head d"]
               ) -> Float[Tensor, "batch head q k"]:
        """``q·k / attn_scale`` (soft-capped if ``cfg.attn_scores_soft_cap > 0``)."""
        q_ = einops.rearrange(q, "batch query_pos head_index d_head -> batch head_index query_pos d_head")
        k_ = einops.rearrange(k, "batch key_pos head_index d_head -> batch head_index d_head key_pos")
        return softcap(q_ @ k_ / self.attn_scale, self.cfg.attn_scores_soft_cap)

    def causal_mask(self, scores: Float[Tensor, "batch head q k"]) -> Float[Tensor, "batch head q k"]:
        """``scores`` with ``IGNORE`` (-inf) where ``key_pos > query_pos``."""
        nq, nk = scores.size(-2), scores.size(-1)
        if nq != nk:
            raise ValueError(f"query_ctx_length {nq} != key_ctx_length {nk}")
        device = scores.device
        keep = (torch.arange(nk, device=device)[None, :] <= torch.arange(nq, device=device)[:, None])[None, None]
        return torch.where(keep, scores, self.IGNORE.to(device))

    def z_scores(self, v: Float[Tensor, "batch k head d"], pattern: Float[Tensor, "batch head q k"]
                 ) -> Float[Tensor, "batch q head d"]:
        """``z = pattern @ v`` per head, through ``hook_z``."""
        v_ = einops.rearrange(v, "batch key_pos head_index d_head -> batch head_index key_pos d_head")
        pattern_ = einops.rearrange(pattern, "batch head_index query_pos key_pos -> batch head_index query_pos key_pos")
        return self.hook_z(einops.rearrange(pattern_ @ v_, "batch head_index query_pos d_head -> batch query_pos head_index d_head"))

    def forward_prior(
        self,
        x: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
    ) -> Float[Tensor, "batch pos d_model"]:
        """Hooked path: TransformerLens's attention with the gated prior added to the scores
        (``hook_prior``) before the causal mask; every hook fires."""
        q, k, v = self.qkv(x)  # [batch, pos, head, d_head] each
        if self.cfg.positional_embedding_type == "rotary":
            q = self.hook_rot_q(self.rotate(q))
            k = self.hook_rot_k(self.rotate(k))
        scores = self.scores(q, k)  # [batch, head, query_pos, key_pos]
        needs = any(p.needs_scores for p in self.priors.values())
        prior = self.prior(PriorInputs(token_embed, x, scores if needs else None), hooked=True)
        if prior is not None:
            prior = self.hook_prior(prior.expand(scores.shape[0], -1, -1, -1))
            scores = scores + prior
        scores = self.hook_attn_scores(self.causal_mask(scores))
        pattern = F.softmax(scores, dim=-1)
        pattern = self.hook_pattern(torch.where(torch.isnan(pattern), 0.0, pattern))
        z = self.z_scores(v, pattern)  # [batch, pos, head, d_head]
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(-2) + self.b_O
        return F.linear(z.flatten(-2), self.W_O.flatten(0, 1).T, self.b_O)

    def forward(  # the attention module's own call: the hooked path
        self,
        x: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
    ) -> Float[Tensor, "batch pos d_model"]:
        return self.forward_prior(x, token_embed)

    # -- fused path ----------------------------------------------------------------------
    def forward_fused(
        self,
        x: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
        causal: Float[Tensor, "query_pos key_pos"],
        rows: Int[Tensor, "n_rows"] | None = None,
        vocab: tuple[Tensor, Tensor] | None = None,
        table: tuple[Tensor, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos_or_rows d_model"]:
        """Unhooked path (:func:`~circuitfade.model.fused.prior_attention` on this module's weights and gates): one QKV
        matmul, low-rank priors as extra query-key columns, the other priors (gated) plus the
        causal mask added to the scores.

        With ``rows`` (query positions), queries, attention and the output are computed
        only at those positions (keys and values still at every position); the result is
        ``[batch, len(rows), d_model]``. Not for priors that need the scores. ``table``: ``x`` as a
        table over (token, position) (the first block; see :func:`~circuitfade.model.fused.fused_block`).
        """
        weights = {name: getattr(self, name) for name in ATTENTION_WEIGHTS}
        gates = {name: self.gate(name) for name in self.priors}
        return prior_attention(self, x, token_embed, causal, weights, gates, rows, vocab=vocab, table=table)


# --------------------------------------------------------------------------------------
# block
# --------------------------------------------------------------------------------------
class PriorBlockCore:
    """A block (``ln1``, ``attn``, ``ln2`` and ``mlp`` unless attention-only, hooks
    ``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
    ``hook_resid_post``) whose attention also reads the token embeddings."""

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
        causal: Float[Tensor, "query_pos key_pos"] | None = None,
        rows: Int[Tensor, "n_rows"] | None = None,
        vocab: tuple[Tensor, Tensor] | None = None,
        table: tuple[Tensor, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos_or_rows d_model"]:
        """``resid + attn(ln1(resid))`` then ``+ mlp(ln2(·))``. With ``causal`` (the additive mask):
        the fused path, no hooks (``rows``: only those query positions; ``vocab``: ``(tokens, W_E)``
        of token inputs, for the priors; ``table``: the residual as a table over (token, position),
        :func:`~circuitfade.model.fused.fused_block`); else every hook fires."""
        if causal is not None:
            return fused_block(resid_pre, lambda h, t: self.attn.forward_fused(h, token_embed, causal, rows, vocab, t),
                               lambda h: layer_norm_unhooked(self.ln1, h), lambda h: layer_norm_unhooked(self.ln2, h),
                               None if self.cfg.attn_only else self.mlp, rows, table)
        resid_pre = self.hook_resid_pre(resid_pre)  # [batch, pos, d_model]
        attn_out = self.hook_attn_out(self.attn.forward_prior(self.ln1(resid_pre), token_embed))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------
class SoftPriorCore:
    """The soft-prior model's forward pass, gate API and persistence, over a module tree with
    ``embed``, ``hook_embed``, ``pos_embed``/``hook_pos_embed`` (learned positions only),
    ``blocks``, ``ln_final`` (if normalised), ``unembed`` and ``hook_dict``."""

    supports_positions = True  # forward(..., positions=) computes the last block only there

    def _finish_init(self) -> None:
        self.use_fused = True
        self._causal_cache: dict = {}
        self._attn_cache = [b.attn for b in self.blocks]

    # -- forward -----------------------------------------------------------------------
    def _hooks_attached(self) -> bool:
        for hp in self.hook_dict.values():
            if hp._forward_hooks or hp._backward_hooks or hp._forward_pre_hooks:
                return True
        return False

    def _check_real(self, x) -> Tensor:
        x = torch.as_tensor(x)
        if x.dim() == 2:
            x = x.unsqueeze(0)
        if x.dim() != 3 or not x.is_floating_point() or x.shape[-1] != self.cfg.d_vocab:
            raise ValueError(
                f"input_mode='real' takes float inputs [batch, pos, {self.cfg.d_vocab}]; got {tuple(x.shape)} {x.dtype}"
            )
        if x.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"sequence length {x.shape[1]} exceeds the context n_ctx={self.cfg.n_ctx}")
        return x.to(device=self.W_E.device, dtype=self.W_E.dtype)

    def _embed(self, x: Tensor) -> Tensor:
        return x @ self.W_E if self.cfg.input_mode == "real" else self.embed(x)

    def _check_tokens(self, tokens) -> Tensor:
        if isinstance(tokens, str) or (isinstance(tokens, list) and tokens and isinstance(tokens[0], str)):
            raise TypeError("SoftPriorTransformer takes token id tensors [batch, pos], not strings")
        tokens = torch.as_tensor(tokens)
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"tokens must be an integer tensor [batch, pos]; got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context n_ctx={self.cfg.n_ctx}")
        # (not while torch.compile traces: reading values would break the graph; the embedding lookup
        # still refuses an id out of range)
        if tokens.numel() and not torch.compiler.is_compiling() \
                and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.d_vocab):
            raise ValueError(
                f"token ids must be in [0, {self.cfg.d_vocab}); got min {int(tokens.min())}, max {int(tokens.max())}"
            )
        return tokens.long().to(self.W_E.device)

    def forward(
        self,
        input: Int[Tensor, "batch pos"],
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        *,
        stop_at_layer: int | None = None,
        positions: Int[Tensor, "n_rows"] | None = None,
        start_at_layer: int | None = None,
        tokens: Int[Tensor, "batch pos"] | None = None,
        **kwargs,
    ):
        """Run the model on token ids ``[batch, pos]`` (or real inputs ``[batch, pos, d_vocab]``).

        ``return_type``: ``"logits"`` ``[batch, pos, d_vocab_out]`` (default), ``"loss"``
        (next-token loss, as in TransformerLens), ``"both"`` or ``None``. ``stop_at_layer``
        returns the residual stream before that block. Keyword arguments of
        ``HookedTransformer.forward`` that make no sense here (strings, KV cache,
        padding) raise ``TypeError``.

        ``positions`` (sequence positions, with ``return_type="logits"``) says that only
        the logits there are needed: on the fused path the last block then computes
        queries, attention, output and unembedding only at those positions (keys and
        values everywhere; the same maths, tested to 1e-5 on loss and every gradient) and
        the logits at every other position are NaN. With a hook attached (or
        ``use_fused = False``) it is ignored and every position is computed.

        ``start_at_layer`` (as in TransformerLens): ``input`` is the residual stream
        ``[batch, pos, d_model]`` before that block, and the blocks from there on run (every
        hook of theirs fires); ``tokens`` are the token ids (or real inputs) it came from,
        which the priors read through ``hook_embed`` and a loss needs.
        """
        unsupported = {k for k, v in kwargs.items() if v is not None and k not in ("prepend_bos", "padding_side")}
        if unsupported:
            raise TypeError(f"SoftPriorTransformer.forward does not support {sorted(unsupported)}")
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}")
        real = self.cfg.input_mode == "real"
        if start_at_layer is not None:
            return self._forward_from(input, tokens, start_at_layer, stop_at_layer, return_type, loss_per_token)
        if tokens is not None:
            raise TypeError("tokens= goes with start_at_layer (the token ids the residual came from)")
        tokens = self._check_real(input) if real else self._check_tokens(input)
        n = tokens.shape[1]
        fused = self.use_fused and not self._hooks_attached() and fused_path_refusal(self.cfg) is None
        rows = None
        if positions is not None:
            if return_type != "logits":
                raise ValueError("positions= needs return_type='logits'")
            rows = self._rows(positions, n)
            if not fused or stop_at_layer is not None:
                rows = None
        if fused:
            logits = self._fused_logits(tokens, rows, stop_at_layer)
            if stop_at_layer is not None:
                return logits
        else:
            embed = self.hook_embed(self._embed(tokens))  # [batch, pos, d_model]
            # its own tensor: an in-place hook on the residual must not change what the priors read
            resid = embed.clone() if self.cfg.nope else embed
            if self.cfg.positional_embedding_type in ("standard", "shortformer"):
                resid = embed + self.hook_pos_embed(self.pos_embed.W_pos[:n].expand(embed.shape[0], -1, -1))
            for block in self.blocks[:stop_at_layer]:
                resid = block(resid, embed)
            if stop_at_layer is not None:
                return resid
            logits = self._unembed(resid)
        logits = logits_at_all_positions(logits, rows, n)
        return self._returned(logits, tokens, return_type, loss_per_token)

    def _unembed(self, resid: Tensor) -> Tensor:
        """Logits of the final residual stream (hooked path): ``ln_final`` if normalised, then ``unembed``."""
        if self.cfg.normalization_type is not None:
            resid = self.ln_final(resid)
        return softcap(self.unembed(resid), self.cfg.output_logits_soft_cap)

    def _returned(self, logits: Tensor, tokens: Tensor, return_type: str | None, loss_per_token: bool):
        """What ``forward`` returns for ``return_type``: the logits, the next-token loss, both, or None."""
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if self.cfg.input_mode == "real":
            raise ValueError("return_type 'loss'/'both' (next-token loss) needs token inputs; use a task's loss")
        loss = next_token_loss(logits, tokens, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _forward_from(self, resid: Tensor, tokens, start: int, stop: int | None, return_type: str | None,
                      loss_per_token: bool):
        """``forward(resid, start_at_layer=start, tokens=tokens)``: the hooked path from block ``start``."""
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= self.cfg.n_layers:
            raise ValueError(f"start_at_layer must be an int in [0, {self.cfg.n_layers}], got {start!r}")
        if tokens is None:
            raise ValueError("start_at_layer needs tokens= (the token ids the residual came from: the priors read "
                             "their embeddings)")
        tokens = self._check_real(tokens) if self.cfg.input_mode == "real" else self._check_tokens(tokens)
        resid = torch.as_tensor(resid)
        if resid.shape != (*tokens.shape[:2], self.cfg.d_model) or not resid.is_floating_point():
            raise ValueError(f"start_at_layer: the input must be the residual stream [batch, pos, d_model] = "
                             f"{[*tokens.shape[:2], self.cfg.d_model]} of the tokens, got {tuple(resid.shape)} {resid.dtype}")
        embed = self.hook_embed(self._embed(tokens))
        for block in self.blocks[start:stop]:
            resid = block(resid, embed)
        if stop is not None:
            return resid
        return self._returned(self._unembed(resid), tokens, return_type, loss_per_token)

    def _fused_logits(self, tokens: Tensor, rows: Tensor | None, stop_at_layer: int | None) -> Tensor:
        """The fused path (:func:`~circuitfade.model.fused.fused_logits` on this model's weights): logits, or the residual
        stream before block ``stop_at_layer``."""
        # token inputs without TransformerLens's post-embedding LayerNorm: the token embedding is W_E[tokens],
        # read by one index_select (the module's values, a faster backward), and the priors may look it up
        # per vocabulary entry
        exact = self.cfg.input_mode != "real" and not getattr(self.cfg, "post_embedding_ln", False)
        embed = lookup(self.W_E, tokens) if exact else self._embed(tokens)
        causal = self._causal(tokens.shape[1], tokens.device)
        vocab = (tokens, self.W_E) if exact else None
        blocks = [lambda resid, r, t, block=block: block(resid, embed, causal, r, vocab, t) for block in self.blocks]
        learned_pos = self.cfg.positional_embedding_type in ("standard", "shortformer")
        norm = self.cfg.normalization_type is not None
        return fused_logits(embed, blocks, self.unembed.W_U, self.unembed.b_U,
                            W_pos=self.pos_embed.W_pos if learned_pos else None,
                            ln_final=(lambda h: layer_norm_unhooked(self.ln_final, h)) if norm else None,
                            rows=rows, stop_at_layer=stop_at_layer, logit_cap=self.cfg.output_logits_soft_cap,
                            vocab=vocab)

    def _causal(self, n: int, device) -> Tensor:
        """:func:`~circuitfade.model.fused.causal_mask` ``[n, n]``, cached."""
        key = (n, str(device))
        mask = self._causal_cache.get(key)
        if mask is None:
            mask = causal_mask(n, device)
            self._causal_cache = {key: mask}
        return mask

    def _rows(self, positions, n: int) -> Tensor | None:
        """``positions`` as sorted distinct rows on the model's device, or None where the
        fast path would not help (every position asked for, or a last-layer prior needs
        the attention scores)."""
        rows = torch.as_tensor(positions).flatten()
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        rows = rows.long()
        if rows.numel() and (int(rows.min()) < -n or int(rows.max()) >= n):
            raise ValueError(f"positions must be in [-{n}, {n}); got {rows.tolist()}")
        rows = torch.unique(rows % n)  # sorted, distinct
        if rows.numel() >= n or any(p.needs_scores for p in self.blocks[-1].attn.priors.values()):
            return None
        return rows.to(self.W_E.device)

    # -- gates ---------------------------------------------------------------------------
    @property
    def attn_layers(self) -> list:
        """The attention module of every block, in layer order."""
        return self._attn_cache

    def _check_prior_names(self, names) -> None:
        bad = [n for n in names if n not in self.cfg.priors]
        if bad:
            raise ValueError(f"unknown gate(s) {bad}; this model's priors are {list(self.cfg.priors)}")

    def _gate_args(self, pos, content, others) -> dict:
        """``{prior: value}`` of the given gates, checked (known prior, finite, in [0, 1])."""
        values = {k: v for k, v in dict(pos=pos, content=content, **others).items() if v is not None}
        self._check_prior_names(values)
        return {k: check_gate_value(k, v) for k, v in values.items()}

    @contextlib.contextmanager
    def gates(self, pos=None, content=None, **others) -> Iterator:
        """Override gates inside a ``with`` block: ``with model.gates(pos=0.0): ...``.

        Each value is a number, a ``[n_heads]`` or a ``[n_layers, n_heads]`` array;
        ``None`` leaves that gate alone. Previous overrides are restored on exit,
        also after an exception.
        """
        values = self._gate_args(pos, content, others)
        saved = [dict(a._gate_override) for a in self.attn_layers]
        try:
            for layer, attn in enumerate(self.attn_layers):
                for name, v in values.items():
                    g = gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)
                    attn._gate_override[name] = g.to(device=attn.W_Q.device, dtype=attn.W_Q.dtype)
            yield self
        finally:
            for attn, s in zip(self.attn_layers, saved):
                attn._gate_override = s

    def gate_hooks(self, pos=None, content=None, **others) -> list[tuple[str, Callable]]:
        """Forward hooks on ``hook_gate_*`` equivalent to :meth:`gates` (for ``run_with_hooks``)."""
        values = self._gate_args(pos, content, others)
        hooks = []
        for layer in range(self.cfg.n_layers):
            for name, v in values.items():
                g = gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)

                def hook(act, hook, g=g):
                    return g.to(device=act.device, dtype=act.dtype)

                hooks.append((f"blocks.{layer}.attn.hook_gate_{name}", hook))
        return hooks

    def set_gate_values(self, pos=None, content=None, **others) -> None:
        """Set the buffers of fixed/scheduled gates (what the trainer does each step)."""
        values = self._gate_args(pos, content, others)
        with torch.no_grad():
            for layer, attn in enumerate(self.attn_layers):
                for name, v in values.items():
                    getattr(attn, f"gate_{name}_value").copy_(
                        gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)
                    )

    def gate_values(self, which: str = "effective") -> dict[str, Tensor]:
        """``{prior: [n_layers, n_heads]}`` gates: ``"effective"`` (what a forward uses now)
        or ``"parameter"`` (``sigmoid(logit)`` whatever the mode)."""
        if which not in ("effective", "parameter"):
            raise ValueError("which must be 'effective' or 'parameter'")
        out = {}
        with torch.no_grad():
            for name in self.cfg.priors:
                rows = [
                    a.gate(name) if which == "effective" else torch.sigmoid(getattr(a, f"gate_{name}_logit"))
                    for a in self.attn_layers
                ]
                out[name] = torch.stack([r.detach().float().cpu() for r in rows])
        return out

    def prior_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters that belong to the priors (bias tables and gate logits)."""
        for name, p in self.named_parameters():
            if ".attn.priors." in name or ".attn.gate_" in name:
                yield name, p

    # -- conversion and persistence ---------------------------------------------------
    def backbone_state_dict(self) -> dict[str, Tensor]:
        """State dict of the plain backbone (no priors, gates; ``W_pos = 0`` for NoPE), in
        ``HookedTransformer`` format."""
        prior_names = {n for n, _ in self.prior_parameters()}
        sd = {
            k: v
            for k, v in self.state_dict().items()
            if k not in prior_names and ".attn.gate_" not in k and ".attn.priors." not in k
        }
        if self.cfg.nope:
            sd["pos_embed.W_pos"] = torch.zeros(self.cfg.n_ctx, self.cfg.d_model, dtype=self.cfg.dtype)
        return sd

    def to_plain_model(self) -> nn.Module:
        """The installed line's plain TransformerLens model with the same backbone weights and
        no priors (``HookedTransformer`` on 3.x, a ``TransformerBridge`` in compatibility mode
        on 4.x; see :func:`circuitfade.compat.plain_model`). A NoPE backbone gets a standard
        positional embedding set to zero. With every gate at zero both give the same logits."""
        from circuitfade import compat

        names = compat.config_fields()
        kw = {k: v for k, v in self.cfg.to_json_dict().items() if k in names}
        kw["dtype"] = self.cfg.dtype
        if self.cfg.nope:
            kw["positional_embedding_type"] = "standard"
        device = str(self.W_E.device)
        plain = compat.plain_model(kw, device, init_weights=False)
        plain.load_state_dict(compat.native_state_dict(self.backbone_state_dict(), plain), strict=True)
        return to_device(plain, device)

    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into directory ``path`` (atomically)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_tensors(path / WEIGHTS_FILE, self.state_dict(), metadata={"format": "circuitfade"})
        write_json(
            path / CONFIG_FILE,
            {"circuitfade_version": __version__, "class": "SoftPriorTransformer", "config": self.cfg.to_json_dict()},
        )
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | None = None, *, dtype=None, **kwargs):
        """Load a model written by :meth:`save_pretrained` on either line (no network, no pickle).

        ``device`` and ``dtype`` (``torch.float64`` or ``"float64"``) override the saved config;
        the weights load as saved otherwise. TransformerLens' weight-processing options
        (``fold_ln=``, ``center_writing_weights=``, ...) do not apply to a circuitfade model folder
        and are refused by name rather than ignored.
        """
        from circuitfade.model.config import SoftPriorConfig

        if kwargs:
            raise ValueError(f"from_pretrained: {sorted(kwargs)} do not apply to a circuitfade model folder "
                             "(weights load as saved: no folding or centering); pass device= or dtype= only")

        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise CheckpointError(f"{path}: no {CONFIG_FILE}; not a circuitfade model directory")
        meta = read_json(path / CONFIG_FILE)
        if not isinstance(meta, dict) or meta.get("class") != "SoftPriorTransformer" or "config" not in meta:
            raise CheckpointError(f"{path / CONFIG_FILE}: not a SoftPriorTransformer config")
        cfg_d = dict(meta["config"])
        if device is not None:
            cfg_d["device"] = device
        if dtype is not None:
            cfg_d["dtype"] = str(dtype).removeprefix("torch.")
        cfg = SoftPriorConfig.from_json_dict(cfg_d, source=str(path / CONFIG_FILE))
        model = cls(cfg)
        model.load_weights(path / WEIGHTS_FILE)
        return model

    def load_weights(self, file: str | Path | Mapping[str, Tensor]):
        """Load a state dict from a file (safetensors / weights-only .pt) or mapping, checked."""
        source = "state dict" if isinstance(file, Mapping) else str(file)
        sd = dict(file) if isinstance(file, Mapping) else load_tensors(file)
        expected = self.state_dict()
        check_state_dict(sd, expected, source)
        self.load_state_dict(sd, strict=True)
        return self

    def n_params(self, trainable_only: bool = False) -> int:
        """Number of parameter entries (``trainable_only``: those with ``requires_grad``)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
