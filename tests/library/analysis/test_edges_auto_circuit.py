"""Agreement of circuitfade's EAP edge scores with auto-circuit's edge attribution (an optional peer).

auto-circuit (``pip install --no-deps auto-circuit==1.0.1 attrs ordered-set blobfile``; the
Makefile's default environment installs it) scores every edge of a factorized
``HookedTransformer`` graph by the gradient of the objective with respect to an edge mask at
mask 0 (``mask_gradient_prune_scores(..., grad_function="logit", answer_function="avg_diff",
mask_val=0)``, the same number as its replication of Syed et al.'s edge attribution
patching). With resample ablation from the corrupted prompts that gradient is
``(a_clean - a_corrupted) . dM/dx_receiver`` averaged over the batch: circuitfade's EAP
score, with the same sign.

Where the two differ by design (docs/circuits.md):

* names: auto-circuit's ``Resid Start``, ``A{l}.{h}``, ``A{l}.{h}.Q``, ``MLP {l}``, ``Resid End``
  are circuitfade's ``input``, ``L{l}H{h}``, ``L{l}H{h}.q``, ``MLP{l}``, ``logits``;
* nodes: on the soft-prior model circuitfade also has the content-prior edges
  ``input -> L{l}H{h}.content`` (the token embeddings read by the prior, outside the residual
  stream); auto-circuit has no such node, and it needs a plain ``HookedTransformer`` (its
  patch wrappers replace ``hook_q_input``, which the soft-prior block does not route
  through), so it scores the model's backbone (``to_plain_model``), which equals the soft-prior
  model when every gate is 0;
* the objective: auto-circuit reads the logits at the last position only (``last_seq``);
  circuitfade averages over each example's answer positions. The inputs here have one answer
  position, the last;
* EAP-IG: auto-circuit interpolates every edge mask at once from 0 to 1 (and sums the
  ``samples + 1`` gradients); circuitfade interpolates the input embeddings from the corrupted
  to the clean run (points ``k / steps``) and averages. Different paths, so no equality is
  expected and none is tested.

auto-circuit 1.0.1 imports ``transformer_lens.past_key_value_caching.HookedTransformerKeyValueCache``
(and ``transformer_lens.HookedTransformerKeyValueCache``), which TransformerLens 3.9 renamed
``TransformerLensKeyValueCache`` (no module of the old name). :func:`_import_auto_circuit`
injects a stand-in module with the old name for the import only and removes it afterwards;
auto-circuit uses the class only for type hints and its prompt-prefix KV caching, which these
tests do not use. Its import also restyles plotly's default template; the same function puts
that back, so the figures of other tests in the process are unchanged. On TransformerLens 4.x auto-circuit cannot run: ``HookedTransformer`` was
removed in 4.0 (auto-circuit builds its graph only for ``isinstance(model, HookedTransformer)``),
and the plain bridge refuses ``use_attn_result``, which auto-circuit's graph needs. The tests
skip there, and wherever auto-circuit is not installed.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import torch

from circuitfade import compat
from circuitfade.analysis.edges import counterfactual_batch, edge_scores
from circuitfade.tasks import Batch, eval_set

TOL = 1e-5
"""Largest absolute difference allowed between the two scores of one edge (float32 models;
the same tolerance as the agreement with TransformerLens's own attribution patching)."""


def _import_auto_circuit():
    """auto-circuit's modules this test uses, or a reason string why they cannot be imported."""
    if compat.is_tl4():
        return ("auto-circuit 1.0.1 needs transformer_lens.HookedTransformer, removed in TransformerLens 4.0 "
                "(and per-head results, which the plain bridge refuses)")
    if importlib.util.find_spec("auto_circuit") is None:
        return "auto-circuit is not installed (pip install --no-deps auto-circuit==1.0.1 attrs ordered-set blobfile)"
    import copy

    import plotly.io as pio
    import transformer_lens as tl

    # auto-circuit's import restyles plotly's default template (colours, font size 19): put it back after
    template, default = copy.deepcopy(pio.templates["plotly"]), pio.templates.default
    # the test-only stand-in: TransformerLens 3.9 renamed HookedTransformerKeyValueCache
    added_attr = not hasattr(tl, "HookedTransformerKeyValueCache")
    old = "transformer_lens.past_key_value_caching"
    added_module = old not in sys.modules and importlib.util.find_spec(old) is None
    if added_attr:
        tl.HookedTransformerKeyValueCache = tl.TransformerLensKeyValueCache
    if added_module:
        shim = types.ModuleType(old)
        shim.HookedTransformerKeyValueCache = tl.TransformerLensKeyValueCache
        sys.modules[old] = shim
    try:
        from auto_circuit.data import PromptDataLoader, PromptDataset
        from auto_circuit.prune_algos.edge_attribution_patching import edge_attribution_patching_prune_scores
        from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
        from auto_circuit.utils.graph_utils import patchable_model
    except ImportError as e:
        return f"auto-circuit does not import here: {e}"
    finally:
        pio.templates["plotly"], pio.templates.default = template, default
        if added_attr:
            del tl.HookedTransformerKeyValueCache
        if added_module:
            sys.modules.pop(old, None)
    return types.SimpleNamespace(PromptDataLoader=PromptDataLoader, PromptDataset=PromptDataset,
                                 mask_gradient=mask_gradient_prune_scores, patchable_model=patchable_model,
                                 syed=edge_attribution_patching_prune_scores)


AC = _import_auto_circuit()
pytestmark = pytest.mark.skipif(isinstance(AC, str), reason=AC if isinstance(AC, str) else "")


def _name(node: str) -> str:
    """auto-circuit's node name as circuitfade's."""
    if node == "Resid Start":
        return "input"
    if node == "Resid End":
        return "logits"
    if node.startswith("MLP "):
        return f"MLP{node.split()[1]}"
    layer, head, *role = node[1:].split(".")
    return f"L{layer}H{head}" + (f".{role[0].lower()}" if role else "")


def auto_circuit_eap(model, clean: Batch, corrupted: Batch, *, syed: bool = False) -> dict[str, float]:
    """auto-circuit's edge attribution of ``model`` (a plain ``HookedTransformer``, changed in
    place: auto-circuit wraps its hook points) on the one answer position of each example, the
    last: ``{circuitfade edge name: score}``."""
    pos = clean.answer_mask.nonzero()[:, 1]
    last = clean.tokens.shape[1] - 1
    assert bool((pos == last).all()) and len(pos) == len(clean), "one answer position per example, the last"
    for flag in ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in"):
        setattr(model.cfg, flag, True)
    model.setup()
    model.eval()
    data = AC.PromptDataset(clean.tokens, corrupted.tokens, [t[None] for t in clean.targets[:, last]],
                            [t[None] for t in corrupted.targets[:, last]])
    loader = AC.PromptDataLoader(data, seq_len=None, diverge_idx=0, batch_size=len(clean), shuffle=False)
    patchable = AC.patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                                   device=torch.device("cpu"))
    if syed:
        scores = AC.syed(patchable, loader, None)
    else:
        scores = AC.mask_gradient(patchable, loader, None, grad_function="logit", answer_function="avg_diff",
                                  mask_val=0.0)
    return {f"{_name(e.src.name)}->{_name(e.dest.name)}": float(scores[e.dest.module_name][e.patch_idx])
            for e in patchable.edges}


