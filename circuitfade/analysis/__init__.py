"""Analyses of trained models: pure functions ``f(model, batch_or_task, *, ...)`` returning
tensors or tidy DataFrames (main paper Sections 6 and 9).

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

from circuitfade.analysis.edges import (
    circuit_timeline,
    edge_attribution,
    edge_effects,
    edge_graph,
    edge_scores,
    faithfulness_curve,
    patch_edges,
)
from circuitfade.analysis.fdt import (FDTRecorder, displacement_statistic, equipartition, fdt_observation, fdt_statistic,
                                      grouped_observation)
from circuitfade.analysis.gates import (
    PRIOR_LABELS,
    NoGatesError,
    condition_metrics,
    describe_gates,
    evaluate,
    gate_intervention_table,
    intervention_conditions,
)
from circuitfade.analysis.heads import (
    ABLATION_IMPORTANCE,
    ABLATION_LOSS_INCREASE,
    SUCCESSOR_MASS,
    head_diagnostics,
    head_label,
    mean_ablation_importance,
    per_head_frame,
    successor_mass,
    successor_value_mass,
)
from circuitfade.analysis.patching import mean_replacement, patch_resid, patched_logits
from circuitfade.analysis.screens import (
    DEFAULT_THRESHOLDS as SCREEN_THRESHOLDS,
    bos_score,
    capability_selectivity,
    classify_heads,
    induction_score,
    previous_token_score,
)
from circuitfade.analysis.spectra import elevated_pr, head_output_pr, participation_ratio, weight_pr
from circuitfade.analysis.timeline import DEFAULT_THRESHOLDS, consolidation_timeline, timeline_long, top_heads

__all__ = [
    "circuit_timeline",
    "edge_attribution",
    "edge_effects",
    "edge_graph",
    "edge_scores",
    "faithfulness_curve",
    "patch_edges",
    "FDTRecorder",
    "displacement_statistic",
    "equipartition",
    "fdt_observation",
    "grouped_observation",
    "fdt_statistic",
    "ABLATION_IMPORTANCE",
    "ABLATION_LOSS_INCREASE",
    "DEFAULT_THRESHOLDS",
    "PRIOR_LABELS",
    "SUCCESSOR_MASS",
    "NoGatesError",
    "SCREEN_THRESHOLDS",
    "bos_score",
    "capability_selectivity",
    "classify_heads",
    "elevated_pr",
    "head_output_pr",
    "induction_score",
    "mean_replacement",
    "participation_ratio",
    "patch_resid",
    "patched_logits",
    "previous_token_score",
    "weight_pr",
    "condition_metrics",
    "consolidation_timeline",
    "describe_gates",
    "evaluate",
    "gate_intervention_table",
    "head_diagnostics",
    "head_label",
    "intervention_conditions",
    "mean_ablation_importance",
    "per_head_frame",
    "successor_mass",
    "successor_value_mass",
    "timeline_long",
    "top_heads",
]
