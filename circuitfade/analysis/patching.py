"""Residual-stream activation patching and mean replacement, for any TransformerLens model.

Two causal interventions, both pure (hooks live only during the forward passes; the
models' train/eval mode is restored; nothing is trained):

* :func:`patch_resid` - run ``target_model`` on ``tokens`` with the residual stream at a
  single ``(layer, position)`` replaced by ``source_model``'s activation there (same
  tokens), for every layer boundary and position, and read a scalar ``metric_fn``
  of the patched logits. The two models must have the same shape (they usually are
  two checkpoints or two training histories of one architecture).
* :func:`mean_replacement` - replace one component's output at one position (a head's
  ``hook_z``, an MLP's ``hook_mlp_out``) by its mean over the batch *for the same
  model*, and read the metric; also all heads / all MLPs at once.

:func:`patched_logits` is the primitive both use. Metrics are callables
``metric_fn(logits [batch, pos, d_vocab_out]) -> scalar`` (e.g. a mean logit margin).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from circuitfade.tasks import Batch

__all__ = [
    "MetricFn",
    "resid_hooks",
    "patched_logits",
    "patch_resid",
    "restored_fraction",
    "mean_replacement",
]

MetricFn = Callable[[Tensor], Tensor | float]


# ---------------------------------------------------------------------------- checks
def _check_model(model, name: str = "model"):
    cfg = getattr(model, "cfg", None)
    if cfg is None or getattr(model, "hook_dict", None) is None:
        raise ValueError(f"{name}: expected a TransformerLens HookedTransformer (with .cfg and hooks), "
                         f"got {type(model).__name__}")
    return cfg


def _check_tokens(model, tokens) -> Tensor:
    if isinstance(tokens, Batch):
        tokens = tokens.tokens
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype != torch.long:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens: expected an int64 tensor [batch, pos], got {shape}")
    if tokens.shape[0] == 0:
        raise ValueError("tokens: expected at least one sequence")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"tokens: sequence length {tokens.shape[1]} exceeds the model's n_ctx={model.cfg.n_ctx}")
    return tokens.to(next(model.parameters()).device)


def _scalar(v) -> float:
    v = torch.as_tensor(v)
    if v.numel() != 1:
        raise ValueError(f"metric_fn: expected a scalar, got shape {tuple(v.shape)}")
    return float(v)


@contextlib.contextmanager
def _inference(*models) -> Iterator[None]:
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, t in zip(models, modes):
            m.train(t)


def resid_hooks(model) -> list[tuple[int, str]]:
    """``(layer, hook name)`` for every residual-stream boundary: ``blocks.{l}.hook_resid_pre``
    for ``l = 0 .. n_layers-1`` and the final residual ``blocks.{n_layers-1}.hook_resid_post``
    (labelled ``layer = n_layers``)."""
    n = _check_model(model).n_layers
    return [(l, f"blocks.{l}.hook_resid_pre") for l in range(n)] + [(n, f"blocks.{n - 1}.hook_resid_post")]


def _positions(pos, n_pos: int):
    if pos is None:
        return slice(None)
    idx = [int(pos)] if isinstance(pos, int) else [int(p) for p in pos]
    for p in idx:
        if not -n_pos <= p < n_pos:
            raise ValueError(f"position {p} out of range for sequences of length {n_pos}")
    return idx


# -------------------------------------------------------------------------- patching
def patched_logits(
    source_model,
    target_model,
    batch: Int[Tensor, "batch pos"] | Batch,
    patches: Mapping[str, int | Sequence[int] | None],
    *,
    source_cache: Mapping[str, Tensor] | None = None,
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """Logits of ``target_model`` on ``tokens`` with activations patched in from ``source_model``.

    ``patches`` maps a hook name to the positions to patch (an int, a list of ints, or
    ``None`` = every position); at each named hook, ``act[:, positions]`` of the target
    is replaced by the source's activation at the same hook and positions, computed on
    the same ``tokens``. An empty mapping gives the target's own logits.
    ``source_cache`` (``{hook name: activation}``) skips re-running the source.
    """
    _check_model(source_model, "source_model")
    _check_model(target_model, "target_model")
    tokens = _check_tokens(target_model, batch)
    names = list(patches)
    missing = [n for n in names if n not in target_model.hook_dict or n not in source_model.hook_dict]
    if missing:
        raise ValueError(f"patches: hooks {missing} not found in both models")
    with _inference(source_model, target_model):
        if source_cache is None and names:
            _, source_cache = source_model.run_with_cache(tokens, names_filter=lambda n: n in names)
        hooks = []
        for name in names:
            src = source_cache[name]
            idx = _positions(patches[name], tokens.shape[1])

            def fn(act, hook, src=src, idx=idx):
                if act.shape != src.shape:
                    raise ValueError(f"{hook.name}: source activation {tuple(src.shape)} does not match "
                                     f"target {tuple(act.shape)} (models must have the same shape)")
                act = act.clone()
                act[:, idx] = src[:, idx].to(act.dtype)
                return act

            hooks.append((name, fn))
        if not hooks:
            return target_model(tokens)
        return target_model.run_with_hooks(tokens, fwd_hooks=hooks)


def restored_fraction(value, source_value: float, target_value: float):
    """``(value - target_value) / (source_value - target_value)``: 0 = the target's metric,
    1 = the source's; NaN when the two models' metrics coincide."""
    gap = source_value - target_value
    if gap == 0:
        return value * float("nan")
    return (value - target_value) / gap


def patch_resid(
    source_model,
    target_model,
    batch: Int[Tensor, "batch pos"] | Batch,
    metric_fn: MetricFn,
    *,
    positions: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Single-site residual-stream patching map from ``source_model`` into ``target_model``.

    For every residual boundary ``(layer, hook)`` of :func:`resid_hooks` (``layer =
    n_layers`` is the final residual) and every position ``pos`` (default: all
    ``0 .. n_pos-1``), the target runs on ``tokens`` with ``hook[:, pos]`` replaced by the
    source's activation there (:func:`patched_logits`), and::

        value    = metric_fn(patched logits)
        restored = (value - metric_target) / (metric_source - metric_target)

    where ``metric_source`` / ``metric_target`` are the metric of the unpatched source and
    target runs (stored in ``df.attrs``). Columns ``layer, hook, pos, value, restored``,
    one row per site. The models must share ``n_layers``, ``d_model`` and ``n_ctx``.
    The target keeps its own final LayerNorm and unembedding, so patching the final
    residual at the query restores exactly 1 only when the two read-outs coincide; the
    shortfall measures how much of the metric difference lives in the read-out weights.
    """
    cs, ct = _check_model(source_model, "source_model"), _check_model(target_model, "target_model")
    for key in ("n_layers", "d_model", "n_ctx"):
        if getattr(cs, key) != getattr(ct, key):
            raise ValueError(f"source and target models differ in {key}: {getattr(cs, key)} vs {getattr(ct, key)}")
    tokens = _check_tokens(target_model, batch)
    n_pos = tokens.shape[1]
    pos_list = list(range(n_pos)) if positions is None else [int(p) % n_pos for p in _positions(positions, n_pos)]
    sites = resid_hooks(target_model)
    with _inference(source_model, target_model):
        src_logits, cache = source_model.run_with_cache(tokens, names_filter=lambda n: n in {h for _, h in sites})
        m_src = _scalar(metric_fn(src_logits))
        m_tgt = _scalar(metric_fn(target_model(tokens)))
        rows = []
        for layer, hook in sites:
            for p in pos_list:
                v = _scalar(metric_fn(patched_logits(source_model, target_model, tokens, {hook: p},
                                                     source_cache=cache)))
                rows.append({"layer": layer, "hook": hook, "pos": p, "value": v,
                             "restored": restored_fraction(v, m_src, m_tgt)})
    df = pd.DataFrame(rows)
    df.attrs.update(metric_source=m_src, metric_target=m_tgt)
    return df


