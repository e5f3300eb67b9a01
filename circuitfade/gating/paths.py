"""The paper's gate training paths.

Every attention head carries gated biases whose gate ``g(t)`` lies in ``[0, 1]``.
A gate is either *learned* (``g = sigmoid(logit)``), *fixed* (a constant) or
*scheduled* (a pure function of the optimisation step, a
:class:`~circuitfade.gating.schedules.Schedule`).  This module holds the named
training paths of the paper:

==========================  =====================================================
path                        gate
==========================  =====================================================
``unforced``                learned freely
``forced_zero``             0 throughout
``forced_const0.5``         0.5 throughout (any constant)
``linear0.5->0``            0.5 at step 0, linearly to 0 at ``total_steps``
``fade600->0``              0.5 until 600, linear fade to 0 over 450 steps
``fade600->0:<shape>``      same, with shape cosine / convex / concave
``twostep600->0``           0.5, then 0.25 from step 600, then 0 from step 1050
``switch@1050``             0.5 for steps < 1050, 0 from step 1050 on
``switch@600``              0.5 for steps < 600, 0 from step 600 on
``posthoc2550``             final ``unforced`` checkpoint + 2550 steps at g = 0
==========================  =====================================================

:func:`parse_path` maps a path spec to a :class:`GatePath`; any spec accepted by
:func:`circuitfade.gating.schedules.parse_schedule` is also a (scheduled) path.

This module builds on :mod:`circuitfade.gating.schedules` (which does not import it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from circuitfade.gating.schedules import (
    _INT,
    _NUM,
    DEFAULT_TOTAL_STEPS,
    SCHEDULE_FORMS,
    Linear,
    Schedule,
    _as_step,
    _as_value,
    _build_schedule,
    _check_step,
    _fmt,
    _normalize,
)

__all__ = [
    "DEFAULT_POSTHOC_STEPS",
    "GATE_MODES",
    "PAPER_PATHS",
    "NAMED_PATHS",
    "GatePath",
    "parse_path",
    "gate_path_names",
]

DEFAULT_POSTHOC_STEPS = 2550
"""Extra steps at g = 0 for the post hoc continuation of an ``unforced`` run."""

GATE_MODES: tuple[str, ...] = ("learned", "fixed", "scheduled")

PAPER_PATHS: tuple[str, ...] = (
    "fade600->0",
    "linear0.5->0",
    "forced_const0.5",
    "unforced",
    "forced_zero",
)
"""The five main training paths of the paper."""

NAMED_PATHS: tuple[str, ...] = PAPER_PATHS + (
    "fade600->0:cosine",
    "fade600->0:convex",
    "fade600->0:concave",
    "twostep600->0",
    "switch@1050",
    "switch@600",
    "posthoc2550",
)
"""Every path of the paper, by canonical name (main paths first)."""


@dataclass(frozen=True)
class GatePath:
    """How the gates are driven along one training path.

    * ``mode == "learned"``: gates are trained (``g = sigmoid(logit)``);
      ``schedule`` and ``value`` are ``None``.
    * ``mode == "fixed"``: ``g = value`` (in ``[0, 1]``); ``schedule`` is ``None``.
    * ``mode == "scheduled"``: ``g = schedule(step)``, whose values must lie in
      ``[0, 1]``; ``value`` is ``None``.

    ``continue_from`` / ``extra_steps`` (both set or both ``None``) describe a
    continuation: start from the final checkpoint of path ``continue_from`` and
    train ``extra_steps >= 1`` more steps; steps passed to :meth:`value_at` then
    count from the start of the continuation.
    """

    name: str
    mode: str
    schedule: Schedule | None
    value: float | None
    continue_from: str | None = None
    extra_steps: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"GatePath.name must be a non-empty string, got {self.name!r}")
        if self.mode not in GATE_MODES:
            raise ValueError(f"GatePath.mode must be one of {', '.join(GATE_MODES)}, got {self.mode!r}")
        if self.mode == "learned":
            if self.schedule is not None or self.value is not None:
                raise ValueError("a learned GatePath expects schedule=None and value=None")
        elif self.mode == "fixed":
            if self.schedule is not None:
                raise ValueError("a fixed GatePath expects schedule=None (use mode='scheduled')")
            if self.value is None:
                raise ValueError("a fixed GatePath expects a value in [0, 1], got None")
            v = _as_value("GatePath.value", self.value)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"GatePath.value must be in [0, 1], got {v}")
            object.__setattr__(self, "value", v)
        else:
            if not isinstance(self.schedule, Schedule):
                raise ValueError(
                    f"a scheduled GatePath expects a Schedule, got {type(self.schedule).__name__}"
                )
            if self.value is not None:
                raise ValueError("a scheduled GatePath expects value=None")
            lo, hi = self.schedule.value_range()
            if lo < 0.0 or hi > 1.0:
                raise ValueError(
                    f"a gate schedule must stay in [0, 1], {self.schedule.spec!r} spans [{lo}, {hi}]"
                )
        if (self.continue_from is None) != (self.extra_steps is None):
            raise ValueError("GatePath expects continue_from and extra_steps both set or both None")
        if self.continue_from is not None:
            if not isinstance(self.continue_from, str) or not self.continue_from:
                raise ValueError(
                    f"GatePath.continue_from must be a non-empty path name, got {self.continue_from!r}"
                )
            object.__setattr__(
                self, "extra_steps", _as_step("GatePath.extra_steps", self.extra_steps, minimum=1)
            )

    @property
    def is_learned(self) -> bool:
        return self.mode == "learned"

    @property
    def is_continuation(self) -> bool:
        return self.continue_from is not None

    def value_at(self, step: int) -> float:
        """Gate value at ``step`` for fixed / scheduled paths.

        Raises ``ValueError`` for learned paths (the gate is a parameter) and
        for ``step < 0``.
        """
        if self.mode == "learned":
            raise ValueError(f"path {self.name!r} has learned gates; there is no prescribed value")
        if self.mode == "fixed":
            _check_step(step)
            return float(self.value)  # type: ignore[arg-type]
        return self.schedule(step)  # type: ignore[misc]


_RE_FORCED_CONST = re.compile(rf"forced_const(?P<v>{_NUM})")
_RE_POSTHOC = re.compile(rf"posthoc(?P<n>{_INT})?")
_RE_HARD_SWITCH = re.compile(rf"hard_?switch@?(?P<t>{_INT})")


def _path_error(spec: str, reason: str | None = None) -> ValueError:
    why = f": {reason}" if reason else ""
    return ValueError(
        f"unknown gate path {spec!r}{why}. Named paths: {', '.join(NAMED_PATHS)} "
        "(aliases: hard_switch@<t>, hard_switch<t>, posthoc, forced_const<v>); "
        "any schedule spec is also accepted: " + "; ".join(SCHEDULE_FORMS)
    )


def _scheduled_name(sched: Schedule, total_steps: int) -> str:
    if isinstance(sched, Linear) and sched.t0 == 0 and sched.t1 == total_steps:
        return f"linear{_fmt(sched.start)}->{_fmt(sched.end)}"
    return sched.spec


def parse_path(spec: str, total_steps: int = DEFAULT_TOTAL_STEPS) -> GatePath:
    """Parse a training-path spec into a :class:`GatePath` (whitespace ignored, case-insensitive).

    * ``unforced`` -> learned gates;
    * ``forced_zero`` -> fixed 0; ``forced_const<v>`` -> fixed ``v``;
    * ``posthoc<n>`` -> continue the final ``unforced`` checkpoint for ``n``
      steps at fixed 0 (``posthoc`` alone: ``n = 2550``);
    * ``hard_switch@<t>`` / ``hard_switch<t>`` -> alias of ``switch@<t>``;
    * anything :func:`parse_schedule` accepts (``linear0.5->0``, ``fade600->0``,
      ``fade600->0:cosine``, ``switch@1050``, ``twostep600->0``, ``pw(...)``,
      ...) -> scheduled.

    The returned ``name`` is the normalized spec (``fade600->0``, ``switch@1050``,
    ``posthoc2550``, ``forced_const0.5``, ``linear0.5->0`` when the ramp spans
    ``0..total_steps``), so ``parse_path(p.name, total_steps) == p``.  Unknown
    specs raise ``ValueError`` listing the named paths.
    """
    s = _normalize(spec, "path spec")
    total_steps = _as_step("total_steps", total_steps, minimum=1)
    if s == "unforced":
        return GatePath("unforced", "learned", None, None)
    if s == "forced_zero":
        return GatePath("forced_zero", "fixed", None, 0.0)
    try:
        if m := _RE_FORCED_CONST.fullmatch(s):
            v = float(m["v"])
            return GatePath(f"forced_const{_fmt(v)}", "fixed", None, v)
        if m := _RE_POSTHOC.fullmatch(s):
            n = int(m["n"]) if m["n"] is not None else DEFAULT_POSTHOC_STEPS
            return GatePath(f"posthoc{n}", "fixed", None, 0.0, continue_from="unforced", extra_steps=n)
    except ValueError as err:
        raise _path_error(spec, str(err)) from None
    if m := _RE_HARD_SWITCH.fullmatch(s):
        s = f"switch@{m['t']}"
    elif s.startswith("hard_switch"):
        s = "switch" + s[len("hard_switch"):]
    try:
        sched = _build_schedule(s, total_steps)
        if sched is None:
            raise _path_error(spec)
        return GatePath(_scheduled_name(sched, total_steps), "scheduled", sched, None)
    except ValueError as err:
        if str(err).startswith("unknown gate path"):
            raise
        raise _path_error(spec, str(err)) from None


def gate_path_names() -> tuple[str, ...]:
    """Canonical names of every path of the paper (:data:`NAMED_PATHS`)."""
    return NAMED_PATHS
