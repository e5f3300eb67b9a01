"""Step schedules (of a gate, or of a data-mix probability such as ``p_ICL``): one value type, one grammar.

A :class:`Schedule` is knots ``(s_i, v_i)`` (steps ``s_i >= 0`` strictly increasing) and an easing ``e``:
``v(t) = v_0`` for ``t < s_0``, ``v_i + (v_{i+1} - v_i) e(u)`` with ``u = (t - s_i) / (s_{i+1} - s_i)`` for
``s_i <= t < s_{i+1}``, ``v_last`` from ``s_last`` on.  The named schedules (:class:`Constant`,
:class:`Linear`, :class:`Fade`, :class:`Switch`, :class:`TwoStep`, :func:`triangular`) only build knots;
:data:`SCHEDULES`, one table, parses specs and writes :attr:`Schedule.spec`: ``parse_schedule(x.spec) == x``.
"""

from __future__ import annotations

import bisect
import inspect
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DEFAULT_TOTAL_STEPS", "DEFAULT_FADE_START", "DEFAULT_FADE_WIDTH", "EASINGS", "FADE_SHAPES",
           "TRIANGULAR_DIRECTIONS", "Schedule", "Constant", "Linear", "Fade", "Switch", "TwoStep", "Piecewise",
           "triangular", "fade_shape_variants", "Form", "Grammar", "SCHEDULES", "parse_schedule", "format_schedule",
           "schedule_context", "as_schedule", "as_real", "as_step"]

DEFAULT_TOTAL_STEPS = 3600  # steps of one path in the paper
DEFAULT_FADE_START, DEFAULT_FADE_WIDTH = 600, 450  # the paper's fades: 0.5 until 600, to 0 over 450 steps

EASINGS: dict[str, Callable[[float], float]] = {
    "linear": lambda u: u,
    "cosine": lambda u: (1.0 - math.cos(math.pi * u)) / 2.0,  # slow at both ends
    "convex": lambda u: 1.0 - (1.0 - u) ** 2,  # a decreasing fade drops fast early, flattens late
    "concave": lambda u: u * u,  # a decreasing fade stays near its start, drops fast late
    "step": lambda u: 0.0,  # hold v_i until s_{i+1}
    "twostep": lambda u: 0.5,  # the midpoint from s_i until s_{i+1}
}  # e(u) for u in [0, 1); each stays in [0, 1]
FADE_SHAPES: tuple[str, ...] = ("linear", "cosine", "convex", "concave")  # the easings a Fade accepts
TRIANGULAR_DIRECTIONS: tuple[str, ...] = ("up_first", "down_first")


