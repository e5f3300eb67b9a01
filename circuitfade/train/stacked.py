"""The stacked model and its optimizer: E models of one shape as ``[E, *shape]`` tensors.

:class:`StackedModel` runs the single model's fused forward (answer-position rows included):
the same functions of :mod:`circuitfade.model.core` (``prior_attention``, ``fused_block``,
``fused_logits``) on weights, gates and prior inputs stacked with a leading member axis; :class:`BatchedAdamW` applies torch's AdamW to each member's slices
with that member's settings. Both do, per member, what the single run's kernels do, so a
member's loss, gradients and update equal its single run's bit for bit on the CPU (see
:mod:`circuitfade.train.ensemble`, which trains with them, and ``tests/library/train/test_ensemble.py``).
"""

from __future__ import annotations

import json
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch.func import functional_call
from torch.optim.adamw import adamw as adamw_step

from circuitfade.model import SoftPriorTransformer
from circuitfade.model.fused import ATTENTION_WEIGHTS, causal_mask, fused_block, fused_logits, prior_attention
from circuitfade.model.priors import PriorInputs, lookup

__all__ = ["StackedModel", "BatchedAdamW", "GateValues"]

# AdamW settings the batched update supports (anything else: the member is refused)
_ADAMW_FIXED = {"amsgrad": False, "capturable": False, "differentiable": False, "decoupled_weight_decay": True}


# ----------------------------------------------------------------------------------------------
# the stacked model
# ----------------------------------------------------------------------------------------------
class _Factors(nn.Module):
    """``prior.factors(inputs)`` as a module's forward (so ``functional_call`` can swap its weights)."""

    def __init__(self, prior: nn.Module):
        super().__init__()
        self.prior = prior

    def forward(self, inputs: PriorInputs):
        return self.prior.factors(inputs)


def _member_inputs(inputs: PriorInputs, e: int) -> PriorInputs:
    return PriorInputs(inputs.token_embed[e], inputs.resid[e],
                       None if inputs.scores is None else inputs.scores[e], inputs.query_index,
                       None if inputs.tokens is None else inputs.tokens[e], None if inputs.W_E is None else inputs.W_E[e])


GateValues = Sequence[dict[str, Tensor]]
"""Gate values per layer: ``values[layer][prior]`` is ``[E, head]`` (one row per member)."""


