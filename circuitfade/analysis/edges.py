"""Edge attribution and exact edge patching for any TransformerLens model, and circuits over a series.

The computational graph of a transformer read through its residual stream:

* **senders** write into the residual stream: ``input`` (the embeddings, read at
  ``blocks.0.hook_resid_pre``), every head ``L{l}H{h}`` (its output ``hook_z[h] @ W_O[h]``,
  ``blocks.{l}.attn.hook_z``) and every MLP ``MLP{l}`` (``blocks.{l}.hook_mlp_out``);
* **receivers** read from it: every head's query, key and value input ``L{l}H{h}.q`` / ``.k`` /
  ``.v`` (``blocks.{l}.attn.hook_q`` / ``hook_k`` / ``hook_v``, recomputed from the receiver's
  own residual stream through ``ln1``), every MLP ``MLP{l}`` (the residual stream it reads at
  ``blocks.{l}.hook_resid_mid``, fed through ``ln2`` into ``blocks[l].mlp``) and ``logits``
  (the final residual stream, ``blocks.{L-1}.hook_resid_post``);
* an **edge** ``sender -> receiver`` exists when the sender writes before the receiver reads.

On circuitfade's soft-prior model a prior whose bias depends on the tokens (the ``content``
prior: a bilinear form of the token embeddings) is a path of its own from the input to each
head's attention pattern that bypasses the residual stream; it is the edge
``input -> L{l}H{h}.content`` (receiver ``blocks.{l}.attn.hook_content_bias``, kind
``"prior"``). Priors that do not depend on the tokens (``pos``) carry the same bias on clean
and corrupted inputs, so no edge of theirs can carry a difference; priors computed from the
attention scores (``cope``, ``dape``) follow the head's own query and key, so they are part of
its q and k edges; gates are weights, not activations: analyse a gate condition by running
under it (``gates=``).

Every function compares a **clean** batch with a **corrupted** one (same shape, e.g.
:func:`counterfactual_batch`) through a per-example **objective** of the logits
(:data:`OBJECTIVES`: ``logit_diff``, ``logprob``, ``neg_kl``; higher = more like the clean
run):

* :func:`edge_scores` - EAP (gradient x activation difference) or EAP-IG (the gradient
  integrated from the corrupted to the clean embeddings in ``steps`` steps), per edge, with a
  bootstrap interval over examples;
* :func:`edge_effects` - exact patching of one edge at a time (the ground truth the scores
  approximate); :func:`patch_edges` - the objective with any set of edges patched;
* :func:`faithfulness_curve` / :func:`smallest_circuit` - the objective recovered by the top
  ``k`` edges and the smallest circuit that recovers a stated fraction;
* :func:`edge_attribution` - the same scores as a metric of :func:`circuitfade.store.trace`,
  so a checkpoint series becomes one tidy frame of edges x steps; :func:`circuit_timeline`
  reads it (when each edge enters and leaves the top-``k`` circuit, overlaps, the first
  checkpoint whose circuit matches the final one).

A score is the estimated drop of the objective when the edge alone carries its corrupted
value: ``(a_clean - a_corrupted) . dM/dx_receiver``; an exact effect is the measured drop
``M(clean) - M(edge patched)``. Patching an edge replaces the sender's contribution to that
receiver's input only (the rest of the residual stream is untouched), hook for hook, so any
model with the standard TransformerLens hooks works: ``HookedTransformer`` (3.x), the 4.x
``TransformerBridge`` (:func:`circuitfade.compat.plain_model`) and the soft-prior model.
Models with grouped-query attention or parallel attention and MLP are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuitfade.analysis.heads import BOOTSTRAP_SEED, check_batch, gates_context
from circuitfade.stats import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, bootstrap_weights, chance_overlap,
                               percentile_interval)
from circuitfade.store.tracing import Metric
from circuitfade.tasks import Batch

__all__ = [
    "EDGE_ATTRIBUTION",
    "OBJECTIVES",
    "Node",
    "EdgeGraph",
    "CircuitTimeline",
    "edge_graph",
    "counterfactual_batch",
    "edge_scores",
    "edge_effects",
    "patch_edges",
    "faithfulness_curve",
    "smallest_circuit",
    "top_edges",
    "edge_attribution",
    "circuit_timeline",
]

EDGE_ATTRIBUTION = "edge_attribution"
"""The metric name :func:`edge_attribution` gives its rows in a trace."""

METHODS = ("eap", "eap-ig")


# ------------------------------------------------------------------------------- graph
@dataclass(frozen=True)
class Node:
    """A sender or receiver: ``name`` (``"input"``, ``"L1H0"``, ``"L1H0.q"``, ``"MLP0"``,
    ``"logits"``), ``kind`` (``input``, ``head``, ``mlp``, ``logits``), ``layer`` (-1 for the
    input, ``n_layers`` for the logits), ``head`` (-1 unless a head), ``role`` (``q``, ``k``,
    ``v``, a prior's name, ``mlp``, ``logits``, or ``""`` for a sender) and ``hook`` (the
    TransformerLens hook point it is read or written at)."""

    name: str
    kind: str
    layer: int
    head: int
    role: str
    hook: str


@dataclass
class EdgeGraph:
    """Senders, receivers and the edges between them (see the module docstring).

    ``edges`` is a DataFrame with one row per edge: ``edge`` (``"L0H1->L1H0.k"``), ``sender``,
    ``receiver``, ``kind`` (``"resid"`` or ``"prior"``), ``sender_layer``, ``sender_head``,
    ``receiver_layer``, ``receiver_head``, ``role``, ``sender_hook``, ``receiver_hook``, and
    the integer columns ``s`` and ``r`` (indices into ``senders`` and ``receivers``).
    """

    n_layers: int
    n_heads: int
    senders: list[Node]
    receivers: list[Node]
    edges: pd.DataFrame
    priors: tuple[str, ...] = ()
    has_mlp: bool = True
    _index: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.edges)

    @property
    def names(self) -> list[str]:
        """Edge names in graph order."""
        return list(self.edges["edge"])

    def receivers_of(self, key) -> list[int]:
        """Receiver indices of one hook group: ``(layer, role)`` or ``"logits"``."""
        return self._index[key]

    def weights(self, edges: Iterable[str] | Mapping[str, float], *, complement: bool = False) -> Tensor:
        """A ``[senders, receivers]`` patch matrix: 1 on ``edges`` (or the weight given per edge),
        0 elsewhere; ``complement=True`` patches every edge *not* named. ``ValueError`` naming an
        unknown edge."""
        known = dict(zip(self.edges["edge"], zip(self.edges["s"], self.edges["r"])))
        items = dict(edges) if isinstance(edges, Mapping) else {str(e): 1.0 for e in edges}
        bad = [e for e in items if e not in known]
        if bad:
            raise ValueError(f"edges: unknown edge(s) {bad[:5]}; edges are named like {self.names[:2]}")
        w = torch.zeros(len(self.senders), len(self.receivers), dtype=torch.float64)
        if complement:
            w[torch.tensor(self.edges["s"].to_numpy()), torch.tensor(self.edges["r"].to_numpy())] = 1.0
            for e in items:
                w[known[e]] = 0.0
        else:
            for e, v in items.items():
                w[known[e]] = float(v)
        return w


def _check_arch(model) -> None:
    cfg = getattr(model, "cfg", None)
    if cfg is None or getattr(model, "hook_dict", None) is None or not hasattr(model, "blocks"):
        raise ValueError(f"model: expected a TransformerLens model (with .cfg, .blocks and hooks), got "
                         f"{type(model).__name__}")
    if getattr(cfg, "n_key_value_heads", None) not in (None, cfg.n_heads):
        raise ValueError("model: grouped-query attention (n_key_value_heads) is not supported by edge attribution")
    if getattr(cfg, "parallel_attn_mlp", False):
        raise ValueError("model: parallel attention and MLP blocks are not supported by edge attribution")


def _token_priors(model) -> tuple[str, ...]:
    """The priors of a soft-prior model whose bias depends on the tokens (a probe forward on two
    sequences: a token-independent bias is exposed without a batch dimension)."""
    names = tuple(getattr(model.cfg, "priors", ()) or ())
    if not names:
        return ()
    attn = model.blocks[0].attn
    names = tuple(n for n in names if not getattr(attn.priors[n], "needs_scores", False))
    seen: dict[str, int] = {}

    def probe(x, hook):
        seen[hook.name.rsplit("hook_", 1)[1][: -len("_bias")]] = x.ndim
        return x

    n = min(2, int(model.cfg.n_ctx))
    tokens = torch.zeros(2, n, dtype=torch.long, device=next(model.parameters()).device)
    hooks = [(f"blocks.0.attn.hook_{p}_bias", probe) for p in names]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    return tuple(p for p in names if seen.get(p) == 4)


def edge_graph(model) -> EdgeGraph:
    """The sender/receiver graph of ``model`` (any TransformerLens model; see the module docstring)."""
    _check_arch(model)
    cfg = model.cfg
    L, H = int(cfg.n_layers), int(cfg.n_heads)
    has_mlp = not bool(getattr(cfg, "attn_only", False))
    priors = _token_priors(model)
    senders = [Node("input", "input", -1, -1, "", "blocks.0.hook_resid_pre")]
    sender_layer_end = []  # number of senders written before layer l's attention reads
    receivers: list[Node] = []
    index: dict = {}
    for l in range(L):
        sender_layer_end.append(len(senders))
        for role in ("q", "k", "v"):
            index[(l, role)] = []
            for h in range(H):
                index[(l, role)].append(len(receivers))
                receivers.append(Node(f"L{l}H{h}.{role}", "head", l, h, role, f"blocks.{l}.attn.hook_{role}"))
        for p in priors:
            index[(l, p)] = []
            for h in range(H):
                index[(l, p)].append(len(receivers))
                receivers.append(Node(f"L{l}H{h}.{p}", "head", l, h, p, f"blocks.{l}.attn.hook_{p}_bias"))
        for h in range(H):
            senders.append(Node(f"L{l}H{h}", "head", l, h, "", f"blocks.{l}.attn.hook_z"))
        if has_mlp:
            index[(l, "mlp")] = [len(receivers)]
            receivers.append(Node(f"MLP{l}", "mlp", l, -1, "mlp", f"blocks.{l}.hook_resid_mid"))
            senders.append(Node(f"MLP{l}", "mlp", l, -1, "", f"blocks.{l}.hook_mlp_out"))
    index["logits"] = [len(receivers)]
    receivers.append(Node("logits", "logits", L, -1, "logits", f"blocks.{L - 1}.hook_resid_post"))
    rows = []
    for r, rec in enumerate(receivers):
        if rec.role in priors:
            upstream = [0]
        elif rec.kind == "head":
            upstream = range(sender_layer_end[rec.layer])
        elif rec.kind == "mlp":
            upstream = range(sender_layer_end[rec.layer] + H)
        else:
            upstream = range(len(senders))
        for s in upstream:
            snd = senders[s]
            rows.append({"edge": f"{snd.name}->{rec.name}", "sender": snd.name, "receiver": rec.name,
                         "kind": "prior" if rec.role in priors else "resid", "sender_layer": snd.layer,
                         "sender_head": snd.head, "receiver_layer": rec.layer, "receiver_head": rec.head,
                         "role": rec.role, "sender_hook": snd.hook, "receiver_hook": rec.hook, "s": s, "r": r})
    edges = pd.DataFrame(rows)
    return EdgeGraph(L, H, senders, receivers, edges, priors, has_mlp, index)


# ------------------------------------------------------------------------- the forward
def _params(model) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


def _run(model, g: EdgeGraph, tokens: Tensor, *, weights: Tensor | None = None, corr: Tensor | None = None,
         delta: Tensor | None = None, embed: Tensor | None = None):
    """One forward with every sender recorded and every receiver's input optionally changed.

    Receiver ``r`` reads ``x + Σ_u weights[u, r] (corr[u] - a_u) + delta[r]`` where ``x`` is its
    input in this run, ``a_u`` sender ``u``'s activation in this run and ``corr`` the corrupted
    run's (``[senders, batch, pos, d_model]``). ``embed`` replaces ``hook_embed``'s output.
    Returns ``(logits, senders [senders, batch, pos, d_model], token embeddings)``.
    """
    L = g.n_layers
    acts: list[Tensor | None] = [None] * len(g.senders)
    state: dict = {}
    if weights is not None:
        weights = weights.to(device=tokens.device, dtype=corr.dtype)
    head0 = {l: next(i for i, s in enumerate(g.senders) if s.layer == l and s.kind == "head") for l in range(L)}
    mlp_sender = {s.layer: i for i, s in enumerate(g.senders) if s.kind == "mlp"}

    def deltas(rs: list[int]) -> Tensor | None:
        out = None
        if weights is not None:  # [senders, receivers], or [batch, senders, receivers]: one matrix per example
            w = weights[..., rs]
            used = w.reshape(-1, w.shape[-2], w.shape[-1]).abs().sum((0, 2))
            ups = used.nonzero().flatten().tolist()
            if ups:
                diff = torch.stack([corr[u] - acts[u] for u in ups])
                eq = "ur,ubpd->rbpd" if w.ndim == 2 else "bur,ubpd->rbpd"
                out = torch.einsum(eq, w[..., ups, :], diff)
        if delta is not None:
            out = delta[rs] if out is None else out + delta[rs]
        return out

    def on_embed(x, hook):
        if embed is not None:
            x = embed.to(x.dtype)
        state["embed"] = x
        return x

    def on_pre(l):
        def f(x, hook):
            state[("pre", l)] = x
            if l == 0:
                acts[0] = x
            return x
        return f

    def on_qkv(l, role):
        rs = g.receivers_of((l, role))
        block = model.blocks[l]

        def f(x, hook):
            d = deltas(rs)
            if d is None:
                return x
            xr = (state[("pre", l)].unsqueeze(0) + d).permute(1, 2, 0, 3)  # [batch, pos, head, d_model]
            w = getattr(block.attn, f"W_{role.upper()}")
            b = getattr(block.attn, f"b_{role.upper()}")
            return (torch.einsum("bphd,hde->bphe", block.ln1(xr), w) + b).to(x.dtype)
        return f

    def on_prior(l, name):
        rs = g.receivers_of((l, name))
        block = model.blocks[l]

        def f(x, hook):
            d = deltas(rs)
            if d is None:
                return x
            from circuitfade.model.priors import PriorInputs

            resid = block.ln1(state[("pre", l)])
            prior = block.attn.priors[name]
            cols = [prior(PriorInputs(state["embed"] + d[h], resid))[:, h] for h in range(g.n_heads)]
            return torch.stack(cols, 1).to(x.dtype)
        return f

    def on_z(l):
        W_O = model.blocks[l].attn.W_O

        def f(z, hook):
            out = torch.einsum("bphk,hkd->hbpd", z, W_O)
            for h in range(g.n_heads):
                acts[head0[l] + h] = out[h]
            return z
        return f

    def on_mid(l):
        def f(x, hook):
            state[("mid", l)] = x
            return x
        return f

    def mlp_input(l):
        """A forward pre-hook on ``blocks[l].mlp``: its input becomes ``ln2(resid_mid + delta)``."""
        rs = g.receivers_of((l, "mlp"))
        block = model.blocks[l]

        def f(module, args):
            d = deltas(rs)
            if d is None or not args:
                return None
            x = block.ln2(state[("mid", l)] + d[0]).to(args[0].dtype)
            return (x,) + tuple(args[1:])
        return f

    def on_mlp_out(l):
        def f(x, hook):
            acts[mlp_sender[l]] = x
            return x
        return f

    def on_post(x, hook):
        d = deltas(g.receivers_of("logits"))
        return x if d is None else x + d[0]

    hooks = [("hook_embed", on_embed)]
    for l in range(L):
        hooks.append((f"blocks.{l}.hook_resid_pre", on_pre(l)))
        for role in ("q", "k", "v"):
            hooks.append((f"blocks.{l}.attn.hook_{role}", on_qkv(l, role)))
        for p in g.priors:
            hooks.append((f"blocks.{l}.attn.hook_{p}_bias", on_prior(l, p)))
        hooks.append((f"blocks.{l}.attn.hook_z", on_z(l)))
        if g.has_mlp:
            hooks.append((f"blocks.{l}.hook_resid_mid", on_mid(l)))
            hooks.append((f"blocks.{l}.hook_mlp_out", on_mlp_out(l)))
    hooks.append((f"blocks.{L - 1}.hook_resid_post", on_post))
    handles = [model.blocks[l].mlp.register_forward_pre_hook(mlp_input(l)) for l in range(L)] if g.has_mlp else []
    try:
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    finally:
        for h in handles:
            h.remove()
    missing = [g.senders[i].name for i, a in enumerate(acts) if a is None]
    if missing:
        raise ValueError(f"model {type(model).__name__}: the hooks of senders {missing[:4]} did not fire; edge "
                         "attribution needs the standard TransformerLens hooks on the hooked path")
    return logits, torch.stack(acts), state.get("embed")


# ------------------------------------------------------------------------- objectives
def _answer_mean(values: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp_min(1.0)


def logit_diff(logits, clean: Batch, corrupted: Batch, clean_logits) -> Tensor:
    """Per example: the logit of the clean answer minus the logit of the corrupted batch's answer,
    averaged over the example's answer positions (the two batches must share answer positions)."""
    if not torch.equal(clean.answer_mask, corrupted.answer_mask):
        raise ValueError("objective 'logit_diff': the corrupted batch must have the same answer positions as "
                         "the clean one (use objective='logprob' otherwise)")
    t_clean = clean.targets.clamp_min(0)[..., None]
    t_corr = corrupted.targets.clamp_min(0)[..., None]
    diff = (logits.gather(-1, t_clean) - logits.gather(-1, t_corr))[..., 0]
    return _answer_mean(diff, clean.answer_mask)


