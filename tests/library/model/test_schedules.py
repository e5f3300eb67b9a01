"""Tests for circuitfade.gating.schedules: values by hand, spec round-trips, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from circuitfade.gating.schedules import (
    FADE_SHAPES,
    Constant,
    Fade,
    Linear,
    Piecewise,
    Schedule,
    Switch,
    TwoStep,
    as_schedule,
    fade_shape_variants,
    format_schedule,
    parse_schedule,
    triangular,
)

# --------------------------------------------------------------------------- #
# values computed by hand
# --------------------------------------------------------------------------- #


def test_constant_values():
    c = Constant(0.5)
    assert c(0) == 0.5 and c(3599) == 0.5 and c(10**9) == 0.5
    assert isinstance(c(3), float)


@pytest.mark.parametrize(
    "step, expected",
    [(0, 0.5), (1, 0.5 - 0.5 / 3600), (1800, 0.25), (2700, 0.125), (3599, 0.5 / 3600), (3600, 0.0), (5000, 0.0)],
)
def test_linear_over_total_steps(step, expected):
    assert parse_schedule("linear0.5->0")(step) == pytest.approx(expected, abs=1e-15)


def test_linear_with_window():
    lin = Linear(0.5, 0.0, 100, 900)
    assert lin(0) == 0.5
    assert lin(100) == 0.5
    assert lin(500) == pytest.approx(0.25)
    assert lin(300) == pytest.approx(0.375)
    assert lin(900) == 0.0
    assert lin(2000) == 0.0
    up = Linear(0.0, 1.0, 0, 10)
    assert up(4) == pytest.approx(0.4)


@pytest.mark.parametrize(
    "step, expected",
    [(0, 0.5), (599, 0.5), (600, 0.5), (825, 0.25), (712.5, 0.375), (1049, 0.5 / 450), (1050, 0.0), (3599, 0.0)],
)
def test_fade_default_linear(step, expected):
    assert Fade()(step) == pytest.approx(expected, abs=1e-15)


def test_fade_end_is_exact():
    for shape in FADE_SHAPES:
        f = Fade(0.5, 0.1, 600, 450, shape)
        assert f(1050) == 0.1
        assert f(600) == 0.5


@pytest.mark.parametrize(
    "shape, mid, quarter",
    [
        # value = 0.5 - 0.5 * s(u); mid: u = 0.5 (step 825); quarter: u = 0.25 (step 712.5)
        ("linear", 0.25, 0.375),
        ("cosine", 0.25, 0.5 - 0.5 * (1 - math.cos(math.pi / 4)) / 2),
        ("convex", 0.125, 0.5 - 0.5 * (1 - 0.75**2)),  # s = 1 - (1-u)^2
        ("concave", 0.375, 0.5 - 0.5 * 0.0625),  # s = u^2
    ],
)
def test_fade_shapes(shape, mid, quarter):
    f = Fade(shape=shape)
    assert f(825) == pytest.approx(mid, abs=1e-12)
    assert f(712.5) == pytest.approx(quarter, abs=1e-12)
    assert f(600) == 0.5 and f(1050) == 0.0


def test_fade_shape_curvature():
    u = np.linspace(600, 1050, 46)
    convex = Fade(shape="convex").values(u)
    concave = Fade(shape="concave").values(u)
    assert np.all(np.diff(convex, 2) >= -1e-12)  # convex curve: fast early drop
    assert np.all(np.diff(concave, 2) <= 1e-12)
    assert convex[10] < Fade().values(u)[10] < concave[10]


def test_fade_width_and_end():
    f = parse_schedule("fade600+300->0.1")
    assert f == Fade(0.5, 0.1, 600, 300, "linear")
    assert f(750) == pytest.approx(0.3)
    assert f(900) == 0.1 and f(3000) == 0.1


def test_switch_boundaries():
    s = parse_schedule("switch@1050")
    assert s(0) == 0.5 and s(1049) == 0.5
    assert s(1050) == 0.0 and s(3599) == 0.0
    s600 = Switch(0.5, 0.0, 600)
    assert s600(599) == 0.5 and s600(600) == 0.0
    assert Switch(0.2, 0.9, 0)(0) == 0.9


def test_twostep_values():
    t = TwoStep()
    assert t(0) == 0.5 and t(599) == 0.5
    assert t(600) == 0.25 and t(1049) == 0.25
    assert t(1050) == 0.0 and t(3599) == 0.0
    t2 = parse_schedule("twostep600+300->0.1")
    assert t2(899) == pytest.approx(0.3) and t2(900) == 0.1


def test_piecewise_interpolation():
    p = parse_schedule("pw(0:0.5,100:0.6,300:0.4,400:0.5)")
    assert isinstance(p, Piecewise)
    assert p(0) == 0.5
    assert p(50) == pytest.approx(0.55)
    assert p(100) == pytest.approx(0.6)
    assert p(200) == pytest.approx(0.5)
    assert p(250) == pytest.approx(0.45)
    assert p(300) == pytest.approx(0.4)
    assert p(350) == pytest.approx(0.45)
    assert p(400) == 0.5 and p(1000) == 0.5
    late = Piecewise(((100, 1.0), (200, 0.0)))
    assert late(0) == 1.0 and late(150) == pytest.approx(0.5) and late(250) == 0.0
    assert Piecewise({0: 0.2, 10: 0.4}) == Piecewise(((0, 0.2), (10, 0.4)))
    assert Piecewise(((5, 0.3),))(0) == 0.3


def test_triangular_knots():
    up = triangular(0.5, 0.1, 400)
    assert up.steps == (0, 100, 300, 400)
    assert [v for _, v in up.points] == pytest.approx([0.5, 0.6, 0.4, 0.5])
    down = triangular(0.5, 0.1, 400, "down_first")
    assert [v for _, v in down.points] == pytest.approx([0.5, 0.4, 0.6, 0.5])
    shifted = triangular(0.5, 0.1, 400, start=1000)
    assert shifted.steps == (1000, 1100, 1300, 1400)
    assert shifted(0) == 0.5 and shifted(1100) == pytest.approx(0.6) and shifted(5000) == 0.5
    # equal slopes
    slopes = [(v1 - v0) / (s1 - s0) for (s0, v0), (s1, v1) in zip(up.points, up.points[1:])]
    assert [abs(x) for x in slopes] == pytest.approx([0.1 / 100] * 3)
    odd = triangular(0.5, 0.1, 10)
    assert odd.steps == (0, 2.5, 7.5, 10)


@pytest.mark.parametrize("period", [4, 10, 400, 401])
def test_triangular_directions_same_multiset(period):
    up = triangular(0.5, 0.1, period, "up_first").values(range(period + 1))
    down = triangular(0.5, 0.1, period, "down_first").values(range(period + 1))
    assert not np.allclose(up, down)
    assert sorted(up) == pytest.approx(sorted(down), abs=1e-12)


def test_fade_shape_variants():
    v = fade_shape_variants()
    assert set(v) == {"linear", "cosine", "convex", "concave", "twostep"}
    assert v["twostep"] == TwoStep() and v["cosine"] == Fade(shape="cosine")


def test_values_array_and_step_validation():
    f = Fade()
    arr = f.values(3600)
    assert isinstance(arr, np.ndarray) and arr.shape == (3600,) and arr.dtype == np.float64
    assert arr[825] == pytest.approx(0.25)
    assert list(f.values([0, 1050])) == [0.5, 0.0]
    assert f(np.int64(825)) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="non-negative"):
        f(-1)
    with pytest.raises(ValueError, match="non-negative"):
        Constant(0.5)(-5)
    with pytest.raises(ValueError, match="non-negative"):
        f.values([0, -1])
    with pytest.raises(TypeError):
        f("3")


def test_dataclasses_hashable_and_comparable():
    assert Fade() == Fade(0.5, 0, 600, 450, "linear")
    assert Fade() != Fade(shape="cosine")
    assert len({Fade(), Fade(0.5, 0.0), Switch(), Switch(0.5, 0, 1050), Constant(0), Constant(0.0)}) == 3
    assert Constant(1) == Constant(1.0)
    with pytest.raises(AttributeError):
        Fade().width = 10  # type: ignore[misc]
    assert str(Fade()) == "fade600->0"
    assert isinstance(Fade(), Schedule)


# --------------------------------------------------------------------------- #
# specs
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("const0.5", Constant(0.5)),
        ("constant0.5", Constant(0.5)),
        ("0.5", Constant(0.5)),
        ("  CONST 0.25 ", Constant(0.25)),
        ("linear0.5->0", Linear(0.5, 0.0, 0, 3600)),
        ("linear0.5->0@100:900", Linear(0.5, 0.0, 100, 900)),
        ("fade600->0", Fade(0.5, 0.0, 600, 450, "linear")),
        ("fade600+300->0", Fade(0.5, 0.0, 600, 300)),
        ("fade600->0.1", Fade(0.5, 0.1, 600, 450)),
        ("fade600->0:cosine", Fade(shape="cosine")),
        ("FADE 600 -> 0 : Convex", Fade(shape="convex")),
        ("fade600->0:linear", Fade()),
        ("fade0.8->0@600+300:concave", Fade(0.8, 0.0, 600, 300, "concave")),
        ("switch@1050", Switch(0.5, 0.0, 1050)),
        ("switch0.5->0@600", Switch(0.5, 0.0, 600)),
        ("twostep600->0", TwoStep(0.5, 0.0, 600, 450)),
        ("twostep600+300->0", TwoStep(0.5, 0.0, 600, 300)),
        ("twostep0.8->0.2@100", TwoStep(0.8, 0.2, 100, 450)),
        ("pw(0:0.5,100:0.6,300:0.4,400:0.5)", Piecewise(((0, 0.5), (100, 0.6), (300, 0.4), (400, 0.5)))),
        ("piecewise(0:1, 2.5:0)", Piecewise(((0, 1.0), (2.5, 0.0)))),
    ],
)
def test_parse_schedule(spec, expected):
    assert parse_schedule(spec) == expected


def test_parse_linear_uses_total_steps():
    assert parse_schedule("linear0.5->0", total_steps=1000) == Linear(0.5, 0, 0, 1000)


@pytest.mark.parametrize(
    "sched",
    [
        Constant(0.5),
        Constant(0),
        Constant(-1.25),
        Constant(1e-5),
        Linear(0.5, 0.0, 0, 3600),
        Linear(0.1, 0.7, 17, 18),
        Fade(),
        Fade(0.5, 0.1, 600, 300, "cosine"),
        Fade(0.8, 0.0, 0, 450, "convex"),
        Fade(0.5, 0.6, 10, 1, "concave"),
        Switch(),
        Switch(0.5, 0.0, 600),
        Switch(0.3, 0.7, 0),
        TwoStep(),
        TwoStep(0.5, 0.0, 600, 300),
        TwoStep(1.0, 0.0, 5, 450),
        Piecewise(((0, 0.5), (100, 0.6), (300, 0.4), (400, 0.5))),
        triangular(0.5, 0.1, 10, "down_first", start=3),
        triangular(1 / 3, 0.1, 400),
    ],
    ids=repr,
)
def test_spec_round_trip(sched):
    spec = sched.spec
    assert parse_schedule(spec) == sched
    assert parse_schedule(str(sched)) == sched
    assert parse_schedule(spec).spec == spec


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("fade600->0", "fade600->0"),
        ("fade600+450->0.0:linear", "fade600->0"),
        ("switch0.5->0@1050", "switch@1050"),
        ("constant0.50", "const0.5"),
        ("twostep600+450->0", "twostep600->0"),
    ],
)
def test_spec_is_canonical(spec, expected):
    assert parse_schedule(spec).spec == expected


@pytest.mark.parametrize(
    "spec, match",
    [
        ("fade->", "accepted forms"),
        ("", "accepted forms"),
        ("garbage", "accepted forms"),
        ("fade600->x", "accepted forms"),
        ("constabc", "accepted forms"),
        ("linear0.5->", "accepted forms"),
        ("fade600+-300->0", "width"),
        ("fade600+0->0", "width"),
        ("fade600->0:wobbly", "linear, cosine, convex, concave"),
        ("fade600->0:twostep", "TwoStep"),
        ("twostep600+-1->0", "width"),
        ("linear0.5->0@900:100", "t0 < t1"),
        ("switch@-5", "Switch.at"),
        ("pw(0:0.5,100:0.6,100:0.4)", "strictly increasing"),
        ("pw(100:0.5,50:0.6)", "strictly increasing"),
        ("pw(0:0.5,100:abc)", "knot"),
        ("pw()", "knot"),
        ("pw(0:0.5", "accepted forms"),
    ],
)
def test_parse_schedule_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(spec)
    with pytest.raises(ValueError, match="accepted forms"):
        parse_schedule(spec)


def test_constructor_validation():
    with pytest.raises(ValueError, match="width"):
        Fade(width=-1)
    with pytest.raises(ValueError, match="fade_start"):
        Fade(fade_start=-600)
    with pytest.raises(ValueError, match="integer"):
        Fade(fade_start=600.5)
    with pytest.raises(ValueError, match="expected one of linear, cosine"):
        Fade(shape="sigmoid")
    with pytest.raises(ValueError, match="finite real"):
        Constant(float("nan"))
    with pytest.raises(ValueError, match="finite real"):
        Constant("0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite real"):
        Switch(before=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="t0 < t1"):
        Linear(0.5, 0, 10, 10)
    with pytest.raises(ValueError, match="at least one"):
        Piecewise(())
    with pytest.raises(ValueError, match="pair"):
        Piecewise(((0, 1, 2),))
    with pytest.raises(ValueError, match=">= 0"):
        Piecewise(((-1, 0.5), (0, 0.5)))
    with pytest.raises(ValueError, match="up_first, down_first"):
        triangular(0.5, 0.1, 400, "below")
    with pytest.raises(ValueError, match="delta"):
        triangular(0.5, -0.1, 400)
    with pytest.raises(ValueError, match="period"):
        triangular(0.5, 0.1, 0)
    assert Fade(fade_start=600.0).fade_start == 600  # integral float is accepted


def test_as_schedule():
    assert as_schedule(0.4) == Constant(0.4)
    assert as_schedule("fade600->0") == Fade()
    f = Fade(shape="cosine")
    assert as_schedule(f) is f
    assert as_schedule("linear1->0", total_steps=10) == Linear(1, 0, 0, 10)
    with pytest.raises(TypeError):
        as_schedule(None)  # type: ignore[arg-type]


def test_one_value_type_with_easings():
    # every named schedule is knots plus an easing; the generic form writes and parses any of them
    assert Fade().knots == ((600, 0.5), (1050, 0.0)) and Fade(shape="cosine").easing == "cosine"
    assert Switch(0.5, 0.0, 1050).knots == ((0, 0.5), (1050, 0.0)) and Switch().easing == "step"
    assert TwoStep().knots == Fade().knots and TwoStep().easing == "twostep" and TwoStep().midpoint == 0.25
    hold = Schedule(((0, 0.2), (10, 0.8), (20, 0.4)), "step")
    assert [hold(t) for t in (0, 9, 10, 19, 20, 99)] == [0.2, 0.2, 0.8, 0.8, 0.4, 0.4]
    assert hold.spec == "pw(0:0.2,10:0.8,20:0.4):step" and parse_schedule(hold.spec) == hold
    eased = parse_schedule("pw(0:1,10:0):concave")
    assert eased(5) == pytest.approx(1 - 0.25) and eased.spec == "pw(0:1,10:0):concave"
    assert Switch(0.3, 0.7, 0) == Switch(0.9, 0.7, 0) and Switch(0.3, 0.7, 0)(0) == 0.7  # never shows `before`
    assert Fade() != Linear(0.5, 0.0, 600, 1050) and Fade()(825) == Linear(0.5, 0.0, 600, 1050)(825)
    with pytest.raises(ValueError, match="unknown easing"):
        Schedule(((0, 1), (1, 0)), "wobbly")


def test_format_schedule_under_a_run_length():
    assert format_schedule(Linear(0.5, 0, 0, 1000), total_steps=1000) == "linear0.5->0"
    assert format_schedule(Linear(0.5, 0, 0, 1000)) == "linear0.5->0@0:1000"
    assert format_schedule(Linear(0.5, 0, 0, 1000), total_steps=3600) == "linear0.5->0@0:1000"
    assert parse_schedule("linear0.5->0", total_steps=1000) == Linear(0.5, 0, 0, 1000)
