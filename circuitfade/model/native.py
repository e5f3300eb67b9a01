"""The soft-prior model on TransformerLens 4.x: a native ``HookedRootModule``.

TransformerLens 4 removed ``HookedTransformer`` but keeps ``HookedRootModule`` and
``HookPoint``. This shell builds the module tree of the 3.x shell
(:mod:`circuitfade.model.hooked`) from them and :mod:`circuitfade.model.backbone`: the same
parameter, buffer and hook names, shapes and order, and the same random draws in the same
order (the 3.x shell draws a ``HookedTransformer`` initialisation, builds the priors, then
draws again), around the same computation (:mod:`circuitfade.model.core`). So a state dict,
a ``config.json`` or a run directory written on one line loads on the other and gives
bit-identical logits, gradients and training runs. What the two shells share is
:mod:`circuitfade.model.shell`; what ``HookedTransformer`` gives the 3.x shell (``to``,
``init_weights``, the stacked ``W_Q``, ``W_E``, ... views) is written here. It also imports
on 3.x, where the equivalence tests run it beside the ``HookedTransformer`` shell.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from circuitfade.model.backbone import (
    MLP,
    Embed,
    PosEmbed,
    Unembed,
    check_native_config,
    init_weights,
    make_norm,
    rotary_tables,
)
from circuitfade.model.config import SoftPriorConfig
from circuitfade.model.core import PriorAttentionCore, PriorBlockCore, SoftPriorCore, attention_scale
from circuitfade.model.shell import FactoredViews, SoftPriorShell, as_config

__all__ = ["SoftPriorAttention", "SoftPriorBlock", "SoftPriorTransformer"]


class SoftPriorAttention(PriorAttentionCore, FactoredViews, nn.Module):
    """Attention with gated priors: ``HookedTransformer``'s attention parameters, buffers
    and hooks (``W_Q``, ``W_O``, ``b_Q``, ``b_O``, ``W_K``, ``W_V``, ``b_K``, ``b_V``;
    ``mask``, ``IGNORE``; ``hook_k`` ... ``hook_result``; rotary ``hook_rot_k``,
    ``hook_rot_q``, ``rotary_sin``, ``rotary_cos``) plus the priors of
    :meth:`~circuitfade.model.core.PriorAttentionCore.add_priors` (added by the model
    after its first initialisation pass, as on 3.x)."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg = cfg
        H, D, E, dt = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.dtype
        self.W_Q = nn.Parameter(torch.empty(H, D, E, dtype=dt))
        self.W_O = nn.Parameter(torch.empty(H, E, D, dtype=dt))
        self.b_Q = nn.Parameter(torch.zeros(H, E, dtype=dt))
        self.b_O = nn.Parameter(torch.zeros(D, dtype=dt))
        self.attn_type = "global"
        self.register_buffer("mask", torch.empty((0, 0), dtype=torch.bool))  # kept for state-dict compatibility
        self.register_buffer("IGNORE", torch.tensor(-torch.inf))
        self.layer_id = layer
        self.attn_scale = attention_scale(cfg, layer)
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]
        if cfg.positional_embedding_type == "shortformer":
            self.hook_attn_input = HookPoint()  # [batch, pos, d_model]
        elif cfg.positional_embedding_type == "rotary":
            self.hook_rot_k = HookPoint()
            self.hook_rot_q = HookPoint()
            sin, cos = rotary_tables(cfg)
            self.register_buffer("rotary_sin", sin)
            self.register_buffer("rotary_cos", cos)
        self.W_K = nn.Parameter(torch.empty(H, D, E, dtype=dt))
        self.W_V = nn.Parameter(torch.empty(H, D, E, dtype=dt))
        self.b_K = nn.Parameter(torch.zeros(H, E, dtype=dt))
        self.b_V = nn.Parameter(torch.zeros(H, E, dtype=dt))


