"""Gates over time and at evaluation: step schedules, the paper's gate paths, and
the named evaluation conditions (``normal``, ``zero``, ``param``, ``half``).

Layer 2: imports :mod:`circuitfade.tasks` (for evaluation batches) and nothing higher.
"""

from circuitfade.gating.evaluation import (
    CONDITIONS,
    NoGatesError,
    evaluate_batch,
    evaluate_conditions,
    gate_condition,
    has_gates,
)
from circuitfade.gating.paths import GatePath, parse_path
from circuitfade.gating.schedules import parse_schedule

__all__ = [
    "CONDITIONS", "NoGatesError", "evaluate_batch", "evaluate_conditions", "gate_condition", "has_gates",
    "GatePath", "parse_path", "parse_schedule",
]
