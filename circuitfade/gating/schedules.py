"""Step schedules for gates and data mixes.

Every attention head carries gated biases whose gate ``g(t)`` lies in ``[0, 1]``.
A gate is either *learned* (``g = sigmoid(logit)``), *fixed* (a constant) or
*scheduled* (a pure function of the optimisation step).  This module holds the
schedule machinery (also used for data-mix probabilities such as ``p_ICL``).
The paper's named gate training paths live in :mod:`circuitfade.gating.paths`.

Schedules are small frozen dataclasses (hashable, comparable) and callables
``step -> float``.  Each has a compact :attr:`Schedule.spec` string that
:func:`parse_schedule` maps back to an equal object.

This module sits at the bottom of the package's dependency graph: it imports
nothing else from :mod:`circuitfade`.
"""

from __future__ import annotations

import abc
import bisect
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TOTAL_STEPS",
    "DEFAULT_FADE_START",
    "DEFAULT_FADE_WIDTH",
    "FADE_SHAPES",
    "TRIANGULAR_DIRECTIONS",
    "SCHEDULE_FORMS",
    "Schedule",
    "Constant",
    "Linear",
    "Fade",
    "Switch",
    "TwoStep",
    "Piecewise",
    "triangular",
    "fade_shape_variants",
    "parse_schedule",
    "as_schedule",
]

DEFAULT_TOTAL_STEPS = 3600
"""Total training budget of one path in the paper (steps)."""

DEFAULT_FADE_START = 600
"""Step at which the paper's fades start."""

DEFAULT_FADE_WIDTH = 450
"""Number of steps over which the paper's fades go from start to end."""

_DEFAULT_START = 0.5
_DEFAULT_END = 0.0

FADE_SHAPES: tuple[str, ...] = ("linear", "cosine", "convex", "concave")
"""Shapes accepted by :class:`Fade` (see :func:`_shape_progress`)."""

TRIANGULAR_DIRECTIONS: tuple[str, ...] = ("up_first", "down_first")
"""Directions accepted by :func:`triangular`."""

SCHEDULE_FORMS: tuple[str, ...] = (
    "const<v> | constant<v> | <v>",
    "linear<a>-><b>  (from step 0 to total_steps)",
    "linear<a>-><b>@<t0>:<t1>",
    "fade<t>[+<w>]-><b>[:<shape>]  (start 0.5, width 450 by default)",
    "fade<a>-><b>@<t>[+<w>][:<shape>]",
    "switch@<t>  (0.5 -> 0)",
    "switch<a>-><b>@<t>",
    "twostep<t>[+<w>]-><b>  (start 0.5, width 450 by default)",
    "twostep<a>-><b>@<t>[+<w>]",
    "pw(<s0>:<v0>,<s1>:<v1>,...) | piecewise(...)",
)
"""Human-readable list of the spec forms accepted by :func:`parse_schedule`."""


# --------------------------------------------------------------------------- #
# validation / formatting helpers
# --------------------------------------------------------------------------- #


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _as_value(name: str, x: Any) -> float:
    """Coerce ``x`` to a finite float or raise ``ValueError``."""
    if not _is_real(x):
        raise ValueError(f"{name} must be a finite real number, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite real number, got {x!r}")
    return v