def _last_position_batch(n: int, pos: int, vocab: int, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, pos), generator=gen)
    targets = torch.full_like(tokens, -100)
    targets[:, -1] = torch.randint(0, vocab, (n,), generator=gen)
    return Batch.from_answers(tokens, [[pos - 1]] * n, targets=targets)


def test_eap_equals_auto_circuit_on_a_plain_model():
    """Every edge of a plain two-layer model with LayerNorm and MLPs (46 edges): the same edge
    set, the same scores and sign, for both of auto-circuit's implementations."""
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_head=16, n_ctx=8, d_vocab=10, d_mlp=64, act_fn="gelu",
               normalization_type="LN", seed=3)
    clean = _last_position_batch(16, 8, 10, seed=0)
    corrupted = counterfactual_batch(clean)
    model = compat.plain_model(cfg)
    model.eval()
    ours = edge_scores(model, clean, corrupted, method="eap", resamples=20).set_index("edge")["value"]
    for syed in (False, True):
        ref = auto_circuit_eap(compat.plain_model(cfg), clean, corrupted, syed=syed)
        assert set(ref) == set(ours.index) and len(ref) == 46
        theirs = np.array([ref[e] for e in ours.index])
        assert np.abs(ours.to_numpy() - theirs).max() < TOL, np.abs(ours.to_numpy() - theirs).max()
        assert np.abs(theirs).max() > 0.1


@pytest.mark.parametrize("step, gates", [(3600, None), (600, "zero")])
def test_eap_equals_auto_circuit_on_the_shipped_fade_series(step, gates):
    """The default soft-prior model (fade series; step 3600 has every gate at 0, step 600 is
    analysed under gates="zero"): auto-circuit on its plain backbone scores the 81 residual
    edges as circuitfade does; the 8 content-prior edges are circuitfade's alone and carry
    nothing at gate 0."""
    from circuitfade.store.examples import example_series

    series = example_series("fade600to0")
    model = series[step]
    clean = eval_set(series.task, n=32)
    corrupted = counterfactual_batch(clean)
    ours = edge_scores(model, clean, corrupted, method="eap", gates=gates, resamples=20)
    ref = auto_circuit_eap(model.to_plain_model(), clean, corrupted)
    extra = ours[~ours["edge"].isin(list(ref))]
    assert set(ref) <= set(ours["edge"]) and len(ref) == 81
    assert set(extra["kind"]) == {"prior"} and len(extra) == 8
    assert (extra["value"] == 0).all()
    shared = ours[ours["edge"].isin(list(ref))]
    diff = np.abs(shared["value"].to_numpy() - np.array([ref[e] for e in shared["edge"]]))
    assert diff.max() < TOL, diff.max()
    assert shared["value"].abs().max() > 0.5
