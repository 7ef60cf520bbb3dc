"""adaptive_echo: fresh first, reuse only while upstream is late, clean threads, exact resume.

Timing is controlled with gates (the source yields an item only when the test releases it) or
with upstream sleeps far longer than a consumer step; no test asserts a tight timing.
"""

from __future__ import annotations

import collections
import gc
import itertools
import math
import threading
import time
import traceback

import numpy as np
import pytest
import torch
from conftest import SlowIterable, run_test_save_load_state, torch_roundtrip, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode

from dataecho.stages.adaptive import ANCHOR_EVERY, THREAD_PREFIX, AdaptiveEcho, adaptive_echo
from dataecho.stages.packing import unpack

pytestmark = pytest.mark.timeout(30)


def producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


class Gate:
    """A source that yields its next item only after the test releases it; counts reads."""

    def __init__(self, items) -> None:
        self.items = list(items)
        self.read = 0
        self._sem = threading.Semaphore(0)

    def release(self, n: int = 1) -> None:
        self._sem.release(n)

    def __iter__(self):
        for item in self.items:
            self._sem.acquire()
            self.read += 1
            yield item


def slow(n: int, delay: float):
    for i in range(n):
        time.sleep(delay)
        yield i


@pytest.fixture
def cleanup():
    """Register nodes and gates; afterwards open the gates, close the nodes, check threads."""
    things: list = []
    yield things
    for thing in things:
        if isinstance(thing, Gate):
            thing.release(len(thing.items) + 1)
    for thing in things:
        if isinstance(thing, AdaptiveEcho):
            assert thing.close(timeout=5.0)
    assert producer_threads() == []


def first_occurrences(values) -> list:
    return list(dict.fromkeys(values))


def test_fast_upstream_is_never_echoed(cleanup):
    node = adaptive_echo(list(range(200)), max_factor=8, queue_size=256)
    cleanup.append(node)
    node.reset()
    assert wait_until(lambda: producer_threads() == [])  # everything and the end marker are queued
    assert list(node) == list(range(200))
    s = node.stats
    assert (s.fresh_examples, s.examples_out, s.realized_factor) == (200, 200, 1.0)
    assert s.echoed_examples == 0 and s.stall_seconds == 0.0


@pytest.mark.parametrize("max_factor, cap", [(4, 4), (2.7, 2)])
def test_slow_upstream_echoes_up_to_max_factor(cleanup, max_factor, cap):
    node = adaptive_echo(slow(12, 0.03), max_factor=max_factor)
    cleanup.append(node)
    out = list(node)
    counts = collections.Counter(out)
    assert first_occurrences(out) == list(range(12))
    assert max(counts.values()) <= cap  # a hard limit, whatever the timing
    # The consumer is ~1000x faster than upstream, so nearly every item is used up.
    assert node.stats.realized_factor >= 0.6 * cap
    assert node.stats.fresh_examples == 12 and node.stats.examples_out == len(out)


def test_latest_policy_and_fresh_first(cleanup):
    gate = Gate(range(10))
    node = adaptive_echo(gate, max_factor=4, buffer_size=2, policy="latest")
    cleanup += [gate, node]
    node.reset()
    gate.release(3)
    assert wait_until(lambda: node.queued == 3)
    assert [next(node) for _ in range(5)] == [0, 1, 2, 2, 2]  # queued first, then reuse
    gate.release()
    assert wait_until(lambda: node.queued == 1)
    assert next(node) == 3  # a fresh item beats a reusable one (2 is still allowed)
    # 3 three more times, then 2 once more; 1 fell out of the 2-item buffer.
    assert [next(node) for _ in range(4)] == [3, 3, 3, 2]
    assert node.stats.stall_seconds == 0.0
    # Nothing may be reused now: the consumer stalls until upstream delivers.
    threading.Timer(0.3, gate.release).start()
    assert next(node) == 4
    assert node.stats.stall_seconds >= 0.1
    assert node.stats.wait_seconds >= node.stats.stall_seconds


