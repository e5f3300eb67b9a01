"""The paper's gate training paths: a gate is *learned*, *fixed* or *scheduled* (a schedule of the step).

``unforced`` learned; ``forced_zero``, ``forced_const0.5`` fixed; ``linear0.5->0`` 0.5 at step 0 to 0 at the
last step; ``fade600->0[:cosine|convex|concave]`` 0.5 until 600, to 0 over 450 steps; ``twostep600->0`` 0.5,
0.25 from 600, 0 from 1050; ``switch@1050``; ``posthoc2550``: the final ``unforced`` checkpoint + 2550 steps
at 0.  :data:`PATHS`, the path grammar, adds these forms and ``hard_switch@<t>`` to the schedule forms.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuitfade.gating.schedules import (DEFAULT_TOTAL_STEPS, SCHEDULES, Constant, Form, Grammar, Schedule, Switch,
                                          as_step, format_schedule, schedule_context)
from circuitfade.model.files import GATE_MODES

__all__ = ["DEFAULT_POSTHOC_STEPS", "GATE_MODES", "PAPER_PATHS", "NAMED_PATHS", "PATHS", "GatePath", "parse_path",
           "gate_path_names"]

DEFAULT_POSTHOC_STEPS = 2550  # steps at g = 0 after the final ``unforced`` checkpoint
PAPER_PATHS: tuple[str, ...] = ("fade600->0", "linear0.5->0", "forced_const0.5", "unforced", "forced_zero")  # main
NAMED_PATHS: tuple[str, ...] = PAPER_PATHS + (
    "fade600->0:cosine", "fade600->0:convex", "fade600->0:concave", "twostep600->0", "switch@1050", "switch@600",
    "posthoc2550",
)  # every path of the paper, by canonical name


@dataclass(frozen=True)
class GatePath:
    """How the gates are driven: ``learned`` (trained), ``fixed`` (``g = value``) or ``scheduled`` (``g =
    schedule(step)``), in ``[0, 1]``.  ``continue_from`` / ``extra_steps`` (both set or both ``None``): train
    ``extra_steps >= 1`` more steps from the final checkpoint of path ``continue_from`` (steps count from there).
    """

    name: str
    mode: str
    schedule: Schedule | None = None
    value: float | None = None
    continue_from: str | None = None
    extra_steps: int | None = None

    def __post_init__(self) -> None:
        m, sched, val, cont = self.mode, self.schedule, self.value, self.continue_from
        problems = {  # message: whether it applies; the first that applies is raised
            f"GatePath.name must be a non-empty string, got {self.name!r}":
                not (isinstance(self.name, str) and self.name),
            f"GatePath.mode must be one of {', '.join(GATE_MODES)}, got {m!r}": m not in GATE_MODES,
            "a learned GatePath expects schedule=None and value=None": m == "learned" and (sched, val) != (None, None),
            "a fixed GatePath expects schedule=None (use mode='scheduled')": m == "fixed" and sched is not None,
            "a fixed GatePath expects a value in [0, 1], got None": m == "fixed" and val is None,
            f"a scheduled GatePath expects a Schedule, got {type(sched).__name__}":
                m == "scheduled" and not isinstance(sched, Schedule),
            "a scheduled GatePath expects value=None": m == "scheduled" and val is not None,
            "GatePath expects continue_from and extra_steps both set or both None":
                (cont is None) != (self.extra_steps is None),
            f"GatePath.continue_from must be a non-empty path name, got {cont!r}":
                cont is not None and not (cont and isinstance(cont, str)),
        }
        if bad := [msg for msg, applies in problems.items() if applies]:
            raise ValueError(bad[0])
        if m == "fixed":
            object.__setattr__(self, "value", Constant(val).value)
        if self.gate is not None and not (0.0 <= min(r := self.gate.value_range()) and max(r) <= 1.0):
            raise ValueError(f"a gate must stay in [0, 1]; GatePath {self.gate.spec!r} spans [{r[0]}, {r[1]}]")
        if cont is not None:
            object.__setattr__(self, "extra_steps", as_step("GatePath.extra_steps", self.extra_steps, minimum=1))

    gate = property(lambda self: Constant(self.value) if self.mode == "fixed" else self.schedule,
                    doc="The prescribed gate as a schedule (a :class:`Constant` if fixed); ``None`` if learned.")
    is_learned = property(lambda self: self.mode == "learned")
    is_continuation = property(lambda self: self.continue_from is not None)

    def value_at(self, step: int) -> float:
        """Gate value at ``step``; ``ValueError`` for learned paths and for ``step < 0``."""
        if self.gate is None:
            raise ValueError(f"path {self.name!r} has learned gates; there is no prescribed value")
        return self.gate(step)


PATHS = Grammar("gate path", (
    Form("unforced", dict, {"mode": "learned"}),
    Form("forced_zero", dict, {"mode": "fixed", "value": 0.0}),
    Form("forced_const{value}", dict, {"mode": "fixed"}),
    Form("posthoc[{extra_steps}]", dict, {"mode": "fixed", "value": 0.0, "continue_from": "unforced",
                                         "extra_steps": DEFAULT_POSTHOC_STEPS}),
    Form("hard[_]switch[@]{at}", Switch),
    Form("hard[_]switch{before}->{after}@{at}", Switch),
) + SCHEDULES.forms, hint=f"Named paths: {', '.join(NAMED_PATHS)}; any schedule spec is a scheduled path; ")
# a row builds the keywords of a learned / fixed GatePath, or a schedule


def parse_path(spec: str, total_steps: int = DEFAULT_TOTAL_STEPS) -> GatePath:
    """:class:`GatePath` of a path spec (forms: :data:`PATHS`; ``posthoc`` alone is ``posthoc2550``).

    ``name`` is canonical (``posthoc2550``, ``switch@1050``; ``linear0.5->0`` when the ramp spans
    ``0..total_steps``): ``parse_path(p.name, total_steps) == p``.  Bad specs raise ``ValueError``.
    """

    def as_path(obj, form: Form, params: dict) -> GatePath:
        if isinstance(obj, Schedule):
            return GatePath(format_schedule(obj, total_steps), "scheduled", obj)
        return GatePath(form.render(params.get, {}), **obj)

    return PATHS.parse(spec, as_path, **schedule_context(total_steps))


def gate_path_names() -> tuple[str, ...]:
    """Canonical names of every path of the paper (:data:`NAMED_PATHS`)."""
    return NAMED_PATHS
