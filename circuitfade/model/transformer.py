"""The annealable soft-prior Transformer: a HookedTransformer with gated attention priors.

Each attention head computes (main paper, Eq. 1)::

    S_ij = Q_i·K_j / √d_head + Σ_p g_p[h] · B^p_ij        (then causal mask, softmax)

with one gate ``g_p`` per layer, head and prior ``p`` (by default ``pos`` and
``content``, see :mod:`circuitfade.model.priors`). A gate's *mode* is one of

* ``learned``   - ``g = sigmoid(logit)``, the logit is trained;
* ``fixed``     - ``g`` is a constant buffer; the logit gets no gradient;
* ``scheduled`` - ``g`` is a buffer the trainer sets from a schedule each step;
  the logit gets no gradient.

Bias tables are always trainable. ``with model.gates(pos=0.0, content=0.0):``
overrides gates for evaluation (restored on exit, also after an exception);
:meth:`SoftPriorTransformer.gate_hooks` gives the same intervention as hooks.

Hook points added to every ``blocks.{l}.attn`` (the standard ones keep their
meaning; ``hook_attn_scores`` includes the prior):

==========================  =================================  ======================================
hook                        shape                              captures
==========================  =================================  ======================================
``hook_pos_bias``           ``[head, query_pos, key_pos]``     position bias, before gating
``hook_content_bias``       ``[batch, head, query_pos, key_pos]``  content bias, before gating
``hook_gate_pos``           ``[head]``                         effective position gate this forward
``hook_gate_content``       ``[head]``                         effective content gate this forward
``hook_prior``              ``[batch, head, query_pos, key_pos]``  total gated bias added to the scores
==========================  =================================  ======================================

When no hook is attached anywhere the model runs a *fused* path (one QKV matmul;
low-rank priors such as ``content`` folded into the query-key product as extra
columns, the others added with the causal mask); it computes the same function
(tested to 1e-5 on logits and gradients) and is what training uses.
``model.use_fused = False`` forces the hooked path. ``model(tokens,
positions=rows)`` computes the last block only at ``rows`` (the answer-position
path training and evaluation use; NaN logits elsewhere).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.components import Attention, TransformerBlock
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import lm_cross_entropy_loss

from circuitfade import __version__
from circuitfade.io import CheckpointError, check_state_dict, load_tensors, read_json, save_tensors, write_json
from circuitfade.model.files import CONFIG_FILE, GATE_MODES, LARGE_OVERRIDES, WEIGHTS_FILE
from circuitfade.model.priors import PRIORS, PriorInputs, build_prior

__all__ = ["SoftPriorConfig", "SoftPriorTransformer", "GATE_MODES", "LARGE_OVERRIDES"]

_SUPPORTED_POS = ("none", "standard", "rotary", "shortformer")


@dataclass
class SoftPriorConfig(HookedTransformerConfig):
    """A ``HookedTransformerConfig`` plus the prior's settings.

    Defaults are the main paper's base model: attention-only, 2 layers, 4 heads,
    ``d_model`` 64, context 32, vocabulary 32, no positional embedding (NoPE, so
    that at zero gate the model has no explicit position signal). Use
    :meth:`base` and :meth:`large` for the two presets.

    Prior settings:
        priors: names of the attention priors (see :mod:`circuitfade.model.priors`).
        gate_modes: ``{prior: "learned" | "fixed" | "scheduled"}``; priors not named
            default to ``"learned"``.
        gate_init: initial gate value (0.5 as in the paper): the logit starts at
            ``logit(gate_init)`` (clamped to ±9.2 so a learned gate can still move)
            and fixed/scheduled gate buffers start at exactly ``gate_init``.
        content_rank: rank ``r`` of the bilinear content bias.
        input_mode: ``"tokens"`` (default: integer ids ``[batch, pos]``) or ``"real"``:
            real-valued inputs ``[batch, pos, d_vocab]`` embedded linearly as
            ``x @ W_E`` (so ``d_vocab`` is the input dimension); with
            ``d_vocab_out=1`` the unembedding is a scalar read-out (used for
            linear-regression ICL). The content prior then sees ``x @ W_E``.
    """

    n_layers: int = 2
    d_model: int = 64
    n_ctx: int = 32
    d_head: int = 16
    n_heads: int = 4
    d_vocab: int = 32
    attn_only: bool = True
    positional_embedding_type: str = "none"
    priors: tuple = ("pos", "content")
    gate_modes: dict = field(default_factory=dict)
    gate_init: float = 0.5
    content_rank: int = 4
    input_mode: str = "tokens"

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "content_rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(self.dtype, str):
            self.dtype = _dtype(self.dtype)
        if isinstance(self.gate_init, bool) or not isinstance(self.gate_init, (int, float)) \
                or not 0.0 <= float(self.gate_init) <= 1.0:
            raise ValueError(f"gate_init must be a number in [0, 1], got {self.gate_init!r}")
        if self.input_mode not in ("tokens", "real"):
            raise ValueError(f"input_mode must be 'tokens' or 'real', got {self.input_mode!r}")
        if self.positional_embedding_type not in _SUPPORTED_POS:
            raise ValueError(
                f"positional_embedding_type must be one of {_SUPPORTED_POS} for SoftPriorTransformer, "
                f"got {self.positional_embedding_type!r}"
            )
        self.priors = tuple(self.priors)
        for p in self.priors:
            if p not in PRIORS:
                raise ValueError(f"unknown prior {p!r}; known priors: {sorted(PRIORS)}")
        if len(set(self.priors)) != len(self.priors):
            raise ValueError(f"priors must be distinct, got {self.priors}")
        self.gate_modes = dict(self.gate_modes)
        for p, m in self.gate_modes.items():
            if p not in self.priors:
                raise ValueError(f"gate_modes names prior {p!r}, which is not in priors {self.priors}")
            if m not in GATE_MODES:
                raise ValueError(f"gate mode for {p!r} must be one of {GATE_MODES}, got {m!r}")
        super().__post_init__()

    def gate_mode(self, prior: str) -> str:
        return self.gate_modes.get(prior, "learned")

    @property
    def nope(self) -> bool:
        return self.positional_embedding_type == "none"

    @classmethod
    def base(cls, **overrides) -> "SoftPriorConfig":
        """The paper's base model (L=2, d=64, 4 heads, ctx 32, vocab 32)."""
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides) -> "SoftPriorConfig":
        """The paper's larger model (L=4, d=128, 4 heads of 32): :data:`LARGE_OVERRIDES`."""
        return cls(**{**LARGE_OVERRIDES, **overrides})

    # -- serialisation -------------------------------------------------------------
    def to_json_dict(self) -> dict:
        """All constructor fields as JSON-friendly values (dtype as a string)."""
        out = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            if isinstance(v, torch.dtype):
                v = str(v).removeprefix("torch.")
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, torch.device):
                v = str(v)
            try:
                json.dumps(v)
            except TypeError:
                continue  # e.g. a tokenizer object: not part of a saved config
            out[f.name] = v
        return out

    @classmethod
    def from_json_dict(cls, d: Mapping, source: str = "config") -> "SoftPriorConfig":
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(f"{source}: unknown config fields {unknown} (written by a newer version?)")
        d = dict(d)
        try:
            return cls(**d)
        except (TypeError, ValueError, AssertionError) as e:
            raise CheckpointError(f"{source}: invalid config: {e}") from None


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype: unknown torch dtype {name!r} (e.g. 'float32', 'float64', 'bfloat16')")
    return dt


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