def logprob(logits, clean: Batch, corrupted: Batch, clean_logits) -> Tensor:
    """Per example: the mean log-probability of the clean answers (minus the loss)."""
    lp = torch.log_softmax(logits, -1).gather(-1, clean.targets.clamp_min(0)[..., None])[..., 0]
    return _answer_mean(lp, clean.answer_mask)


def neg_kl(logits, clean: Batch, corrupted: Batch, clean_logits) -> Tensor:
    """Per example: minus the KL divergence of the prediction from the clean run's, averaged over
    answer positions (0 on the clean run; its gradient there is 0, so use EAP-IG with it)."""
    p_log = torch.log_softmax(clean_logits.to(logits.dtype), -1)
    kl = (p_log.exp() * (p_log - torch.log_softmax(logits, -1))).sum(-1)
    return -_answer_mean(kl, clean.answer_mask)


OBJECTIVES: dict[str, Callable] = {"logit_diff": logit_diff, "logprob": logprob, "neg_kl": neg_kl}
"""Built-in objectives ``f(logits, clean, corrupted, clean_logits) -> [batch]`` (higher = more
like the clean run). Pass your own function of the same signature as ``objective=``."""


def _objective(objective) -> tuple[str, Callable]:
    if callable(objective):
        return getattr(objective, "__name__", "objective"), objective
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: expected one of {sorted(OBJECTIVES)} or a function, got {objective!r}")
    return objective, OBJECTIVES[objective]


