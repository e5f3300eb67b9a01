"""The soft-prior model's backbone without ``HookedTransformer``: config, components, initialisation.

TransformerLens 4 removed ``HookedTransformer``, ``HookedTransformerConfig`` and
``transformer_lens.components``. The native shell of the soft-prior model
(:mod:`circuitfade.model.native`) is built from the pieces here, which reproduce
TransformerLens 3.9's backbone exactly: the same parameter and buffer names, shapes,
dtypes and registration order (so state dicts, ``named_parameters`` order and
optimizer state line up), the same hook points, the same arithmetic (so logits and
gradients are bit-identical), and the same random initialisation sequence. Only
``HookPoint`` (shared by both lines) is taken from TransformerLens; everything here
imports on either line, and ``tests/tl4/test_soft_prior_lines.py`` checks it against
TransformerLens 3.9 term by term.

* :class:`BackboneConfig` - the fields, defaults and derived values of 3.9's
  ``HookedTransformerConfig`` (``d_mlp = 4 d_model``, ``d_vocab_out = d_vocab``,
  ``attn_scale = √d_head``, ``initializer_range = 0.8 / √d_model`` for ``gpt2`` init,
  ``rotary_dim = d_head``, ``n_params``, the device, seeding). A config written by either
  line reads on the other (same JSON fields).
* :class:`Embed`, :class:`PosEmbed`, :class:`Unembed`, :class:`LayerNorm`,
  :class:`LayerNormPre`, :class:`RMSNorm`, :class:`RMSNormPre`, :class:`MLP` - the
  components, with ``HookedTransformer``'s names (``embed.W_E``, ``ln1.w``,
  ``mlp.W_in``, ``unembed.b_U``, ...) and hooks (``hook_scale``, ``hook_normalized``,
  ``hook_pre``, ``hook_post``, ``hook_in``, ``hook_out``).
* :func:`init_weights` - ``HookedTransformer.init_weights`` for every ``init_mode``.
* :func:`rotary_tables`, :func:`apply_rotary` - rotary embeddings (GPT-J or GPT-NeoX
  pairing, linear scaling factor).

``HookedTransformer`` options that give the 3.x shell other modules or tables (gated or
mixture-of-experts MLPs, QK-norm, a post-embedding LayerNorm, extra norms, attention sinks,
NTK/YaRN rotary tables, 4-bit weights, several devices, an ``xielu`` MLP) raise
``ValueError`` naming the field (:func:`check_native_config`); options the soft-prior
model ignores on 3.x are ignored here too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Union

import einops
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

__all__ = [
    "BackboneConfig", "ACTIVATIONS", "SOFTCAP_DISABLED", "check_native_config", "make_norm", "Embed", "PosEmbed",
    "Unembed", "LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre", "MLP", "init_weights", "rotary_tables",
    "apply_rotary", "best_device",
]

SOFTCAP_DISABLED = -1.0


# --------------------------------------------------------------------------------------
# activation functions (TransformerLens 3.9's formulas)
# --------------------------------------------------------------------------------------
def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU: ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``."""
    return 0.5 * x * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: Tensor) -> Tensor:
    """``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x²)))``."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def solu(x: Tensor) -> Tensor:
    """SoLU: ``x · softmax(x)`` over the last axis."""
    return x * F.softmax(x, dim=-1)


def relu2(x: Tensor) -> Tensor:
    """Squared ReLU: ``relu(x)²``."""
    r = F.relu(x)
    return r * r


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "solu": solu,
    "solu_ln": solu,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "silu": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu2": relu2,
}
"""Activation functions of the native MLP, by ``act_fn`` name (TransformerLens 3.9's formulas)."""
_CONFIG_ACTIVATIONS = frozenset(ACTIVATIONS) | {"xielu"}  # what HookedTransformerConfig accepts


def best_device() -> str:
    """``"cuda"`` if available, else ``"cpu"`` (TransformerLens's default ``cfg.device``)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------
@dataclass
class BackboneConfig:
    """TransformerLens 3.9's ``HookedTransformerConfig`` fields, defaults and derived values.

    The field list (names, order, defaults) is 3.9's, so ``to_json_dict`` of a
    :class:`~circuitfade.model.SoftPriorConfig` is the same on both lines and a config
    written by one line reads on the other. ``__post_init__`` derives what 3.9 derives:
    ``n_heads = d_model // d_head`` (if -1), ``d_mlp = 4 d_model`` (if None),
    ``initializer_range = 0.8 / √d_model`` (``gpt2`` init) or 1.0, ``d_vocab_out = d_vocab``
    (if -1), ``rotary_dim = d_head`` (rotary), ``n_params``, ``attn_scale = √d_head`` (if -1)
    and ``device`` (CUDA if available); with ``seed`` set it seeds torch, ``random`` and
    numpy, as 3.9 does.
    """

    d_model: int
    d_head: int
    n_layers: int
    n_ctx: int
    n_heads: int = -1
    d_mlp: Optional[int] = None
    d_vocab: int = -1
    device: Optional[str] = None
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    default_prepend_bos: bool = True
    positional_embedding_type: str = "standard"
    n_key_value_heads: Optional[int] = None
    attn_only: bool = False
    gated_mlp: bool = False
    uses_rms_norm: bool = False
    eps: float = 1e-05
    layer_norm_folding: bool = False
    act_fn: str = "relu"
    normalization_type: Optional[str] = "LN"
    num_experts: Optional[int] = None
    experts_per_token: Optional[int] = None
    final_rms: bool = False
    dtype: torch.dtype = torch.float32
    model_name: str = "custom"
    use_attn_scale: bool = True
    attn_scale: float = -1.0
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_qk_norm: bool = False
    clip_qkv: Optional[float] = None
    use_logn_attn: bool = False
    train_seq_length: Optional[int] = None
    use_dynamic_ntk_rope: bool = False
    use_local_attn: bool = False
    ungroup_grouped_query_attention: bool = False
    original_architecture: Optional[str] = None
    from_checkpoint: bool = False
    checkpoint_index: Optional[int] = None
    checkpoint_label_type: Optional[str] = None
    checkpoint_value: Optional[int] = None
    tokenizer_name: Optional[str] = None
    window_size: Optional[int] = None
    attn_types: Optional[List] = None
    init_mode: str = "gpt2"
    n_devices: int = 1
    attention_dir: str = "causal"
    seed: Optional[int] = None
    initializer_range: float = -1.0
    init_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    d_vocab_out: int = -1
    parallel_attn_mlp: bool = False
    rotary_dim: Optional[int] = None
    n_params: Optional[int] = None
    use_hook_tokens: bool = False
    tokenizer_prepends_bos: Optional[bool] = None
    post_embedding_ln: bool = False
    rotary_base: Union[float, int] = 10000
    rotary_base_local: Optional[Union[float, int]] = None
    rotary_scaling_factor: float = 1.0
    trust_remote_code: bool = False
    rotary_adjacent_pairs: bool = False
    load_in_4bit: bool = False
    quantization_method: Optional[str] = None
    relative_attention_max_distance: Optional[int] = None
    relative_attention_num_buckets: Optional[int] = None
    decoder_start_token_id: Optional[int] = None
    tie_word_embeddings: bool = False
    use_normalization_before_and_after: bool = False
    attn_scores_soft_cap: float = SOFTCAP_DISABLED
    output_logits_soft_cap: float = SOFTCAP_DISABLED
    use_NTK_by_parts_rope: bool = False
    NTK_by_parts_low_freq_factor: float = 1.0
    NTK_by_parts_high_freq_factor: float = 4.0
    NTK_by_parts_factor: float = 8.0
    NTK_original_ctx_len: int = 8192
    use_yarn_rope: bool = False
    yarn_factor: float = 1.0
    yarn_attention_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_truncate: bool = True
    yarn_global_attn_only: bool = False
    use_attention_sinks: bool = False
    norm_topk_prob: bool = False

    def __post_init__(self):
        if self.n_heads == -1:
            self.n_heads = self.d_model // self.d_head
            if not self.d_model % self.d_head == 0:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by d_head ({self.d_head})")
        if self.device is None:
            self.device = best_device()
        if self.d_mlp is None:
            self.d_mlp = self.d_model * 4
        if self.seed is not None:
            self.set_seed_everywhere(self.seed)
        if self.use_local_attn:
            assert self.window_size is not None, "window_size must be specified for local attention"
            assert self.attn_types is not None, "attn_types must be specified for local attention"
        if not self.attn_only:
            assert self.act_fn is not None, "act_fn must be specified for non-attn-only models"
            assert self.act_fn in _CONFIG_ACTIVATIONS, f"act_fn={self.act_fn} must be one of {sorted(_CONFIG_ACTIVATIONS)}"
        if self.initializer_range < 0 and self.init_mode == "gpt2":
            self.initializer_range = 0.8 / np.sqrt(self.d_model)
        if self.initializer_range < 0 and self.init_mode != "gpt2":
            self.initializer_range = 1.0
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.num_experts is not None:
            assert self.experts_per_token is not None, "experts_per_token must be set if num_experts is set"
        if self.experts_per_token is not None:
            assert self.num_experts is not None, "num_experts must be set if experts_per_token is set"
        self.n_params = self.n_layers * (self.d_model * self.d_head * self.n_heads * 4)
        if not self.attn_only:
            assert self.d_mlp is not None
            mlp_params_per_layer = self.d_model * self.d_mlp * (2 + self.gated_mlp)
            if self.num_experts:
                mlp_params_per_layer = (mlp_params_per_layer + self.d_model) * self.num_experts
            self.n_params += self.n_layers * mlp_params_per_layer
        if self.n_devices > 1:
            assert torch.cuda.device_count() >= self.n_devices, \
                f"Not enough CUDA devices to support n_devices {self.n_devices}"
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = np.sqrt(self.d_head)
        assert self.default_prepend_bos in [True, False], \
            f"default_prepend_bos must be either True or False, but {self.default_prepend_bos} is given"

    def set_seed_everywhere(self, seed: int) -> None:
        """Seed torch, ``random`` and numpy with ``seed`` (as ``HookedTransformerConfig`` does)."""
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__

    def is_layer_norm_activation(self) -> bool:
        return self.act_fn is not None and self.act_fn.endswith("_ln")


_UNSUPPORTED = (  # (field, the value the native shell supports): the other values change the 3.x shell's
    # module tree or tables (extra parameters, other MLPs, other rotary tables), so no native equivalent
    ("gated_mlp", False), ("num_experts", None), ("use_qk_norm", False), ("post_embedding_ln", False),
    ("use_normalization_before_and_after", False), ("load_in_4bit", False), ("parallel_attn_mlp", False),
    ("n_devices", 1), ("use_NTK_by_parts_rope", False), ("use_yarn_rope", False), ("use_attention_sinks", False),
)


def check_native_config(cfg) -> None:
    """``ValueError`` naming the first field of ``cfg`` that the native shell does not implement."""
    for name, ok in _UNSUPPORTED:
        v = getattr(cfg, name, ok)
        if v != ok and not (ok is None and v is None):
            raise ValueError(f"{name}={v!r} is not supported by the soft-prior model on TransformerLens 4 "
                             f"(native shell); supported: {name}={ok!r}")
    if cfg.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre", None):
        raise ValueError(f"normalization_type must be 'LN', 'LNPre', 'RMS', 'RMSPre' or None, "
                         f"got {cfg.normalization_type!r}")
    if not cfg.attn_only and cfg.act_fn not in ACTIVATIONS:
        raise ValueError(f"act_fn={cfg.act_fn!r} is not supported by the native shell; one of {sorted(ACTIVATIONS)}")


# --------------------------------------------------------------------------------------
# components (TransformerLens 3.9's names, hooks and arithmetic)
# --------------------------------------------------------------------------------------
class Embed(nn.Module):
    """Token embedding ``W_E [d_vocab, d_model]``: ``tokens -> W_E[tokens]``."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens, :]


class PosEmbed(nn.Module):
    """Learned absolute positions ``W_pos [n_ctx, d_model]``: ``tokens -> W_pos[:pos]`` per batch row."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[Tensor, "batch pos"], past_kv_pos_offset: int = 0) -> Float[Tensor, "batch pos d_model"]:
        n = tokens.size(-1)
        pos_embed = self.W_pos[past_kv_pos_offset: n + past_kv_pos_offset, :]
        return einops.repeat(pos_embed, "pos d_model -> batch pos d_model", batch=tokens.size(0)).clone()


class Unembed(nn.Module):
    """Read-out ``resid @ W_U + b_U`` (``W_U [d_model, d_vocab_out]``), hooks ``hook_in``, ``hook_out``."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab_out"]:
        residual = self.hook_in(residual)
        return self.hook_out(F.linear(residual, self.W_U.T.contiguous(), self.b_U))


