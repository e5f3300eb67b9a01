"""Published attention biases as :class:`~circuitfade.model.priors.AttentionPrior` implementations.

Each class returns a bias ``[batch or 1, head, query_pos, key_pos]`` *before*
gating, for positions ``0 .. n-1`` of the current sequence (the model has no KV
cache, so query ``i`` and key ``j`` are absolute positions and ``d = i - j``).
Every bias is finite everywhere and exactly 0 above the diagonal (``j > i``,
masked by the model anyway), and at ``(i, j)`` with ``j <= i`` it depends only on
inputs at positions ``<= i``, so no prior lets a query see the future.

The model multiplies each bias by its own gate ``g[head]``; with the gate
fixed at 1 a prior reproduces the published method, with a learned, scheduled or
zero gate it becomes a fadeable prior like ``pos`` and ``content``.

Registry names (registered at the bottom of this module, imported by
:mod:`circuitfade.model.priors`): ``alibi``, ``t5``, ``kerple_log``,
``kerple_power``, ``fire``, ``cope``, ``dape``, ``gpsa``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from circuitfade.model.priors import AttentionPrior, PriorInputs, register_prior, relative_distance

__all__ = [
    "ALiBiBias",
    "T5RelativeBias",
    "KerpleLogBias",
    "KerplePowerBias",
    "FIREBias",
    "CoPEBias",
    "DAPEBias",
    "GPSABias",
    "alibi_slopes",
    "t5_bucket",
]


def _causal_zero(bias: Float[Tensor, "... query_pos key_pos"]) -> Float[Tensor, "... query_pos key_pos"]:
    """Set entries with ``key_pos > query_pos`` to exactly 0 (they are masked by the model)."""
    n = bias.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool, device=bias.device).tril()
    return torch.where(keep, bias, torch.zeros((), dtype=bias.dtype, device=bias.device))


@contextlib.contextmanager
def _init_rng(cfg, layer: int):
    """Make a prior's random initialisation a function of ``(cfg.seed, layer)`` when
    ``cfg.seed`` is set, without consuming the global RNG; otherwise use the global RNG."""
    if cfg.seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1009 * int(cfg.seed) + layer + 1)
        yield


def _inv_softplus(y: Tensor) -> Tensor:
    """``x`` with ``softplus(x) = y`` for ``y > 0`` (stable for large ``y``)."""
    return y + torch.log(-torch.expm1(-y))


def _distance(inputs: PriorInputs, dtype) -> Float[Tensor, "query_pos key_pos"]:
    """``[n, n]`` float tensor ``max(i - j, 0)`` for the current sequence length ``n``."""
    n = inputs.resid.shape[1]
    return relative_distance(n, device=inputs.resid.device).to(dtype)


# --------------------------------------------------------------------------------------
def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes (Press et al., 2022, and their reference code).

    For ``H`` a power of two: ``m_h = 2^(-8 h / H)`` for ``h = 1 .. H`` (``H = 4``:
    ``[2^-2, 2^-4, 2^-6, 2^-8]``). Otherwise the slopes of the closest lower power
    of two ``P`` followed by every other slope of ``2P``, first ``H - P`` of them.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    p = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: n_heads - p]


class ALiBiBias(AttentionPrior):
    """ALiBi (Press, Smith & Lewis, ICLR 2022): ``B[h, i, j] = -m_h · (i - j)`` for ``j <= i``.

    ``m_h`` are the fixed geometric slopes of :func:`alibi_slopes`. No parameters:
    with a *learned* gate, ``g_h · m_h`` is in effect a learned per-head slope.
    """

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        slopes = torch.tensor(alibi_slopes(cfg.n_heads), dtype=cfg.dtype)
        self.register_buffer("slopes", slopes, persistent=False)  # [head]

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        d = _distance(inputs, self.slopes.dtype)  # [q, k], 0 above the diagonal
        return (-self.slopes[:, None, None] * d).unsqueeze(0)


# --------------------------------------------------------------------------------------
def t5_bucket(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's unidirectional relative-position bucket of ``distance = max(i - j, 0)``.

    ``d < num_buckets // 2 =: E`` gets its own bucket ``d``; larger distances get
    ``min(E + floor(log(d / E) / log(max_distance / E) · (num_buckets - E)), num_buckets - 1)``
    (Raffel et al., 2020, ``_relative_position_bucket`` with ``bidirectional=False``).
    """
    d = distance.clamp(min=0).long()
    exact = num_buckets // 2
    log_ratio = torch.log(d.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(d < exact, d, large)


class T5RelativeBias(AttentionPrior):
    """Learned bucketed relative position bias: ``B[h, i, j] = b[h, bucket(i - j)]`` for ``j <= i``.

    The scalar-per-head relative bias of Shaw, Uszkoreit & Vaswani (2018) with the
    log-spaced buckets of T5 (Raffel et al., 2020; :func:`t5_bucket`, T5's defaults
    of 32 buckets and max distance 128; causal, so only ``i - j >= 0`` is used).
    ``b`` is ``[head, num_buckets]`` and starts at zero, like the ``pos`` prior.
    """

    num_buckets = 32
    max_distance = 128

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.rel_bias = nn.Parameter(torch.zeros(cfg.n_heads, self.num_buckets, dtype=cfg.dtype))
        buckets = t5_bucket(relative_distance(cfg.n_ctx), self.num_buckets, self.max_distance)
        self.register_buffer("buckets", buckets, persistent=False)  # [n_ctx, n_ctx] long

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        n = inputs.resid.shape[1]
        return _causal_zero(self.rel_bias[:, self.buckets[:n, :n]]).unsqueeze(0)


# --------------------------------------------------------------------------------------
class _Kerple(AttentionPrior):
    """Shared parts of the two KERPLE kernels: per-head ``r1 = softplus(raw_r1) > 0``.

    Initialisation follows the KERPLE reference code: ``r1 ~ U(0, 2)``,
    ``r2 ~ U(0, 1)``, both at least ``1e-2`` (random init of every zoo prior is
    reproducible from ``cfg.seed`` and the layer when ``cfg.seed`` is set).
    """

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        H = cfg.n_heads
        self.raw_r1 = nn.Parameter(torch.empty(H, dtype=cfg.dtype))
        self.raw_r2 = nn.Parameter(torch.empty(H, dtype=cfg.dtype))
        with _init_rng(cfg, layer):
            r1 = (2 * torch.rand(H, dtype=cfg.dtype)).clamp(min=1e-2)
            r2 = torch.rand(H, dtype=cfg.dtype).clamp(min=1e-2)
        self.set_params(r1, r2)

    @property
    def r1(self) -> Float[Tensor, "head"]:
        return F.softplus(self.raw_r1)

    def set_params(self, r1, r2) -> None:
        """Set ``r1`` and ``r2`` (numbers or ``[head]``) by inverting the parameterisation."""
        r1 = torch.as_tensor(r1, dtype=self.raw_r1.dtype).expand(self.n_heads)
        r2 = torch.as_tensor(r2, dtype=self.raw_r2.dtype).expand(self.n_heads)
        if (r1 <= 0).any():
            raise ValueError(f"KERPLE r1 must be > 0, got {r1.tolist()}")
        with torch.no_grad():
            self.raw_r1.copy_(_inv_softplus(r1))
            self.raw_r2.copy_(self._r2_inverse(r2))


class KerpleLogBias(_Kerple):
    """KERPLE, logarithmic variant (Chi et al., NeurIPS 2022):
    ``B[h, i, j] = -r1_h · log(1 + r2_h · (i - j))`` for ``j <= i``,
    with ``r1 = softplus(raw_r1) > 0`` and ``r2 = softplus(raw_r2) > 0`` learned per head.
    """

    @property
    def r2(self) -> Float[Tensor, "head"]:
        return F.softplus(self.raw_r2)

    def _r2_inverse(self, r2: Tensor) -> Tensor:
        if (r2 <= 0).any():
            raise ValueError(f"KERPLE-log r2 must be > 0, got {r2.tolist()}")
        return _inv_softplus(r2)

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        d = _distance(inputs, self.raw_r1.dtype)  # [q, k]
        return (-self.r1[:, None, None] * torch.log1p(self.r2[:, None, None] * d)).unsqueeze(0)


class KerplePowerBias(_Kerple):
    """KERPLE, power variant (Chi et al., NeurIPS 2022):
    ``B[h, i, j] = -r1_h · (i - j)^{r2_h}`` for ``j <= i``,
    with ``r1 = softplus(raw_r1) > 0`` and ``r2 = 2·sigmoid(raw_r2) ∈ (0, 2)`` learned per head.
    ``0^{r2}`` is taken as 0 (computed without a ``log 0`` so gradients stay finite).
    """

    @property
    def r2(self) -> Float[Tensor, "head"]:
        return 2 * torch.sigmoid(self.raw_r2)

    def _r2_inverse(self, r2: Tensor) -> Tensor:
        if ((r2 <= 0) | (r2 >= 2)).any():
            raise ValueError(f"KERPLE-power r2 must be in (0, 2), got {r2.tolist()}")
        return torch.logit(r2 / 2)

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        d = _distance(inputs, self.raw_r1.dtype)  # [q, k]
        powered = d.clamp(min=1.0)[None] ** self.r2[:, None, None]  # [head, q, k]; clamp avoids 0^r
        powered = torch.where(d > 0, powered, torch.zeros_like(powered))
        return (-self.r1[:, None, None] * powered).unsqueeze(0)


# --------------------------------------------------------------------------------------
class FIREBias(AttentionPrior):
    """FIRE (Li et al., ICLR 2024): ``B[h, i, j] = f_θ(ψ(i - j) / ψ(max(L, i)))_h`` for ``j <= i``.

    Exactly as the paper's reference code: ``ψ(x) = log(|c·x| + 1)`` with learnable
    ``c`` (init 0.1); threshold ``L = |L_mult · L_0|`` with learnable ``L_mult``
    (init 1) and fixed ``L_0``; the denominator gets ``+ 1e-6``; ``f_θ`` is an
    MLP ``1 -> 32 -> H`` with ReLU (one shared input, one output per head). The
    reference code uses ``L_0 = 512`` for training length 2048; we keep that
    ratio, ``L_0 = n_ctx / 4``.
    """

    mlp_width = 32
    eps = 1e-6

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        with _init_rng(cfg, layer):  # PyTorch's default Linear init, as in the reference code
            self.mlp = nn.Sequential(nn.Linear(1, self.mlp_width), nn.ReLU(), nn.Linear(self.mlp_width, cfg.n_heads))
        self.mlp.to(cfg.dtype)
        self.c = nn.Parameter(torch.tensor(0.1, dtype=cfg.dtype))
        self.L_mult = nn.Parameter(torch.tensor(1.0, dtype=cfg.dtype))
        self.register_buffer("L0", torch.tensor(cfg.n_ctx / 4, dtype=cfg.dtype), persistent=False)

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        d = _distance(inputs, self.c.dtype)  # [q, k]
        pos = torch.arange(d.shape[0], device=d.device, dtype=d.dtype)  # [q]
        normaliser = torch.maximum(pos, torch.abs(self.L_mult * self.L0))  # [q]
        num = torch.log(torch.abs(self.c * d) + 1)
        den = torch.log(torch.abs(self.c * normaliser) + 1) + self.eps
        x = (num / den[:, None]).unsqueeze(-1)  # [q, k, 1]
        return _causal_zero(self.mlp(x).permute(2, 0, 1)).unsqueeze(0)  # [1, head, q, k]


# --------------------------------------------------------------------------------------
class CoPEBias(AttentionPrior):
    """CoPE, contextual position (Golovneva et al., 2024), scalar-per-head form.

    From the layer's scores ``s_ij = q_i·k_j / √d_head``: gates ``g_ik = sigmoid(s_ik)``
    for ``k <= i`` (0 for ``k > i``); contextual position ``p_ij = Σ_{k=j..i} g_ik``
    (clamped to ``[0, n_ctx]``); bias ``B[b, h, i, j] = (1 - w)·e_h[⌊p⌋] + w·e_h[⌈p⌉]``
    with ``w = p - ⌊p⌋`` and a learned table ``e`` of shape ``[head, n_ctx + 1]``
    (init 0, as in the paper's code).

    Simplifications (the prior does not own ``W_Q``): the paper's bias is
    ``q_i · e[p_ij]`` with *vector* position embeddings, i.e. query-dependent;
    here each head has a *scalar* table ``e_h[p]`` (no query dependence), and the
    gates use the scaled scores (the paper uses ``q·k`` before the ``1/√d`` scale).
    """

    needs_scores = True

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.cope_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.n_ctx + 1, dtype=cfg.dtype))

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "batch head query_pos key_pos"]:
        s = inputs.scores
        if s is None:
            raise ValueError("CoPE needs the attention scores (PriorInputs.scores); got None")
        n = s.shape[-1]
        past = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
        gates = torch.where(past, torch.sigmoid(s), torch.zeros((), dtype=s.dtype, device=s.device))
        p = gates.flip(-1).cumsum(-1).flip(-1).clamp(0, self.cope_bias.shape[1] - 1)  # [b, h, q, k]
        lo, hi = p.floor(), p.ceil()
        w = p - lo
        heads = torch.arange(self.n_heads, device=s.device)[None, :, None, None]
        table = self.cope_bias.to(s.dtype)
        bias = (1 - w) * table[heads, lo.long()] + w * table[heads, hi.long()]
        return _causal_zero(bias)


