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
from circuitfade.model.devices import resolve_device
from circuitfade.model.priors import PRIORS, AttentionPrior, PriorInputs, build_prior, register_prior
from circuitfade.model.transformer import SoftPriorConfig, SoftPriorTransformer

__all__ = [
    "SoftPriorConfig", "SoftPriorTransformer", "PRIORS", "AttentionPrior", "PriorInputs", "build_prior",
    "register_prior", "resolve_device",
]
"""The model's components (``SoftPriorAttention``, ``SoftPriorBlock``), its file names and gate modes
(:mod:`circuitfade.model.files`) and the device table (:mod:`circuitfade.model.devices`) are
importable from their modules."""