def _reuses(cleanup, policy: str, seed: int) -> list[int]:
    """The 12 reuses of items 1-3 (cap 5, buffer 3) after 4 fresh items, upstream held back."""
    gate = Gate(range(10))
    node = adaptive_echo(gate, max_factor=5, buffer_size=3, policy=policy, seed=seed)
    cleanup += [gate, node]
    node.reset()
    gate.release(4)
    assert wait_until(lambda: node.queued == 4)
    assert [next(node) for _ in range(4)] == [0, 1, 2, 3]
    reuses = [next(node) for _ in range(12)]
    threading.Timer(0.2, gate.release).start()
    assert next(node) == 4  # all three used up: it waited for fresh data
    return reuses


def _uniform_run(cleanup, seed: int) -> list[int]:
    return _reuses(cleanup, "uniform", seed)


def test_uniform_policy(cleanup):
    reuses = _uniform_run(cleanup, seed=1)
    # Only the last 3 fresh items, each until its cap (4 reuses + 1 fresh = 5).
    assert collections.Counter(reuses) == {1: 4, 2: 4, 3: 4}
    assert len(set(reuses[:4])) >= 2  # "latest" would give 3, 3, 3, 3
    assert _uniform_run(cleanup, seed=1) == reuses  # seeded: the same draws


def test_fewest_policy_gives_every_buffered_item_a_copy_before_any_a_second(cleanup):
    reuses = _reuses(cleanup, "fewest", seed=2)
    # In rounds: each of the last 3 fresh items once (in a seeded random order), then again.
    assert [sorted(reuses[i : i + 3]) for i in range(0, 12, 3)] == [[1, 2, 3]] * 4
    assert _reuses(cleanup, "fewest", seed=2) == reuses  # seeded: the same order


def test_max_factor_one_never_reuses(cleanup):
    node = adaptive_echo(slow(5, 0.02), max_factor=1)
    cleanup.append(node)
    assert list(node) == [0, 1, 2, 3, 4]
    assert node.stats.realized_factor == 1.0 and node.stats.stall_seconds > 0


def test_end_of_source_drains_and_stops(cleanup):
    node = adaptive_echo(slow(6, 0.02), max_factor=3, queue_size=2)
    cleanup.append(node)
    out = list(node)
    assert first_occurrences(out) == list(range(6))
    assert producer_threads() == []  # the thread is gone as soon as the end is seen
    with pytest.raises(StopIteration):
        next(node)


def _exploding_source():
    yield 0
    yield 1
    yield 2
    raise ValueError("boom after 3")


@pytest.mark.parametrize("max_factor", [1, 3])
def test_upstream_exception_reaches_consumer(cleanup, max_factor):
    node = adaptive_echo(_exploding_source(), max_factor=max_factor)
    cleanup.append(node)
    got = []
    with pytest.raises(ValueError, match="boom after 3") as info:
        for item in node:
            got.append(item)
    assert first_occurrences(got) == [0, 1, 2]  # every item produced before the error
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_exploding_source" in frames  # the original traceback, from the thread
    if hasattr(info.value, "__notes__"):
        assert THREAD_PREFIX in info.value.__notes__[0]
    with pytest.raises(StopIteration):
        next(node)


def test_close_mid_stream_with_full_queue(cleanup):
    node = adaptive_echo(itertools.count(), max_factor=2, queue_size=4)
    cleanup.append(node)
    assert next(node) == 0
    assert wait_until(lambda: node.queued == 4)  # the thread now waits on a full queue
    start = time.monotonic()
    assert node.close()
    assert time.monotonic() - start < 2.0
    assert producer_threads() == []
    with pytest.raises(StopIteration):
        next(node)


def _sleepy_source(entered: threading.Event, reads: list, nap: float):
    reads.append(0)
    yield 0
    entered.set()
    time.sleep(nap)  # a source blocked in a call nothing can interrupt
    for i in itertools.count(1):
        reads.append(i)
        yield i


