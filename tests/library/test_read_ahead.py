"""read_ahead: a thread reads ahead in chunks; same items, exact resume, original errors, stops."""

from __future__ import annotations

import collections
import math
import threading
import time
import traceback

import numpy as np
import pytest
import torch
from conftest import assert_same_stream, run_test_save_load_state, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from test_loader import add_noise
from torch.utils.data import Dataset
from torchdata.nodes import IterableWrapper

from dataecho import EchoingDataLoader
from dataecho.loader.read_ahead import CHUNK, read_ahead, stop_read_ahead
from dataecho.loader.reading import IndexedReader
from dataecho.loader.streams.base import PositionReader

# One chunk of 1, one partial chunk, one whole chunk, and several chunks (40 -> 3 x 16).
EXAMPLES = (1, 5, 16, 40)


def raise_deep_inside(i: int, raised: list[BaseException]) -> None:
    error = KeyError(f"record {i} is corrupt")
    raised.append(error)
    raise error


class Records(Dataset):
    """Record i is i. Counts its reads; can fail at one index, or hold one read (by number)
    until ``release`` is set or ``hold_seconds`` pass; once ``release_after`` reads have
    happened, ``release`` is set."""

    def __init__(
        self,
        n: int,
        *,
        fail_at: int | None = None,
        hold_read: int | None = None,
        hold_seconds: float = 20.0,
        release_after: int | None = None,
    ) -> None:
        self.n, self.fail_at = n, fail_at
        self.hold_read, self.hold_seconds = hold_read, hold_seconds
        self.release_after = release_after
        self.reads = 0
        self.release = threading.Event()
        self.raised: list[BaseException] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.reads += 1  # one reader thread at a time when read_ahead is correct
        if self.release_after is not None and self.reads >= self.release_after:
            self.release.set()
        if self.reads == self.hold_read:
            self.release.wait(self.hold_seconds)
        if i == self.fail_at:
            raise_deep_inside(i, self.raised)
        return i


def reader(dataset: Dataset) -> IndexedReader:
    """The pipeline's own map-style reader (one worker, in order)."""
    return IndexedReader(dataset, np.arange(len(dataset)))


