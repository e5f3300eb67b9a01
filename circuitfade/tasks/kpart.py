"""A shortcut-free K-part capability: the answer needs all K inputs, and any K-1 of them are worth nothing.

The task (the no-partial-credit circuit-formation study)
----------------------------------------------------------
Each sequence has ``N = K + n_distractors`` *value* positions holding tokens drawn
independently and uniformly from ``{0, .., V-1}``, followed by one *query* position
holding the query token ``Q = V``. The target at the query position is::

    y = ( π_1(x_{p_1}) + π_2(x_{p_2}) + ... + π_K(x_{p_K}) )  mod V

where ``p_1 < .. < p_K`` are ``K`` fixed *input positions* among the ``N`` value
positions (the rest are distractors, uniform and ignored by the target) and
``π_i`` are fixed permutations of ``Z_V`` (drawn from ``perm_seed``; with
``permute=False`` every ``π_i`` is the identity and ``y`` is the plain sum).

Why it is shortcut-free (the target is independent of every strict subset of the inputs)
----------------------------------------------------------------------------------------
Take any strict subset ``A`` of the K inputs and an input ``j`` not in ``A``. Given
the values of the inputs in ``A`` (and of every other input except ``j``, and of all
distractors), ``y = (c + π_j(x_{p_j})) mod V`` with ``c`` fixed; ``x_{p_j}`` is
uniform on ``Z_V`` and independent of everything conditioned on, ``π_j`` is a
bijection, and adding a constant mod V is a bijection, so ``y`` is *exactly*
uniform on ``Z_V`` whatever the values in ``A``. Hence ``P(y | inputs in A) = 1/V``:
a model that reads fewer than all K inputs (and anything else in the sequence) is
at chance, exactly. :func:`conditional_target_table` computes these conditional
distributions by enumeration, so tests check the claim from the data distribution
itself, not from a model.

Why heads are the parts
-----------------------
Each input sits at its own fixed position, so fetching it is one attention head's
job (query position -> key ``p_i``). Left to itself a trained one-layer model does
not keep to that: we measured every head attending 0.2-0.5 to two or three inputs
(a distributed code that several heads share, with no head necessary on its own),
so "the K parts" and "re-initialise m of them" would not be defined. The model
preset (:func:`kpart_model`) therefore pins each head's read-out attention with a
fixed, untrained prior (:class:`PinnedReadout`): at the query, head ``i < K`` can
attend only to input ``i``; the spare heads read a distractor or the query token.
The K parts are then the K heads' value/output slices (with what the shared MLP does
with them), identifiable by construction. The permutations ``π_i`` make every input
enter the target differently, so no head could stand in for another.

The price of the pin: every part is the *only* route for its input and its query-key
slices cannot move its attention, so on this shortcut-free task ablating any one part
gives chance in *any* model, trained or not, and a test of "no partial credit" on the
pinned preset cannot fail. The *unpinned* preset (``kpart_model(task, pinned=False)``,
:data:`APPARATUS`) drops the prior: each head learns its own routing, a part is its QK
*and* OV slices, heads may share inputs or attend partly to the right one, and the part
ablation statistic can report partial credit. Its parts are found after training
(:func:`circuitfade.analysis.parts.routing_parts`). :func:`hand_built_additive_model` on
:func:`additive_batch` is the planted counterpart with partial credit by construction.
The read-out needs a non-linearity: no read-out that is a *sum* of per-input terms
(what a one-layer attention-only model computes, ``logit_y = Σ_i f_i(x_{p_i}, y)``)
can compute ``y`` (already for ``V = 2, K = 2`` the four sign conditions of XOR
contradict each other), so the preset has one MLP layer after the heads.

The hand-built solution (:func:`hand_built_model`) sets every weight by hand and
solves the task exactly: head ``i`` attends only to ``p_i`` and writes ``π_i(x_{p_i})``
into one residual direction ``s``, so the residual at the query holds the integer
``S = Σ_i π_i(x_{p_i})``; the MLP turns ``S`` into one-hot bumps
``[S = s] = r_{s-1} - 2 r_s + r_{s+1}`` with ``r_t = relu(S - t)`` (exact on integers)
and writes ``[S = s]`` to the answer direction of ``s mod V``. Its parts are the K
heads ``(0, 0) .. (0, K-1)``; heads ``K, K+1, ..`` are non-parts (they attend to the
distractors and write into a direction nothing reads). With ``pinned=False`` the same
routing is set by hand in ``W_Q, W_K`` instead of coming from the prior.

Data mix ("drive" for the waiting-time experiments)
----------------------------------------------------
``sample(n, generator, p_capability=1.0)``: each sequence is a capability sequence
with probability ``p_capability``; otherwise a *base* sequence whose query token is
``Q_base = V + 1`` and whose target is a copy of the token at the last value
position ``N - 1`` (a distractor when ``n_distractors >= 1``). ``RunConfig.mix``
schedules ``p_capability``, so the capability's share of the data is a drive that
can be set. Evaluation sets (``eval_set``) use the default ``p_capability = 1``.

Chance accuracy: ``1 / V`` (the capability targets are uniform on ``Z_V``).
``model_overrides`` sets the model's ``d_vocab = V + 2`` and ``n_ctx = N + 1``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from circuitfade.model.priors import AttentionPrior, PriorInputs, register_prior

from .base import IGNORE_INDEX, Batch, Task, check_sample_args

__all__ = ["KPartConfig", "KPart", "kpart_model", "hand_built_model", "hand_built_additive_model", "additive_batch",
           "conditional_target_table", "K_RANGE", "APPARATUS"]

K_RANGE = (2, 6)
"""Smallest and largest K the apparatus supports (inclusive)."""


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class KPartConfig:
    """Configuration of :class:`KPart`.

    * ``k``: number of inputs (parts), ``2 <= k <= 6``.
    * ``v``: modulus and number of value tokens (``>= 2``).
    * ``n_distractors``: value positions that are not inputs (``>= 0``).
    * ``positions``: the input positions ``p_1..p_K`` (distinct, sorted, in
      ``[0, k + n_distractors)``); ``None``: ``0, 1, .., k-1`` (distractors follow).
    * ``permute``: use per-position permutations ``π_i`` (default) or the plain sum.
    * ``perm_seed``: seed of the permutations.
    """

    k: int = 3
    v: int = 5
    n_distractors: int = 2
    positions: tuple | None = None
    permute: bool = True
    perm_seed: int = 0

    def __post_init__(self) -> None:
        _check_int("k", self.k, 1)
        if not K_RANGE[0] <= self.k <= K_RANGE[1]:
            raise ValueError(f"k: expected {K_RANGE[0]} <= k <= {K_RANGE[1]}, got {self.k}")
        _check_int("v", self.v, 2)
        _check_int("n_distractors", self.n_distractors, 0)
        _check_int("perm_seed", self.perm_seed, 0)
        if not isinstance(self.permute, bool):
            raise ValueError(f"permute: expected a bool, got {self.permute!r}")
        if self.positions is not None:
            pos = tuple(self.positions)
            n = self.k + self.n_distractors
            if (len(pos) != self.k or any(isinstance(p, bool) or not isinstance(p, int) for p in pos)
                    or list(pos) != sorted(set(pos)) or pos[0] < 0 or pos[-1] >= n):
                raise ValueError(
                    f"positions: expected {self.k} distinct sorted ints in [0, {n}), got {self.positions!r}"
                )
            object.__setattr__(self, "positions", pos)


class KPart(Task):
    """The K-part modular-sum capability (see the module docstring for the definition and proof)."""

    name = "kpart"

    def __init__(self, config: KPartConfig | None = None) -> None:
        self.config = config if config is not None else KPartConfig()
        if not isinstance(self.config, KPartConfig):
            raise ValueError(f"config: expected a KPartConfig, got {type(self.config).__name__}")
        cfg = self.config
        self.k, self.v = cfg.k, cfg.v
        self.n_values = cfg.k + cfg.n_distractors  # value positions 0 .. N-1
        self.query_pos = self.n_values  # position N holds the query token
        self.n_ctx = self.n_values + 1
        self.query_token, self.base_query_token = cfg.v, cfg.v + 1
        self.d_vocab = cfg.v + 2
        self.chance = 1.0 / cfg.v
        self.positions: tuple[int, ...] = cfg.positions if cfg.positions is not None else tuple(range(cfg.k))
        self.model_overrides = {"d_vocab": self.d_vocab, "n_ctx": self.n_ctx}
        register_pin()  # the preset's read-out prior must be known wherever this task's runs are opened
        g = torch.Generator().manual_seed(cfg.perm_seed)
        perms = [torch.randperm(cfg.v, generator=g) for _ in range(cfg.k)]
        if not cfg.permute:
            perms = [torch.arange(cfg.v) for _ in range(cfg.k)]
        self.perms: Int[Tensor, "k v"] = torch.stack(perms)

    def target_of(self, inputs: Int[Tensor, "... k"]) -> Int[Tensor, "..."]:
        """``(Σ_i π_i(inputs[..., i])) mod V`` for input values at the K input positions."""
        inputs = torch.as_tensor(inputs, dtype=torch.long)
        if inputs.shape[-1] != self.k:
            raise ValueError(f"inputs: expected last dimension {self.k}, got shape {tuple(inputs.shape)}")
        mapped = torch.stack([self.perms[i][inputs[..., i]] for i in range(self.k)], dim=-1)
        return mapped.sum(-1) % self.v

    def sample(self, n: int, generator: torch.Generator, p_capability: float = 1.0) -> Batch:
        """Draw ``n`` sequences: value tokens, then (capability with probability ``p_capability``,
        drawn only if ``p_capability < 1``) the query token; the target at the query position."""
        check_sample_args(n, generator)
        if isinstance(p_capability, bool) or not isinstance(p_capability, (int, float)) or not 0 <= p_capability <= 1:
            raise ValueError(f"p_capability: expected a number in [0, 1], got {p_capability!r}")
        N, q = self.n_values, self.query_pos
        values = torch.randint(0, self.v, (n, N), generator=generator)
        if p_capability < 1:
            cap = torch.rand(n, generator=generator) < p_capability
        else:
            cap = torch.ones(n, dtype=torch.bool)
        target = torch.where(cap, self.target_of(values[:, list(self.positions)]), values[:, N - 1])
        tokens = torch.cat([values, torch.where(cap, self.query_token, self.base_query_token)[:, None]], dim=1)
        targets = torch.full((n, self.n_ctx), IGNORE_INDEX, dtype=torch.long)
        targets[:, q] = target
        mask = targets != IGNORE_INDEX
        sources = torch.zeros(n, self.n_ctx, self.n_ctx, dtype=torch.bool)
        sources[~cap, q, N - 1] = True  # a base sequence's answer sits at position N-1
        return Batch(tokens, targets, mask, sources)


def conditional_target_table(task: KPart, known: tuple[int, ...]) -> Tensor:
    """``P(y = t | inputs in known = a)`` for every assignment ``a``, by exact enumeration.

    Enumerates all ``V^K`` joint values of the K inputs (each equally likely under the
    task's distribution: independent uniform tokens; distractors do not enter the
    target and are independent of it) and returns a float64 tensor
    ``[V^len(known), V]``: row ``a`` (the known inputs' values in lexicographic order)
    is the exact conditional distribution of the target. For a strict subset every
    row is ``1/V`` (shortcut-free); for ``known = all K`` every row is one-hot.
    """
    k, v = task.k, task.v
    known = tuple(known)
    if len(set(known)) != len(known) or any(not 0 <= i < k for i in known):
        raise ValueError(f"known: expected distinct input indices in [0, {k}), got {known!r}")
    grid = torch.tensor(list(itertools.product(range(v), repeat=k)), dtype=torch.long)  # [V^K, K]
    y = task.target_of(grid)
    row = torch.zeros(len(grid), dtype=torch.long)
    for i in known:
        row = row * v + grid[:, i]
    counts = torch.zeros(v ** len(known), v, dtype=torch.float64)
    counts.index_put_((row, y), torch.ones(len(grid), dtype=torch.float64), accumulate=True)
    return counts / counts.sum(1, keepdim=True)


# --------------------------------------------------------------------------------------
# the pinned read-out prior, the model preset and the hand-built circuit
# --------------------------------------------------------------------------------------
PIN_PRIOR = "kpart_pin"
"""Registry name of :class:`PinnedReadout` (registered by :func:`register_pin`)."""

PIN_BIAS = 30.0
"""How far below 0 the pinned prior puts every key a head does not read (``exp(-30) ≈ 1e-13``)."""


class PinnedReadout(AttentionPrior):
    """A fixed (untrained) prior that pins each head's attention *at the last position*.

    At the last query row ``i = n - 1`` head ``h`` gets bias 0 on key ``h`` if
    ``h < n - 1`` (else on the query position ``n - 1`` itself) and ``-PIN_BIAS`` on
    every other key; all other query rows get bias 0. With the default input
    positions of :class:`KPart` (``p_i = i``) head ``i < K`` is the only head that
    can read input ``i`` (heads ``K .. K+D-1`` read the distractors, later heads the
    query token), so the K parts of the capability are the K heads' value/output
    slices (``W_V[i], W_O[i]``, plus what the MLP does with them): identifiable by
    construction, not found after the fact. Without the pin a trained one-layer model
    spreads every input over several heads (we measured it: every head attending
    0.2-0.5 to two inputs, no head necessary on its own), and "re-initialise m
    parts" would not be defined. Use it with gate mode ``"fixed"`` and
    ``gate_init = 1`` (what :func:`kpart_model` sets).
    """

    name = PIN_PRIOR

    def forward(self, inputs: PriorInputs) -> Tensor:
        n = inputs.token_embed.shape[1]
        heads = torch.arange(self.n_heads, device=inputs.token_embed.device)
        key = torch.where(heads < n - 1, heads, torch.full_like(heads, n - 1))  # [head]
        bias = torch.zeros(1, self.n_heads, n, n, dtype=inputs.token_embed.dtype, device=inputs.token_embed.device)
        last = torch.full((self.n_heads, n), -PIN_BIAS, dtype=bias.dtype, device=bias.device)
        last[heads, key] = 0.0
        bias[0, :, n - 1, :] = last
        return bias


def register_pin() -> None:
    """Register :class:`PinnedReadout` as prior ``"kpart_pin"`` (idempotent).

    Called when a :class:`KPart` task or the :func:`kpart_model` preset is built (so a
    kpart run directory opens with ``attach``), not at import: the pin is a task-specific
    fixed read-out, not one of the general-purpose priors the prior tests sweep over.
    """
    from circuitfade.model.priors import PRIORS

    if PRIORS.get(PIN_PRIOR) is not PinnedReadout:
        register_prior(PIN_PRIOR, PinnedReadout)


APPARATUS = ("pinned", "unpinned")
"""The two model presets of :func:`kpart_model`: ``"pinned"`` (each part head's read-out fixed by
:class:`PinnedReadout`; the parts are the heads' value/output slices) and ``"unpinned"`` (no prior:
every head learns its own query-key routing, so a part is its QK *and* OV slices)."""


def kpart_model(task: KPart, *, spare_heads: int = 2, d_model: int = 32, d_head: int = 8, d_mlp: int = 64,
                pinned: bool = True) -> dict:
    """``SoftPriorConfig`` overrides (JSON form, for ``RunConfig.model``) sized for ``task``.

    One layer with ``K + spare_heads`` heads, learned absolute positional embeddings, one
    ReLU MLP (the read-out needs a non-linearity, see the module docstring), no LayerNorm;
    ``d_vocab`` and ``n_ctx`` come from the task. Two presets (:data:`APPARATUS`):

    * ``pinned=True`` (the default): the read-out attention is pinned by the fixed
      :class:`PinnedReadout` prior (head ``i < K`` reads input ``i``; the spare heads, the
      non-part heads a random-head ablation draws from, read distractors or the query
      token). The parts are identifiable by construction, but every part is the *only*
      route for its input and its query-key slices cannot move its query-row attention:
      on the shortcut-free task any single-part ablation then gives chance in any model.
      Needs the default input positions ``0 .. K-1``.
    * ``pinned=False``: no prior at all, a plain one-layer ``HookedTransformer``
      computation. Each head learns where to attend (``W_Q, W_K`` on token + position
      embeddings), so a part is a head's QK *and* OV slices, several heads may share an
      input, and a head may attend partly to the right input: partial alignment is
      possible. Which heads are the parts is then found after training (e.g.
      :func:`circuitfade.analysis.parts.routing_parts`), not fixed in advance.

    Apart from the fixed pin both are plain ``HookedTransformer`` computations with the standard hooks.
    """
    _check_int("spare_heads", spare_heads, 0)
    if not isinstance(pinned, bool):
        raise ValueError(f"pinned: expected a bool, got {pinned!r}")
    common = {"n_layers": 1, "n_heads": task.k + spare_heads, "d_model": d_model, "d_head": d_head,
              "d_mlp": d_mlp, "attn_only": False, "act_fn": "relu", "positional_embedding_type": "standard",
              "normalization_type": None}
    if not pinned:
        return {**common, "priors": [], **task.model_overrides}
    register_pin()
    if task.positions != tuple(range(task.k)):
        raise ValueError(f"kpart_model pins head i to position i; needs positions 0..K-1, got {task.positions}")
    return {**common, "priors": [PIN_PRIOR], "gate_modes": {PIN_PRIOR: "fixed"}, "gate_init": 1.0,
            **task.model_overrides}


def _routed_model(task: KPart, spare_heads: int, pinned: bool, d_head: int = 8):
    """A zeroed model of the :func:`kpart_model` preset whose heads already attend where the hand-built
    circuits need them: head ``h`` reads position ``h`` at the query (``h < n_ctx - 1``; later heads the query
    itself), by the pin (``pinned``) or by hand-set ``W_Q, W_K`` (query token one-hot x position one-hot,
    score ``PIN_BIAS`` on that key, 0 on the others). Returns ``(model, layout)`` with the residual layout
    ``{"POS", "TOK", "S", "JUNK", "ANS"}`` (position one-hots, token one-hots, the running sum, the junk
    direction non-part heads write, then ``V`` answer directions); embeddings and unembedding are set."""
    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

    v, n_ctx = task.v, task.n_ctx
    cfg_d = kpart_model(task, spare_heads=spare_heads, pinned=pinned, d_head=d_head)
    cfg_d["d_model"] = max(cfg_d["d_model"], n_ctx + task.d_vocab + 2 + v)
    cfg_d["d_mlp"] = max(cfg_d["d_mlp"], task.k * (v - 1) + 3)
    cfg = SoftPriorConfig.from_json_dict(cfg_d, source="hand_built_model")
    model = SoftPriorTransformer(cfg)
    lay = {"POS": 0, "TOK": n_ctx, "S": n_ctx + task.d_vocab, "JUNK": n_ctx + task.d_vocab + 1,
           "ANS": n_ctx + task.d_vocab + 2}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[torch.arange(task.d_vocab), lay["TOK"] + torch.arange(task.d_vocab)] = 1.0
        model.pos_embed.W_pos[torch.arange(n_ctx), lay["POS"] + torch.arange(n_ctx)] = 1.0
        attn = model.blocks[0].attn
        if not pinned:  # q . k / sqrt(d_head) = PIN_BIAS on the head's key, 0 elsewhere
            a = float((PIN_BIAS * cfg.d_head ** 0.5) ** 0.5)
            for h in range(cfg.n_heads):
                attn.W_Q[h, lay["TOK"] + task.query_token, 0] = a
                attn.W_K[h, lay["POS"] + min(h, n_ctx - 1), 0] = a
        model.unembed.W_U[lay["ANS"] + torch.arange(v), torch.arange(v)] = 1.0
    return model, lay


def _junk_heads(model, task: KPart, lay: dict, first: int) -> None:
    """Heads ``first, ..`` (the non-parts) write the token id they read on the junk direction (read by nothing)."""
    attn = model.blocks[0].attn
    with torch.no_grad():
        for h in range(first, model.cfg.n_heads):
            attn.W_V[h, lay["TOK"] + torch.arange(task.d_vocab), 0] = torch.arange(task.d_vocab).float()
            attn.W_O[h, 0, lay["JUNK"]] = 1.0


def hand_built_model(task: KPart, *, spare_heads: int = 2, margin: float = 10.0, pinned: bool = True):
    """A model of the :func:`kpart_model` preset whose weights are set by hand to solve ``task`` exactly:
    the *conjunction* circuit (no partial credit: every part is needed).

    Returns ``(model, parts)`` with ``parts = [(0, i) for i in range(K)]`` (layer, head).
    Head ``i`` reads only position ``i`` at the query: with ``pinned=True`` by the pinned prior
    (``W_Q = W_K = 0``; other keys get weight ``exp(-30)``), with ``pinned=False`` by hand-set
    query-key weights (the query token's embedding times the position embedding of ``i``, score 30
    on that key and 0 on the others, so the same ``exp(-30)``). Residual layout (``d_model`` as the
    preset, or larger if the layout needs it): ``[0, n_ctx)`` position one-hots, then ``d_vocab``
    token one-hots, then ``s`` (the running sum), ``junk`` (written by the non-part heads, read by
    nothing), then ``V`` answer directions. Part ``i < K`` writes ``π_i(token)`` on ``s``; a non-part
    head writes the token id it reads on ``junk``. The MLP (``K(V-1) + 3`` ReLU units
    ``r_t = relu(S - t)``, ``t = -1 .. K(V-1)+1``; the rest zero) writes ``margin * [S = s]`` (with
    ``[S = s] = r_{s-1} - 2 r_s + r_{s+1}``) on the answer direction of ``s mod V``; the unembedding
    reads the answer directions. Logits: ``margin`` on the answer, 0 elsewhere.
    """
    k, v = task.k, task.v
    s_max = k * (v - 1)
    n_units = s_max + 3
    model, lay = _routed_model(task, spare_heads, pinned)
    S, ANS = lay["S"], lay["ANS"]
    with torch.no_grad():
        attn = model.blocks[0].attn
        for h in range(k):  # part i: write π_i(x_i) on s
            attn.W_V[h, lay["TOK"] + torch.arange(v), 0] = task.perms[h].float()
            attn.W_O[h, 0, S] = 1.0
        _junk_heads(model, task, lay, k)
        mlp = model.blocks[0].mlp
        t = torch.arange(-1, s_max + 2)  # r_t = relu(S - t) for t = -1 .. s_max + 1
        mlp.W_in[S, :n_units] = 1.0
        mlp.b_in[:n_units] = -t.float()
        for s_val in range(s_max + 1):  # [S = s] = r_{s-1} - 2 r_s + r_{s+1}; the unit of r_t is t + 1
            a = ANS + s_val % v
            mlp.W_out[s_val, a] += margin
            mlp.W_out[s_val + 1, a] -= 2 * margin
            mlp.W_out[s_val + 2, a] += margin
    model.eval()
    return model, [(0, i) for i in range(k)]


def additive_batch(task: KPart, n: int, generator: torch.Generator) -> Batch:
    """``n`` sequences of the K-part layout on which each input alone answers ``1/K`` of the examples.

    Per sequence one *live* input ``j`` (uniform on ``0..K-1``) holds the answer ``y`` (uniform on
    ``Z_V``); every other input holds the blank token ``task.base_query_token`` (never a value);
    distractors and the query are as in :meth:`KPart.sample`. A circuit that reads each input with its
    own part and adds the evidence (:func:`hand_built_additive_model`) is exact here, and without part
    ``j`` it loses exactly the sequences whose live input is ``j``: retained ``(K-1)/K`` in expectation,
    the *partial-credit* prediction. The planted counterpart of :func:`hand_built_model` on the task itself.
    """
    check_sample_args(n, generator)
    N, q, blank = task.n_values, task.query_pos, task.base_query_token
    values = torch.randint(0, task.v, (n, N), generator=generator)
    live = torch.randint(0, task.k, (n,), generator=generator)
    pos = torch.tensor(task.positions)
    rows = torch.arange(n)
    y = values[rows, pos[live]]
    for j, p in enumerate(task.positions):
        values[live != j, p] = blank
    tokens = torch.cat([values, torch.full((n, 1), task.query_token, dtype=torch.long)], dim=1)
    targets = torch.full((n, task.n_ctx), IGNORE_INDEX, dtype=torch.long)
    targets[:, q] = y
    sources = torch.zeros(n, task.n_ctx, task.n_ctx, dtype=torch.bool)
    sources[rows, q, pos[live]] = True
    return Batch(tokens, targets, targets != IGNORE_INDEX, sources)


def hand_built_additive_model(task: KPart, *, spare_heads: int = 2, margin: float = 10.0, pinned: bool = True):
    """The *additive* circuit (partial credit by construction) for :func:`additive_batch`: ``(model, parts)``.

    Same preset, routing and non-part heads as :func:`hand_built_model` (``pinned`` as there); part ``i``
    copies the token it reads straight to the answer logits (``W_V``: value token ``t`` -> head dimension
    ``t``, the blank -> 0; ``W_O``: head dimension ``t`` -> ``margin`` on the answer direction of ``t``);
    the MLP is zero. Each part adds its own evidence, so ablating one loses only the sequences it answers.
    Needs ``V <= d_head`` (8).
    """
    k, v = task.k, task.v
    model, lay = _routed_model(task, spare_heads, pinned)
    if v > model.cfg.d_head:
        raise ValueError(f"hand_built_additive_model needs V <= d_head = {model.cfg.d_head}, got V = {v}")
    with torch.no_grad():
        attn = model.blocks[0].attn
        for h in range(k):
            attn.W_V[h, lay["TOK"] + torch.arange(v), torch.arange(v)] = 1.0
            attn.W_O[h, torch.arange(v), lay["ANS"] + torch.arange(v)] = margin
        _junk_heads(model, task, lay, k)
    model.eval()
    return model, [(0, i) for i in range(k)]