def _to_compute(cfg, x: Tensor) -> Tensor:
    return x if cfg.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


class _Norm(nn.Module):
    """The four normalisations, one forward: ``x`` (centred if ``centre``) divided by
    ``√(mean(x²) + eps)``, then ``· w`` (+ ``b``) if ``weighted``; hooks ``hook_scale``
    ``[batch, pos, 1]`` and ``hook_normalized``. TransformerLens 3.9's arithmetic, in its order."""

    centre = weighted = biased = False

    def __init__(self, cfg, length: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.eps = cfg.eps
        if self.weighted:
            self.length = cfg.d_model if length is None else length
            self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
            if self.biased:
                self.b = nn.Parameter(torch.zeros(self.length, dtype=cfg.dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "... length"]) -> Float[Tensor, "... length"]:
        x = _to_compute(self.cfg, x)
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale).to(self.cfg.dtype)
        if not self.weighted:
            return x
        return x * self.w + self.b if self.biased else x * self.w


class LayerNorm(_Norm):
    """``(x - mean) / √(var + eps) · w + b`` over the last axis."""

    centre = weighted = biased = True


class LayerNormPre(_Norm):
    """LayerNorm's centre-and-normalise part, no weights: ``(x - mean) / √(var + eps)``."""

    centre = True

    def __init__(self, cfg):
        super().__init__(cfg)