# ------------------------------------------------------------------------------ batches
def counterfactual_batch(batch: Batch, shift: int = 1) -> Batch:
    """The corrupted batch every task can give: example ``i`` paired with example ``i + shift``
    of the same batch (another draw from the task, so its answers differ and its answer
    positions match whenever the task's do, as in associative recall)."""
    if not isinstance(batch, Batch):
        raise ValueError(f"batch: expected a circuitfade.tasks.Batch, got {type(batch).__name__}")
    if len(batch) < 2:
        raise ValueError("batch: a counterfactual pairing needs at least 2 examples")
    if isinstance(shift, bool) or not isinstance(shift, int) or shift % len(batch) == 0:
        raise ValueError(f"shift: expected an int that is not a multiple of the batch size {len(batch)}, got {shift!r}")
    idx = torch.roll(torch.arange(len(batch)), -shift)
    return batch[idx.to(batch.device)]


def _check_pair(model, clean: Batch, corrupted: Batch) -> tuple[Batch, Batch]:
    if not isinstance(corrupted, Batch):
        raise ValueError(f"corrupted: expected a circuitfade.tasks.Batch, got {type(corrupted).__name__}")
    clean = check_batch(model, clean)
    if corrupted.tokens.shape != clean.tokens.shape:
        raise ValueError(f"corrupted: tokens of shape {tuple(corrupted.tokens.shape)}; expected the clean batch's "
                         f"{tuple(clean.tokens.shape)}")
    if len(clean) < 2:
        raise ValueError("clean: expected at least 2 examples (the interval resamples examples)")
    corrupted = corrupted.to(clean.device)
    return clean, corrupted