def _as_gate_tensor(value, n_layers: int, n_heads: int, layer: int) -> Tensor:
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


class SoftPriorAttention(Attention):
    """TransformerLens ``Attention`` plus gated priors (same weight names, same hooks)."""

    def __init__(self, cfg: SoftPriorConfig, layer: int):
        super().__init__(cfg, "global", layer)
        # TransformerLens stores a numpy scalar; SDPA (and torch.compile) need a Python float
        self.attn_scale = float(self.attn_scale)
        H = cfg.n_heads
        self.priors = nn.ModuleDict({name: build_prior(name, cfg, layer) for name in cfg.priors})
        g0 = float(cfg.gate_init)
        logit0 = math.log(max(g0, 1e-4) / max(1.0 - g0, 1e-4))
        for name in cfg.priors:
            learned = cfg.gate_mode(name) == "learned"
            logit = nn.Parameter(torch.full((H,), logit0, dtype=cfg.dtype), requires_grad=learned)
            setattr(self, f"gate_{name}_logit", logit)
            self.register_buffer(f"gate_{name}_value", torch.full((H,), g0, dtype=cfg.dtype))
            # [head]: the bias of prior `name` before gating has its own hook below
            setattr(self, f"hook_{name}_bias", HookPoint())  # pos: [1->head, q, k]; content: [batch, head, q, k]
            setattr(self, f"hook_gate_{name}", HookPoint())  # [head] effective gate used in this forward
        self.hook_prior = HookPoint()  # [batch, head, query_pos, key_pos] total gated bias, before the causal mask
        self._gate_override: dict[str, Tensor] = {}

    # -- gates ---------------------------------------------------------------------
    def gate(self, name: str) -> Float[Tensor, "head"]:
        """Effective gate of prior ``name``: override > learned sigmoid(logit) > buffer."""
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
        total = None
        for g, bias in self._prior_terms(inputs, hooked):
            term = g.to(bias.dtype)[:, None, None] * bias
            total = term if total is None else total + term
        return total

    # -- forward -----------------------------------------------------------------------
    def forward_prior(
        self,
        x: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
    ) -> Float[Tensor, "batch pos d_model"]:
        """Hooked path: TransformerLens's attention with the prior added to the scores."""
        q, k, v = self.calculate_qkv_matrices(x, x, x)  # [batch, pos, head, d_head] each
        if self.cfg.positional_embedding_type == "rotary":
            q = self.hook_rot_q(self.apply_rotary(q, 0, None))
            k = self.hook_rot_k(self.apply_rotary(k, 0, None))
        scores = self.calculate_attention_scores(q, k)  # [batch, head, query_pos, key_pos]
        needs = any(p.needs_scores for p in self.priors.values())
        prior = self.prior(PriorInputs(token_embed, x, scores if needs else None), hooked=True)
        if prior is not None:
            prior = self.hook_prior(prior.expand(scores.shape[0], -1, -1, -1))
            scores = scores + prior
        scores = self.hook_attn_scores(self.apply_causal_mask(scores))
        pattern = F.softmax(scores, dim=-1)
        pattern = self.hook_pattern(torch.where(torch.isnan(pattern), 0.0, pattern))
        z = self.calculate_z_scores(v, pattern)  # [batch, pos, head, d_head]
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(-2) + self.b_O
        return F.linear(z.flatten(-2), self.W_O.flatten(0, 1).T, self.b_O)

    def forward_fused(
        self,
        x: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
        causal: Float[Tensor, "query_pos key_pos"],
        rows: Int[Tensor, "n_rows"] | None = None,
    ) -> Float[Tensor, "batch pos_or_rows d_model"]:
        """Unhooked path: one QKV matmul, low-rank priors as extra query-key columns, the
        other priors (gated) plus the causal mask added to the scores.

        With ``rows`` (query positions), queries, attention and the output are computed
        only at those positions (keys and values still at every position); the result is
        ``[batch, len(rows), d_model]``. Not for priors that need the scores.
        """
        B, P, _ = x.shape
        H, Dh = self.cfg.n_heads, self.cfg.d_head
        if rows is None:
            w = torch.stack([self.W_Q, self.W_K, self.W_V])  # [3, head, d_model, d_head]
            b = torch.stack([self.b_Q, self.b_K, self.b_V])  # [3, head, d_head]
            qkv = x @ w.permute(2, 0, 1, 3).reshape(x.shape[-1], 3 * H * Dh) + b.reshape(-1)
            q, k, v = qkv.view(B, P, 3, H, Dh).permute(2, 0, 3, 1, 4)  # 3 x [batch, head, pos, d_head]
            M = P
        else:
            w = torch.stack([self.W_K, self.W_V])  # [2, head, d_model, d_head]
            b = torch.stack([self.b_K, self.b_V])
            kv = x @ w.permute(2, 0, 1, 3).reshape(x.shape[-1], 2 * H * Dh) + b.reshape(-1)
            k, v = kv.view(B, P, 2, H, Dh).permute(2, 0, 3, 1, 4)  # 2 x [batch, head, pos, d_head]
            M = rows.numel()
            q = x[:, rows] @ self.W_Q.permute(1, 0, 2).reshape(x.shape[-1], H * Dh) + self.b_Q.reshape(-1)
            q = q.view(B, M, H, Dh).transpose(1, 2)  # [batch, head, rows, d_head]
            causal = causal[rows]
        needs = any(p.needs_scores for p in self.priors.values())
        scores = (q @ k.transpose(-1, -2)) / self.attn_scale if needs else None
        inputs = PriorInputs(token_embed, x, scores, query_index=rows)
        # low-rank priors (a @ b^T) join the query-key product as extra columns; the rest add to the mask
        qs, ks, bias = [q / self.attn_scale], [k], None
        for name, prior in self.priors.items():
            g = self.gate(name).to(q.dtype)[:, None, None]
            ab = prior.factors(inputs)
            if ab is not None:
                qs.append(ab[0] * g)
                ks.append(ab[1])
                continue
            term = prior(inputs)
            if rows is not None and term.shape[-2] != M:
                term = term[..., rows, :]
            bias = g * term if bias is None else bias + g * term
        mask = causal if bias is None else bias + causal  # [batch_or_1, head, q, k]
        if len(qs) > 1:
            q, k = torch.cat(qs, -1), torch.cat(ks, -1)
        else:
            q = qs[0]
        # no row is fully masked (the diagonal is always visible), so a plain softmax is exact
        pattern = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
        z = (pattern @ v).transpose(1, 2).reshape(B, M, H * Dh)  # [batch, pos_or_rows, head*d_head]
        return F.linear(z, self.W_O.flatten(0, 1).T, self.b_O)


