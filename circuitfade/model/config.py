"""``SoftPriorConfig``: the soft-prior model's configuration, on both TransformerLens lines.

On TransformerLens 3.x it subclasses ``HookedTransformerConfig`` (so a
:class:`~circuitfade.model.SoftPriorTransformer` is a ``HookedTransformer`` with a
``HookedTransformerConfig``); on 4.x, which removed that class, it subclasses
:class:`~circuitfade.model.backbone.BackboneConfig`, which has the same fields, defaults
and derived values. The declaration below is the same on both lines, so
:meth:`SoftPriorConfig.to_json_dict` writes the same JSON and a config written by one
line reads on the other.

Why the base class follows the line: TransformerLens 3.9's ``HookedTransformer`` (and each
of its components) takes the config through ``HookedTransformerConfig.unwrap``, which keeps
a config only if it is a ``HookedTransformerConfig`` and otherwise rebuilds one from
``to_dict()``, failing on the prior fields; so the 3.x shell needs that base (checked in
``tests/tl4/test_line_specific.py``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Mapping

import torch

from circuitfade.compat import is_tl4
from circuitfade.io import CheckpointError
from circuitfade.model.files import GATE_MODES, LARGE_OVERRIDES
from circuitfade.model.priors import PRIORS

if is_tl4():
    from circuitfade.model.backbone import BackboneConfig as _BackboneConfig
else:
    from transformer_lens import HookedTransformerConfig as _BackboneConfig

__all__ = ["SoftPriorConfig", "SUPPORTED_POS"]

SUPPORTED_POS = ("none", "standard", "rotary", "shortformer")


@dataclass
class SoftPriorConfig(_BackboneConfig):
    """A ``HookedTransformerConfig`` (3.x) or its 4.x stand-in plus the prior's settings.

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
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64 (the soft-prior forward computes in one floating "
                             f"dtype; half precision is not supported), got {self.dtype}")
        if not self.attn_only and self.d_mlp is not None and (
                isinstance(self.d_mlp, bool) or not isinstance(self.d_mlp, int) or self.d_mlp < 1):
            raise ValueError(f"d_mlp must be a positive integer when attn_only is false, got {self.d_mlp!r}")
        if isinstance(self.gate_init, bool) or not isinstance(self.gate_init, (int, float)) \
                or not 0.0 <= float(self.gate_init) <= 1.0:
            raise ValueError(f"gate_init must be a number in [0, 1], got {self.gate_init!r}")
        if self.input_mode not in ("tokens", "real"):
            raise ValueError(f"input_mode must be 'tokens' or 'real', got {self.input_mode!r}")
        if self.positional_embedding_type not in SUPPORTED_POS:
            raise ValueError(
                f"positional_embedding_type must be one of {SUPPORTED_POS} for SoftPriorTransformer, "
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
        """``"learned"``, ``"fixed"`` or ``"scheduled"``: how prior ``prior``'s gate is set."""
        return self.gate_modes.get(prior, "learned")

    @property
    def nope(self) -> bool:
        """No positional embedding at all (``positional_embedding_type == "none"``)."""
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
        """The config of :meth:`to_json_dict` output ``d``; :class:`~circuitfade.io.CheckpointError`
        naming ``source`` for unknown fields or invalid values."""
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