class _Eval:
    """Eval mode and the gate condition for the duration of a ``with`` block."""

    def __init__(self, model, gates):
        self.model, self.ctx = model, gates_context(model, gates)

    def __enter__(self):
        self.training = self.model.training
        self.model.eval()
        self.ctx.__enter__()

    def __exit__(self, *exc):
        try:
            self.ctx.__exit__(*exc)
        finally:
            self.model.train(self.training)


def _interval(per_example: np.ndarray, resamples: int, level: float) -> dict[str, np.ndarray]:
    """Mean over examples with a bootstrap standard error and percentile interval (the package's
    fixed resamples over examples, so every edge and checkpoint shares them)."""
    n = per_example.shape[0]
    w = bootstrap_weights(n, resamples, BOOTSTRAP_SEED)
    with np.errstate(invalid="ignore"):
        boot = (w @ per_example) / n  # a non-finite example (a model with non-finite weights) gives NaN
    lo, hi = percentile_interval(boot, level)
    return {"value": per_example.mean(0), "se": boot.std(0, ddof=1), "lo": lo, "hi": hi}


# ---------------------------------------------------------------------------- scores
def _frame(g: EdgeGraph, stats: Mapping[str, np.ndarray], **const) -> pd.DataFrame:
    cols = ["edge", "sender", "receiver", "kind", "sender_layer", "sender_head", "receiver_layer",
            "receiver_head", "role", "sender_hook", "receiver_hook"]
    df = g.edges[cols].copy().reset_index(drop=True)
    for k, v in stats.items():
        df[k] = np.asarray(v, dtype=float)
    for k, v in const.items():
        df[k] = v
    return df


