"""The shared counters (dataecho.stages.stats) and how stages keep them."""

from __future__ import annotations

import json

import pytest
from conftest import SlowIterable, torch_roundtrip

from dataecho.stages import EchoStats, echo, shuffle


def test_derived_figures() -> None:
    s = EchoStats()
    assert s.realized_factor == 0.0 and s.echoed_examples == 0
    s.fresh_examples, s.examples_out = 4, 10
    assert s.realized_factor == 2.5
    assert s.echoed_examples == 6
    assert s.as_dict() == {
        "fresh_examples": 4,
        "examples_out": 10,
        "batches": 0,
        "wait_seconds": 0.0,
        "stall_seconds": 0.0,
        "realized_factor": 2.5,
        "echoed_examples": 6,
    }


def test_echoed_examples_never_negative() -> None:
    # A shuffle buffer that has read more than it emitted so far.
    assert EchoStats(fresh_examples=8, examples_out=3).echoed_examples == 0


def test_state_round_trips_through_json_and_torch() -> None:
    s = EchoStats(fresh_examples=3, examples_out=7, batches=2, wait_seconds=1.5)
    for state in (json.loads(json.dumps(s.state_dict())), torch_roundtrip(s.state_dict())):
        t = EchoStats()
        t.load_state_dict(state)
        assert t == s


def test_load_coerces_types_and_keeps_missing_fields() -> None:
    # JSON and older checkpoints may give floats for counts, or lack newer fields.
    t = EchoStats(batches=5)
    t.load_state_dict({"fresh_examples": 3.0, "examples_out": 6, "wait_seconds": 1})
    assert t == EchoStats(fresh_examples=3, examples_out=6, batches=5, wait_seconds=1.0)
    assert type(t.fresh_examples) is int and type(t.wait_seconds) is float


def test_stage_counters_survive_a_resume() -> None:
    node = echo(list(range(50)), 2.5, seed=0)
    [next(node) for _ in range(40)]
    state = node.state_dict()
    resumed = echo(list(range(50)), 2.5, seed=0)
    resumed.reset(state)
    assert resumed.stats == node.stats
    list(node), list(resumed)
    assert resumed.stats.examples_out == node.stats.examples_out
    assert resumed.stats.fresh_examples == 50


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", [lambda s: echo(s, 3, seed=0), lambda s: shuffle(s, 4, seed=0)])
def test_wait_seconds_counts_a_slow_source(make) -> None:
    delay, n = 0.02, 10
    node = make(SlowIterable(n, delay))
    out = list(node)
    assert len(out) >= n
    # Every fresh item waited at least its sleep; echoed copies and buffer hits add no sleep.
    assert node.stats.wait_seconds >= n * delay
    assert node.stats.fresh_examples == n


def test_wait_seconds_is_part_of_the_state() -> None:
    node = echo(SlowIterable(3, 0.01), 2, seed=0)
    list(node)
    waited = node.stats.wait_seconds
    assert waited >= 0.03
    resumed = echo(SlowIterable(3, 0.0), 2, seed=0)
    resumed.reset(node.state_dict())
    assert resumed.stats.wait_seconds == waited
