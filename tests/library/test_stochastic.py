"""Stochastic data echoing (dataecho.stages.stochastic)."""

from __future__ import annotations

import itertools
import math
import weakref
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import run_test_save_load_state
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho.schedules import constant, cosine_decreasing, cosine_increasing
from dataecho.stages.packing import unpack
from dataecho.stages.stochastic import StochasticEcho, stochastic_echo


def split_fresh(stream: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """For a stream over ``range(n)``: the fresh items in order, and each reuse as
    (item, how many fresh items back it was loaded: 0 = the latest)."""
    fresh: list[int] = []
    reuses: list[tuple[int, int]] = []
    for x in stream:
        if not fresh or x > fresh[-1]:
            fresh.append(x)
        else:
            reuses.append((x, fresh[-1] - x))
    return fresh, reuses


def summary(node: StochasticEcho) -> tuple[int, int, int]:
    return node.stats.fresh_examples, node.stats.examples_out, node._step


# --- reuse count and the buffer ---------------------------------------------------------------


@pytest.mark.parametrize(("p", "tol"), [(0.25, 0.15), (0.5, 0.05), (0.1, 0.5)])
def test_mean_reuse_count_is_one_over_p_over_20k_steps(p: float, tol: float) -> None:
    node = stochastic_echo(range(20_000), load_prob=p, buffer_size=16, seed=0)
    out = list(itertools.islice(node, 20_000))
    assert len(out) == node.stats.examples_out == 20_000
    fresh, _ = split_fresh(out)
    assert node.stats.fresh_examples == len(fresh)
    assert node.stats.realized_factor == 20_000 / len(fresh)
    assert abs(node.stats.realized_factor - 1 / p) < tol


@pytest.mark.parametrize("load_prob", [1.0, 1, constant(1.0)])
def test_p_one_never_reuses(load_prob: object) -> None:
    src = list(range(300))
    node = stochastic_echo(src, load_prob=load_prob, buffer_size=4, seed=1)
    assert list(node) == src
    assert node.stats.fresh_examples == node.stats.examples_out == 300


class Box:
    def __init__(self, i: int) -> None:
        self.i = i


class UniqueObjects:
    """A source of ``n`` new objects, each tracked by a weak reference."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.refs: list[weakref.ref] = []

    def __iter__(self) -> Iterator[Box]:
        for i in range(self.n):
            box = Box(i)
            self.refs.append(weakref.ref(box))
            yield box
            del box  # the generator frame must not keep it alive

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("buffer_size", [1, 5])
def test_buffer_holds_at_most_buffer_size_items(copy: bool, buffer_size: int) -> None:
    src = UniqueObjects(600)
    node = stochastic_echo(src, load_prob=0.3, buffer_size=buffer_size, seed=2, copy=copy)
    steps = 0
    for item in node:
        assert isinstance(item, Box)
        del item
        steps += 1
        # Exactly the last buffer_size fresh objects are alive: older ones were released.
        assert src.alive() == min(node.stats.fresh_examples, buffer_size)
        assert len(node._buffer) <= buffer_size
    assert steps > 1_000 and src.alive() == buffer_size
    assert len(unpack(node.state_dict()["buffer"])) == buffer_size


def test_reuses_come_uniformly_from_the_last_buffer_size_fresh_items() -> None:
    m = 4
    out = list(
        itertools.islice(
            stochastic_echo(range(10**6), load_prob=0.25, buffer_size=m, seed=3), 20_000
        )
    )
    fresh, reuses = split_fresh(out)
    assert fresh == list(range(len(fresh)))  # fresh items arrive in order, none skipped
    assert all(0 <= back < m for _, back in reuses)
    # Once the buffer is full, every slot is drawn about equally often.
    counts = Counter(back for x, back in reuses if x >= m)
    mean = sum(counts.values()) / m
    assert sorted(counts) == list(range(m))
    assert all(abs(c - mean) < 0.06 * mean for c in counts.values()), counts


def test_first_step_loads_and_stream_stops_at_first_missing_fresh_item() -> None:
    node = stochastic_echo([7, 8, 9], load_prob=1e-3, buffer_size=2, seed=4)
    out = list(itertools.islice(node, 50))
    # With p this small the source is barely touched: item 7 is loaded then reused.
    assert out[0] == 7 and set(out) == {7} and len(out) == 50
    assert list(stochastic_echo([], load_prob=0.5, buffer_size=2, seed=0)) == []
    # Once stopped, next() stays stopped until the next epoch (reset(), or a new for loop).
    node = stochastic_echo(range(5), load_prob=0.5, buffer_size=2, seed=5)
    assert sorted(set(node)) == [0, 1, 2, 3, 4]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(node)
    assert sorted(set(node)) == [0, 1, 2, 3, 4] and node.stats.fresh_examples == 10


# --- schedules --------------------------------------------------------------------------------


class Recorder:
    """A schedule that records every step it is asked about."""

    def __init__(self, k: int, after: float) -> None:
        self.k, self.after, self.steps = k, after, []

    def __call__(self, step: int) -> float:
        self.steps.append(step)
        return 1.0 if step < self.k else self.after


def test_schedule_switching_at_step_k_is_honoured() -> None:
    sched = Recorder(300, 0.2)
    node = stochastic_echo(range(10**6), load_prob=sched, buffer_size=8, seed=6)
    out = list(itertools.islice(node, 5_300))
    assert out[:300] == list(range(300))  # p = 1: no reuse before step k
    assert sched.steps == list(range(5_300))  # asked once per step, in order
    fresh_after = len(split_fresh(out[300:])[0])
    assert abs(5_000 / fresh_after - 5.0) < 0.4


def test_schedule_step_counts_across_epochs() -> None:
    sched = Recorder(0, 0.5)
    node = stochastic_echo(range(20), load_prob=sched, buffer_size=3, seed=7)
    first = list(node)
    node.reset()
    second = list(node)
    assert second[0] == 0  # a new epoch starts with an empty buffer
    assert sorted(set(second)) == list(range(20)) and second != first
    emitted = len(first) + len(second)
    # Each epoch asks once more for the step that found the source empty.
    assert sched.steps == [*range(len(first) + 1), *range(len(first), emitted + 1)]


@pytest.mark.parametrize("rising", [True, False])
def test_cosine_schedules_move_the_fresh_rate(rising: bool) -> None:
    sched = cosine_increasing(0.1, 1.0, 4_000) if rising else cosine_decreasing(1.0, 0.1, 4_000)
    out = list(
        itertools.islice(
            stochastic_echo(range(10**6), load_prob=sched, buffer_size=8, seed=8), 4_000
        )
    )
    early = len(split_fresh(out[:500])[0])
    late = len(split_fresh(out[-500:])[0])
    low, high = (early, late) if rising else (late, early)
    assert low < 100 < 450 < high


# --- determinism and copies -------------------------------------------------------------------


def test_same_seed_same_stream_different_seeds_differ() -> None:
    def run(seed: int | None) -> list[int]:
        return list(stochastic_echo(range(200), load_prob=0.5, buffer_size=4, seed=seed))

    assert run(11) == run(11)
    assert run(11) != run(12)
    unseeded = stochastic_echo(range(200), load_prob=0.5, buffer_size=4)
    out = list(unseeded)
    again = stochastic_echo(range(200), load_prob=0.5, buffer_size=4, seed=unseeded.seed)
    assert list(again) == out  # the drawn seed is kept, so the run can be replayed


def test_copies_protect_buffer_and_source_from_in_place_changes() -> None:
    src = [{"x": np.full(3, i), "t": torch.full((2,), float(i))} for i in range(50)]
    node = stochastic_echo(src, load_prob=0.3, buffer_size=4, seed=9)
    n = 0
    for item in node:
        assert item["x"][0] < 1_000 and item["t"][0] < 1_000  # nobody's change shows
        item["x"] += 1_000
        item["t"].add_(1_000)
        n += 1
    assert n > 100
    assert all(d["x"][0] == i and d["t"][0] == i for i, d in enumerate(src))


def test_copy_false_emits_the_buffered_objects_but_states_are_copies() -> None:
    src = [np.full(3, i) for i in range(40)]
    node = stochastic_echo(src, load_prob=0.3, buffer_size=4, seed=10, copy=False)
    out = list(itertools.islice(node, 60))
    assert all(any(o is s for s in src) for o in out)
    assert len({id(o) for o in out}) < len(out)  # some object really was emitted twice
    state = node.state_dict()
    for a in src:
        a += 1_000
    assert all(b[0] < 1_000 for b in unpack(state["buffer"]))


# --- argument errors --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, 2, math.nan, math.inf])
def test_bad_load_prob_value(bad: float) -> None:
    with pytest.raises(ValueError, match=rf"load_prob must be in \(0, 1\], got {bad!r}"):
        stochastic_echo(range(3), load_prob=bad, buffer_size=2)


@pytest.mark.parametrize("bad", ["0.5", None, [0.5], True])
def test_non_callable_non_number_load_prob(bad: object) -> None:
    with pytest.raises(
        TypeError,
        match=r"load_prob must be a probability in \(0, 1\].*got .*or a callable step",
    ):
        stochastic_echo(range(3), load_prob=bad, buffer_size=2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "exc"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("4", TypeError)]
)
def test_bad_buffer_size(bad: object, exc: type[Exception]) -> None:
    with pytest.raises(exc, match=f"buffer_size must be .*got {bad!r}"):
        stochastic_echo(range(3), load_prob=0.5, buffer_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "exc"),
    [
        (1.5, ValueError),
        (0.0, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
        (None, TypeError),
        ("0.5", TypeError),
    ],
)
def test_bad_schedule_output_names_step_and_value(value: object, exc: type[Exception]) -> None:
    node = stochastic_echo(
        range(100), load_prob=lambda t: 0.5 if t < 5 else value, buffer_size=2, seed=0
    )
    assert len(list(itertools.islice(node, 5))) == 5
    with pytest.raises(exc, match=rf"returned {value!r}.* at step 5"):
        next(node)


# --- resume -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("load_prob", "buffer_size"),
    [(0.3, 3), (0.5, 1), (cosine_decreasing(0.6, 0.2, 40), 4)],
)
def test_resumes_exactly_at_every_position(load_prob: object, buffer_size: int) -> None:
    recorded = run_test_save_load_state(
        lambda: stochastic_echo(
            list(range(16)), load_prob=load_prob, buffer_size=buffer_size, seed=12
        ),
        summary=summary,
        end_may_start_next_epoch=True,  # a state taken after the end resumes as ended
    )
    assert all(len(epoch) > 16 for epoch in recorded)
    assert recorded[0] != recorded[1]


@pytest.mark.timeout(60)
def test_resumes_with_tensor_items() -> None:
    def factory() -> StochasticEcho:
        src = [torch.full((2,), float(i)) for i in range(12)]
        return stochastic_echo(src, load_prob=0.4, buffer_size=3, seed=13)

    run_test_save_load_state(
        factory, summary=summary, new_epoch=lambda node: None, end_may_start_next_epoch=True
    )


# --- properties -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None)
@given(
    probs=st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=1, max_size=5),
    scheduled=st.booleans(),
    buffer_size=st.integers(1, 8),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32),
)
def test_counts_add_up_every_item_emitted_and_no_hang(
    probs: list[float], scheduled: bool, buffer_size: int, n: int, seed: int
) -> None:
    load_prob = (lambda t: probs[t % len(probs)]) if scheduled else probs[0]
    node = stochastic_echo(range(n), load_prob=load_prob, buffer_size=buffer_size, seed=seed)
    cap = 100_000
    out = list(itertools.islice(node, cap))
    assert len(out) < cap  # the stream ended by itself
    fresh, reuses = split_fresh(out)
    assert fresh == list(range(n))  # every source item, once each as fresh, in order
    assert all(back < buffer_size for _, back in reuses)
    assert node.stats.fresh_examples == n and node.stats.examples_out == len(out)
    assert len(out) == n + len(reuses)
    with pytest.raises(StopIteration):
        next(node)  # and it stays ended
