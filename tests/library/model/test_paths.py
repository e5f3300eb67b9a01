"""Tests for circuitfade.gating.paths: the paper's gate paths, name normalization, errors."""

from __future__ import annotations

import pytest

from circuitfade.gating.paths import NAMED_PATHS, PAPER_PATHS, GatePath, gate_path_names, parse_path
from circuitfade.gating.schedules import Constant, Fade, Linear, Piecewise, Switch, TwoStep, triangular


def test_paper_paths():
    assert PAPER_PATHS == ("fade600->0", "linear0.5->0", "forced_const0.5", "unforced", "forced_zero")
    assert set(PAPER_PATHS) <= set(gate_path_names())
    assert gate_path_names() == NAMED_PATHS


@pytest.mark.parametrize(
    "spec, mode, value, schedule",
    [
        ("unforced", "learned", None, None),
        ("forced_zero", "fixed", 0.0, None),
        ("forced_const0.5", "fixed", 0.5, None),
        ("forced_const0.25", "fixed", 0.25, None),
        ("linear0.5->0", "scheduled", None, Linear(0.5, 0, 0, 3600)),
        ("fade600->0", "scheduled", None, Fade()),
        ("fade600+300->0", "scheduled", None, Fade(width=300)),
        ("fade600->0.1", "scheduled", None, Fade(end=0.1)),
        ("fade600->0:cosine", "scheduled", None, Fade(shape="cosine")),
        ("fade600->0:convex", "scheduled", None, Fade(shape="convex")),
        ("fade600->0:concave", "scheduled", None, Fade(shape="concave")),
        ("switch@1050", "scheduled", None, Switch(0.5, 0, 1050)),
        ("switch@600", "scheduled", None, Switch(0.5, 0, 600)),
        ("hard_switch@1050", "scheduled", None, Switch(0.5, 0, 1050)),
        ("hard_switch1050", "scheduled", None, Switch(0.5, 0, 1050)),
        ("hard_switch0.5->0@600", "scheduled", None, Switch(0.5, 0, 600)),
        ("twostep600->0", "scheduled", None, TwoStep()),
        ("posthoc2550", "fixed", 0.0, None),
        ("posthoc", "fixed", 0.0, None),
        ("pw(0:0.5,100:0.6,300:0.4,400:0.5)", "scheduled", None, triangular(0.5, 0.1, 400)),
        ("const0.5", "scheduled", None, Constant(0.5)),
    ],
)
def test_parse_path(spec, mode, value, schedule):
    p = parse_path(spec)
    assert isinstance(p, GatePath)
    assert p.mode == mode
    assert p.value == value
    if schedule is None:
        assert p.schedule is None
    elif isinstance(schedule, Piecewise):
        assert [v for _, v in p.schedule.points] == pytest.approx([v for _, v in schedule.points])
    else:
        assert p.schedule == schedule
    assert parse_path(p.name) == p  # name is a canonical spec


@pytest.mark.parametrize("name", NAMED_PATHS)
def test_named_paths_canonical(name):
    assert parse_path(name).name == name


@pytest.mark.parametrize(
    "spec, name",
    [
        ("hard_switch@1050", "switch@1050"),
        ("hard_switch1050", "switch@1050"),
        ("posthoc", "posthoc2550"),
        ("  Fade 600 -> 0.0 ", "fade600->0"),
        ("forced_const0.50", "forced_const0.5"),
        ("linear0.5->0@0:3600", "linear0.5->0"),
        ("linear0.5->0@0:1000", "linear0.5->0@0:1000"),
    ],
)
def test_path_names_normalized(spec, name):
    assert parse_path(spec).name == name


def test_posthoc_continuation():
    p = parse_path("posthoc")
    assert p == parse_path("posthoc2550")
    assert p.continue_from == "unforced" and p.extra_steps == 2550
    assert p.is_continuation and p.value_at(0) == 0.0 and p.value_at(2549) == 0.0
    q = parse_path("posthoc1000")
    assert q.extra_steps == 1000 and q.name == "posthoc1000"
    assert not parse_path("fade600->0").is_continuation


def test_path_value_at():
    assert parse_path("fade600->0").value_at(825) == pytest.approx(0.25)
    assert parse_path("forced_const0.5").value_at(3599) == 0.5
    assert parse_path("forced_zero").value_at(0) == 0.0
    assert parse_path("switch@1050").value_at(1050) == 0.0
    lin = parse_path("linear0.5->0", total_steps=1000)
    assert lin.schedule == Linear(0.5, 0, 0, 1000)
    assert lin.value_at(500) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="learned"):
        parse_path("unforced").value_at(0)
    with pytest.raises(ValueError, match="non-negative"):
        parse_path("forced_zero").value_at(-1)
    assert parse_path("unforced").is_learned


@pytest.mark.parametrize(
    "spec, match",
    [
        ("forced", "Named paths"),
        ("unforced2", "Named paths"),
        ("fade->", "Named paths"),
        ("forced_const", "Named paths"),
        ("forced_const1.5", r"\[0, 1\]"),
        ("posthoc0", "extra_steps"),
        ("posthoc-5", "extra_steps"),
        ("fade600+-300->0", "width"),
        ("linear1.5->0", r"\[0, 1\]"),
        ("pw(0:0.5,100:-0.1)", r"\[0, 1\]"),
    ],
)
def test_parse_path_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_path(spec)
    with pytest.raises(ValueError, match="forced_zero"):
        parse_path(spec)


def test_gatepath_validation():
    with pytest.raises(ValueError, match="mode"):
        GatePath("x", "annealed", None, None)
    with pytest.raises(ValueError, match="schedule=None and value=None"):
        GatePath("x", "learned", None, 0.5)
    with pytest.raises(ValueError, match="expects a value"):
        GatePath("x", "fixed", None, None)
    with pytest.raises(ValueError, match="expects a Schedule"):
        GatePath("x", "scheduled", None, None)
    with pytest.raises(ValueError, match="value=None"):
        GatePath("x", "scheduled", Fade(), 0.5)
    with pytest.raises(ValueError, match="both set"):
        GatePath("x", "fixed", None, 0.0, continue_from="unforced")
    with pytest.raises(ValueError, match="non-empty"):
        GatePath("", "learned", None, None)
    p = GatePath("fade600->0", "scheduled", Fade(), None)
    assert p == parse_path("fade600->0")
    assert hash(p) == hash(parse_path("fade600->0"))