def _as_step(name: str, x: Any, minimum: int = 0) -> int:
    """Coerce ``x`` to an ``int >= minimum`` (integral floats accepted)."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        v = int(x)
    elif _is_real(x) and math.isfinite(float(x)) and float(x).is_integer():
        v = int(float(x))
    else:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v}")
    return v


def _as_knot_step(name: str, x: Any) -> int | float:
    """Coerce a knot position to a real ``>= 0``: ``int`` if integral else ``float``."""
    v = _as_value(name, x)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {x!r}")
    return int(v) if v.is_integer() else v


def _check_step(step: Any) -> float:
    """Validate a step passed to a schedule; returns it as a float."""
    if not _is_real(step):
        raise TypeError(f"step must be a non-negative integer, got {step!r}")
    s = float(step)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return s


def _fmt(x: float) -> str:
    """Shortest string that ``float()`` maps back to ``x`` (``0.5``, ``0``, ``1e-05``)."""
    v = float(x)
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


# --------------------------------------------------------------------------- #
# schedules
# --------------------------------------------------------------------------- #


class Schedule(abc.ABC):
    """A pure function ``step -> float`` for steps ``>= 0``.

    Subclasses implement :meth:`_value` (the formula, called with a validated
    step as a float), :attr:`spec` (a compact string that
    :func:`parse_schedule` maps back to an equal object) and
    :meth:`value_range` (the closed interval of values the schedule takes).
    """

    __slots__ = ()

    def __call__(self, step: int) -> float:
        """Value at ``step``; raises ``ValueError`` for ``step < 0``."""
        return float(self._value(_check_step(step)))

    @abc.abstractmethod
    def _value(self, step: float) -> float:
        """The formula, for an already validated ``step >= 0``."""

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """Compact spec string; ``parse_schedule(self.spec) == self``."""

    @abc.abstractmethod
    def value_range(self) -> tuple[float, float]:
        """``(min, max)`` of the values over all steps ``>= 0`` (may be loose for knots < 0)."""

    def values(self, steps: int | Iterable[int]) -> np.ndarray:
        """Values at ``steps`` as a float64 array; an int ``n`` means ``range(n)``."""
        if isinstance(steps, numbers.Integral) and not isinstance(steps, bool):
            steps = range(int(steps))
        return np.asarray([self(s) for s in steps], dtype=np.float64)

    def __str__(self) -> str:
        return self.spec


@dataclass(frozen=True)
class Constant(Schedule):
    """``value`` at every step.  Spec: ``const<value>``."""

    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _as_value("Constant.value", self.value))

    def _value(self, step: float) -> float:
        return self.value

    @property
    def spec(self) -> str:
        return f"const{_fmt(self.value)}"

    def value_range(self) -> tuple[float, float]:
        return (self.value, self.value)


@dataclass(frozen=True)
class Linear(Schedule):
    """Linear ramp between two steps.

    ``v(t) = start`` for ``t <= t0``; ``end`` for ``t >= t1``; otherwise
    ``start + (end - start) * (t - t0) / (t1 - t0)``.  Requires ``0 <= t0 < t1``.
    Spec: ``linear<start>-><end>@<t0>:<t1>``.
    """

    start: float
    end: float
    t0: int
    t1: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _as_value("Linear.start", self.start))
        object.__setattr__(self, "end", _as_value("Linear.end", self.end))
        t0 = _as_step("Linear.t0", self.t0)
        t1 = _as_step("Linear.t1", self.t1)
        if t1 <= t0:
            raise ValueError(f"Linear needs t0 < t1, got t0={t0}, t1={t1}")
        object.__setattr__(self, "t0", t0)
        object.__setattr__(self, "t1", t1)

    def _value(self, step: float) -> float:
        if step <= self.t0:
            return self.start
        if step >= self.t1:
            return self.end
        return self.start + (self.end - self.start) * (step - self.t0) / (self.t1 - self.t0)

    @property
    def spec(self) -> str:
        return f"linear{_fmt(self.start)}->{_fmt(self.end)}@{self.t0}:{self.t1}"

    def value_range(self) -> tuple[float, float]:
        return (min(self.start, self.end), max(self.start, self.end))


def _shape_progress(shape: str, u: float) -> float:
    """Eased progress ``s(u)`` for ``u in [0, 1]``; ``s(0) = 0``, ``s(1) = 1``.

    * ``linear``:  ``s(u) = u``
    * ``cosine``:  ``s(u) = (1 - cos(pi * u)) / 2``
    * ``convex``:  ``s(u) = 1 - (1 - u)**2`` (fast early, slow late)
    * ``concave``: ``s(u) = u**2`` (slow early, fast late)
    """
    if shape == "linear":
        return u
    if shape == "cosine":
        return (1.0 - math.cos(math.pi * u)) / 2.0
    if shape == "convex":
        return 1.0 - (1.0 - u) ** 2
    if shape == "concave":
        return u * u
    raise ValueError(f"unknown fade shape {shape!r}; expected one of {', '.join(FADE_SHAPES)}")


@dataclass(frozen=True)
class Fade(Schedule):
    """Hold, fade, hold.

    With ``u = (t - fade_start) / width``:

    * ``v(t) = start`` for ``t <= fade_start``;
    * ``v(t) = start + (end - start) * s(u)`` for ``fade_start < t < fade_start + width``;
    * ``v(t) = end`` (exactly) for ``t >= fade_start + width``.

    The shape ``s`` is one of :data:`FADE_SHAPES`:

    * ``linear``:  ``s(u) = u``;
    * ``cosine``:  ``s(u) = (1 - cos(pi u)) / 2`` (slow at both ends);
    * ``convex``:  ``s(u) = 1 - (1 - u)^2`` -- for a *decreasing* fade
      (``end < start``) the value curve is convex in ``u``: it drops fast early
      and flattens towards ``end``;
    * ``concave``: ``s(u) = u^2`` -- for a decreasing fade the value curve is
      concave: it stays near ``start`` early and drops fast late.

    (For an increasing fade the same ``s`` is used, so the curvature names
    refer to the decreasing case.)  Requires ``fade_start >= 0`` and
    ``width >= 1``.  Spec: ``fade<fade_start>[+<width>]-><end>[:<shape>]`` when
    ``start == 0.5``, else ``fade<start>-><end>@<fade_start>[+<width>][:<shape>]``;
    ``+<width>`` is omitted for 450 and ``:<shape>`` for linear.
    """

    start: float = _DEFAULT_START
    end: float = _DEFAULT_END
    fade_start: int = DEFAULT_FADE_START
    width: int = DEFAULT_FADE_WIDTH
    shape: str = "linear"

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _as_value("Fade.start", self.start))
        object.__setattr__(self, "end", _as_value("Fade.end", self.end))
        object.__setattr__(self, "fade_start", _as_step("Fade.fade_start", self.fade_start))
        object.__setattr__(self, "width", _as_step("Fade.width", self.width, minimum=1))
        shape = self.shape.strip().lower() if isinstance(self.shape, str) else self.shape
        if shape not in FADE_SHAPES:
            hint = " (for a two-step schedule use TwoStep / 'twostep<t>-><b>')" if shape == "twostep" else ""
            raise ValueError(
                f"unknown fade shape {self.shape!r}; expected one of {', '.join(FADE_SHAPES)}{hint}"
            )
        object.__setattr__(self, "shape", shape)

    @property
    def fade_end(self) -> int:
        """First step at which the value is exactly ``end`` (``fade_start + width``)."""
        return self.fade_start + self.width

    def _value(self, step: float) -> float:
        if step <= self.fade_start:
            return self.start
        if step >= self.fade_end:
            return self.end
        u = (step - self.fade_start) / self.width
        return self.start + (self.end - self.start) * _shape_progress(self.shape, u)

    @property
    def spec(self) -> str:
        width = "" if self.width == DEFAULT_FADE_WIDTH else f"+{self.width}"
        shape = "" if self.shape == "linear" else f":{self.shape}"
        if self.start == _DEFAULT_START:
            return f"fade{self.fade_start}{width}->{_fmt(self.end)}{shape}"
        return f"fade{_fmt(self.start)}->{_fmt(self.end)}@{self.fade_start}{width}{shape}"

    def value_range(self) -> tuple[float, float]:
        return (min(self.start, self.end), max(self.start, self.end))


@dataclass(frozen=True)
class Switch(Schedule):
    """Hard switch: ``v(t) = before`` for ``t < at``, ``after`` for ``t >= at``.

    Requires ``at >= 0``.  Spec: ``switch@<at>`` when ``before == 0.5`` and
    ``after == 0``, else ``switch<before>-><after>@<at>``.
    """

    before: float = _DEFAULT_START
    after: float = _DEFAULT_END
    at: int = DEFAULT_FADE_START + DEFAULT_FADE_WIDTH

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", _as_value("Switch.before", self.before))
        object.__setattr__(self, "after", _as_value("Switch.after", self.after))
        object.__setattr__(self, "at", _as_step("Switch.at", self.at))

    def _value(self, step: float) -> float:
        return self.before if step < self.at else self.after

    @property
    def spec(self) -> str:
        if self.before == _DEFAULT_START and self.after == _DEFAULT_END:
            return f"switch@{self.at}"
        return f"switch{_fmt(self.before)}->{_fmt(self.after)}@{self.at}"

    def value_range(self) -> tuple[float, float]:
        if self.at == 0:
            return (self.after, self.after)
        return (min(self.before, self.after), max(self.before, self.after))


@dataclass(frozen=True)
class TwoStep(Schedule):
    """Two hard steps through the midpoint.

    ``v(t) = start`` for ``t < fade_start``; ``(start + end) / 2`` for
    ``fade_start <= t < fade_start + width``; ``end`` for ``t >= fade_start + width``.
    Requires ``fade_start >= 0`` and ``width >= 1``.  Spec:
    ``twostep<fade_start>[+<width>]-><end>`` when ``start == 0.5``, else
    ``twostep<start>-><end>@<fade_start>[+<width>]`` (``+<width>`` omitted for 450).
    """

    start: float = _DEFAULT_START
    end: float = _DEFAULT_END
    fade_start: int = DEFAULT_FADE_START
    width: int = DEFAULT_FADE_WIDTH

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _as_value("TwoStep.start", self.start))
        object.__setattr__(self, "end", _as_value("TwoStep.end", self.end))
        object.__setattr__(self, "fade_start", _as_step("TwoStep.fade_start", self.fade_start))
        object.__setattr__(self, "width", _as_step("TwoStep.width", self.width, minimum=1))

    @property
    def midpoint(self) -> float:
        """``(start + end) / 2``."""
        return (self.start + self.end) / 2.0

    @property
    def fade_end(self) -> int:
        """First step at which the value is ``end`` (``fade_start + width``)."""
        return self.fade_start + self.width

    def _value(self, step: float) -> float:
        if step < self.fade_start:
            return self.start
        if step < self.fade_end:
            return self.midpoint
        return self.end

    @property
    def spec(self) -> str:
        width = "" if self.width == DEFAULT_FADE_WIDTH else f"+{self.width}"
        if self.start == _DEFAULT_START:
            return f"twostep{self.fade_start}{width}->{_fmt(self.end)}"
        return f"twostep{_fmt(self.start)}->{_fmt(self.end)}@{self.fade_start}{width}"

    def value_range(self) -> tuple[float, float]:
        return (min(self.start, self.end), max(self.start, self.end))


@dataclass(frozen=True)
class Piecewise(Schedule):
    """Piecewise-linear interpolation through knots ``(s_i, v_i)``.

    Knot steps must be ``>= 0`` and strictly increasing (they may be
    non-integral).  ``v(t) = v_0`` for ``t <= s_0``; ``v_last`` for
    ``t >= s_last``; for ``s_i <= t < s_{i+1}``:
    ``v(t) = v_i + (v_{i+1} - v_i) * (t - s_i) / (s_{i+1} - s_i)``.
    ``points`` may be any iterable of pairs or a mapping ``step -> value``; it is
    stored as a tuple of ``(step, value)`` tuples.
    Spec: ``pw(<s0>:<v0>,<s1>:<v1>,...)``.
    """

    points: tuple[tuple[int | float, float], ...]

    def __post_init__(self) -> None:
        raw = self.points
        if isinstance(raw, Mapping):
            raw = list(raw.items())
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
            raise ValueError(f"Piecewise.points must be an iterable of (step, value) pairs, got {raw!r}")
        pts: list[tuple[int | float, float]] = []
        for i, p in enumerate(raw):
            try:
                s, v = p
            except (TypeError, ValueError):
                raise ValueError(
                    f"Piecewise.points[{i}] must be a (step, value) pair, got {p!r}"
                ) from None
            pts.append((_as_knot_step(f"Piecewise.points[{i}] step", s), _as_value(f"Piecewise.points[{i}] value", v)))
        if not pts:
            raise ValueError("Piecewise needs at least one (step, value) knot")
        for (s0, _), (s1, _) in zip(pts, pts[1:]):
            if not s1 > s0:
                raise ValueError(
                    f"Piecewise knot steps must be strictly increasing, got {s0} then {s1}"
                )
        object.__setattr__(self, "points", tuple(pts))

    @property
    def steps(self) -> tuple[int | float, ...]:
        return tuple(s for s, _ in self.points)

    def _value(self, step: float) -> float:
        pts = self.points
        if step <= pts[0][0]:
            return pts[0][1]
        if step >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right(self.steps, step) - 1
        (s0, v0), (s1, v1) = pts[i], pts[i + 1]
        if step == s0:
            return v0
        return v0 + (v1 - v0) * (step - s0) / (s1 - s0)

    @property
    def spec(self) -> str:
        return "pw(" + ",".join(f"{_fmt(s)}:{_fmt(v)}" for s, v in self.points) + ")"

    def value_range(self) -> tuple[float, float]:
        vals = [v for _, v in self.points]
        return (min(vals), max(vals))


def triangular(
    p0: float,
    delta: float,
    period: int,
    direction: str = "up_first",
    start: int = 0,
) -> Piecewise:
    """Triangular excursion around ``p0`` as a :class:`Piecewise`.

    Knots at ``start + (0, period/4, 3*period/4, period)`` with values

    * ``up_first``:   ``p0, p0 + delta, p0 - delta, p0``;
    * ``down_first``: ``p0, p0 - delta, p0 + delta, p0``;

    so every segment has slope ``+-4 * delta / period``.  The value is ``p0``
    before ``start`` and after ``start + period``.  Requires ``delta >= 0``,
    ``period >= 1`` and ``start >= 0``.  Example: ``triangular(0.5, 0.1, 400)``
    is the data-mix schedule 0.5 -> 0.6 -> 0.4 -> 0.5.
    """
    p0 = _as_value("triangular p0", p0)
    delta = _as_value("triangular delta", delta)
    if delta < 0:
        raise ValueError(
            f"triangular delta must be >= 0 (use direction='down_first' to go down first), got {delta}"
        )
    period = _as_step("triangular period", period, minimum=1)
    start = _as_step("triangular start", start)
    if direction not in TRIANGULAR_DIRECTIONS:
        raise ValueError(
            f"unknown triangular direction {direction!r}; expected one of {', '.join(TRIANGULAR_DIRECTIONS)}"
        )
    sign = 1.0 if direction == "up_first" else -1.0
    return Piecewise(
        (
            (start, p0),
            (start + period / 4, p0 + sign * delta),
            (start + 3 * period / 4, p0 - sign * delta),
            (start + period, p0),
        )
    )


def fade_shape_variants(
    start: float = _DEFAULT_START,
    end: float = _DEFAULT_END,
    fade_start: int = DEFAULT_FADE_START,
    width: int = DEFAULT_FADE_WIDTH,
) -> dict[str, Schedule]:
    """The paper's fade-shape sweep: one :class:`Fade` per shape plus a :class:`TwoStep`.

    Keys: ``linear``, ``cosine``, ``convex``, ``concave``, ``twostep``.
    """
    out: dict[str, Schedule] = {s: Fade(start, end, fade_start, width, s) for s in FADE_SHAPES}
    out["twostep"] = TwoStep(start, end, fade_start, width)
    return out


# --------------------------------------------------------------------------- #
# parsing
# --------------------------------------------------------------------------- #

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_INT = r"[+-]?\d+"
_SHAPE = r"(?::(?P<shape>[a-z_]+))?"

_RE_CONST = re.compile(rf"(?:const|constant)?(?P<v>{_NUM})")
_RE_LINEAR = re.compile(rf"linear(?P<a>{_NUM})->(?P<b>{_NUM})(?:@(?P<t0>{_INT}):(?P<t1>{_INT}))?")
_RE_FADE_SHORT = re.compile(rf"fade(?P<t>{_INT})(?:\+(?P<w>{_INT}))?->(?P<b>{_NUM}){_SHAPE}")
_RE_FADE_LONG = re.compile(rf"fade(?P<a>{_NUM})->(?P<b>{_NUM})@(?P<t>{_INT})(?:\+(?P<w>{_INT}))?{_SHAPE}")
_RE_SWITCH_SHORT = re.compile(rf"switch@(?P<t>{_INT})")
_RE_SWITCH_LONG = re.compile(rf"switch(?P<a>{_NUM})->(?P<b>{_NUM})@(?P<t>{_INT})")
_RE_TWOSTEP_SHORT = re.compile(rf"twostep(?P<t>{_INT})(?:\+(?P<w>{_INT}))?->(?P<b>{_NUM})")
_RE_TWOSTEP_LONG = re.compile(rf"twostep(?P<a>{_NUM})->(?P<b>{_NUM})@(?P<t>{_INT})(?:\+(?P<w>{_INT}))?")
_RE_PW = re.compile(r"(?:pw|piecewise)\((?P<body>.*)\)")
_RE_KNOT = re.compile(rf"(?P<s>{_NUM}):(?P<v>{_NUM})")


def _normalize(spec: Any, what: str) -> str:
    if not isinstance(spec, str):
        raise TypeError(f"{what} must be a string, got {type(spec).__name__}")
    return re.sub(r"\s+", "", spec).lower()


def _schedule_error(spec: str, reason: str | None = None) -> ValueError:
    why = f": {reason}" if reason else ""
    return ValueError(
        f"invalid schedule spec {spec!r}{why}; accepted forms: " + "; ".join(SCHEDULE_FORMS)
    )


def _width(m: re.Match[str]) -> int:
    return int(m["w"]) if m["w"] is not None else DEFAULT_FADE_WIDTH


def _shape(m: re.Match[str]) -> str:
    return m["shape"] if m["shape"] is not None else "linear"


def _build_schedule(s: str, total_steps: int) -> Schedule | None:
    """Return the schedule for normalized spec ``s``, or ``None`` if no form matches."""
    if m := _RE_CONST.fullmatch(s):
        return Constant(float(m["v"]))
    if m := _RE_LINEAR.fullmatch(s):
        t0 = int(m["t0"]) if m["t0"] is not None else 0
        t1 = int(m["t1"]) if m["t1"] is not None else total_steps
        return Linear(float(m["a"]), float(m["b"]), t0, t1)
    if m := _RE_FADE_SHORT.fullmatch(s):
        return Fade(_DEFAULT_START, float(m["b"]), int(m["t"]), _width(m), _shape(m))
    if m := _RE_FADE_LONG.fullmatch(s):
        return Fade(float(m["a"]), float(m["b"]), int(m["t"]), _width(m), _shape(m))
    if m := _RE_SWITCH_SHORT.fullmatch(s):
        return Switch(_DEFAULT_START, _DEFAULT_END, int(m["t"]))
    if m := _RE_SWITCH_LONG.fullmatch(s):
        return Switch(float(m["a"]), float(m["b"]), int(m["t"]))
    if m := _RE_TWOSTEP_SHORT.fullmatch(s):
        return TwoStep(_DEFAULT_START, float(m["b"]), int(m["t"]), _width(m))
    if m := _RE_TWOSTEP_LONG.fullmatch(s):
        return TwoStep(float(m["a"]), float(m["b"]), int(m["t"]), _width(m))
    if m := _RE_PW.fullmatch(s):
        knots = []
        for part in m["body"].split(","):
            k = _RE_KNOT.fullmatch(part)
            if k is None:
                raise ValueError(f"knot {part!r} is not of the form <step>:<value>")
            knots.append((float(k["s"]), float(k["v"])))
        return Piecewise(tuple(knots))
    return None


def parse_schedule(spec: str, total_steps: int = DEFAULT_TOTAL_STEPS) -> Schedule:
    """Parse a compact schedule spec (whitespace ignored, case-insensitive).

    Accepted forms (``<a>``, ``<b>``, ``<v>`` numbers; ``<t>``, ``<w>`` steps):

    * ``const0.5``, ``constant0.5``, ``0.5`` -> ``Constant(0.5)``
    * ``linear0.5->0`` -> ``Linear(0.5, 0, 0, total_steps)``;
      ``linear0.5->0@100:900`` -> ``Linear(0.5, 0, 100, 900)``
    * ``fade600->0`` -> ``Fade(0.5, 0, 600, 450, "linear")``;
      ``fade600+300->0`` (width 300); ``fade600->0.1`` (end 0.1);
      ``fade600->0:cosine`` (shape); ``fade0.8->0@600+300:convex`` (start 0.8)
    * ``switch@1050`` -> ``Switch(0.5, 0, 1050)``; ``switch0.5->0@600``
    * ``twostep600->0`` -> ``TwoStep(0.5, 0, 600, 450)``; ``twostep600+300->0``;
      ``twostep0.8->0@600+300``
    * ``pw(0:0.5,100:0.6,300:0.4,400:0.5)`` -> ``Piecewise(...)`` (also ``piecewise(...)``)

    For every schedule ``x``, ``parse_schedule(x.spec) == x``.  Unknown or
    inconsistent specs raise ``ValueError`` listing the accepted forms.
    """
    s = _normalize(spec, "schedule spec")
    total_steps = _as_step("total_steps", total_steps, minimum=1)
    try:
        sched = _build_schedule(s, total_steps)
    except ValueError as err:
        raise _schedule_error(spec, str(err)) from None
    if sched is None:
        raise _schedule_error(spec)
    return sched


def as_schedule(obj: Schedule | str | float, total_steps: int = DEFAULT_TOTAL_STEPS) -> Schedule:
    """Schedule from a :class:`Schedule` (returned as is), a spec string, or a number (constant)."""
    if isinstance(obj, Schedule):
        return obj
    if isinstance(obj, str):
        return parse_schedule(obj, total_steps)
    if _is_real(obj):
        return Constant(obj)
    raise TypeError(f"expected a Schedule, a spec string or a number, got {type(obj).__name__}")
