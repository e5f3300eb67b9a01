"""The annealable soft-prior Transformer: config, model, and the prior registry.

Layer 1 (above :mod:`circuitfade.io` only). Importing this package registers the
built-in priors (``pos``, ``content``) and the published biases of
:mod:`circuitfade.model.zoo` (``alibi``, ``t5``, ``kerple_*``, ``fire``, ``cope``,
``dape``, ``gpsa``).

The model subclasses TransformerLens 3's ``HookedTransformer``; under TransformerLens 4
the names resolve to stand-ins (:mod:`circuitfade.model.unavailable`) that raise a
one-line :class:`~circuitfade.compat.TLLineError` when used.
"""

from circuitfade.compat import is_tl4
from circuitfade.model import zoo as _zoo  # noqa: F401  (registers the published priors)
from circuitfade.model.devices import DEVICES, resolve_device
from circuitfade.model.files import CONFIG_FILE, GATE_MODES, LARGE_OVERRIDES, WEIGHTS_FILE
from circuitfade.model.priors import PRIORS, AttentionPrior, PriorInputs, build_prior, register_prior

if is_tl4():  # the model subclasses HookedTransformer (TransformerLens 3 only): stand-ins that say so
    from circuitfade.model.unavailable import SoftPriorAttention, SoftPriorBlock, SoftPriorConfig, SoftPriorTransformer
else:
    from circuitfade.model.transformer import SoftPriorAttention, SoftPriorBlock, SoftPriorConfig, SoftPriorTransformer

__all__ = [
    "SoftPriorConfig", "SoftPriorTransformer", "SoftPriorAttention", "SoftPriorBlock", "GATE_MODES", "LARGE_OVERRIDES",
    "CONFIG_FILE", "WEIGHTS_FILE", "PRIORS", "AttentionPrior", "PriorInputs", "build_prior", "register_prior",
    "DEVICES", "resolve_device",
]
