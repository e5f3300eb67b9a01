"""The annealable soft-prior Transformer: config, model, and the prior registry.

Layer 1 (above :mod:`circuitfade.io` and :mod:`circuitfade.compat` only). Importing this
package registers the built-in priors (``pos``, ``content``) and the published biases of
:mod:`circuitfade.model.zoo` (``alibi``, ``t5``, ``kerple_*``, ``fire``, ``cope``,
``dape``, ``gpsa``).

The model works on both TransformerLens lines: on 3.x :class:`SoftPriorTransformer` is a
``HookedTransformer`` subclass (:mod:`circuitfade.model.hooked`), on 4.x a native
``HookedRootModule`` with the same parameters, hook names and shapes, numerics and
initialisation (:mod:`circuitfade.model.native`); the computation itself is written
once, in :mod:`circuitfade.model.core`.
"""

from circuitfade.model import zoo as _zoo  # noqa: F401  (registers the published priors)
from circuitfade.model.devices import DEVICES, resolve_device
from circuitfade.model.files import CONFIG_FILE, GATE_MODES, LARGE_OVERRIDES, WEIGHTS_FILE
from circuitfade.model.priors import PRIORS, AttentionPrior, PriorInputs, build_prior, register_prior
from circuitfade.model.transformer import SoftPriorAttention, SoftPriorBlock, SoftPriorConfig, SoftPriorTransformer

__all__ = [
    "SoftPriorConfig", "SoftPriorTransformer", "SoftPriorAttention", "SoftPriorBlock", "GATE_MODES", "LARGE_OVERRIDES",
    "CONFIG_FILE", "WEIGHTS_FILE", "PRIORS", "AttentionPrior", "PriorInputs", "build_prior", "register_prior",
    "DEVICES", "resolve_device",
]