class SoftPriorBlock(TransformerBlock):
    """A TransformerLens block whose attention takes the token embeddings too."""

    def __init__(self, cfg: SoftPriorConfig, layer: int):
        super().__init__(cfg, layer)
        self.attn = SoftPriorAttention(cfg, layer)

    def forward(  # type: ignore[override]
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        token_embed: Float[Tensor, "batch pos d_model"],
        causal: Float[Tensor, "query_pos key_pos"] | None = None,
        rows: Int[Tensor, "n_rows"] | None = None,
    ) -> Float[Tensor, "batch pos_or_rows d_model"]:
        if causal is not None:  # fused path: no hooks anywhere (``rows``: only those query positions)
            attn_out = self.attn.forward_fused(_ln(self.ln1, resid_pre), token_embed, causal, rows)
            resid = (resid_pre if rows is None else resid_pre[:, rows]) + attn_out
            if not self.cfg.attn_only:
                resid = resid + self.mlp(_ln(self.ln2, resid))
            return resid
        resid_pre = self.hook_resid_pre(resid_pre)  # [batch, pos, d_model]
        attn_out = self.hook_attn_out(self.attn.forward_prior(self.ln1(resid_pre), token_embed))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


def _ln(module: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm without hooks (same maths as TransformerLens's LayerNorm)."""
    if hasattr(module, "w") and hasattr(module, "b") and type(module).__name__ == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), module.w, module.b, module.eps)
    return module(x)