class SlowNumbers(Dataset):
    """Example i is (a float tensor filled with i, label i); each read sleeps ``delay`` s."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.full((3,), float(i)), i


def threads_left(before: set[threading.Thread], timeout: float = 10.0) -> set[threading.Thread]:
    """Threads started since ``before`` still alive after waiting up to ``timeout`` s for them."""
    wait_until(lambda: not set(threading.enumerate()) - before, timeout)
    return set(threading.enumerate()) - before


def most_reads(consumed: int, examples: int, n: int) -> int:
    """Reads allowed once ``consumed`` items were taken: the chunks handed over so far plus
    ``examples`` rounded up to whole chunks (the last one possibly still being read)."""
    chunk = min(CHUNK, examples)
    return min(n, (math.ceil(consumed / chunk) + math.ceil(examples / chunk)) * chunk)


# --- the node alone -------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 70), examples=st.sampled_from(EXAMPLES) | st.integers(1, 60))
def test_yields_exactly_the_source_in_order(n, examples):
    node = read_ahead(IterableWrapper(range(n)), examples)
    assert list(node) == list(range(n))
    node.reset(None)  # the next epoch reads it all again
    assert list(node) == list(range(n))


@pytest.mark.parametrize("examples", EXAMPLES)
def test_map_style_reader_read_ahead_in_order(examples):
    assert list(read_ahead(reader(Records(37)), examples)) == list(range(37))


def test_zero_returns_the_source_itself():
    source = IterableWrapper(range(3))
    assert read_ahead(source, 0) is source
    stop_read_ahead(source)  # not a read-ahead node: nothing to stop
    assert list(source) == [0, 1, 2]


# --- exact resume ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("examples", "kind"), [(k, "iterable") for k in EXAMPLES] + [(5, "map-style")]
)
def test_resumes_exactly_at_every_position(examples, kind):
    n = 23  # not a multiple of any chunk size: a partial last chunk
    if kind == "iterable":
        factory = lambda: read_ahead(IterableWrapper(range(n)), examples)  # noqa: E731
    else:
        factory = lambda: read_ahead(reader(Records(n)), examples)  # noqa: E731
    # Every position of two epochs, after the end too, in memory and through torch.save.
    recorded = run_test_save_load_state(factory)
    assert recorded == [list(range(n))] * 2


def test_a_source_with_a_cheap_state_resumes_past_what_was_handed_on_reading_none_again():
    # A streaming library's reader keeps a position (CHEAP_STATE): the read-ahead takes its
    # state after each item, so a resume fetches nothing handed on before the checkpoint.
    fetched: list[int] = []
    make = lambda: read_ahead(PositionReader(range(40), lambda k: fetched.append(k) or k), 16)  # noqa: E731
    node = make()
    node.reset()
    got = [next(node) for _ in range(21)]  # into the second chunk of 16
    state = node.state_dict()
    fetched.clear()
    resumed = make()
    resumed.reset(state)
    assert got + list(resumed) == list(range(40))
    assert min(fetched) == 21, "no item before the checkpoint read again"
    assert run_test_save_load_state(make) == [list(range(40))] * 2


# --- failures -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("examples", EXAMPLES)
@pytest.mark.parametrize("fail_at", [0, 7, 37])
def test_source_failure_reaches_consumer_as_the_original_exception(examples, fail_at):
    before = set(threading.enumerate())
    records = Records(60, fail_at=fail_at)
    got = []
    with pytest.raises(KeyError, match=f"record {fail_at} is corrupt") as info:
        for item in read_ahead(reader(records), examples):
            got.append(item)
    assert got == list(range(fail_at))  # everything before the failure, in order
    assert info.value is records.raised[0]  # the object itself, not a re-wrapped copy
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "raise_deep_inside" in frames and "__getitem__" in frames
    assert threads_left(before) == set()  # the reader ended at the failure ...
    assert records.reads == fail_at + 1  # ... and read nothing past it


# --- stopping -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_stop_read_ahead_ends_its_thread():
    before = set(threading.enumerate())
    node = read_ahead(IterableWrapper(range(10**6)), 40)
    stop_read_ahead(node)  # never started: nothing to stop
    assert next(node) == 0
    assert set(threading.enumerate()) - before  # the reader runs (so the check below can fail)
    stop_read_ahead(node)
    assert threads_left(before) == set()
    stop_read_ahead(node)  # twice is fine


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read_ahead_examples", [None, 0])
def test_loader_close_mid_epoch_leaves_no_thread(read_ahead_examples):
    before = set(threading.enumerate())
    loader = EchoingDataLoader(SlowNumbers(400, delay=0.001), batch_size=8, echo_factor=2,
                               where="after_augment", num_workers=0, seed=0,
                               read_ahead=read_ahead_examples)  # fmt: skip
    it = iter(loader)
    next(it)
    # The default reads ahead on a thread of this process; 0 reads in step, with no thread.
    assert bool(set(threading.enumerate()) - before) == (read_ahead_examples is None)
    loader.close()
    assert threads_left(before) == set()


@pytest.mark.timeout(60)
def test_stopped_reader_reads_nothing_after_the_read_in_flight():
    before = set(threading.enumerate())
    records = Records(100, hold_read=5, hold_seconds=1.0)  # read 5 is slow: 1 s
    node = read_ahead(reader(records), 16)
    node.reset(None)
    assert wait_until(lambda: records.reads == 5)
    stop_read_ahead(node)
    records.release.set()
    assert threads_left(before) == set()
    assert records.reads == 5


@pytest.mark.timeout(60)
def test_reset_while_a_read_is_in_flight_gives_the_whole_new_epoch():
    # Read 5 (item 4) is held until the new epoch's reader has read a chunk (read 21), or 3 s.
    before = set(threading.enumerate())
    records = Records(100, hold_read=5, hold_seconds=3.0, release_after=21)
    node = read_ahead(reader(records), 16)
    node.reset(None)
    assert wait_until(lambda: records.reads == 5)
    first_reader = set(threading.enumerate()) - before
    node.reset(None)  # a new epoch
    # Let the first reader end before consuming: the new one waits for the consumer meanwhile,
    # so whatever the first reader still reads is lost to the new epoch, not raced for.
    assert wait_until(lambda: not any(t.is_alive() for t in first_reader))
    assert list(node) == list(range(100))


# --- through EchoingDataLoader --------------------------------------------------------------


def epochs_of(loader: EchoingDataLoader, epochs: int = 2) -> list[list]:
    return [list(loader) for _ in range(epochs)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_stream_is_the_same_with_and_without_read_ahead(num_workers):
    def make(read_ahead_examples):
        return EchoingDataLoader(SlowNumbers(40, delay=0.002), batch_size=8, echo_factor=2,
                                 where="before_augment", transform=add_noise, shuffle=True,
                                 shuffle_buffer=4, num_workers=num_workers, seed=3,
                                 read_ahead=read_ahead_examples)  # fmt: skip

    ahead, in_step = make(None), make(0)
    assert (ahead.options.read_ahead, in_step.options.read_ahead) == (8, 0)
    got, want = epochs_of(ahead), epochs_of(in_step)
    for epoch, (g, w) in enumerate(zip(got, want, strict=True)):
        # Same order and the same augmentation draws: reading ahead changes only when.
        assert_same_stream(g, w, f"epoch {epoch}, read_ahead=8 vs 0")
        counts = collections.Counter(int(y) for _, ys in g for y in ys)
        assert counts == dict.fromkeys(range(40), 2)  # every example exactly twice
        copies = [x for xs, ys in g for x, y in zip(xs, ys, strict=True) if y == 0]
        assert not torch.equal(copies[0], copies[1])  # the copies were augmented apart
    assert got[0][0][1].tolist() != got[1][0][1].tolist()  # a new order in epoch 1
    assert ahead.stats.fresh_examples == in_step.stats.fresh_examples == 80


@pytest.mark.timeout(60)
def test_loader_with_read_ahead_resumes_exactly():
    def make():
        return EchoingDataLoader(SlowNumbers(20, delay=0.0), batch_size=4, echo_factor=2,
                                 transform=add_noise, shuffle=True, seed=1)  # fmt: skip

    assert make().options.read_ahead == 4
    recorded = run_test_save_load_state(
        make,
        positions=[0, 1, 4, 7],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
    )
    assert all(len(epoch) == 10 for epoch in recorded)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"echo_factor": 2}, 8),
        ({"echo_factor": 2.5}, 8),
        ({"echo_factor": 2, "where": "after_augment"}, 8),
        ({"echo_factor": "auto"}, 0),  # its own reader reads ahead
        ({"echo_factor": "auto", "where": "batch"}, 0),
        ({"echo_factor": 2, "where": "batch"}, 0),
        ({"echo_factor": 1}, 0),
        ({}, 0),
        ({"echo_factor": 2, "read_ahead": 0}, 0),
        ({"echo_factor": 1, "read_ahead": 3}, 3),
        ({"echo_factor": 2, "read_ahead": 100}, 100),
    ],
)
def test_read_ahead_default_is_one_batch_only_for_fixed_example_echoing(kwargs, expected):
    loader = EchoingDataLoader(SlowNumbers(4, delay=0.0), batch_size=8, **kwargs)
    assert loader.options.read_ahead == expected


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (-1, ValueError, ["read_ahead", "-1", ">= 0", "0 reads in step"]),
        (
            1.5,
            TypeError,
            ["read_ahead", "1.5", "integer in 0..16777216", "float", "0 reads in step"],
        ),
        ("x", TypeError, ["read_ahead", "'x'", "integer in 0..16777216", "str", "0 reads in step"]),
        (True, TypeError, ["read_ahead", "True", "integer in 0..16777216", "bool"]),
    ],
)
def test_bad_read_ahead_names_value_range_and_fix(value, error, words):
    with pytest.raises(error) as info:
        EchoingDataLoader(SlowNumbers(4, delay=0.0), batch_size=4, echo_factor=2, read_ahead=value)
    for word in words:
        assert word in str(info.value)


# --- overlap, shown by counts ---------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("examples", EXAMPLES)
def test_reader_runs_ahead_of_a_waiting_consumer_up_to_its_bound(examples):
    n = 200
    records = Records(n)
    node = read_ahead(reader(records), examples)
    node.reset(None)  # starts the reader; the consumer holds off
    consumed = 0
    for target in (0, 1, 20):
        while consumed < target:
            assert next(node) == consumed
            consumed += 1
        bound = most_reads(consumed, examples, n)
        assert wait_until(lambda b=bound: records.reads >= b), (records.reads, bound)
        # A reader past its bound would show here; waiting longer cannot make this fail.
        time.sleep(0.05)
        assert records.reads == bound > consumed
    assert list(node) == list(range(consumed, n))
    assert records.reads == n  # read ahead, never twice


@pytest.mark.timeout(60)
def test_consumer_takes_read_items_while_a_read_is_in_flight():
    records = Records(64, hold_read=21)  # read 21 (item 20) waits until released
    node = read_ahead(reader(records), 16)
    assert next(node) == 0  # takes chunk 0 (items 0-15); the reader starts chunk 1
    assert wait_until(lambda: records.reads == 21)  # the reader is inside the held read
    assert [next(node) for _ in range(15)] == list(range(1, 16))  # taken meanwhile
    assert records.reads == 21
    records.release.set()
    assert list(node) == list(range(16, 64))


def test_a_state_of_another_version_is_refused_naming_the_way_out():
    node = read_ahead(IterableWrapper(range(40)), 16)
    next(node)
    state = node.state_dict()
    old = {"source": state["source"], "batch_idx": state["place"]}  # the previous layout
    fresh = read_ahead(IterableWrapper(range(40)), 16)
    with pytest.raises(ValueError, match="batch_idx, source.*start the run anew"):
        fresh.reset(old)
    stop_read_ahead(node)
    stop_read_ahead(fresh)