def test_close_while_source_sleeps(cleanup):
    entered, reads = threading.Event(), []
    node = adaptive_echo(_sleepy_source(entered, reads, 0.5), max_factor=2)
    cleanup.append(node)
    assert next(node) == 0
    assert entered.wait(5)
    start = time.monotonic()
    assert node.close()  # returns once the sleep ends; reads nothing more
    assert time.monotonic() - start < 4.0
    assert producer_threads() == []
    assert reads == [0, 1]


def test_close_with_timeout_leaves_thread_to_finish(cleanup):
    entered, reads = threading.Event(), []
    node = adaptive_echo(_sleepy_source(entered, reads, 1.5), max_factor=2)
    cleanup.append(node)
    next(node)
    assert entered.wait(5)
    start = time.monotonic()
    assert node.close(timeout=0.05) is False  # still inside the source's call
    assert time.monotonic() - start < 1.0
    assert wait_until(lambda: producer_threads() == [])  # and it exits when the call returns
    assert reads == [0, 1]


def test_context_manager_and_garbage_collection(cleanup):
    with adaptive_echo(itertools.count(), max_factor=2) as node:
        next(node)
    assert producer_threads() == []
    node = adaptive_echo(itertools.count(), max_factor=2, queue_size=2)
    next(node)
    del node
    gc.collect()
    assert wait_until(lambda: producer_threads() == [])


