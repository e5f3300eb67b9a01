"""Edge scores from a peer library on the same model and inputs: auto-circuit's edge attribution.

`auto-circuit <https://pypi.org/project/auto-circuit/>`_ (an optional peer:
``pip install --no-deps auto-circuit==1.0.1 attrs ordered-set blobfile``) scores every edge of a
factorized ``HookedTransformer`` graph by the gradient of the objective with respect to an edge
mask at mask 0 (``mask_gradient_prune_scores(..., grad_function="logit",
answer_function="avg_diff", mask_val=0)``, the same number as its replication of Syed et al.'s
edge attribution patching). With resample ablation from the corrupted prompts that gradient is
``(a_clean - a_corrupted) . dM/dx_receiver`` averaged over the batch: the EAP score of
:func:`circuitfade.analysis.edges.edge_scores`, with the same sign. :func:`auto_circuit_eap`
returns it under circuitfade's edge names, so the two can be compared edge by edge
(``tests`` do, and ``benchmarks/edges_auto_circuit.py`` times both).

Where the two differ by design:

* names: auto-circuit's ``Resid Start``, ``A{l}.{h}``, ``A{l}.{h}.Q``, ``MLP {l}``, ``Resid End``
  are circuitfade's ``input``, ``L{l}H{h}``, ``L{l}H{h}.q``, ``MLP{l}``, ``logits``
  (:func:`auto_circuit_node_name`);
* nodes: on the soft-prior model circuitfade also has the content-prior edges
  ``input -> L{l}H{h}.content``; auto-circuit needs a plain ``HookedTransformer`` (its patch
  wrappers replace ``hook_q_input``, which the soft-prior block does not route through), so it
  scores the model's backbone (``to_plain_model()``), which equals the soft-prior model when
  every gate is 0;
* the objective: auto-circuit reads the logits at the last position only; circuitfade averages
  over each example's answer positions (:func:`auto_circuit_eap` requires one answer position
  per example, the last);
* EAP-IG: auto-circuit interpolates every edge mask at once and sums the gradients; circuitfade
  interpolates the input embeddings from the corrupted to the clean run and averages. Different
  paths: no equality is expected.

auto-circuit 1.0.1 imports ``transformer_lens.past_key_value_caching.HookedTransformerKeyValueCache``,
which TransformerLens 3.9 renamed ``TransformerLensKeyValueCache``: :func:`import_auto_circuit` imports it
inside :func:`circuitfade.compat.legacy_kv_cache_names`, which gives the old names for the import
only (auto-circuit uses the class for type hints and prompt-prefix caching, not used here), and
puts back plotly's default template, which auto-circuit's import restyles. On TransformerLens 4.x auto-circuit cannot run
(``HookedTransformer`` was removed in 4.0, and the plain bridge refuses ``use_attn_result``).
"""

from __future__ import annotations

import copy
import importlib.util
import types

import torch

from circuitfade import compat

__all__ = ["auto_circuit_unavailable", "import_auto_circuit", "auto_circuit_node_name", "auto_circuit_eap",
           "AUTO_CIRCUIT_INSTALL"]

AUTO_CIRCUIT_INSTALL = "pip install --no-deps auto-circuit==1.0.1 attrs ordered-set blobfile"
"""The install line of the peer (its other declared dependencies are not used for edge attribution)."""


def auto_circuit_unavailable() -> str | None:
    """Why auto-circuit cannot run here (a sentence), or ``None`` when it can be imported."""
    if compat.is_tl4():
        return ("auto-circuit 1.0.1 needs transformer_lens.HookedTransformer, removed in TransformerLens 4.0 "
                "(and per-head results, which the plain bridge refuses)")
    if importlib.util.find_spec("auto_circuit") is None:
        return f"auto-circuit is not installed ({AUTO_CIRCUIT_INSTALL})"
    try:
        import_auto_circuit()
    except ImportError as e:
        return f"auto-circuit does not import here: {e}"
    return None


def import_auto_circuit() -> types.SimpleNamespace:
    """auto-circuit's graph, data and edge-attribution functions: ``PromptDataLoader``,
    ``PromptDataset``, ``patchable_model``, ``mask_gradient`` and ``syed`` (its replication of
    edge attribution patching). Raises ``ImportError`` where it cannot be imported."""
    import plotly.io as pio

    # auto-circuit's import restyles plotly's default template (colours, font size 19): put it back after
    template, default = copy.deepcopy(pio.templates["plotly"]), pio.templates.default
    try:
        with compat.legacy_kv_cache_names():
            from auto_circuit.data import PromptDataLoader, PromptDataset
            from auto_circuit.prune_algos.edge_attribution_patching import edge_attribution_patching_prune_scores
            from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
            from auto_circuit.utils.graph_utils import patchable_model
    finally:
        pio.templates["plotly"], pio.templates.default = template, default
    return types.SimpleNamespace(PromptDataLoader=PromptDataLoader, PromptDataset=PromptDataset,
                                 mask_gradient=mask_gradient_prune_scores, patchable_model=patchable_model,
                                 syed=edge_attribution_patching_prune_scores)


def auto_circuit_node_name(node: str) -> str:
    """auto-circuit's node name as circuitfade's (``"A1.3.Q"`` -> ``"L1H3.q"``)."""
    if node == "Resid Start":
        return "input"
    if node == "Resid End":
        return "logits"
    if node.startswith("MLP "):
        return f"MLP{node.split()[1]}"
    layer, head, *role = node[1:].split(".")
    return f"L{layer}H{head}" + (f".{role[0].lower()}" if role else "")


def auto_circuit_eap(model, clean, corrupted, *, syed: bool = False, ac: types.SimpleNamespace | None = None
                     ) -> dict[str, float]:
    """auto-circuit's edge attribution of ``model`` (a plain 3.x ``HookedTransformer``, changed in
    place: auto-circuit wraps its hook points) on ``clean`` and ``corrupted``
    (:class:`~circuitfade.tasks.Batch` es with one answer position per example, the last), the
    logit difference of the clean and the corrupted answer: ``{circuitfade edge name: score}``.
    ``syed``: its edge-attribution-patching replication instead of the mask gradient (the same
    numbers); ``ac``: an :func:`import_auto_circuit` result to reuse."""
    ac = ac or import_auto_circuit()
    pos = clean.answer_mask.nonzero()[:, 1]
    last = clean.tokens.shape[1] - 1
    if len(pos) != len(clean) or not bool((pos == last).all()):
        raise ValueError("auto_circuit_eap: one answer position per example, the last (auto-circuit reads the "
                         "last position's logits)")
    for flag in ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in"):
        setattr(model.cfg, flag, True)
    model.setup()
    model.eval()
    data = ac.PromptDataset(clean.tokens, corrupted.tokens, [t[None] for t in clean.targets[:, last]],
                            [t[None] for t in corrupted.targets[:, last]])
    loader = ac.PromptDataLoader(data, seq_len=None, diverge_idx=0, batch_size=len(clean), shuffle=False)
    patchable = ac.patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                                   device=torch.device("cpu"))
    if syed:
        scores = ac.syed(patchable, loader, None)
    else:
        scores = ac.mask_gradient(patchable, loader, None, grad_function="logit", answer_function="avg_diff",
                                  mask_val=0.0)
    return {f"{auto_circuit_node_name(e.src.name)}->{auto_circuit_node_name(e.dest.name)}":
            float(scores[e.dest.module_name][e.patch_idx]) for e in patchable.edges}