def _edge_products(model, g: EdgeGraph, clean: Batch, corrupted: Batch, fn, alphas: Sequence[float]) -> Tensor:
    """Per example and edge ``[batch, edges]``: ``(a_clean - a_corrupted) . dM/dx_receiver``, the
    gradient averaged over the embedding interpolation points ``alphas`` (``[1.0]``: EAP)."""
    with torch.no_grad():
        clean_logits, a_clean, e_clean = _run(model, g, clean.tokens)
        _, a_corr, e_corr = _run(model, g, corrupted.tokens)
    grad = torch.zeros((len(g.receivers),) + tuple(a_clean.shape[1:]), dtype=a_clean.dtype, device=a_clean.device)
    for a in alphas:
        delta = torch.zeros_like(grad, requires_grad=True)
        emb = None if a == 1.0 else e_corr + a * (e_clean - e_corr)
        with torch.enable_grad():
            logits, _, _ = _run(model, g, clean.tokens, delta=delta, embed=emb)
            total = fn(logits, clean, corrupted, clean_logits).sum()
            (gr,) = torch.autograd.grad(total, delta, allow_unused=True)
        if gr is not None:
            grad += gr.detach() / len(alphas)
    diff = (a_clean - a_corr).detach()
    s_idx = torch.tensor(g.edges["s"].to_numpy(), device=diff.device)
    r_idx = torch.tensor(g.edges["r"].to_numpy(), device=diff.device)
    # every sender x receiver product per example ([batch, senders, receivers]), then the edges
    pairs = torch.einsum("ubpd,rbpd->bur", diff.double(), grad.double())
    return pairs[:, s_idx, r_idx]