def test_reset_starts_a_new_epoch_with_one_thread(cleanup):
    node = adaptive_echo(list(range(30)), max_factor=1, queue_size=4)
    cleanup.append(node)
    assert [next(node) for _ in range(5)] == [0, 1, 2, 3, 4]
    node.reset()
    assert len(producer_threads()) == 1
    assert list(node) == list(range(30))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_factor": 0.5}, ValueError, r"max_factor must be >= 1.*got 0\.5"),
        ({"max_factor": math.inf}, ValueError, r"max_factor must be a finite.*got inf"),
        ({"max_factor": math.nan}, ValueError, r"max_factor must be a finite"),
        ({"max_factor": "2"}, TypeError, r"max_factor must be a real number.*got '2'"),
        ({"max_factor": 2, "buffer_size": 0}, ValueError, r"buffer_size must be >= 1, got 0"),
        ({"max_factor": 2, "buffer_size": 1.5}, TypeError, r"buffer_size must be an integer"),
        (
            {"max_factor": 2, "policy": "random"},
            ValueError,
            r"'latest', 'uniform', 'fewest', got 'random'",
        ),
        ({"max_factor": 2, "queue_size": 0}, ValueError, r"queue_size must be >= 1, got 0"),
        ({"max_factor": 2, "seed": -1}, ValueError, r"seed must be >= 0, got -1"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        adaptive_echo([1, 2], **kwargs)
    assert producer_threads() == []  # nothing started on a bad argument


@pytest.mark.parametrize("copy", [True, False])
def test_copies_never_alias(cleanup, copy):
    originals = [{"x": np.zeros(3), "t": torch.zeros(2)}, {"x": np.ones(3), "t": torch.ones(2)}]
    gate = Gate(originals)
    node = adaptive_echo(gate, max_factor=3, copy=copy)
    cleanup += [gate, node]
    gate.release()
    outs = []
    for _ in range(3):  # one fresh emission, then two reuses while upstream is gated
        out = next(node)
        if copy:
            assert (out["x"] == 0).all() and (out["t"] == 0).all()  # pristine on arrival
        out["x"] += 100  # the consumer works in place
        out["t"].add_(100)
        outs.append(out)
    if copy:
        assert len({id(o["x"]) for o in outs} | {id(originals[0]["x"])}) == 4
        assert (originals[0]["x"] == 0).all() and (originals[0]["t"] == 0).all()
    else:
        assert all(o is originals[0] for o in outs)  # copy=False: the same object
    assert node.stats.echoed_examples == 2


def _resume_and_check(node: AdaptiveEcho, make, before: list, n: int, cap: int) -> None:
    state = torch_roundtrip(node.state_dict())  # a real checkpoint round trip
    node.close()
    resumed = make()
    resumed.reset(state)
    after = list(resumed)
    resumed.close()
    new = [x for x in first_occurrences(after) if x not in set(before)]
    assert new == list(range(max(before) + 1, n))  # exactly the remainder, once each
    assert first_occurrences(before + after) == list(range(n))
    assert max(collections.Counter(before + after).values()) <= cap  # counts carried over
    assert resumed.stats.fresh_examples == n
    assert resumed.stats.examples_out == len(before) + len(after)


def test_resume_keeps_read_ahead_items(cleanup):
    def make():
        return adaptive_echo(list(range(60)), max_factor=4, buffer_size=2, queue_size=16)

    node = make()
    cleanup.append(node)
    node.reset()
    assert wait_until(lambda: node.queued == 16)
    before = [next(node) for _ in range(5)]
    assert before == [0, 1, 2, 3, 4] and node.queued >= 10  # the thread is well ahead
    _resume_and_check(node, make, before, 60, 4)


def test_resume_mid_echo_with_slow_upstream(cleanup):
    def make():
        return adaptive_echo(SlowIterable(40, 0.004), max_factor=3, buffer_size=2, policy="uniform")

    node = make()
    cleanup.append(node)
    before = [next(node) for _ in range(30)]
    _resume_and_check(node, make, before, 40, 3)


def test_resume_restores_reuse_buffer_and_counts(cleanup):
    def make(gate):
        return adaptive_echo(gate, max_factor=4, buffer_size=2, policy="latest")

    gate = Gate(range(10))
    node = make(gate)
    cleanup += [gate, node]
    node.reset()
    gate.release(3)
    assert wait_until(lambda: node.queued == 3)
    assert [next(node) for _ in range(4)] == [0, 1, 2, 2]
    state = torch_roundtrip(node.state_dict())
    assert unpack(state["buffer"]) == [1, 2]  # the last 2 fresh items
    assert state["counts"] == [1, 2]  # ... and how often each was emitted
    gate2 = Gate(range(10))
    gate2.release(3)  # lets the resumed source fast-forward past 0, 1, 2
    resumed = make(gate2)
    cleanup += [gate2, resumed]
    resumed.reset(state)
    # Upstream is gated, so it reuses what the checkpoint held, up to the caps: 2 twice more.
    assert [next(resumed) for _ in range(5)] == [2, 2, 1, 1, 1]
    threading.Timer(0.2, gate2.release).start()
    assert next(resumed) == 3  # then the first item not emitted before the checkpoint
    assert gate2.read == 4


def test_resume_is_exact_without_reuse():
    # max_factor=1 takes timing out of the stream, so resumes must replay it item for item,
    # at every position of two epochs, from in-memory and torch-loaded states.
    recorded = run_test_save_load_state(
        lambda: adaptive_echo(list(range(12)), max_factor=1, queue_size=3, seed=0),
        summary=lambda node: (node.stats.fresh_examples, node.stats.examples_out),
        new_epoch=lambda node: None,  # each for loop's iter() starts the next epoch
        end_may_start_next_epoch=True,
    )
    assert recorded == [list(range(12))] * 3
    gc.collect()
    assert wait_until(lambda: producer_threads() == [])


class PositionNode(BaseNode):
    """0..n-1 whose state is the position: a restore jumps there. Records every read."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.position, self.reads = n, 0, []

    def reset(self, initial_state=None) -> None:
        super().reset(initial_state)
        self.position = initial_state["position"] if initial_state else 0

    def next(self) -> int:
        if self.position >= self.n:
            raise StopIteration
        self.reads.append(self.position)
        self.position += 1
        return self.position - 1

    def get_state(self) -> dict:
        return {"position": self.position}


def test_resume_across_anchors_is_exact_and_rereads_less_than_one_anchor_interval():
    # The thread sends the source's state only with every ANCHOR_EVERY-th item: a resume
    # restores the last one and reads past the items emitted after it, at every position.
    n = 3 * ANCHOR_EVERY + 5
    recorded = run_test_save_load_state(
        lambda: adaptive_echo(list(range(n)), max_factor=1, queue_size=4, seed=0),
        positions=[0, 1, ANCHOR_EVERY - 1, ANCHOR_EVERY, ANCHOR_EVERY + 7, 3 * ANCHOR_EVERY + 4],
        new_epoch=lambda node: None,
        end_may_start_next_epoch=True,
    )
    assert recorded == [list(range(n))] * 3

    source = PositionNode(n)
    node = adaptive_echo(source, max_factor=1, queue_size=4, seed=0)
    taken = [next(node) for _ in range(ANCHOR_EVERY + 7)]
    state = torch_roundtrip(node.state_dict())
    node.close()
    assert state["skip"] == 7  # fresh items emitted after the anchor, the state after item 31
    assert state["source"] == {"position": ANCHOR_EVERY}
    resumed = adaptive_echo(PositionNode(n), max_factor=1, queue_size=4, seed=0)
    resumed.reset(state)
    assert resumed.replayed_reads == 7  # what a deferred count downstream must drop
    assert list(resumed) == list(range(len(taken), n))
    # From the anchor on: the 7 items emitted after it read again (not emitted), then the rest.
    assert resumed.source.reads == list(range(ANCHOR_EVERY, n))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 40),
    max_factor=st.sampled_from([1, 1.5, 2, 3, 5]),
    buffer_size=st.integers(1, 4),
    policy=st.sampled_from(["latest", "uniform", "fewest"]),
    queue_size=st.integers(1, 4),
)
def test_stream_invariants(n, max_factor, buffer_size, policy, queue_size):
    node = adaptive_echo(
        list(range(n)),
        max_factor=max_factor,
        buffer_size=buffer_size,
        policy=policy,
        queue_size=queue_size,
        seed=0,
    )
    out, latest = [], -1
    for x in node:
        if x > latest:
            assert x == latest + 1  # fresh items in order, none skipped
            latest = x
        else:
            assert x > latest - buffer_size  # reuse only from the last buffer_size fresh
        out.append(x)
    assert latest == n - 1
    assert max(collections.Counter(out).values(), default=0) <= math.floor(max_factor)
    assert node.stats.fresh_examples == n and node.stats.examples_out == len(out)
    assert producer_threads() == []


class Thirty(torch.utils.data.Dataset):
    """Example i is (a float tensor of i, label i), 30 of them."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "num_workers", "shuffle_buffer"),
    [("batch", 0, None), ("batch", 0, 4), ("batch", 1, None), ("batch", 1, 4), ("device", 0, 4)],
)
def test_batch_auto_counts_each_fresh_example_once_across_a_resume_anywhere(
    where, num_workers, shuffle_buffer
):
    # A resume reads the batches emitted since the reader's last anchor again, and drops
    # them: counted before the checkpoint, they must not count again in the resumed epoch.
    from dataecho import EchoingDataLoader

    def make() -> EchoingDataLoader:
        return EchoingDataLoader(
            Thirty(), batch_size=4, echo_factor="auto", max_echo_factor=2, where=where,
            echo_device="cpu" if where == "device" else None, shuffle=True,
            shuffle_buffer=shuffle_buffer, num_workers=num_workers, seed=0,
        )  # fmt: skip

    def ids(batches) -> set[int]:
        return {int(y) for _, ys in batches for y in ys}

    loader = make()
    head, states = [], [torch_roundtrip(loader.state_dict())]
    for batch in loader:
        head.append(batch)
        states.append(torch_roundtrip(loader.state_dict()))  # after each batch, and the end
    assert loader.stats.fresh_examples == 30 and ids(head) == set(range(30))
    states.append(torch_roundtrip(loader.state_dict()))
    for k, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(state)
        rest = list(resumed)
        epochs = resumed.epoch + 1  # resumed after the last batch: the rest is the next epoch
        at = (
            f"resumed after {k} of {len(head)} batches: {resumed.stats.fresh_examples} fresh "
            f"examples by epoch {resumed.epoch}"
        )
        assert resumed.stats.fresh_examples == 30 * epochs, at
        assert ids(rest if epochs > 1 else head[:k] + rest) == set(range(30)), at
