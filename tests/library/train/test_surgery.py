"""reinit_slices: exactly the named head slices change, with the model's own init, reproducibly.

Runs on both TransformerLens lines: plain models come from :func:`circuitfade.compat.plain_model`
(a ``HookedTransformer`` on 3.x, a ``TransformerBridge`` on 4.x, whose per-head ``W_Q``/... are views
of its fused projection weights), so slices are compared through those per-head views."""

from __future__ import annotations

import math

import pytest
import torch

from circuitfade import compat
from circuitfade.train.surgery import WHICH as SLICES, init_values, reinit_slices, reset_slice_moments
from circuitfade.model.transformer import SoftPriorTransformer


ATTN = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def _snapshot(model):
    """(parameters, buffers), detached copies. Parameters: every attention tensor by its
    ``blocks.{l}.attn.{W_Q,...,b_O}`` name (per-head views on a bridge, the parameters themselves
    on a ``HookedTransformer``), plus every named parameter whose storage none of those covers."""
    views = {f"blocks.{l}.attn.{w}": getattr(model.blocks[l].attn, w) for l in range(model.cfg.n_layers) for w in ATTN}
    covered = {v.untyped_storage().data_ptr() for v in views.values()}
    params = {k: v.detach().clone() for k, v in views.items()}
    params |= {k: v.detach().clone() for k, v in model.named_parameters()
               if v.untyped_storage().data_ptr() not in covered}
    return params, {k: v.detach().clone() for k, v in model.named_buffers()}


def _tl(**kw):
    cfg = dict(n_layers=2, d_model=32, n_ctx=8, d_head=8, n_heads=4, d_vocab=11, act_fn="relu", seed=1)
    return compat.plain_model({**cfg, **kw})


def _expected_changed(heads, which):
    return {(f"blocks.{l}.attn.{w}", h) for l, h in heads for w in SLICES[which]}


@pytest.mark.parametrize("which", ["qk", "ov"])
@pytest.mark.parametrize("make", [lambda: SoftPriorTransformer(seed=0), lambda: _tl()], ids=["softprior", "tl"])
def test_exactly_the_named_slices_change(which, make):
    model = make()
    with torch.no_grad():  # nonzero biases, so a bias that is reset to 0 visibly changes
        for name, p in model.named_parameters():
            if ".b_" in name or name.endswith(".bias"):  # HookedTransformer / bridge names
                p.add_(0.5)
    params0, bufs0 = _snapshot(model)
    heads = [(0, 1), (1, 3)]
    changes = reinit_slices(model, heads, which, generator=torch.Generator().manual_seed(7))
    assert {(c.name, c.head) for c in changes} == _expected_changed(heads, which)
    params1, bufs1 = _snapshot(model)
    assert bufs0.keys() == bufs1.keys() and all(torch.equal(bufs0[k], bufs1[k]) for k in bufs0)
    for name, before in params0.items():
        after = params1[name]
        touched = {h for n, h in _expected_changed(heads, which) if n == name}
        for h in range(before.shape[0] if touched else 0):
            if h in touched:
                assert not torch.equal(before[h], after[h]), (name, h)
            else:
                assert torch.equal(before[h], after[h]), (name, h)
        if not touched:
            assert torch.equal(before, after), name
    for c in changes:
        assert torch.equal(c.before, params0[c.name][c.head]) and torch.equal(c.after, params1[c.name][c.head])
        if c.weight.startswith("b_"):
            assert torch.equal(c.after, torch.zeros_like(c.after))  # TransformerLens initialises biases to 0


def test_deterministic_given_the_generator_and_fused_path_sees_the_change():
    a, b = SoftPriorTransformer(seed=0), SoftPriorTransformer(seed=0)
    tokens = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(0))
    before = a(tokens)
    ca = reinit_slices(a, [(1, 2)], "qk", generator=torch.Generator().manual_seed(3))
    cb = reinit_slices(b, [(1, 2)], "qk", generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(x.after, y.after) for x, y in zip(ca, cb))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    cc = reinit_slices(b, [(1, 2)], "qk", generator=torch.Generator().manual_seed(4))
    assert not torch.equal(cc[0].after, ca[0].after)
    after_fused = a(tokens)
    a.use_fused = False
    assert torch.allclose(after_fused, a(tokens), atol=1e-5)  # fused and hooked paths agree after surgery
    assert not torch.allclose(before, after_fused)


@pytest.mark.parametrize("mode,check", [
    ("gpt2", ("normal", lambda cfg, full: cfg.initializer_range)),
    ("xavier_uniform", ("uniform", lambda cfg, full: math.sqrt(6 / (full[1] + full[0] * full[2])))),
    ("kaiming_normal", ("normal", lambda cfg, full: math.sqrt(2) / math.sqrt(full[1]))),
])
def test_new_values_follow_the_models_init_distribution(mode, check):
    model = _tl(d_model=256, d_head=64, init_mode=mode, initializer_range=1.0 if mode != "gpt2" else 0.05)
    kind, scale_of = check
    full = tuple(model.blocks[0].attn.W_Q.shape)  # [4, 256, 64]: the whole tensor's fans, not the slice's
    scale = scale_of(model.cfg, full)
    changes = reinit_slices(model, [(0, h) for h in range(4)], "qk", generator=torch.Generator().manual_seed(0))
    w = torch.cat([c.after.reshape(-1) for c in changes if c.weight == "W_Q"]).double()  # 65536 values
    sd = math.sqrt(scale**2 / 3) if kind == "uniform" else scale
    assert abs(float(w.std()) / sd - 1) < 0.02  # relative se of an sd from 65536 draws: ~0.3%
    if kind == "uniform":
        assert float(w.abs().max()) <= scale
    # the slice's own fans would give a different scale (the test would catch per-slice fans)
    assert init_values(model.cfg, "W_Q", full, full[1:], torch.Generator()).shape == full[1:]


def test_bad_input_is_refused():
    model = SoftPriorTransformer(seed=0)
    with pytest.raises(ValueError, match="which"):
        reinit_slices(model, [(0, 0)], "qkv")
    with pytest.raises(ValueError, match="out of range"):
        reinit_slices(model, [(2, 0)], "qk")
    with pytest.raises(ValueError, match="pairs"):
        reinit_slices(model, [3], "qk")
    with pytest.raises(ValueError, match="no heads"):
        reinit_slices(model, [], "qk")
    with pytest.raises(TypeError):
        reinit_slices(torch.nn.Linear(2, 2), [(0, 0)])


def test_reset_slice_moments_zeroes_exactly_those_slices():
    model = SoftPriorTransformer(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        opt.zero_grad()
        model(tokens, return_type="loss").backward()
        opt.step()
    state0 = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    changes = reinit_slices(model, [(0, 1)], "ov", generator=torch.Generator().manual_seed(0))
    assert reset_slice_moments(opt, model, changes) == 2 * len(changes)  # exp_avg, exp_avg_sq per slice
    names = {c.name: c.head for c in changes}
    for name, p in model.named_parameters():
        for k, v in opt.state[p].items():
            v0 = state0[id(p)][k]
            if name in names and v.shape == p.shape:
                h = names[name]
                assert torch.equal(v[h], torch.zeros_like(v[h])) and not torch.equal(v0[h], v[h])
                keep = [i for i in range(p.shape[0]) if i != h]
                assert torch.equal(v[keep], v0[keep])
            else:
                assert torch.equal(v, v0), (name, k)  # including Adam's shared step count
