"""The soft-prior model on TransformerLens 3.x: a ``HookedTransformer`` subclass.

The computation lives in :mod:`circuitfade.model.core`; this shell gives it
``HookedTransformer``'s module tree (``Attention``, ``TransformerBlock``, the
embeddings, norms and MLPs of ``transformer_lens.components``), so a
:class:`SoftPriorTransformer` here *is* a ``HookedTransformer`` and every
TransformerLens 3 tool works on it. Import it through :mod:`circuitfade.model`, which
picks this shell on 3.x and :mod:`circuitfade.model.native` on 4.x.

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
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Mapping

import torch.nn as nn
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.components import Attention, TransformerBlock

from circuitfade.model.config import SoftPriorConfig
from circuitfade.model.core import PriorAttentionCore, PriorBlockCore, SoftPriorCore

__all__ = ["SoftPriorAttention", "SoftPriorBlock", "SoftPriorTransformer"]


def _as_config(cfg, overrides) -> SoftPriorConfig:
    if cfg is None:
        cfg = SoftPriorConfig(**overrides)
    elif isinstance(cfg, Mapping):
        cfg = SoftPriorConfig(**{**cfg, **overrides})
    elif overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    if not isinstance(cfg, SoftPriorConfig):
        raise TypeError(f"expected a SoftPriorConfig, got {type(cfg).__name__}")
    return cfg


class SoftPriorAttention(PriorAttentionCore, Attention):
    """TransformerLens ``Attention`` plus gated priors (same weight names, same hooks)."""

    def __init__(self, cfg: SoftPriorConfig, layer: int):
        Attention.__init__(self, cfg, "global", layer)
        # TransformerLens stores a numpy scalar; SDPA (and torch.compile) need a Python float
        self.attn_scale = float(self.attn_scale)
        self.add_priors(cfg, layer)


class SoftPriorBlock(PriorBlockCore, TransformerBlock):
    """A TransformerLens block whose attention takes the token embeddings too."""

    def __init__(self, cfg: SoftPriorConfig, layer: int):
        TransformerBlock.__init__(self, cfg, layer)
        self.attn = SoftPriorAttention(cfg, layer)


class SoftPriorTransformer(SoftPriorCore, HookedTransformer):
    """A ``HookedTransformer`` whose attention heads carry gated, annealable priors.

    Build with ``SoftPriorTransformer(SoftPriorConfig.base())`` (or keyword
    overrides: ``SoftPriorTransformer(n_layers=4)``). Inputs are token tensors
    ``[batch, pos]``; ``run_with_cache``, ``run_with_hooks`` and the standard
    hook names (``utils.get_act_name("pattern", 0)``) work as usual.
    """

    cfg: SoftPriorConfig

    def __init__(self, cfg: SoftPriorConfig | Mapping | None = None, **overrides):
        cfg = _as_config(cfg, overrides)
        with warnings.catch_warnings():
            # our own subclass is the supported way to use HookedTransformer here
            warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
            HookedTransformer.__init__(self, cfg)
        self.blocks = nn.ModuleList([SoftPriorBlock(cfg, layer) for layer in range(cfg.n_layers)])
        if cfg.nope:
            del self.pos_embed, self.hook_pos_embed
        self.init_weights()
        self.setup()
        self._finish_init()

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
