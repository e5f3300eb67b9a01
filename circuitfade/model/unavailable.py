"""Stand-ins for the soft-prior model under TransformerLens 4.

:class:`~circuitfade.model.SoftPriorTransformer` subclasses ``HookedTransformer`` and
its attention, which TransformerLens 4 removed, so under 4.x the model and the trainer
are not available (the README's "TransformerLens 4" section gives the reasons and the
install lines). These stand-ins keep :mod:`circuitfade.model` importable, so that the
store, the analyses, the screens, patching and the plots work on TransformerBridge
models, and make every use of the model (construction, a classmethod such as
``SoftPriorConfig.base()`` or ``SoftPriorTransformer.from_pretrained``) raise one
:class:`~circuitfade.compat.TLLineError` line. ``isinstance(x, SoftPriorConfig)`` is
simply False.
"""

from __future__ import annotations

from circuitfade.compat import require_tl3

__all__ = ["SoftPriorConfig", "SoftPriorTransformer", "SoftPriorAttention", "SoftPriorBlock"]


class _Unavailable(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        require_tl3(f"circuitfade's {cls.__name__}")
        raise AttributeError(name)  # pragma: no cover - require_tl3 raises on 4.x


class _Stub(metaclass=_Unavailable):
    def __init__(self, *args, **kwargs):
        require_tl3(f"circuitfade's {type(self).__name__}")


class SoftPriorConfig(_Stub):
    """Unavailable under TransformerLens 4 (see the module docstring)."""


class SoftPriorTransformer(_Stub):
    """Unavailable under TransformerLens 4 (see the module docstring)."""


class SoftPriorAttention(_Stub):
    """Unavailable under TransformerLens 4 (see the module docstring)."""


class SoftPriorBlock(_Stub):
    """Unavailable under TransformerLens 4 (see the module docstring)."""