def edge_scores(
    model,
    clean: Batch,
    corrupted: Batch,
    *,
    method: str = "eap-ig",
    steps: int = 5,
    objective: str | Callable = "logit_diff",
    gates=None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    graph: EdgeGraph | None = None,
    chunk: int | None = None,
) -> pd.DataFrame:
    """Attribution score of every edge: EAP or EAP-IG, with a bootstrap interval over examples.

    ``score = mean over examples of (a_clean - a_corrupted) . g`` where ``a`` is the sender's
    activation and ``g`` the gradient of the objective with respect to the receiver's input: at
    the clean run (``method="eap"``) or averaged over ``steps`` runs whose embeddings go from the
    corrupted to the clean ones (``"eap-ig"``, points ``k / steps``, ``k = 1..steps``). A positive
    score says patching the edge alone to its corrupted value lowers the objective by about that
    much. ``gates``: a gate condition for a soft-prior model (``None``: as it is). ``chunk``:
    examples per forward and backward pass (``None``: the whole batch at once); the gradient
    buffer ``[receivers, chunk, pos, d_model]`` then stays that size whatever the batch, and the
    scores are the same up to float rounding.

    Returns one row per edge: the graph columns (:class:`EdgeGraph`), ``value``, ``se``, ``lo``,
    ``hi`` (bootstrap over examples, ``resamples`` resamples, percentile interval at ``level``),
    ``method``, ``objective``, ``n`` (examples).
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk: expected a positive int or None, got {chunk!r}")
    name, fn = _objective(objective)
    g = graph if graph is not None else edge_graph(model)
    clean, corrupted = _check_pair(model, clean, corrupted)
    alphas = [1.0] if method == "eap" else [k / steps for k in range(1, steps + 1)]
    n = len(clean)
    size = n if chunk is None else min(int(chunk), n)
    with _Eval(model, gates):
        parts = []
        for start in range(0, n, size):
            idx = torch.arange(start, min(start + size, n), device=clean.device)
            part = (clean, corrupted) if size == n else (clean[idx], corrupted[idx])
            parts.append(_edge_products(model, g, *part, fn, alphas).cpu())
        per_edge = torch.cat(parts, 0)
    stats = _interval(per_edge.cpu().numpy(), resamples, level)
    return _frame(g, stats, method=method, objective=name, n=len(clean))


# ----------------------------------------------------------------------- exact patching
def _patched_objective(model, g, clean, corrupted, fn, weights_list: Sequence[Tensor],
                       max_batch: int = 256) -> list[Tensor]:
    """Per-example objective ``[batch]`` of the clean run with each patch matrix applied (plus the
    clean and the corrupted run first: ``[clean, corrupted, *patched]``). Several patches share
    one forward on the batch repeated once per patch, up to ``max_batch`` sequences."""
    with torch.no_grad():
        clean_logits, _, _ = _run(model, g, clean.tokens)
        corr_logits, a_corr, _ = _run(model, g, corrupted.tokens)
        out = [fn(clean_logits, clean, corrupted, clean_logits), fn(corr_logits, clean, corrupted, clean_logits)]
        n = len(clean)
        per = max(1, int(max_batch) // n)
        for start in range(0, len(weights_list), per):
            chunk = weights_list[start:start + per]
            c = len(chunk)
            idx = torch.arange(n, device=clean.device).repeat(c)
            w = torch.stack(chunk).repeat_interleave(n, 0)  # [c * batch, senders, receivers]
            logits, _, _ = _run(model, g, clean.tokens[idx], weights=w, corr=a_corr[:, idx])
            values = fn(logits, clean[idx], corrupted[idx], clean_logits[idx])
            out.extend(values.reshape(c, n).unbind(0))
    return out


def patch_edges(
    model,
    clean: Batch,
    corrupted: Batch,
    edges: Iterable[str] | Mapping[str, float],
    *,
    keep: bool = False,
    objective: str | Callable = "logit_diff",
    gates=None,
    graph: EdgeGraph | None = None,
) -> dict[str, float]:
    """The objective with ``edges`` patched to their corrupted values (``keep=True``: every edge
    *except* ``edges``, i.e. the circuit ``edges`` alone carries the clean run). A mapping
    ``{edge: weight}`` patches a fraction ``weight`` of each edge's difference.

    Returns ``{"clean", "corrupted", "patched", "recovered"}``: the mean objective of the clean
    run, the corrupted run, the patched run, and ``(patched - corrupted) / (clean - corrupted)``.
    """
    name, fn = _objective(objective)
    g = graph if graph is not None else edge_graph(model)
    clean, corrupted = _check_pair(model, clean, corrupted)
    w = g.weights(edges, complement=keep)
    with _Eval(model, gates):
        c, k, p = (float(v.mean()) for v in _patched_objective(model, g, clean, corrupted, fn, [w]))
    return {"clean": c, "corrupted": k, "patched": p, "recovered": _recovered(p, c, k)}


def _recovered(value: float, clean: float, corrupted: float) -> float:
    gap = clean - corrupted
    return (value - corrupted) / gap if gap != 0 and math.isfinite(gap) else math.nan


def edge_effects(
    model,
    clean: Batch,
    corrupted: Batch,
    *,
    edges: Iterable[str] | None = None,
    objective: str | Callable = "logit_diff",
    gates=None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    graph: EdgeGraph | None = None,
) -> pd.DataFrame:
    """Exact effect of every edge (or of ``edges``): ``objective(clean) - objective(clean with that
    edge alone patched to its corrupted value)``, one forward per edge, with the bootstrap
    interval over examples. Same columns as :func:`edge_scores` (``method = "patching"``)."""
    name, fn = _objective(objective)
    g = graph if graph is not None else edge_graph(model)
    clean, corrupted = _check_pair(model, clean, corrupted)
    edges = None if edges is None else list(dict.fromkeys(edges))
    sub = g.edges if edges is None else g.edges[g.edges["edge"].isin(edges)]
    if edges is not None and len(sub) != len(edges):
        unknown = sorted(set(edges) - set(sub["edge"]))
        raise ValueError(f"edges: unknown edge(s) {unknown[:5]}")
    ws = [g.weights([e]) for e in sub["edge"]]
    with _Eval(model, gates):
        vals = _patched_objective(model, g, clean, corrupted, fn, ws)
    base = vals[0]
    per_edge = torch.stack([(base - v).double() for v in vals[2:]], 1).cpu().numpy()  # [batch, edges]
    stats = _interval(per_edge, resamples, level)
    sub_graph = EdgeGraph(g.n_layers, g.n_heads, g.senders, g.receivers, sub.reset_index(drop=True), g.priors,
                          g.has_mlp, g._index)
    return _frame(sub_graph, stats, method="patching", objective=name, n=len(clean))


def top_edges(scores: pd.DataFrame, k: int, *, by: str = "abs") -> list[str]:
    """The ``k`` edges with the largest score (``by="abs"``: largest ``|value|``; ``"value"``:
    largest signed value), ties broken by graph order."""
    if by not in ("abs", "value"):
        raise ValueError(f"by: expected 'abs' or 'value', got {by!r}")
    if "edge" not in scores.columns or "value" not in scores.columns:
        raise ValueError("scores: expected a frame with 'edge' and 'value' columns (from edge_scores)")
    key = scores["value"].abs() if by == "abs" else scores["value"]
    order = np.argsort(-key.fillna(-np.inf).to_numpy(), kind="stable")
    return list(scores["edge"].to_numpy()[order[: int(k)]])


def faithfulness_curve(
    model,
    clean: Batch,
    corrupted: Batch,
    scores: pd.DataFrame,
    *,
    ks: Sequence[int] | None = None,
    by: str = "abs",
    objective: str | Callable = "logit_diff",
    gates=None,
    graph: EdgeGraph | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """The objective recovered by the circuit of the top ``k`` edges of ``scores`` (every other
    edge patched to its corrupted value), measured exactly, for each ``k`` in ``ks`` (default:
    about 20 sizes from 0 to every edge, log-spaced).

    Returns columns ``k``, ``value`` (mean objective), ``recovered`` (``(value - corrupted) /
    (clean - corrupted)``: 0 = the corrupted run, 1 = the clean run), ``lo`` / ``hi`` (bootstrap
    percentile interval of ``recovered`` over examples at ``level``: clean, corrupted and
    patched means recomputed on each of ``resamples`` shared resamples), ``clean``,
    ``corrupted``, ``objective``.
    """
    name, fn = _objective(objective)
    g = graph if graph is not None else edge_graph(model)
    clean, corrupted = _check_pair(model, clean, corrupted)
    n = len(g)
    if ks is None:
        ks = sorted({0, n, *np.unique(np.round(np.geomspace(1, n, 18)).astype(int)).tolist()})
    ks = [int(k) for k in ks]
    if any(k < 0 or k > n for k in ks):
        raise ValueError(f"ks: expected sizes between 0 and the number of edges {n}, got {ks}")
    ranked = top_edges(scores, n, by=by)
    ws = [g.weights(ranked[:k], complement=True) for k in ks]
    with _Eval(model, gates):
        per = torch.stack(_patched_objective(model, g, clean, corrupted, fn, ws)).double().cpu().numpy()
    vals = [float(v) for v in per.mean(1)]
    c, kc = vals[0], vals[1]
    w = bootstrap_weights(per.shape[1], resamples, BOOTSTRAP_SEED)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (w @ per.T) / per.shape[1]  # [resamples, clean + corrupted + sizes]
        rec = (boot[:, 2:] - boot[:, 1:2]) / (boot[:, :1] - boot[:, 1:2])
    rec[~np.isfinite(rec)] = np.nan
    lo, hi = percentile_interval(rec, level)
    return pd.DataFrame({"k": ks, "value": vals[2:], "recovered": [_recovered(v, c, kc) for v in vals[2:]],
                         "lo": lo, "hi": hi, "clean": c, "corrupted": kc, "objective": name})


def smallest_circuit(curve: pd.DataFrame, fraction: float = 0.8) -> dict:
    """The smallest ``k`` of a :func:`faithfulness_curve` whose circuit recovers at least
    ``fraction`` of the objective, and stays at or above it for every larger ``k`` measured:
    ``{"k", "recovered", "fraction"}`` (``k = None`` if no size does)."""
    if not 0 < float(fraction) <= 1.5:
        raise ValueError(f"fraction: expected a number in (0, 1.5], got {fraction!r}")
    c = curve.sort_values("k")
    ok = (c["recovered"] >= fraction).to_numpy()
    k = None
    for i in range(len(c)):
        if ok[i:].all():
            k = int(c["k"].iloc[i])
            break
    rec = float(c.loc[c["k"] == k, "recovered"].iloc[0]) if k is not None else math.nan
    return {"k": k, "recovered": rec, "fraction": float(fraction)}


# ------------------------------------------------------------------- across checkpoints
def edge_attribution(
    corrupted: Batch | Callable[[Batch], Batch] | None = None,
    *,
    method: str = "eap-ig",
    steps: int = 5,
    objective: str | Callable = "logit_diff",
    gates=None,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    name: str = EDGE_ATTRIBUTION,
    chunk: int | None = None,
) -> Metric:
    """:func:`edge_scores` as a metric of :func:`circuitfade.store.trace`: one row per edge and
    checkpoint, metric ``name``, ``layer`` / ``head`` NA, the edge columns kept.

    ``corrupted``: a :class:`Batch` matching the traced batch, a function ``batch -> Batch``,
    or ``None`` for :func:`counterfactual_batch` of the traced batch. Gradients are switched on
    inside the metric, so ``trace`` needs no ``grad=True``; one model is in memory at a time.
    ``chunk``: examples per gradient pass (:func:`edge_scores`).
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    _objective(objective)
    if corrupted is not None and not isinstance(corrupted, Batch) and not callable(corrupted):
        raise ValueError(f"corrupted: expected a Batch, a function batch -> Batch or None, got {type(corrupted).__name__}")

    def fn(model, batch):
        if not isinstance(batch, Batch):
            raise ValueError("edge_attribution needs a Batch with answers (pass task= or batch= to trace)")
        corr = counterfactual_batch(batch) if corrupted is None else (
            corrupted if isinstance(corrupted, Batch) else corrupted(batch))
        return edge_scores(model, batch, corr, method=method, steps=steps, objective=objective, gates=gates,
                           resamples=resamples, level=level, chunk=chunk)

    fn.__name__ = name
    return Metric(fn, name=name, inputs=("model", "batch"))


