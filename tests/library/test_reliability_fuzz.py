"""Hypothesis fuzz of the stream stages: random stages, factors, buffers, faults, resume points.

Each example builds a chain (echo, stochastic or adaptive echo, then maybe a shuffle) over a
source with explicit state, and checks: the counts add up (fresh = items read, out = items
emitted), nothing is lost (every source item comes out, at most as often as the stage allows),
a source error comes out as that error (never swallowed, never a hang), and a resume from a
state taken at a random point (also just before a fault) continues without losing or
doubling a fresh item.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
from conftest import torch_roundtrip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode

from dataecho.stages import AdaptiveEcho, Echo, Shuffle, StochasticEcho


class Upstream(OSError):
    """The fault a source raises."""


class Source(BaseNode[int]):
    """0, 1, ..., n-1; raises :class:`Upstream` instead of item ``fail_at``. State: position."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        super().__init__()
        self.n, self.fail_at, self.pos = n, fail_at, 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.pos = int(initial_state["pos"]) if initial_state else 0

    def next(self) -> int:
        if self.pos == self.fail_at:
            raise Upstream(f"upstream fault at item {self.pos}")
        if self.pos >= self.n:
            raise StopIteration
        self.pos += 1
        return self.pos - 1

    def get_state(self) -> dict[str, Any]:
        return {"pos": self.pos}


stage_spec = st.one_of(
    st.tuples(st.just("echo"), st.floats(1.0, 4.0), st.just(0)),
    st.tuples(st.just("stochastic"), st.floats(0.2, 1.0), st.integers(1, 6)),
    st.tuples(st.just("adaptive"), st.floats(1.0, 4.0), st.integers(1, 4)),
)
chain_spec = st.fixed_dictionaries(
    {
        "stage": stage_spec,
        "shuffle": st.integers(0, 12),
        "n": st.integers(0, 30),
        "seed": st.integers(0, 2**16),
    }
)


def build(spec: dict[str, Any], source: Source) -> tuple[BaseNode[int], BaseNode[int]]:
    """The chain's output node and its echo stage."""
    kind, x, buffer = spec["stage"]
    if kind == "echo":
        stage = Echo(source, x, seed=spec["seed"])
    elif kind == "stochastic":
        stage = StochasticEcho(source, load_prob=x, buffer_size=buffer, seed=spec["seed"])
    else:
        stage = AdaptiveEcho(source, max_factor=x, buffer_size=buffer, seed=spec["seed"])
    out = Shuffle(stage, spec["shuffle"], seed=spec["seed"] + 1) if spec["shuffle"] else stage
    return out, stage


def limit(spec: dict[str, Any]) -> float:
    """The most times one fresh item may come out."""
    kind, x, _ = spec["stage"]
    return math.ceil(x) if kind == "echo" else math.floor(x) if kind == "adaptive" else math.inf


def check_counts(
    spec: dict[str, Any], out: list[int], stage: Any, n_read: int, *, whole: bool = True
) -> None:
    """Counts add up; ``whole``: ``out`` is a complete epoch (no copy still held back)."""
    counts = collections.Counter(out)
    assert stage.stats.fresh_examples == n_read, (stage.stats, n_read)
    assert stage.stats.examples_out >= len(out)  # a shuffle may still hold some
    assert set(counts) <= set(range(n_read))
    assert all(c <= limit(spec) for c in counts.values()), counts
    kind, x, _ = spec["stage"]
    if kind == "echo" and whole:
        assert all(c >= math.floor(x) for c in counts.values()), counts


def close(node: Any) -> None:
    while node is not None:
        if isinstance(node, AdaptiveEcho):
            assert node.close(timeout=5.0), "the adaptive reader thread did not stop"
        node = getattr(node, "source", None)


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.timeout(120)
@FUZZ
@given(spec=chain_spec, where=st.floats(0.0, 1.0))
def test_counts_add_up_and_a_resume_loses_and_doubles_nothing(spec, where):
    node, stage = build(spec, Source(spec["n"]))
    try:
        out = list(node)
    finally:
        close(node)
    check_counts(spec, out, stage, spec["n"])
    assert set(out) == set(range(spec["n"]))  # nothing lost: every item came out
    assert stage.stats.examples_out == len(out)

    k = round(where * len(out))
    first, first_stage = build(spec, Source(spec["n"]))
    try:
        head = [next(first) for _ in range(k)]
        state = torch_roundtrip(first.state_dict())
    finally:
        close(first)
    resumed, resumed_stage = build(spec, Source(spec["n"]))
    resumed.reset(state)
    try:
        rest = list(resumed)
    finally:
        close(resumed)
    whole = head + rest
    check_counts(spec, whole, resumed_stage, spec["n"])
    assert set(whole) == set(range(spec["n"]))
    if spec["stage"][0] != "adaptive":  # adaptive reuse depends on timing, by design
        assert whole == out
    else:  # each fresh item came out fresh exactly once across the two runs
        assert resumed_stage.stats.fresh_examples == spec["n"]


@pytest.mark.timeout(120)
@FUZZ
@given(spec=chain_spec, fail=st.floats(0.0, 1.0))
def test_a_source_fault_comes_out_as_itself_and_a_resume_before_it_continues(spec, fail):
    n = spec["n"] + 1
    spec = {**spec, "n": n}
    fail_at = min(int(fail * n), n - 1)
    node, stage = build(spec, Source(n, fail_at=fail_at))
    out, state = [], None
    try:
        with pytest.raises(Upstream, match=f"upstream fault at item {fail_at}"):
            while True:
                state = torch_roundtrip(node.state_dict())  # the last one before the fault
                out.append(next(node))
    finally:
        close(node)
    check_counts(spec, out, stage, stage.stats.fresh_examples, whole=False)
    assert stage.stats.fresh_examples <= fail_at

    # The upstream recovers: a resume from the last state continues to the end, nothing lost.
    resumed, resumed_stage = build(spec, Source(n))
    resumed.reset(state)
    try:
        rest = list(resumed)
    finally:
        close(resumed)
    whole = out + rest
    check_counts(spec, whole, resumed_stage, n)
    assert set(whole) == set(range(n))
