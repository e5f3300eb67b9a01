"""What the two shells of the soft-prior model share, written once.

The computation is :mod:`circuitfade.model.core`. A *shell* gives it a module tree:
:mod:`circuitfade.model.hooked` on TransformerLens 3.x (a ``HookedTransformer`` subclass,
as the 3.x line promises) and :mod:`circuitfade.model.native` on 4.x (a native
``HookedRootModule`` with the same parameters, hooks and numerics). Everything else the
two have in common lives here and imports on either line:

* :func:`as_config` - the constructor's ``cfg`` argument (a config, a dict of its fields
  or nothing, plus keyword overrides) as a :class:`~circuitfade.model.SoftPriorConfig`;
* :class:`SoftPriorShell` - the model methods that are the same on both lines (the
  deprecated :meth:`~SoftPriorShell.to_hooked_transformer` alias of
  :meth:`~circuitfade.model.core.SoftPriorCore.to_plain_model`);
* :class:`FactoredViews` - the ``QK`` and ``OV`` ``FactoredMatrix`` views of an attention
  layer or a whole model (``W_Q``/``W_K``/``W_V``/``W_O`` with or without a layer axis);

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

(``hook_{prior}_bias`` and ``hook_gate_{prior}`` exist for every prior in ``cfg.priors``;
the table shows the default ``pos`` and ``content``.)
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Mapping

import torch.nn as nn

from circuitfade.model.config import SoftPriorConfig

__all__ = ["as_config", "SoftPriorShell", "FactoredViews"]

def as_config(cfg: SoftPriorConfig | Mapping | None, overrides: Mapping) -> SoftPriorConfig:
    """``cfg`` with ``overrides`` applied, as a :class:`~circuitfade.model.SoftPriorConfig`:
    ``None`` (the base model), a dict of its fields or a config (copied by
    ``dataclasses.replace`` when there are overrides). ``TypeError`` for anything else."""
    if cfg is None:
        cfg = SoftPriorConfig(**overrides)
    elif isinstance(cfg, Mapping):
        cfg = SoftPriorConfig(**{**cfg, **overrides})
    elif overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    if not isinstance(cfg, SoftPriorConfig):
        raise TypeError(f"expected a SoftPriorConfig, got {type(cfg).__name__}")
    return cfg


class SoftPriorShell:
    """Model methods that are the same on both shells (mixed in before
    :class:`~circuitfade.model.core.SoftPriorCore`)."""

    def to_hooked_transformer(self) -> nn.Module:
        """Deprecated name of :meth:`~circuitfade.model.core.SoftPriorCore.to_plain_model`
        (the installed line's plain model with the same backbone weights and no priors:
        a ``HookedTransformer`` on 3.x, a ``TransformerBridge`` on 4.x). Warns
        ``DeprecationWarning``; it will be removed in the next release."""
        warnings.warn("SoftPriorTransformer.to_hooked_transformer() is deprecated; use to_plain_model() "
                      "(the same model: a HookedTransformer on TransformerLens 3, a TransformerBridge on 4)",
                      DeprecationWarning, stacklevel=2)
        return self.to_plain_model()


class FactoredViews:
    """``QK`` and ``OV`` as TransformerLens ``FactoredMatrix`` views of ``W_Q``, ``W_K``,
    ``W_V``, ``W_O`` (per head for an attention layer, per layer and head for a model)."""

    @property
    def QK(self):
        """``W_Q @ W_Kᵀ`` as a ``FactoredMatrix`` (``[..., head, d_model, d_model]``)."""
        from transformer_lens import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self):
        """``W_V @ W_O`` as a ``FactoredMatrix`` (``[..., head, d_model, d_model]``)."""
        from transformer_lens import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)