# --------------------------------------------------------------------------------------
class DAPEBias(AttentionPrior):
    """DAPE (Zheng et al., NeurIPS 2024), residual form with a KERPLE-log base bias.

    ``B[b, :, i, j] = K[:, i, j] + f([s[b, :, i, j], K[:, i, j]])`` for ``j <= i``, where
    ``s`` are the layer's scores ``q·k/√d_head`` (all heads), ``K`` is a
    :class:`KerpleLogBias` with its own learned ``r1, r2`` (DAPE's main base), and
    ``f`` is an MLP ``2H -> 32 -> H`` with LeakyReLU applied at every ``(i, j)``
    across heads. The attention logit is then ``s + g·B``; with ``g = 1`` this is
    DAPE's ``A = QKᵀ + B + f(QKᵀ, B)``.
    """

    needs_scores = True
    mlp_width = 32

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.base = KerpleLogBias(cfg, layer)
        H = cfg.n_heads
        with _init_rng(cfg, layer + 7919):  # not the stream of the base's KERPLE init
            self.mlp = nn.Sequential(nn.Linear(2 * H, self.mlp_width), nn.LeakyReLU(), nn.Linear(self.mlp_width, H))
        self.mlp.to(cfg.dtype)

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "batch head query_pos key_pos"]:
        s = inputs.scores
        if s is None:
            raise ValueError("DAPE needs the attention scores (PriorInputs.scores); got None")
        base = self.base(inputs)  # [1, head, q, k]
        feats = torch.cat([s, base.expand_as(s)], dim=1).permute(0, 2, 3, 1)  # [b, q, k, 2*head]
        correction = self.mlp(feats).permute(0, 3, 1, 2)  # [b, head, q, k]
        return _causal_zero(base + correction)