class StackedModel:
    """E :class:`~circuitfade.model.SoftPriorTransformer` s of one shape as stacked tensors.

    ``params[name]``: ``[E, *shape]`` leaf tensors (``name`` as in the single model's
    ``named_parameters``); ``buffers[name]``: the gate-value buffers ``[E, head]``. The
    forward is the single model's fused path (answer-position rows included) with a
    leading member axis: :meth:`logits` maps tokens ``[E, batch, pos]`` to logits
    ``[E, batch, len(rows), d_vocab_out]``. Each member's gates are its own: learned
    (``sigmoid(logit)``), or its gate buffer (fixed / scheduled), or 0 where ``zero[e]``
    (prior dropout, the dual loss's second pass).
    """

    def __init__(self, models: Sequence[SoftPriorTransformer], learned: Sequence[dict[str, bool]]):
        if not models:
            raise ValueError("StackedModel needs at least one model")
        self.template = models[0]
        self.cfg = self.template.cfg
        self.E = len(models)
        self.names = [n for n, _ in self.template.named_parameters()]
        params = [dict(m.named_parameters()) for m in models]
        buffers = [dict(m.named_buffers()) for m in models]
        with torch.no_grad():
            self.params: dict[str, Tensor] = {}
            for n in self.names:
                stacked = torch.stack([p[n].detach() for p in params]).clone()
                self.params[n] = stacked.requires_grad_(any(p[n].requires_grad for p in params))
            self.buffers: dict[str, Tensor] = {
                n: torch.stack([b[n].detach() for b in buffers]).clone()
                for n in buffers[0] if ".gate_" in n and n.endswith("_value")
            }
        priors = self.cfg.priors
        self.learned = torch.tensor([[bool(lm[p]) for p in priors] for lm in learned],
                                    dtype=torch.bool, device=self.device).reshape(self.E, len(priors))
        self._views: dict[str, tuple[Tensor, ...]] = {}

    @property
    def device(self) -> torch.device:
        return self.template.W_E.device

    # -- per-member helpers ------------------------------------------------------------------
    def member_params(self, name: str) -> tuple[Tensor, ...]:
        """The E members' slices of parameter ``name`` (differentiable views, made once per forward)."""
        v = self._views.get(name)
        if v is None:
            v = self._views[name] = self.params[name].unbind(0)
        return v

    def _per_member(self, module: nn.Module, prefix: str, x: Tensor) -> Tensor:
        """``module`` applied to each member's slice of ``x`` with that member's weights."""
        names = [n for n, _ in module.named_parameters()]
        if not names:
            return module(x)  # no weights (LayerNormPre, Identity): the same function on every slice
        xs = x.unbind(0)
        if hasattr(module, "w") and hasattr(module, "b") and type(module).__name__ == "LayerNorm":
            w, b = self.member_params(prefix + "w"), self.member_params(prefix + "b")
            return torch.stack([F.layer_norm(xs[e], (xs[e].shape[-1],), w[e], b[e], module.eps)
                                for e in range(self.E)])
        # vmap, not a loop over members: each op then consumes the stacked input once, as the single
        # model's op consumes its input, so autograd sums the input's gradients in the same order
        params = {n: self.params[prefix + n] for n in names}
        return torch.func.vmap(lambda p, xe: functional_call(module, p, (xe,)))(params, x)

    def gates(self, layer: int, zero: Bool[Tensor, "E"] | None,
              override: GateValues | None = None) -> dict[str, Float[Tensor, "E head"]]:
        """Effective gates of ``layer``: ``g[e] = sigmoid(logit[e])`` for a member whose gate is learned,
        its buffer (fixed / scheduled) otherwise, and 0 where ``zero[e]``; ``override[layer][prior]``
        (``[E, head]``), when given, instead."""
        if override is not None:
            return dict(override[layer])
        out = {}
        for j, name in enumerate(self.cfg.priors):
            pre = f"blocks.{layer}.attn.gate_{name}"
            g = torch.where(self.learned[:, j, None], torch.sigmoid(self.params[pre + "_logit"]),
                            self.buffers[pre + "_value"])
            if zero is not None:
                g = torch.where(zero[:, None], torch.zeros((), dtype=g.dtype, device=g.device), g)
            out[name] = g
        return out

    # -- forward ---------------------------------------------------------------------------------
    def embed(self, x: Int[Tensor, "E batch pos"] | Float[Tensor, "E batch pos d_in"]) -> Float[Tensor, "E batch pos d_model"]:
        """Token embeddings ``W_E[e][x[e]]`` (real inputs: ``x[e] @ W_E[e]``)."""
        E = self.E
        if self.cfg.input_mode == "real":
            W = self.params["embed.W_E"]  # [E, d_in, d_model]
            return torch.bmm(x.reshape(E, -1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[-1])
        return lookup(self.params["embed.W_E"], x)  # W_E [E, d_vocab, d_model] -> [E, batch, pos, d_model]

    def attention(self, layer: int, x: Float[Tensor, "E batch pos d_model"],
                  token_embed: Float[Tensor, "E batch pos d_model"], causal: Float[Tensor, "pos pos"],
                  rows: Int[Tensor, "rows"] | None, zero: Bool[Tensor, "E"] | None,
                  override: GateValues | None = None, vocab: tuple[Tensor, Tensor] | None = None,
                  table: tuple[Tensor, Tensor] | None = None) -> Float[Tensor, "E batch pos_or_rows d_model"]:
        """Block ``layer``'s attention: :func:`~circuitfade.model.fused.prior_attention` (the single
        model's fused attention) on the members' stacked weights, gates and prior terms."""
        attn = self.template.blocks[layer].attn
        pre = f"blocks.{layer}.attn."
        weights = {name: self.params[pre + name] for name in ATTENTION_WEIGHTS}
        return prior_attention(attn, x, token_embed, causal, weights, self.gates(layer, zero, override), rows,
                               prior_term=lambda name, prior, inputs: self._prior_term(layer, name, prior, inputs),
                               vocab=vocab, table=table,
                               prior_weights=lambda name, prior: list(self._prior_params(layer, name, prior).values()))

    def _prior_params(self, layer: int, name: str, prior: nn.Module) -> dict[str, Tensor]:
        """Prior ``name`` of block ``layer``: its parameters stacked ``[E, *shape]``, by the prior's own names."""
        ppre = f"blocks.{layer}.attn.priors.{name}."
        return {n: self.params[ppre + n] for n, _ in prior.named_parameters()}

    def _prior_term(self, layer: int, name: str, prior: nn.Module, inputs: PriorInputs):
        """Prior ``name``'s factors or bias for every member (``[E, ...]``), with the members' weights:
        the prior's own :meth:`~circuitfade.model.priors.AttentionPrior.member_term` where it has
        one, else the prior called once per member."""
        term = prior.member_term(inputs, self._prior_params(layer, name, prior))
        if term is not None:
            return term
        ppre = f"blocks.{layer}.attn.priors.{name}."
        ab = self._member_prior(prior, ppre, inputs, factors=True)
        return ab if ab is not None else self._member_prior(prior, ppre, inputs, factors=False)

    def _member_prior(self, prior: nn.Module, ppre: str, inputs: PriorInputs, *, factors: bool):
        """A prior the stack has no batched form for (the registered priors other than ``pos`` and
        ``content``), called once per member with that member's weights and inputs. (A loop, not
        ``vmap``: a vmapped ``nn.Linear`` inside a prior rounds differently from the single model.)"""
        names = [n for n, _ in prior.named_parameters()]
        views = {n: self.member_params(ppre + n) for n in names}
        module = _Factors(prior) if factors else prior
        key = "prior." if factors else ""
        outs = [functional_call(module, {key + n: v[e] for n, v in views.items()}, (_member_inputs(inputs, e),))
                for e in range(self.E)]
        if factors:
            if outs[0] is None:
                return None
            return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])
        return torch.stack(outs)

    def logits(self, x: Int[Tensor, "E batch pos"] | Float[Tensor, "E batch pos d_in"], rows: Int[Tensor, "rows"] | None,
               zero: Bool[Tensor, "E"] | None = None,
               gates: GateValues | None = None) -> Float[Tensor, "E batch rows_or_pos d_vocab_out"]:
        """Float logits ``[E, batch, rows_or_pos, d_vocab_out]`` of inputs ``x [E, batch, pos]``
        (``[E, batch, pos, d_vocab]`` for real inputs); ``rows``: the query positions computed
        in the last block (``None``: every position); ``gates``: every gate's value per layer
        (``gates[layer][prior]``: ``[E, head]``) in place of the members' own."""
        self._views = {}
        cfg = self.cfg
        embed = self.embed(x)
        causal = causal_mask(x.shape[2], x.device)
        vocab = (x, self.params["embed.W_E"]) if cfg.input_mode != "real" else None

        def block(i: int, resid: Tensor, r: Tensor | None, table: tuple[Tensor, Tensor] | None) -> Tensor:
            b, pre = self.template.blocks[i], f"blocks.{i}."
            return fused_block(resid, lambda h, t: self.attention(i, h, embed, causal, r, zero, gates, vocab, t),
                               lambda h: self._per_member(b.ln1, pre + "ln1.", h),
                               lambda h: self._per_member(b.ln2, pre + "ln2.", h),
                               None if cfg.attn_only else (lambda h: self._per_member(b.mlp, pre + "mlp.", h)), r,
                               table)

        learned_pos = cfg.positional_embedding_type in ("standard", "shortformer")
        norm = cfg.normalization_type is not None
        out = fused_logits(embed, [lambda resid, r, t, i=i: block(i, resid, r, t) for i in range(cfg.n_layers)],
                           self.params["unembed.W_U"], self.params["unembed.b_U"],
                           W_pos=self.params["pos_embed.W_pos"] if learned_pos else None,
                           ln_final=(lambda h: self._per_member(self.template.ln_final, "ln_final.", h)) if norm else None,
                           rows=rows, logit_cap=cfg.output_logits_soft_cap, vocab=vocab)
        self._views = {}
        return out

    # -- members ------------------------------------------------------------------------------------
    def copy_to(self, e: int, model: SoftPriorTransformer) -> None:
        """Write member ``e``'s weights and gate buffers into ``model`` (a single model of the same shape)."""
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(self.params[n][e])
            for n, b in model.named_buffers():
                if n in self.buffers:
                    b.copy_(self.buffers[n][e])

    def copy_buffers_from(self, e: int, model: SoftPriorTransformer) -> None:
        """Take ``model``'s gate buffers as member ``e``'s (after the trainer set them for an evaluation)."""
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in self.buffers:
                    self.buffers[n][e].copy_(b)

    def finite(self) -> Bool[Tensor, "E"]:
        """Whether every weight of member e is finite."""
        ok = torch.ones(self.E, dtype=torch.bool, device=self.device)
        with torch.no_grad():
            for p in self.params.values():
                ok &= torch.isfinite(p).reshape(self.E, -1).all(1)
        return ok

    def keep(self, idx: Sequence[int]) -> None:
        """Keep only members ``idx`` (in that order)."""
        sel = torch.as_tensor(list(idx), dtype=torch.long, device=self.device)
        with torch.no_grad():
            for n, p in self.params.items():
                self.params[n] = p.detach().index_select(0, sel).clone().requires_grad_(p.requires_grad)
            for n, b in self.buffers.items():
                self.buffers[n] = b.index_select(0, sel).clone()
        self.learned = self.learned.index_select(0, sel)
        self.E = len(idx)


