"""The soft-prior model on TransformerLens 3.x: a ``HookedTransformer`` subclass.

The computation lives in :mod:`circuitfade.model.core`; this shell gives it
``HookedTransformer``'s module tree (``Attention``, ``TransformerBlock``, the
embeddings, norms and MLPs of ``transformer_lens.components``), so a
:class:`SoftPriorTransformer` here *is* a ``HookedTransformer`` and every
TransformerLens 3 tool works on it. What it shares with the 4.x shell (the config
argument, the deprecated ``to_hooked_transformer`` alias, the prior hook points listed
in :mod:`circuitfade.model.shell`) is in :mod:`circuitfade.model.shell`. Import it
through :mod:`circuitfade.model`, which picks this shell on 3.x and
:mod:`circuitfade.model.native` on 4.x.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import torch.nn as nn
from transformer_lens import HookedTransformer
from transformer_lens.components import Attention, TransformerBlock

from circuitfade.model.config import SoftPriorConfig
from circuitfade.model.core import PriorAttentionCore, PriorBlockCore, SoftPriorCore
from circuitfade.model.shell import SoftPriorShell, as_config

__all__ = ["SoftPriorAttention", "SoftPriorBlock", "SoftPriorTransformer"]


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


class SoftPriorTransformer(SoftPriorShell, SoftPriorCore, HookedTransformer):
    """A ``HookedTransformer`` whose attention heads carry gated, annealable priors.

    Build with ``SoftPriorTransformer(SoftPriorConfig.base())`` (or keyword
    overrides: ``SoftPriorTransformer(n_layers=4)``). Inputs are token tensors
    ``[batch, pos]``; ``run_with_cache``, ``run_with_hooks`` and the standard
    hook names (``utils.get_act_name("pattern", 0)``) work as usual.
    """

    cfg: SoftPriorConfig

    def __init__(self, cfg: SoftPriorConfig | Mapping | None = None, **overrides):
        cfg = as_config(cfg, overrides)
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