# --------------------------------------------------------------------------------------
class GPSABias(AttentionPrior):
    """Gated positional self-attention, 1-D causal (ConViT, d'Ascoli et al., ICML 2021).

    ``B[h, i, j] = log softmax_{j' <= i}(v_h · r_{ij'})[j]`` for ``j <= i``, with
    relative features ``r_ij = [(i - j)², (i - j)]`` and learned ``v`` ``[head, 2]``,
    i.e. the log of a positional attention map. ConViT's locality initialisation
    in 1-D: ``v_h = α·[-1, 2Δ_h]`` so ``v_h·r = -α((i - j - Δ_h)² - Δ_h²)``, a
    Gaussian around offset ``Δ_h = h`` with strength ``α = 1``.

    ConViT mixes *attention maps*, ``(1 - σ(λ_h))·softmax(s) + σ(λ_h)·P``; here
    the gate ``g`` adds ``g·log P`` to the *logits*, so the pattern is
    ``∝ softmax(s) · P^g`` (a geometric, not convex, mixture). The gate plays
    the role of ``σ(λ)``.
    """

    locality_strength = 1.0

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        offsets = torch.arange(cfg.n_heads, dtype=cfg.dtype)
        v = self.locality_strength * torch.stack([-torch.ones_like(offsets), 2 * offsets], dim=1)
        self.v_pos = nn.Parameter(v)  # [head, 2]

    def forward(self, inputs: PriorInputs) -> Float[Tensor, "1 head query_pos key_pos"]:
        d = _distance(inputs, self.v_pos.dtype)  # [q, k]
        logits = self.v_pos[:, 0, None, None] * d**2 + self.v_pos[:, 1, None, None] * d  # [head, q, k]
        n = d.shape[0]
        past = torch.ones(n, n, dtype=torch.bool, device=d.device).tril()
        logits = logits.masked_fill(~past, float("-inf"))
        return _causal_zero(torch.log_softmax(logits, dim=-1)).unsqueeze(0)


_ZOO = {
    "alibi": ALiBiBias,
    "t5": T5RelativeBias,
    "kerple_log": KerpleLogBias,
    "kerple_power": KerplePowerBias,
    "fire": FIREBias,
    "cope": CoPEBias,
    "dape": DAPEBias,
    "gpsa": GPSABias,
}
for _name, _cls in _ZOO.items():
    register_prior(_name, _cls)
