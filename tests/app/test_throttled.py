"""The slow-storage emulation: pace, pass-through, validation, use inside loader workers.

Timing checks use lower bounds (a sleep never returns early) and generous upper bounds, so a
loaded machine cannot fail them.
"""

from __future__ import annotations

import math
import time

import pytest

from dataecho.app.sources.throttled import _SLACK_SECONDS, Throttled
from dataecho.loader import EchoingDataLoader


class Recording:
    """A map-style dataset of ints that records which indices were read, in order."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.reads.append(index)
        return index * 10


def test_passes_items_and_length_through():
    source = Recording(5)
    slow = Throttled(source, delay=0.0)
    assert len(slow) == 5 and [slow[i] for i in (4, 0, 2)] == [40, 0, 20]
    assert source.reads == [4, 0, 2]  # one read of the source per read of the wrapper
    assert slow.rate == math.inf


@pytest.mark.timeout(30)
def test_reads_take_at_least_the_delay_each():
    slow = Throttled(Recording(100), delay=0.004)
    start = time.perf_counter()
    for i in range(50):
        slow[i]
    elapsed = time.perf_counter() - start
    # The clock may grant one burst of _SLACK_SECONDS at the start, never more.
    assert elapsed >= 50 * 0.004 - _SLACK_SECONDS
    assert elapsed < 50 * 0.004 + 2.0


@pytest.mark.timeout(30)
def test_rate_is_examples_per_second_and_overshoot_is_paid_back():
    slow = Throttled(Recording(2000), rate=2000)
    assert slow.delay == pytest.approx(0.0005) and slow.rate == pytest.approx(2000)
    start = time.perf_counter()
    for i in range(1000):  # 1000 sub-millisecond sleeps: overshoot would add up without the clock
        slow[i]
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.5 - _SLACK_SECONDS
    assert elapsed < 0.5 + 2.0


@pytest.mark.timeout(30)
def test_an_idle_reader_gets_no_more_than_the_slack_for_free():
    slow = Throttled(Recording(10), delay=0.05)
    slow[0]
    time.sleep(0.2)  # idle: the clock falls behind, but only _SLACK_SECONDS may be caught up
    start = time.perf_counter()
    slow[1]
    assert time.perf_counter() - start >= 0.05 - _SLACK_SECONDS


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "exactly one of delay .* and rate"),
        ({"delay": 0.1, "rate": 10}, ValueError, "exactly one of delay"),
        ({"rate": 0}, ValueError, r"rate must be a finite number > 0, got 0.0; use delay=0"),
        ({"rate": float("inf")}, ValueError, "rate must be a finite number > 0"),
        ({"delay": -1}, ValueError, r"delay must be a finite number >= 0, got -1.0"),
        ({"delay": "1"}, TypeError, "delay must be a real number >= 0, got '1'"),
        ({"delay": True}, TypeError, "delay must be a real number"),
    ],
)
def test_rejects_bad_settings_with_the_fix(kwargs, error, message):
    with pytest.raises(error, match=message):
        Throttled(Recording(3), **kwargs)


def test_rejects_an_iterable_without_indexing():
    with pytest.raises(TypeError, match="map-style dataset .* got generator"):
        Throttled((i for i in range(3)), delay=0.1)


@pytest.mark.timeout(60)
def test_works_inside_a_loader_worker_and_echo_saves_reads():
    """In a worker process, with echo factor 2: every example read once, each emitted twice."""
    loader = EchoingDataLoader(
        Throttled(Recording(64), delay=0.001),
        batch_size=16,
        echo_factor=2,
        where="after_augment",
        num_workers=1,
        seed=0,
        shuffle=True,
    )
    values = sorted(int(v) for batch in loader for v in batch)
    assert values == sorted(list(range(0, 640, 10)) * 2)
    assert loader.stats.fresh_examples == 64 and loader.stats.examples_out == 128
