"""The shuffle buffer (dataecho.stages.shuffle_buffer) alone and after an echo stage."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from conftest import run_test_save_load_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import Loader

from dataecho.stages import echo, shuffle


@pytest.mark.parametrize("buffer_size", [0, 1, 2, 3, 7, 99, 100, 101, 1000])
def test_drains_everything(buffer_size: int) -> None:
    src = list(range(100))
    node = shuffle(src, buffer_size, seed=0)
    out = list(node)
    assert sorted(out) == src
    assert node.stats.fresh_examples == node.stats.examples_out == 100


def test_drains_duplicates_and_empty_sources() -> None:
    src = [1, 1, 2, 2, 2, 3]
    assert Counter(shuffle(src, 4, seed=0)) == Counter(src)
    assert list(shuffle([], 4, seed=0)) == []


@pytest.mark.parametrize("buffer_size", [0, 1])
def test_buffer_zero_or_one_passes_through(buffer_size: int) -> None:
    src = list(range(50))
    assert list(shuffle(src, buffer_size, seed=3)) == src


@pytest.mark.parametrize("seed", range(5))
def test_actually_reorders(seed: int) -> None:
    src = list(range(100))
    out = list(shuffle(src, 10, seed=seed))
    assert out != src
    # Most items move: a buffer of 10 keeps an item in place with low probability.
    assert sum(a != b for a, b in zip(out, src, strict=True)) > 50


@pytest.mark.parametrize("buffer_size", [2, 5, 16])
def test_no_item_leaves_before_it_entered_the_buffer(buffer_size: int) -> None:
    # Item i enters once i - buffer_size + 1 items have left: it cannot come out earlier.
    out = list(shuffle(range(200), buffer_size, seed=1))
    assert all(pos >= item - buffer_size + 1 for pos, item in enumerate(out))


def test_buffer_larger_than_source_is_a_full_shuffle() -> None:
    src = list(range(100))
    out = list(shuffle(src, 10_000, seed=2))
    assert sorted(out) == src
    # A full shuffle moves items far: with a window of 10_000 the late items can come first.
    assert max(out[:10]) >= 50


def test_new_epoch_new_order_same_seed_same_orders() -> None:
    src = list(range(100))
    node = shuffle(src, 16, seed=4)
    first = list(node)
    node.reset(None)
    second = list(node)
    assert first != second and sorted(second) == src
    again = shuffle(src, 16, seed=4)
    assert list(again) == first
    again.reset(None)
    assert list(again) == second
    assert list(shuffle(src, 16, seed=5)) != first


@pytest.mark.parametrize("bad", [-1, -100])
def test_negative_buffer_error_names_value_and_fix(bad: int) -> None:
    with pytest.raises(ValueError) as info:
        shuffle(range(3), bad)
    msg = str(info.value)
    assert f"buffer_size must be >= 0, got {bad}" in msg
    assert "use 0 (or 1) for no shuffling" in msg


@pytest.mark.parametrize("bad", [2.5, "8", None, True])
def test_non_integer_buffer_error(bad: object) -> None:
    with pytest.raises(TypeError) as info:
        shuffle(range(3), bad)  # type: ignore[arg-type]
    msg = str(info.value)
    assert (
        f"buffer_size must be an integer in 0..16777216, got {bad!r} of type {type(bad).__name__}"
        in msg
    )


# --- resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("buffer_size", [0, 1, 4, 64])
def test_resume_at_every_position(buffer_size: int) -> None:
    rec = run_test_save_load_state(
        lambda: shuffle(list(range(20)), buffer_size, seed=8),
        summary=lambda n: (n.stats.fresh_examples, n.stats.examples_out),
        end_may_start_next_epoch=True,  # a state taken after the end resumes as ended
    )
    assert sorted(rec[0]) == sorted(rec[1]) == list(range(20))


def test_resume_after_echo_at_every_position() -> None:
    rec = run_test_save_load_state(
        lambda: shuffle(echo(list(range(12)), 2.5, seed=1), 8, seed=2),
        summary=lambda n: (n.stats.examples_out, n.source.stats.fresh_examples),
        new_epoch=lambda node: None,  # each for loop's iter() starts the next epoch
        end_may_start_next_epoch=True,
    )
    assert rec[0] != rec[1]


def test_resume_through_a_torchdata_loader() -> None:
    # torchdata's Loader resumes a state taken at an epoch's end as the next epoch.
    rec = run_test_save_load_state(
        lambda: Loader(shuffle(echo(list(range(8)), 2.5, seed=1), 4, seed=2)),
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        end_may_start_next_epoch=True,
    )
    assert all(sorted(set(r)) == list(range(8)) for r in rec)


# --- properties of shuffle(echo(...)) ------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    factor=st.floats(1, 6),
    buffer_size=st.integers(0, 40),
    n=st.integers(0, 60),
    seed=st.integers(0, 2**63 - 1),
)
@pytest.mark.timeout(60)
def test_echo_then_shuffle_properties(factor: float, buffer_size: int, n: int, seed: int) -> None:
    inner = echo(range(n), factor, seed=seed)
    node = shuffle(inner, buffer_size, seed=seed)
    # Bounded read: a stream that does not end within the most items it may emit is a hang.
    most = n * math.ceil(factor)
    out = list(itertools.islice(node, most + 1))
    assert len(out) <= most
    with pytest.raises(StopIteration):
        next(node)
    counts = Counter(out)
    assert set(counts) == set(range(n))
    assert all(math.floor(factor) <= c <= math.ceil(factor) for c in counts.values())
    # Counts add up through both stages.
    assert inner.stats.fresh_examples == n
    assert inner.stats.examples_out == node.stats.fresh_examples == node.stats.examples_out
    assert node.stats.examples_out == len(out)
    assert inner.stats.echoed_examples == len(out) - n


@settings(max_examples=25, deadline=None)
@given(
    factor=st.floats(1, 6),
    buffer_size=st.integers(0, 20),
    n=st.integers(0, 15),
    k=st.integers(0, 100),
    seed=st.integers(0, 2**32),
)
@pytest.mark.timeout(60)
def test_echo_then_shuffle_resumes_at_random_points(
    factor: float, buffer_size: int, n: int, k: int, seed: int
) -> None:
    run_test_save_load_state(
        lambda: shuffle(echo(list(range(n)), factor, seed=seed), buffer_size, seed=seed + 1),
        positions=[k],
    )


def test_a_drain_emits_the_buffer_and_the_copies_due_and_a_resume_the_rest() -> None:
    def make():
        return shuffle(echo(list(range(20)), 3, seed=0), 7, seed=1)

    node = make()
    head = [next(node) for _ in range(5)]  # 7 + 5 copies taken from the echo stage: 4 items
    node.drain()
    tail = list(node)
    assert node.drained
    assert Counter(head + tail) == {i: 3 for i in range(4)}  # every copy of what was read
    resumed = make()
    resumed.reset(node.state_dict())
    assert Counter(head + tail + list(resumed)) == {i: 3 for i in range(20)}
