"""Gates over time and at evaluation: step schedules, the paper's gate paths, and
the named evaluation conditions (``normal``, ``zero``, ``param``, ``half``).

Layer 2: imports :mod:`circuitfade.tasks` (for evaluation batches) and nothing higher.

Evaluating a model under a condition is :func:`circuitfade.analysis.evaluate` (the one public
evaluation); :func:`~circuitfade.gating.evaluation.evaluate_batch` and
:func:`~circuitfade.gating.evaluation.evaluate_conditions` are the trainer's fast internal
forms of it (the ``acc_<condition>`` columns of ``metrics.csv``).
"""

from circuitfade.compat import deprecated_names
from circuitfade.gating.evaluation import CONDITIONS, NoGatesError, gate_condition, has_gates
from circuitfade.gating.paths import GatePath, parse_path
from circuitfade.gating.schedules import parse_schedule

__all__ = ["CONDITIONS", "NoGatesError", "gate_condition", "has_gates", "GatePath", "parse_path", "parse_schedule"]

__getattr__ = deprecated_names(__name__, {
    "evaluate_batch": ("circuitfade.gating.evaluation", "evaluate_batch", "circuitfade.analysis.evaluate"),
    "evaluate_conditions": ("circuitfade.gating.evaluation", "evaluate_conditions", "circuitfade.analysis.evaluate"),
})
"""Names of the previous release (a ``DeprecationWarning`` names the replacement)."""