@dataclass
class CircuitTimeline:
    """What :func:`circuit_timeline` returns.

    * ``edges``: one row per edge that is ever in the top-``k`` circuit: ``edge``, ``first_step``,
      ``last_step``, ``n_steps`` (checkpoints in the circuit), ``entered`` / ``left`` (the steps
      at which it joined / dropped out), ``in_final``;
    * ``steps``: one row per checkpoint: ``step``, ``circuit`` (its edges, best first),
      ``overlap_prev`` and ``overlap_final`` (Jaccard overlap with the previous checkpoint's and
      the final circuit), ``chance`` (the expected Jaccard overlap of two random ``k``-edge
      circuits of the graph's edges: :func:`~circuitfade.stats.chance_overlap`, the baseline
      beside both overlaps), ``entered``, ``left`` (counts);
    * ``match_step``: the first checkpoint from which every circuit overlaps the final one by at
      least ``overlap`` (``None`` if only the final one does); ``first_match``: the first that
      does at all; ``n_edges``: the edges ranked per checkpoint; ``chance``: as in ``steps``.
    """

    edges: pd.DataFrame
    steps: pd.DataFrame
    match_step: int | None
    first_match: int | None
    k: int
    overlap: float
    n_edges: int = 0
    chance: float = math.nan


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def circuit_timeline(traced: pd.DataFrame, *, k: int = 10, overlap: float = 0.8, by: str = "abs",
                     metric: str = EDGE_ATTRIBUTION) -> CircuitTimeline:
    """When each edge enters and leaves the top-``k`` circuit over a traced series.

    ``traced``: a :func:`~circuitfade.store.trace` frame with :func:`edge_attribution` rows
    (``metric``), or any frame with ``step``, ``edge``, ``value``. See :class:`CircuitTimeline`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    if not 0 < float(overlap) <= 1:
        raise ValueError(f"overlap: expected a number in (0, 1], got {overlap!r}")
    need = {"step", "edge", "value"}
    if not isinstance(traced, pd.DataFrame) or not need <= set(traced.columns):
        raise ValueError(f"traced: expected a frame with columns {sorted(need)} (trace with edge_attribution)")
    df = traced[traced["metric"] == metric] if "metric" in traced.columns else traced
    if df.empty:
        raise ValueError(f"traced: no rows of metric {metric!r}")
    steps = sorted(int(s) for s in df["step"].unique())
    circuits = {s: top_edges(df[df["step"] == s], k, by=by) for s in steps}
    n_edges = int(df["edge"].nunique())
    chance = chance_overlap(n_edges, min(k, n_edges))["jaccard"]
    final = set(circuits[steps[-1]])
    rows, prev = [], None
    history: dict[str, dict] = {}
    for s in steps:
        cur = set(circuits[s])
        entered = cur - (prev or set())
        left = (prev or set()) - cur
        for e in entered:
            h = history.setdefault(e, {"edge": e, "first_step": s, "entered": [], "left": [], "n_steps": 0})
            h["entered"].append(s)
        for e in left:
            history[e]["left"].append(s)
        for e in cur:
            history[e]["n_steps"] += 1
            history[e]["last_step"] = s
        rows.append({"step": s, "circuit": circuits[s], "overlap_prev": math.nan if prev is None else _jaccard(cur, prev),
                     "overlap_final": _jaccard(cur, final), "chance": chance, "entered": len(entered) if prev is not None else 0,
                     "left": len(left)})
        prev = cur
    step_frame = pd.DataFrame(rows)
    ok = (step_frame["overlap_final"] >= overlap).to_numpy()
    match = next((steps[i] for i in range(len(steps)) if ok[i:].all()), None)
    first = next((steps[i] for i in range(len(steps)) if ok[i]), None)
    edge_frame = pd.DataFrame([{**h, "in_final": h["edge"] in final} for h in history.values()],
                              columns=["edge", "first_step", "last_step", "n_steps", "entered", "left", "in_final"])
    edge_frame = edge_frame.sort_values(["first_step", "edge"], ignore_index=True)
    return CircuitTimeline(edge_frame, step_frame, match, first, int(k), float(overlap), n_edges, chance)