# ----------------------------------------------------------------------------------------------
# AdamW per member
# ----------------------------------------------------------------------------------------------
class BatchedAdamW:
    """Torch's AdamW, applied to each member's slices with that member's settings.

    State per parameter ``[E, *shape]`` (``exp_avg``, ``exp_avg_sq``) and per-parameter step
    counts ``[E]``, exactly the state each member's ``torch.optim.AdamW`` would hold (a
    parameter without a gradient at a step, e.g. a learned gate under prior dropout, is
    skipped and its count not advanced, as torch does). :meth:`step` calls
    ``torch.optim.adamw.adamw`` (the functional form of ``torch.optim.AdamW.step``) once per
    group of members with equal settings, on the members' slices, so each member's update
    is torch's own kernel on its own tensors.
    """

    def __init__(self, stacked: StackedModel, optimizers: Sequence[torch.optim.Optimizer],
                 models: Sequence[SoftPriorTransformer]):
        self.stacked = stacked
        self.settings: list[dict] = []
        for opt in optimizers:
            if len(opt.param_groups) != 1:
                raise ValueError("BatchedAdamW: each member's optimizer must have one parameter group")
            g = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
            for k, want in _ADAMW_FIXED.items():
                if g.get(k, want) != want:
                    raise ValueError(f"BatchedAdamW supports AdamW with {k}={want}, got {g.get(k)!r}")
            self.settings.append(g)
        names = stacked.names
        P = stacked.params
        with torch.no_grad():
            self.exp_avg = {n: torch.zeros_like(P[n]) for n in names if P[n].requires_grad}
            self.exp_avg_sq = {n: torch.zeros_like(P[n]) for n in names if P[n].requires_grad}
            self.steps = {n: torch.zeros(stacked.E, dtype=torch.float32, device=P[n].device)
                          for n in names if P[n].requires_grad}
            for e, (opt, model) in enumerate(zip(optimizers, models)):
                for n, p in model.named_parameters():
                    st = opt.state.get(p)
                    if not st:
                        continue
                    if n not in self.steps:
                        raise ValueError(f"BatchedAdamW: optimizer state for {n}, which no member trains")
                    self.exp_avg[n][e].copy_(st["exp_avg"])
                    self.exp_avg_sq[n][e].copy_(st["exp_avg_sq"])
                    self.steps[n][e] = float(st["step"])
        self._refresh()

    def _refresh(self) -> None:
        """Per-member views of the stacked state (made once; remade after :meth:`keep`)."""
        P = self.stacked.params
        self._p = {n: P[n].detach().unbind(0) for n in self.steps}
        self._m = {n: t.unbind(0) for n, t in self.exp_avg.items()}
        self._v = {n: t.unbind(0) for n, t in self.exp_avg_sq.items()}
        self._s = {n: t.unbind(0) for n, t in self.steps.items()}
        groups: dict[str, list[int]] = {}
        for e, g in enumerate(self.settings):
            groups.setdefault(json.dumps(g, sort_keys=True, default=str), []).append(e)
        self._groups = list(groups.values())

    @torch.no_grad()
    def step(self, grads: dict[str, tuple[Tensor, ...]], has_grad: dict[str, list[bool]], update: Sequence[bool]) -> None:
        """One AdamW step for every member ``e`` with ``update[e]``, on the parameters it has a
        gradient for (``has_grad[name][e]``); ``grads[name][e]``: member e's gradient."""
        for members in self._groups:
            ps, gs, ms, vs, ss = [], [], [], [], []
            for n in self.steps:
                if n not in grads:
                    continue
                for e in members:
                    if update[e] and has_grad[n][e]:
                        ps.append(self._p[n][e])
                        gs.append(grads[n][e])
                        ms.append(self._m[n][e])
                        vs.append(self._v[n][e])
                        ss.append(self._s[n][e])
            if not ps:
                continue
            g = self.settings[members[0]]
            adamw_step(ps, gs, ms, vs, [], ss, foreach=g.get("foreach"), fused=g.get("fused"),
                                    amsgrad=False, beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"],
                                    weight_decay=g["weight_decay"], eps=g["eps"], maximize=g.get("maximize", False))

    def copy_to(self, e: int, opt: torch.optim.Optimizer, model: SoftPriorTransformer) -> None:
        """Load member ``e``'s state into ``opt`` (``model``'s ``torch.optim.AdamW``), as torch would hold it."""
        state = {}
        for idx, (n, _) in enumerate(model.named_parameters()):
            if n in self.steps and float(self.steps[n][e]) > 0:
                state[idx] = {"step": self.steps[n][e].detach().clone(), "exp_avg": self.exp_avg[n][e].clone(),
                              "exp_avg_sq": self.exp_avg_sq[n][e].clone()}
        opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})

    def keep(self, idx: Sequence[int]) -> None:
        """Keep only members ``idx`` (after :meth:`StackedModel.keep`)."""
        sel = torch.as_tensor(list(idx), dtype=torch.long)
        for d in (self.exp_avg, self.exp_avg_sq, self.steps):
            for n, t in d.items():
                d[n] = t.index_select(0, sel.to(t.device)).clone()
        self.settings = [self.settings[i] for i in idx]
        self._refresh()
