"""The annealable soft-prior Transformer of the installed TransformerLens line.

Each attention head computes (main paper, Eq. 1)::

    S_ij = Q_i·K_j / √d_head + Σ_p g_p[h] · B^p_ij        (then causal mask, softmax)

with one gate ``g_p`` per layer, head and prior ``p`` (by default ``pos`` and
``content``, see :mod:`circuitfade.model.priors`). A gate's *mode* is one of

* ``learned``   - ``g = sigmoid(logit)``, the logit is trained;
* ``fixed``     - ``g`` is a constant buffer; the logit gets no gradient;
* ``scheduled`` - ``g`` is a buffer the trainer sets from a schedule each step;
  the logit gets no gradient.

Bias tables are always trainable. ``with model.gates(pos=0.0, content=0.0):``
overrides gates for evaluation (restored on exit, also after an exception);
``model.gate_hooks(...)`` gives the same intervention as hooks.

The hook points the priors add to every ``blocks.{l}.attn`` (``hook_pos_bias``,
``hook_gate_pos``, ``hook_prior``, ...; ``hook_attn_scores`` includes the prior) are
listed in :mod:`circuitfade.model.shell`.

When no hook is attached anywhere the model runs a *fused* path (one QKV matmul;
low-rank priors such as ``content`` folded into the query-key product as extra
columns, the others added with the causal mask); it computes the same function
(tested to 1e-5 on logits and gradients) and is what training uses.
``model.use_fused = False`` forces the hooked path. ``model(tokens,
positions=rows)`` computes the last block only at ``rows`` (the answer-position
path training and evaluation use; NaN logits elsewhere).

The computation is :mod:`circuitfade.model.core`; the classes here are its shell for
the installed line: a ``HookedTransformer`` subclass on TransformerLens 3.x
(:mod:`circuitfade.model.hooked`), a native ``HookedRootModule`` with the same
parameters, hooks and numerics on 4.x (:mod:`circuitfade.model.native`); what the two
share is written once in :mod:`circuitfade.model.shell`.
"""

from circuitfade.compat import is_tl4
from circuitfade.model.config import SoftPriorConfig
from circuitfade.model.core import check_gate_value
from circuitfade.model.files import GATE_MODES, LARGE_OVERRIDES

if is_tl4():
    from circuitfade.model.native import SoftPriorAttention, SoftPriorBlock, SoftPriorTransformer
else:
    from circuitfade.model.hooked import SoftPriorAttention, SoftPriorBlock, SoftPriorTransformer

__all__ = ["SoftPriorConfig", "SoftPriorTransformer", "SoftPriorAttention", "SoftPriorBlock", "GATE_MODES",
           "LARGE_OVERRIDES", "check_gate_value"]