def as_real(name: str, x: Any) -> float:
    """``x`` as a finite float, or ``ValueError`` naming ``name``."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite real number, got {x!r}")
    return float(x)


def as_step(name: str, x: Any, minimum: int = 0) -> int:
    """``x`` as an ``int >= minimum`` (integral floats accepted), or ``ValueError`` naming ``name``."""
    ok = isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))
    if not ok or not float(x).is_integer() or int(x) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    return int(x)


def _fmt(x: float) -> str:  # shortest string that float() maps back to x: 0.5, 0, 1e-05
    v = float(x)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


@dataclass(frozen=True)
class Schedule:
    """Knots ``(step, value)`` (pairs or a mapping) and an easing: ``step -> float``; kinds compare apart."""

    knots: tuple[tuple[int | float, float], ...]
    easing: str = "linear"

    def __post_init__(self) -> None:
        what, raw = type(self).__name__, self.knots
        raw = list(raw.items()) if isinstance(raw, Mapping) else raw
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
            raise ValueError(f"{what} knots must be an iterable of (step, value) pairs, got {raw!r}")
        knots = []
        for i, p in enumerate(raw):
            if not isinstance(p, Iterable) or len(p := tuple(p)) != 2 or (s := as_real(f"{what} step", p[0])) < 0:
                raise ValueError(f"{what} knot {i} must be a (step >= 0, value) pair, got {p!r}")
            knots.append((int(s) if s.is_integer() else s, as_real(f"{what} knot value", p[1])))
        if not knots:
            raise ValueError(f"{what} needs at least one (step, value) knot")
        if bad := [(a, b) for (a, _), (b, _) in zip(knots, knots[1:]) if not b > a]:
            raise ValueError(f"{what} knot steps must be strictly increasing, got {bad[0][0]} then {bad[0][1]}")
        if self.easing not in EASINGS:
            raise ValueError(f"unknown easing {self.easing!r}; expected one of {', '.join(EASINGS)}")
        object.__setattr__(self, "knots", tuple(knots))
        object.__setattr__(self, "easing", self.easing if len(knots) > 1 else "linear")

    def __call__(self, step: int) -> float:
        """Value at ``step``; ``TypeError`` / ``ValueError`` unless ``step`` is a real ``>= 0``."""
        if not isinstance(step, numbers.Real) or isinstance(step, bool):
            raise TypeError(f"step must be a non-negative integer, got {step!r}")
        if not math.isfinite(t := float(step)) or t < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        k, i = self.knots, bisect.bisect_right(self.steps, t) - 1
        if i < 0 or i == len(k) - 1:
            return float(k[max(i, 0)][1])
        (s0, v0), (s1, v1) = k[i], k[i + 1]
        if self.easing == "linear":  # written as the paper's ramps are, bit for bit
            return v0 + (v1 - v0) * (t - s0) / (s1 - s0)
        return v0 + (v1 - v0) * EASINGS[self.easing]((t - s0) / (s1 - s0))

    steps = property(lambda self: tuple(s for s, _ in self.knots))
    points = property(lambda self: self.knots)  # the name Piecewise uses
    start = property(lambda self: self.knots[0][1])  # value up to the first knot
    end = property(lambda self: self.knots[-1][1])  # value from the last knot on
    spec = property(lambda self: SCHEDULES.format(self), doc="Compact spec: ``parse_schedule(s.spec) == s``.")

    def value_range(self) -> tuple[float, float]:
        """``(min, max)`` of the values over all steps ``>= 0``."""
        return (min(v for _, v in self.knots), max(v for _, v in self.knots))

    def values(self, steps: int | Iterable[int]) -> np.ndarray:
        """Values at ``steps`` as a float64 array; an int ``n`` means ``range(n)``."""
        steps = range(steps) if isinstance(steps, numbers.Integral) and not isinstance(steps, bool) else steps
        return np.asarray([self(s) for s in steps], dtype=np.float64)

    def __str__(self) -> str:
        return self.spec


Piecewise = Schedule  # piecewise-linear through knots: Piecewise(((0, 0.5), (100, 0.6)))


def _knot(i: int, j: int) -> property:
    return property(lambda self: self.knots[i][j])


class Constant(Schedule):
    """``value`` at every step."""
    def __init__(self, value: float):
        super().__init__(((0, value),))
    value = _knot(0, 1)


class Linear(Schedule):
    """``start`` until ``t0``, linear to ``end`` at ``t1``, then ``end``; needs ``0 <= t0 < t1``."""
    def __init__(self, start: float, end: float, t0: int, t1: int):
        t0, t1 = as_step("Linear.t0", t0), as_step("Linear.t1", t1)
        if t1 <= t0:
            raise ValueError(f"Linear needs t0 < t1, got t0={t0}, t1={t1}")
        super().__init__(((t0, start), (t1, end)))
    t0, t1 = _knot(0, 0), _knot(-1, 0)


class Fade(Schedule):
    """Hold ``start`` until ``fade_start``, ease to ``end`` over ``width >= 1`` steps (shape: an easing of
    :data:`FADE_SHAPES`; convex / concave name the curve of a decreasing fade), exactly ``end`` from ``fade_end``."""
    def __init__(self, start: float = 0.5, end: float = 0.0, fade_start: int = DEFAULT_FADE_START,
                 width: int = DEFAULT_FADE_WIDTH, shape: str = "linear"):
        s, name = (shape.strip().lower() if isinstance(shape, str) else shape), type(self).__name__
        if s not in self._shapes:
            hint = " (for a two-step schedule use TwoStep / 'twostep<t>-><b>')" if s == "twostep" else ""
            raise ValueError(f"unknown fade shape {shape!r}; expected one of {', '.join(self._shapes)}{hint}")
        t, w = as_step(f"{name}.fade_start", fade_start), as_step(f"{name}.width", width, minimum=1)
        super().__init__(((t, start), (t + w, end)), s)
    _shapes = FADE_SHAPES
    fade_start, fade_end = _knot(0, 0), _knot(-1, 0)  # last step at ``start``, first exactly at ``end``
    width = property(lambda self: self.fade_end - self.fade_start)
    shape = property(lambda self: self.easing)


class TwoStep(Fade):
    """``start`` before ``fade_start``, ``(start + end) / 2`` until ``fade_start + width``, then ``end``."""
    def __init__(self, start: float = 0.5, end: float = 0.0, fade_start: int = DEFAULT_FADE_START,
                 width: int = DEFAULT_FADE_WIDTH):
        super().__init__(start, end, fade_start, width, "twostep")
    _shapes = ("twostep",)
    midpoint = property(lambda self: self(self.fade_start))  # (start + end) / 2


class Switch(Schedule):
    """Hard switch: ``before`` for steps ``< at``, ``after`` from ``at`` on (``at >= 0``)."""
    def __init__(self, before: float = 0.5, after: float = 0.0, at: int = DEFAULT_FADE_START + DEFAULT_FADE_WIDTH):
        at = as_step("Switch.at", at)
        if at == 0:  # a switch at step 0 never shows ``before``: one knot
            as_real("Switch.before", before)
        super().__init__(((0, before), (at, after))[1 if at == 0 else 0:], "step")
    before, after, at = _knot(0, 1), _knot(-1, 1), _knot(-1, 0)


def triangular(p0: float, delta: float, period: int, direction: str = "up_first", start: int = 0) -> Schedule:
    """Knots ``p0, p0 + delta, p0 - delta, p0`` (``up_first``; ``down_first`` mirrors) at ``start`` + 0,
    ``period / 4``, ``3 period / 4``, ``period``: slopes ``+-4 delta / period``; ``triangular(0.5, 0.1, 400)``."""
    p0, delta = as_real("triangular p0", p0), as_real("triangular delta", delta)
    if delta < 0:
        raise ValueError(f"triangular delta must be >= 0 (direction='down_first' goes down first), got {delta}")
    period, start = as_step("triangular period", period, minimum=1), as_step("triangular start", start)
    if direction not in TRIANGULAR_DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {', '.join(TRIANGULAR_DIRECTIONS)}")
    d = delta if direction == "up_first" else -delta
    return Piecewise(zip((start, start + period / 4, start + 3 * period / 4, start + period), (p0, p0 + d, p0 - d, p0)))


def fade_shape_variants(start: float = 0.5, end: float = 0.0, fade_start: int = DEFAULT_FADE_START,
                        width: int = DEFAULT_FADE_WIDTH) -> dict[str, Schedule]:
    """The paper's fade-shape sweep: one :class:`Fade` per shape plus ``twostep``: a :class:`TwoStep`."""
    fades = {s: Fade(start, end, fade_start, width, s) for s in FADE_SHAPES}
    return {**fades, "twostep": TwoStep(start, end, fade_start, width)}