class SoftPriorBlock(PriorBlockCore, nn.Module):
    """A block with ``HookedTransformer``'s ``TransformerBlock`` names and hooks
    (``ln1``, ``ln2``, ``attn``, ``mlp``, ``hook_attn_in`` ... ``hook_resid_post``)."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg = cfg
        self.normalization_type = cfg.normalization_type
        self.ln1 = make_norm(cfg)
        if not cfg.attn_only:
            self.ln2 = make_norm(cfg)
        self.attn = SoftPriorAttention(cfg, layer)
        if not cfg.attn_only:
            self.mlp = MLP(cfg)
        self.hook_attn_in = HookPoint()  # unused (as in the 3.x shell): kept so the hook names agree
        self.hook_q_input = HookPoint()
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_mlp_in = HookPoint()
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        if not cfg.attn_only:
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]


def _stacked(module: str, name: str, shape: str) -> property:
    """A read-only view: ``blocks.{l}.<module>.<name>`` of every layer stacked on a new first axis."""
    def stack(self) -> Tensor:
        return torch.stack([getattr(getattr(b, module), name) for b in self.blocks], dim=0)

    return property(stack, doc=f"``blocks.{{l}}.{module}.{name}`` of every layer, stacked ``[{shape}]``.")


class SoftPriorTransformer(SoftPriorShell, FactoredViews, SoftPriorCore, HookedRootModule):
    """The soft-prior Transformer as a native TransformerLens ``HookedRootModule``: built,
    called and hooked as the 3.x shell's :class:`~circuitfade.model.hooked.SoftPriorTransformer`."""

    cfg: SoftPriorConfig

    def __init__(self, cfg: SoftPriorConfig | Mapping | None = None, **overrides):
        cfg = as_config(cfg, overrides)
        check_native_config(cfg)
        super().__init__()
        self.cfg = cfg
        self.tokenizer = None
        # HookedTransformer's module tree, in its registration order
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.positional_embedding_type != "rotary":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        if cfg.use_hook_tokens:
            self.hook_tokens = HookPoint()  # [batch, pos]
        self.blocks = nn.ModuleList([SoftPriorBlock(cfg, layer) for layer in range(cfg.n_layers)])
        ln_final = make_norm(cfg, final=True)
        if ln_final is not None:
            self.ln_final = ln_final
        self.unembed = Unembed(cfg)
        # the 3.x shell's random draws, in order: HookedTransformer's initialisation of the plain
        # model, the modules moved to cfg.device, the priors built layer by layer, a second pass
        if cfg.init_weights:
            init_weights(self, cfg)
        self._move_outer_modules(cfg.device)
        for layer, block in enumerate(self.blocks):
            block.attn.add_priors(cfg, layer)
        if cfg.nope:
            del self.pos_embed, self.hook_pos_embed
        init_weights(self, cfg)
        self.dataset = None
        self.setup()
        self._finish_init()

    def _move_outer_modules(self, device) -> None:
        """Move the embeddings, final norm and read-out to ``device`` (``HookedTransformer``
        does this before the 3.x shell replaces its blocks; the blocks stay where they are)."""
        target = torch.device(device) if not isinstance(device, torch.device) else device
        for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed", "ln_final", "unembed"):
            module = getattr(self, name, None)
            if module is not None:
                module.to(target)

    def init_weights(self) -> None:
        """Re-draw every ``W_*`` parameter as ``HookedTransformer.init_weights`` does (see
        :func:`circuitfade.model.backbone.init_weights`)."""
        init_weights(self, self.cfg)

    # -- devices ------------------------------------------------------------------------
    def to(self, *args, print_details: bool = True, **kwargs):  # type: ignore[override]
        """``nn.Module.to`` that also records a new device or dtype in ``cfg`` (as
        ``HookedTransformer.to``; ``print_details`` prints the move)."""
        target = args[0] if args else kwargs.get("device", kwargs.get("dtype"))
        if isinstance(target, (str, torch.device)):
            self.cfg.device = torch.device(target).type if isinstance(target, torch.device) else target
            if print_details:
                print("Moving model to device: ", self.cfg.device)
        elif isinstance(target, torch.dtype):
            self.cfg.dtype = target
            if print_details:
                print("Changing model dtype to", target)
        return nn.Module.to(self, *args, **kwargs)

    def cuda(self, device=None):  # type: ignore[override]
        return self.to(f"cuda:{device}" if isinstance(device, int) else (device or "cuda"))

    def cpu(self):  # type: ignore[override]
        return self.to(torch.device("cpu"))

    # -- HookedTransformer's weight views (QK and OV: FactoredViews) ----------------------
    W_U = property(lambda self: self.unembed.W_U, doc="``unembed.W_U`` ``[d_model, d_vocab_out]``.")
    b_U = property(lambda self: self.unembed.b_U, doc="``unembed.b_U`` ``[d_vocab_out]``.")
    W_E = property(lambda self: self.embed.W_E, doc="``embed.W_E`` ``[d_vocab, d_model]``.")
    W_pos = property(lambda self: self.pos_embed.W_pos,
                     doc="Learned positions ``[n_ctx, d_model]`` (``positional_embedding_type`` standard/shortformer).")

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        return torch.cat([self.W_E, self.W_pos], dim=0)

    W_K = _stacked("attn", "W_K", "n_layers n_heads d_model d_head")
    W_Q = _stacked("attn", "W_Q", "n_layers n_heads d_model d_head")
    W_V = _stacked("attn", "W_V", "n_layers n_heads d_model d_head")
    W_O = _stacked("attn", "W_O", "n_layers n_heads d_head d_model")
    b_K = _stacked("attn", "b_K", "n_layers n_heads d_head")
    b_Q = _stacked("attn", "b_Q", "n_layers n_heads d_head")
    b_V = _stacked("attn", "b_V", "n_layers n_heads d_head")
    b_O = _stacked("attn", "b_O", "n_layers d_model")
    W_in = _stacked("mlp", "W_in", "n_layers d_model d_mlp")
    W_out = _stacked("mlp", "W_out", "n_layers d_mlp d_model")
    b_in = _stacked("mlp", "b_in", "n_layers d_mlp")
    b_out = _stacked("mlp", "b_out", "n_layers d_model")

    def all_head_labels(self) -> list[str]:
        return [f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]
