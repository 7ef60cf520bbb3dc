"""Loading-probability schedules (dataecho.schedules)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho.schedules import (
    Constant,
    Cosine,
    check_probability,
    constant,
    cosine_decreasing,
    cosine_increasing,
)

probs = st.floats(min_value=1e-6, max_value=1.0)


def test_constant_returns_p_at_every_step() -> None:
    s = constant(0.25)
    assert [s(t) for t in (0, 1, 10, 10**9)] == [0.25] * 4
    assert constant(1)(3) == 1.0 and isinstance(constant(1)(0), float)


def test_cosine_increasing_endpoints_midpoint_and_clamp() -> None:
    s = cosine_increasing(0.1, 0.9, 100)
    assert s(0) == pytest.approx(0.1)
    assert s(50) == pytest.approx(0.5)
    assert s(25) == pytest.approx(0.1 + 0.8 * (1 - math.cos(math.pi / 4)) / 2)
    assert s(100) == pytest.approx(0.9)
    # Past total_steps the end value holds.
    assert s(101) == s(10_000) == s(100)
    values = [s(t) for t in range(101)]
    assert all(a < b for a, b in itertools.pairwise(values))


def test_cosine_decreasing_mirrors_increasing() -> None:
    up, down = cosine_increasing(0.2, 1.0, 40), cosine_decreasing(1.0, 0.2, 40)
    assert down(0) == 1.0 and down(40) == pytest.approx(0.2) and down(1_000) == down(40)
    for t in range(41):
        assert down(t) == pytest.approx(up(40 - t))
    values = [down(t) for t in range(41)]
    assert all(a > b for a, b in itertools.pairwise(values))


def test_one_step_schedule_and_equal_ends() -> None:
    s = cosine_increasing(0.3, 0.6, 1)
    assert (s(0), s(1), s(2)) == (pytest.approx(0.3), pytest.approx(0.6), pytest.approx(0.6))
    flat = cosine_decreasing(0.5, 0.5, 10)
    assert {flat(t) for t in range(20)} == {0.5}


def test_mean_over_total_steps_is_midpoint() -> None:
    # The module docstring promises constant((p_min + p_max) / 2) as a load-matched baseline.
    for s in (cosine_increasing(0.1, 0.7, 10_000), cosine_decreasing(0.7, 0.1, 10_000)):
        assert sum(s(t) for t in range(10_000)) / 10_000 == pytest.approx(0.4, abs=1e-3)


@settings(max_examples=200, deadline=None)
@given(a=probs, b=probs, total=st.integers(1, 10_000), step=st.integers(0, 20_000))
def test_values_stay_in_range_between_the_ends(a: float, b: float, total: int, step: int) -> None:
    lo, hi = min(a, b), max(a, b)
    for s in (cosine_increasing(lo, hi, total), cosine_decreasing(hi, lo, total)):
        p = s(step)
        assert 0.0 < p <= 1.0
        assert lo <= p <= hi


def test_schedules_are_picklable_frozen_and_comparable() -> None:
    for s in (constant(0.5), cosine_increasing(0.1, 0.9, 7), cosine_decreasing(0.9, 0.1, 7)):
        back = pickle.loads(pickle.dumps(s))
        assert back == s and [back(t) for t in range(10)] == [s(t) for t in range(10)]
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.total_steps = 3  # type: ignore[misc]
    assert cosine_increasing(0.1, 0.9, 7) == Cosine(0.1, 0.9, 7)
    assert constant(0.5) == Constant(0.5)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0001, 2, math.nan, math.inf, -math.inf])
def test_bad_probability_values(bad: float) -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        constant(bad)
    with pytest.raises(ValueError, match="p_min"):
        cosine_increasing(bad, 1.0, 10)
    with pytest.raises(ValueError, match="p_max"):
        cosine_decreasing(bad, 0.5, 10)


@pytest.mark.parametrize("bad", ["0.5", None, True, [0.5], 0.5j])
def test_non_numeric_probability_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="probability in"):
        check_probability(bad, name="p")
    with pytest.raises(TypeError, match="p_max"):
        cosine_increasing(0.1, bad, 10)  # type: ignore[arg-type]


def test_wrong_direction_names_the_other_schedule() -> None:
    with pytest.raises(ValueError, match=r"cosine_decreasing\(p_max, p_min"):
        cosine_increasing(0.9, 0.1, 10)
    with pytest.raises(ValueError, match=r"cosine_increasing\(p_min, p_max"):
        cosine_decreasing(0.1, 0.9, 10)


@pytest.mark.parametrize("bad", [0, -5, 2.5, "10", True, None])
def test_bad_total_steps(bad: object) -> None:
    with pytest.raises(ValueError, match=f"total_steps must be an integer >= 1.*got {bad!r}"):
        cosine_increasing(0.1, 0.9, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_bad_step(bad: object) -> None:
    for s in (constant(0.5), cosine_increasing(0.1, 0.9, 10)):
        with pytest.raises(ValueError, match="step must be an integer >= 0"):
            s(bad)  # type: ignore[arg-type]