class RMSNorm(_Norm):
    """``x / √(mean(x²) + eps) · w``."""

    weighted = True


class RMSNormPre(_Norm):
    """``x / √(mean(x²) + eps)``, no weights."""

    def __init__(self, cfg):
        super().__init__(cfg)


def make_norm(cfg, final: bool = False) -> nn.Module | None:
    """The normalisation layer ``HookedTransformer`` builds for ``cfg.normalization_type``
    (``final``: ``ln_final``, which is RMS for ``final_rms`` and absent for RMS/None types)."""
    kind = cfg.normalization_type
    if final:
        if kind == "LN":
            return RMSNorm(cfg) if cfg.final_rms else LayerNorm(cfg)
        if kind == "LNPre":
            return RMSNormPre(cfg) if cfg.final_rms else LayerNormPre(cfg)
        if kind == "RMS":
            return RMSNorm(cfg)
        if kind == "RMSPre":
            return RMSNormPre(cfg)
        return None
    return {"LN": LayerNorm, "LNPre": LayerNormPre, "RMS": RMSNorm, "RMSPre": RMSNormPre}.get(
        kind, lambda cfg: nn.Identity())(cfg)


def _batch_addmm(bias: Tensor, weight: Float[Tensor, "d_in d_out"], x: Float[Tensor, "... d_in"]) -> Tensor:
    """``x @ weight + bias`` as one ``addmm`` over the flattened batch (TransformerLens's ``batch_addmm``)."""
    size_out = x.size()[:-1] + (weight.shape[-1],)
    return torch.addmm(bias, x.view(-1, x.size(-1)), weight).view(size_out)