# ----------------------------------------------------------------- mean replacement
def mean_replacement(
    model,
    batch: Int[Tensor, "batch pos"] | Batch,
    metric_fn: MetricFn,
    *,
    position: int = -1,
) -> pd.DataFrame:
    """Metric after replacing components' outputs at ``position`` by their batch means.

    Means are this model's own activations on ``tokens``, averaged over the batch at
    ``position``: for head ``(l, h)`` the vector ``mean_b z[b, position, h, :]`` at
    ``blocks.{l}.attn.hook_z``; for MLP ``l`` the vector ``mean_b mlp_out[b, position, :]``
    at ``blocks.{l}.hook_mlp_out`` (skipped for attention-only models). Interventions:

    * ``none`` - no replacement (the baseline);
    * ``head`` - one head (component ``"L{l}H{h}"``);
    * ``all_heads`` - every head at once;
    * ``mlp`` - one MLP (``"L{l}MLP"``);
    * ``all_mlps`` - every MLP at once.

    Columns ``component, kind, layer, head, value, delta`` with ``value = metric_fn(logits)``
    and ``delta = value - baseline`` (``layer``/``head`` are -1 where they do not apply).
    """
    cfg = _check_model(model)
    tokens = _check_tokens(model, batch)
    n_pos = tokens.shape[1]
    if not -n_pos <= int(position) < n_pos:
        raise ValueError(f"position {position} out of range for sequences of length {n_pos}")
    pos = int(position) % n_pos
    L, H = cfg.n_layers, cfg.n_heads
    z_names = [f"blocks.{l}.attn.hook_z" for l in range(L)]
    mlp_names = [] if cfg.attn_only else [f"blocks.{l}.hook_mlp_out" for l in range(L)]
    with _inference(model):
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in set(z_names + mlp_names))
        means = {n: cache[n][:, pos].mean(0) for n in z_names + mlp_names}
        base = _scalar(metric_fn(logits))

        def z_hook(heads):
            def fn(act, hook):
                act = act.clone()
                act[:, pos, heads] = means[hook.name][heads].to(act.dtype)
                return act
            return fn

        def mlp_fn(act, hook):
            act = act.clone()
            act[:, pos] = means[hook.name].to(act.dtype)
            return act

        def metric(hooks) -> float:
            return _scalar(metric_fn(model.run_with_hooks(tokens, fwd_hooks=hooks)))

        rows = [{"component": "none", "kind": "none", "layer": -1, "head": -1, "value": base}]
        for l in range(L):
            for h in range(H):
                rows.append({"component": f"L{l}H{h}", "kind": "head", "layer": l, "head": h,
                             "value": metric([(z_names[l], z_hook([h]))])})
        rows.append({"component": "all_heads", "kind": "all_heads", "layer": -1, "head": -1,
                     "value": metric([(n, z_hook(list(range(H)))) for n in z_names])})
        if mlp_names:
            for l, n in enumerate(mlp_names):
                rows.append({"component": f"L{l}MLP", "kind": "mlp", "layer": l, "head": -1,
                             "value": metric([(n, mlp_fn)])})
            rows.append({"component": "all_mlps", "kind": "all_mlps", "layer": -1, "head": -1,
                         "value": metric([(n, mlp_fn) for n in mlp_names])})
    df = pd.DataFrame(rows)
    df["delta"] = df["value"] - base
    return df