# the spec grammar: one table of templates that both parse and format
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_num, _int, _word = (_NUM, float, _fmt), (r"[+-]?\d+", int, str), (r"[a-z_]+", str, str)


def _parse_knots(body: str) -> tuple:
    if bad := [p for p in body.split(",") if not re.fullmatch(f"{_NUM}:{_NUM}", p)]:
        raise ValueError(f"knot {bad[0]!r} is not of the form <step>:<value>")
    return tuple(tuple(map(float, p.split(":"))) for p in body.split(","))


FIELDS: dict[str, tuple[str, Callable[[str], Any], Callable[[Any], str]]] = {  # name: (regex, parse, format)
    **dict.fromkeys(("value", "start", "end", "before", "after"), _num),
    **dict.fromkeys(("t0", "t1", "at", "fade_start", "width", "extra_steps"), _int),
    **dict.fromkeys(("shape", "easing"), _word),
    "knots": (r".*", _parse_knots, lambda k: ",".join(f"{_fmt(s)}:{_fmt(v)}" for s, v in k)),
}
_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Form:
    """A grammar row: ``template`` (text, ``{field}`` of :data:`FIELDS`, ``[optional part]``), ``build(**params)``,
    ``fixed`` params: defaults of template fields, else conditions (an object of type ``build`` is written by
    the first row it meets; an optional part is left out when its fields are at the defaults)."""

    template: str
    build: Callable[..., Any]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = [(p[0] == "[", p.strip("[]")) for p in re.split(r"(\[[^\]]*\])", self.template) if p]
        rx = "".join(("(?:%s)?" if opt else "%s") % "".join(f"(?P<{t}>{FIELDS[t][0]})" if i % 2 else re.escape(t)
                                                            for i, t in enumerate(_FIELD.split(text)))
                     for opt, text in parts)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "regex", re.compile(rx))
        object.__setattr__(self, "fields", tuple(_FIELD.findall(self.template)))

    def match(self, s: str, context: Mapping[str, Any]) -> dict | None:  # params of normalized spec s, or None
        if (m := self.regex.fullmatch(s)) is None:
            return None
        given = {k: FIELDS[k][1](v) for k, v in m.groupdict().items() if v is not None}
        return {**self.fixed, **{k: context[k] for k in self.fields if k in context}, **given}

    def render(self, get: Callable[[str], Any], defaults: Mapping[str, Any]) -> str:  # spec of params get(name)
        keep = [not (opt and all(n in defaults and get(n) == defaults[n] for n in _FIELD.findall(text)))
                for opt, text in self.parts]
        return "".join(_FIELD.sub(lambda m: FIELDS[m[1]][2](get(m[1])), text)
                       for k, (_, text) in zip(keep, self.parts) if k)

    def writes(self, obj: Any) -> bool:
        conditions = {k: v for k, v in self.fixed.items() if k not in self.fields}
        return type(obj) is self.build and all(getattr(obj, k) == v for k, v in conditions.items())