class MLP(nn.Module):
    """``act(x W_in + b_in) W_out + b_out`` (``W_in [d_model, d_mlp]``); hooks ``hook_pre``, ``hook_post``
    (and ``hook_mid`` plus a LayerNorm ``ln`` for ``*_ln`` activations)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        if cfg.d_mlp is None:
            raise ValueError("d_mlp must be set to use an MLP")
        if cfg.act_fn not in ACTIVATIONS:
            raise ValueError(f"act_fn={cfg.act_fn!r} is not supported by the native shell; one of {sorted(ACTIVATIONS)}")
        self.d_mlp = cfg.d_mlp
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        if cfg.is_layer_norm_activation():
            self.hook_mid = HookPoint()
            self.ln = LayerNorm(cfg, self.d_mlp) if cfg.normalization_type == "LN" else LayerNormPre(cfg)
        else:
            self.hook_mid, self.ln = None, None
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, self.d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(self.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(self.d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre_act = self.hook_pre(_batch_addmm(self.b_in, self.W_in, x))
        if self.ln is not None:
            post_act = self.hook_post(self.ln(self.hook_mid(self.act_fn(pre_act))))
        else:
            post_act = self.hook_post(self.act_fn(pre_act))
        return _batch_addmm(self.b_out, self.W_out, post_act)


# --------------------------------------------------------------------------------------
# rotary embeddings
# --------------------------------------------------------------------------------------
ROTARY_CACHE = 2048


def rotary_tables(cfg) -> tuple[Float[Tensor, "n rotary_dim"], Float[Tensor, "n rotary_dim"]]:
    """``(sin, cos)`` tables ``[min(n_ctx, 2048), rotary_dim]`` of angle ``pos / base^(2i / rotary_dim)``
    (frequencies repeated ``(d 2)`` for adjacent pairs, ``(2 d)`` otherwise; times
    ``rotary_scaling_factor``), computed in float32 (float64 for float64 models)."""
    rotary_dim, dtype = cfg.rotary_dim, cfg.dtype
    high = torch.float32 if dtype != torch.float64 else torch.float64
    pos = torch.arange(min(cfg.n_ctx, ROTARY_CACHE), dtype=high)
    dim = torch.arange(rotary_dim // 2, dtype=high)
    freq = cfg.rotary_base ** (dim / (rotary_dim / 2))
    scaling = getattr(cfg, "rotary_scaling_factor", 1.0)
    if scaling != 1.0:
        freq = freq * scaling
    freq = einops.repeat(freq, "d -> (d 2)") if cfg.rotary_adjacent_pairs else einops.repeat(freq, "d -> (2 d)")
    angles = pos[:, None] / freq[None, :]
    return torch.sin(angles).to(dtype), torch.cos(angles).to(dtype)


def _rotate_every_two(x: Tensor, adjacent: bool) -> Tensor:
    rot_x = x.clone()
    if adjacent:
        rot_x[..., ::2] = -x[..., 1::2]
        rot_x[..., 1::2] = x[..., ::2]
    else:
        n = x.size(-1) // 2
        rot_x[..., :n] = -x[..., n:]
        rot_x[..., n:] = x[..., :n]
    return rot_x


def apply_rotary(x: Float[Tensor, "batch pos head d_head"], sin: Tensor, cos: Tensor, cfg) -> Float[Tensor, "batch pos head d_head"]:
    """Rotate the first ``rotary_dim`` features of ``x`` at positions ``0 .. pos-1``:
    ``x_rot cos + rotate(x_rot) sin`` (the rest pass through)."""
    if x.device != sin.device:
        x = x.to(sin.device)
    n = x.size(1)
    if n > cos.shape[0]:
        raise ValueError(f"sequence length {n} exceeds the rotary table ({cos.shape[0]} positions)")
    x_rot, x_pass = x[..., : cfg.rotary_dim], x[..., cfg.rotary_dim:]
    x_flip = _rotate_every_two(x_rot, cfg.rotary_adjacent_pairs)
    x_rotated = x_rot * cos[None, 0:n, None, :] + x_flip * sin[None, 0:n, None, :]
    return torch.cat([x_rotated, x_pass], dim=-1)


# --------------------------------------------------------------------------------------
# initialisation (HookedTransformer.init_weights)
# --------------------------------------------------------------------------------------
def _fans(param: Tensor) -> tuple[int, int]:
    shape = param.shape
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3:
        return shape[1], shape[0] * shape[2]
    raise ValueError(f"no fan-in / fan-out for a tensor of shape {tuple(shape)}")


def init_weights(model: nn.Module, cfg) -> None:
    """Initialise every parameter whose name contains ``W_`` as ``HookedTransformer.init_weights``
    does, in ``named_parameters`` order (seeding torch with ``cfg.seed`` first, if set):
    ``gpt2`` N(0, initializer_range²); ``xavier_uniform`` U(±g√(6/(fan_in+fan_out)));
    ``xavier_normal`` N(0, g²·2/(fan_in+fan_out)); ``kaiming_uniform`` U(±g√2·√(3/fan_in));
    ``kaiming_normal`` N(0, 2g²/fan_in); ``muP`` N(0, s²) with s = 1 (embed), 1/fan_in
    (unembed), 1/√fan_in (others); g = ``initializer_range``."""
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    mode, gain = cfg.init_mode, cfg.initializer_range
    for name, param in model.named_parameters():
        if "W_" not in name:
            continue
        if mode == "gpt2":
            nn.init.normal_(param, std=gain)
        elif mode in ("xavier_uniform", "xavier_normal"):
            fan_in, fan_out = _fans(param)
            if mode == "xavier_uniform":
                bound = gain * np.sqrt(6.0 / (fan_in + fan_out))
                nn.init.uniform_(param, -bound, bound)
            else:
                nn.init.normal_(param, mean=0.0, std=gain * np.sqrt(2.0 / (fan_in + fan_out)))
        elif mode in ("kaiming_uniform", "kaiming_normal"):
            fan_in, _ = _fans(param)
            g = gain * nn.init.calculate_gain("relu", 0)
            if mode == "kaiming_uniform":
                bound = g * np.sqrt(3.0 / fan_in)
                nn.init.uniform_(param, -bound, bound)
            else:
                nn.init.normal_(param, mean=0.0, std=g * np.sqrt(1.0 / fan_in))
        elif mode == "muP":
            fan_in, _ = _fans(param)
            # as in TransformerLens: "embed" is tested first, so the unembedding gets scale 1 too
            scale = float(1) if "embed" in name else (1 / fan_in if "unembed" in name else 1 / fan_in**0.5)
            nn.init.normal_(param, std=scale)
        # any other init_mode: no initialisation, as in TransformerLens
