"""Analyses of trained models: pure functions returning tensors or tidy DataFrames (main paper
Sections 6 and 9).

One argument convention: a model-level analysis is ``f(model, batch, [task,] *, options)``,
the order :func:`~circuitfade.store.trace` passes a metric's inputs. ``batch`` is the data the
model runs on: a :class:`~circuitfade.tasks.Batch` (the screens, spectra and patching also take
plain token ids ``[batch, pos]``; :func:`evaluate` and :func:`gate_intervention_table` also take
a task, whose evaluation set is used); ``task`` scores it where a loss or accuracy is needed.
Options are keywords. Exceptions by nature: weight-only analyses (``weight_pr(model)``),
analyses that build their own inputs (``capability_selectivity(model, *, ...)``), two-model
patching (``patch_resid(source_model, target_model, batch, ...)``) and the edge analyses, which
take a clean and a corrupted batch (``edge_scores(model, clean, corrupted, ...)``).

* :mod:`~circuitfade.analysis.gates` - evaluation under gate conditions and the gate
  intervention table (Section 6, Figure 4);
* :mod:`~circuitfade.analysis.heads` - per-head successor-value mass and mean-ablation
  importance, for any TransformerLens ``HookedTransformer`` (Section 9);
* :mod:`~circuitfade.analysis.timeline` - threshold crossings of traced head metrics
  over a checkpoint series (Table 3);
* :mod:`~circuitfade.analysis.screens` - induction / previous-token / BOS-attractor
  screens with capability selectivity;
* :mod:`~circuitfade.analysis.attention` - attention patterns of one sequence across a
  checkpoint series (:mod:`circuitfade.viz.attention` draws them);
* :mod:`~circuitfade.analysis.spectra` - participation ratio of head outputs and weights;
* :mod:`~circuitfade.analysis.patching` - residual-stream activation patching and
  mean replacement between two models;
* :mod:`~circuitfade.analysis.edges` - edge attribution (EAP, EAP-IG) with intervals, exact
  edge patching, faithfulness and the circuit timeline across checkpoints;
* :mod:`~circuitfade.analysis.fdt` - the fluctuation-dissipation statistic of SGD at
  stationarity (:func:`fdt_statistic`).
"""

from circuitfade.analysis.edges import circuit_timeline, edge_attribution, edge_scores, faithfulness_curve, patch_edges
from circuitfade.analysis.fdt import FDTRecorder, equipartition, fdt_statistic
from circuitfade.analysis.gates import evaluate, gate_intervention_table
from circuitfade.analysis.heads import head_diagnostics, mean_ablation_importance, successor_mass
from circuitfade.analysis.patching import mean_replacement, patch_resid, patched_logits
from circuitfade.analysis.screens import bos_score, capability_selectivity, classify_heads, induction_score, previous_token_score
from circuitfade.analysis.spectra import head_output_pr, participation_ratio, weight_pr
from circuitfade.analysis.timeline import consolidation_timeline, top_heads
from circuitfade.compat import deprecated_names


__all__ = [
    # evaluation under gate conditions (Section 6)
    "evaluate",
    "gate_intervention_table",
    # per-head diagnostics and their timeline (Section 9)
    "head_diagnostics",
    "successor_mass",
    "mean_ablation_importance",
    "consolidation_timeline",
    "top_heads",
    # circuits
    "edge_attribution",
    "edge_scores",
    "patch_edges",
    "faithfulness_curve",
    "circuit_timeline",
    # screens and spectra
    "induction_score",
    "previous_token_score",
    "bos_score",
    "capability_selectivity",
    "classify_heads",
    "participation_ratio",
    "head_output_pr",
    "weight_pr",
    # patching
    "patched_logits",
    "patch_resid",
    "mean_replacement",
    # the fluctuation-dissipation statistic
    "FDTRecorder",
    "fdt_statistic",
    "equipartition",
]

__getattr__ = deprecated_names(__name__, {
    "successor_value_mass": ("circuitfade.analysis", "successor_mass"),
    "condition_metrics": ("circuitfade.analysis.gates", "condition_metrics", "circuitfade.analysis.evaluate"),
    "NoGatesError": ("circuitfade.gating", "NoGatesError"),
    "head_label": ("circuitfade.store", "head_label"),
    "per_head_frame": ("circuitfade.store", "per_head_frame"),
    "SCREEN_THRESHOLDS": ("circuitfade.analysis.screens", "DEFAULT_THRESHOLDS"),
})
"""Names of the previous release (a ``DeprecationWarning`` names the replacement)."""