@dataclass(frozen=True)
class Grammar:
    """An ordered table of :class:`Form` rows: the first row that fits parses, the first that writes formats."""

    what: str
    forms: tuple[Form, ...]
    hint: str = ""

    def parse(self, spec: str, then: Callable | None = None, **context: Any) -> Any:
        """Object of ``spec`` (whitespace, case ignored), through ``then(obj, form, params)``; one ValueError."""
        if not isinstance(spec, str):
            raise TypeError(f"{self.what} must be a string, got {type(spec).__name__}")
        s, why = re.sub(r"\s+", "", spec).lower(), ""
        try:
            for form in self.forms:
                if (params := form.match(s, context)) is not None:
                    obj = form.build(**params)
                    return then(obj, form, params) if then else obj
        except ValueError as err:
            why = f": {err}"
        forms = "; ".join(f.template for f in self.forms)
        raise ValueError(f"invalid {self.what} {spec!r}{why}; {self.hint}accepted forms: {forms}") from None

    def format(self, obj: Any, **context: Any) -> str:
        """Spec of ``obj``; ``context`` gives further defaults (e.g. ``t1=total_steps``)."""
        form = next((f for f in self.forms if f.writes(obj)), None)
        if form is None:
            raise ValueError(f"no {self.what} form writes {obj!r}")
        sig = inspect.signature(form.build).parameters.values()
        defaults = {p.name: p.default for p in sig if p.default is not p.empty}
        defaults.update({k: v for k, v in form.fixed.items() if k in form.fields}, **context)
        return form.render(lambda n: getattr(obj, n), defaults)


SCHEDULES = Grammar("schedule spec", (
    Form("const[ant]{value}", Constant),
    Form("{value}", Constant),
    Form("linear{start}->{end}[@{t0}:{t1}]", Linear, {"t0": 0}),
    Form("fade{fade_start}[+{width}]->{end}[:{shape}]", Fade, {"start": 0.5}),
    Form("fade{start}->{end}@{fade_start}[+{width}][:{shape}]", Fade),
    Form("switch@{at}", Switch, {"before": 0.5, "after": 0.0}),
    Form("switch{before}->{after}@{at}", Switch),
    Form("twostep{fade_start}[+{width}]->{end}", TwoStep, {"start": 0.5}),
    Form("twostep{start}->{end}@{fade_start}[+{width}]", TwoStep),
    Form("pw({knots})[:{easing}]", Schedule),
    Form("piecewise({knots})[:{easing}]", Schedule),
))  # ``linear<a>-><b>`` runs from step 0 to ``total_steps``


def parse_schedule(spec: str, total_steps: int = DEFAULT_TOTAL_STEPS) -> Schedule:
    """Schedule of a spec (whitespace ignored, case-insensitive; forms: :data:`SCHEDULES`), e.g. ``0.5``,
    ``linear0.5->0`` (step 0 to ``total_steps``), ``fade600+300->0.1:cosine``, ``switch@1050``, ``twostep600->0``,
    ``pw(0:0.5,100:0.6)``.  A bad spec raises ``ValueError`` listing the accepted forms."""
    return SCHEDULES.parse(spec, **schedule_context(total_steps))


def schedule_context(total_steps: int) -> dict[str, int]:
    """Defaults that a spec takes from the run's length (``linear<a>-><b>`` ends at ``total_steps``)."""
    return {"t1": as_step("total_steps", total_steps, minimum=1)}


def format_schedule(sched: Schedule, total_steps: int | None = None) -> str:
    """Spec of ``sched``; with ``total_steps``, the shortest one that parses back under that length."""
    return SCHEDULES.format(sched, **({} if total_steps is None else schedule_context(total_steps)))


def as_schedule(obj: Schedule | str | float, total_steps: int = DEFAULT_TOTAL_STEPS) -> Schedule:
    """Schedule from a :class:`Schedule` (returned as is), a spec string, or a number (constant)."""
    if isinstance(obj, (Schedule, str)):
        return obj if isinstance(obj, Schedule) else parse_schedule(obj, total_steps)
    if isinstance(obj, numbers.Real) and not isinstance(obj, bool):
        return Constant(obj)
    raise TypeError(f"expected a Schedule, a spec string or a number, got {type(obj).__name__}")