class SoftPriorTransformer(HookedTransformer):
    """A ``HookedTransformer`` whose attention heads carry gated, annealable priors.

    Build with ``SoftPriorTransformer(SoftPriorConfig.base())`` (or keyword
    overrides: ``SoftPriorTransformer(n_layers=4)``). Inputs are token tensors
    ``[batch, pos]``; ``run_with_cache``, ``run_with_hooks`` and the standard
    hook names (``utils.get_act_name("pattern", 0)``) work as usual.
    """

    cfg: SoftPriorConfig
    supports_positions = True  # forward(..., positions=) computes the last block only there

    def __init__(self, cfg: SoftPriorConfig | Mapping | None = None, **overrides):
        if cfg is None:
            cfg = SoftPriorConfig(**overrides)
        elif isinstance(cfg, Mapping):
            cfg = SoftPriorConfig(**{**cfg, **overrides})
        elif overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        if not isinstance(cfg, SoftPriorConfig):
            raise TypeError(f"expected a SoftPriorConfig, got {type(cfg).__name__}")
        with warnings.catch_warnings():
            # our own subclass is the supported way to use HookedTransformer here
            warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
            super().__init__(cfg)
        self.blocks = nn.ModuleList([SoftPriorBlock(cfg, layer) for layer in range(cfg.n_layers)])
        if cfg.nope:
            del self.pos_embed, self.hook_pos_embed
        self.init_weights()
        self.setup()
        self.use_fused = True
        self._causal_cache: dict = {}
        self._attn_cache: list[SoftPriorAttention] = [b.attn for b in self.blocks]

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
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.d_vocab):
            raise ValueError(
                f"token ids must be in [0, {self.cfg.d_vocab}); got min {int(tokens.min())}, max {int(tokens.max())}"
            )
        return tokens.long().to(self.W_E.device)

    def forward(  # type: ignore[override]
        self,
        input: Int[Tensor, "batch pos"],
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        *,
        stop_at_layer: int | None = None,
        positions: Int[Tensor, "n_rows"] | None = None,
        **kwargs,
    ):
        """Run the model on token ids.

        ``return_type``: ``"logits"`` (default), ``"loss"`` (next-token loss, as in
        TransformerLens), ``"both"`` or ``None``. ``stop_at_layer`` returns the
        residual stream before that block. Keyword arguments of
        ``HookedTransformer.forward`` that make no sense here (strings, KV cache,
        padding) raise ``TypeError``.

        ``positions`` (sequence positions, with ``return_type="logits"``) says that only
        the logits there are needed: on the fused path the last block then computes
        queries, attention, output and unembedding only at those positions (keys and
        values everywhere; the same maths, tested to 1e-5 on loss and every gradient) and
        the logits at every other position are NaN. With a hook attached (or
        ``use_fused = False``) it is ignored and every position is computed.
        """
        unsupported = {k for k, v in kwargs.items() if v is not None and k not in ("prepend_bos", "padding_side")}
        if unsupported:
            raise TypeError(f"SoftPriorTransformer.forward does not support {sorted(unsupported)}")
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}")
        real = self.cfg.input_mode == "real"
        tokens = self._check_real(input) if real else self._check_tokens(input)
        n = tokens.shape[1]
        fused = self.use_fused and not self._hooks_attached() and self.cfg.positional_embedding_type != "rotary"
        rows = None
        if positions is not None:
            if return_type != "logits":
                raise ValueError("positions= needs return_type='logits'")
            rows = self._rows(positions, n)
            if not fused or stop_at_layer is not None:
                rows = None
        if fused:
            causal = self._causal(n, tokens.device)
            embed = self._embed(tokens)
            resid = embed
            if self.cfg.positional_embedding_type in ("standard", "shortformer"):
                resid = embed + self.pos_embed.W_pos[:n]
        else:
            causal = None
            embed = self.hook_embed(self._embed(tokens))  # [batch, pos, d_model]
            # its own tensor: an in-place hook on the residual must not change what the priors read
            resid = embed.clone() if self.cfg.nope else embed
            if self.cfg.positional_embedding_type in ("standard", "shortformer"):
                resid = embed + self.hook_pos_embed(self.pos_embed.W_pos[:n].expand(embed.shape[0], -1, -1))
        blocks = self.blocks[:stop_at_layer]
        last = len(blocks) - 1
        for i, block in enumerate(blocks):
            resid = block(resid, embed, causal, rows if i == last else None)
        if stop_at_layer is not None:
            return resid
        if self.cfg.normalization_type is not None:
            resid = _ln(self.ln_final, resid) if fused else self.ln_final(resid)
        logits = F.linear(resid, self.unembed.W_U.T, self.unembed.b_U) if fused else self.unembed(resid)
        if rows is not None:  # only those positions were computed; NaN elsewhere
            full = logits.new_full((logits.shape[0], n, logits.shape[-1]), float("nan"))
            logits = full.index_copy(1, rows, logits)
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if real:
            raise ValueError("return_type 'loss'/'both' (next-token loss) needs token inputs; use a task's loss")
        loss = lm_cross_entropy_loss(logits, tokens, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _causal(self, n: int, device) -> Tensor:
        """The additive causal mask ``[n, n]`` (0 on and below the diagonal, -inf above), cached."""
        key = (n, str(device))
        mask = self._causal_cache.get(key)
        if mask is None:
            mask = torch.full((n, n), float("-inf"), device=device).triu(1)
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
    def attn_layers(self) -> list[SoftPriorAttention]:
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
    def gates(self, pos=None, content=None, **others) -> Iterator["SoftPriorTransformer"]:
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
                    g = _as_gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)
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
                g = _as_gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)

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
                        _as_gate_tensor(v, self.cfg.n_layers, self.cfg.n_heads, layer)
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
        """State dict of the plain backbone (no priors, gates; W_pos = 0 for NoPE)."""
        prior_names = {n for n, _ in self.prior_parameters()}
        sd = {
            k: v
            for k, v in self.state_dict().items()
            if k not in prior_names and ".attn.gate_" not in k and ".attn.priors." not in k
        }
        if self.cfg.nope:
            sd["pos_embed.W_pos"] = torch.zeros(self.cfg.n_ctx, self.cfg.d_model, dtype=self.cfg.dtype)
        return sd

    def to_hooked_transformer(self) -> HookedTransformer:
        """A plain ``HookedTransformer`` with the same backbone weights and no priors.

        For a NoPE backbone it uses a standard positional embedding set to zero.
        With every gate at zero the two models give the same logits.
        """
        names = {f.name for f in dataclasses.fields(HookedTransformerConfig) if f.init}
        kw = {k: v for k, v in self.cfg.to_json_dict().items() if k in names}
        kw["dtype"] = self.cfg.dtype
        if self.cfg.nope:
            kw["positional_embedding_type"] = "standard"
        ht = HookedTransformer(HookedTransformerConfig(**kw))
        ht.load_state_dict(self.backbone_state_dict(), strict=True)
        return ht.to(self.W_E.device, print_details=False)

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
    def from_pretrained(cls, path: str | Path, device: str | None = None, **_ignored) -> "SoftPriorTransformer":  # type: ignore[override]
        """Load a model written by :meth:`save_pretrained` (no network, no pickle)."""
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise CheckpointError(f"{path}: no {CONFIG_FILE}; not a circuitfade model directory")
        meta = read_json(path / CONFIG_FILE)
        if not isinstance(meta, dict) or meta.get("class") != "SoftPriorTransformer" or "config" not in meta:
            raise CheckpointError(f"{path / CONFIG_FILE}: not a SoftPriorTransformer config")
        cfg_d = dict(meta["config"])
        if device is not None:
            cfg_d["device"] = device
        cfg = SoftPriorConfig.from_json_dict(cfg_d, source=str(path / CONFIG_FILE))
        model = cls(cfg)
        model.load_weights(path / WEIGHTS_FILE)
        return model

    def load_weights(self, file: str | Path | Mapping[str, Tensor]) -> "SoftPriorTransformer":
        """Load a state dict from a file (safetensors / weights-only .pt) or mapping, checked."""
        source = "state dict" if isinstance(file, Mapping) else str(file)
        sd = dict(file) if isinstance(file, Mapping) else load_tensors(file)
        expected = self.state_dict()
        check_state_dict(sd, expected, source)
        self.load_state_dict(sd, strict=True)
        return self

    def n_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
