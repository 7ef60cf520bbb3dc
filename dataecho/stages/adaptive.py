"""Adaptive echoing: echo only while fresh data is late.

A background thread reads ``source`` into a bounded queue and blocks only when it is full, so
echoing never slows upstream. ``next()`` returns a fresh item when one is ready; otherwise it
re-emits one of the last ``buffer_size`` fresh items rather than wait. No item is emitted more
than ``max_factor`` times (the fresh emission counts); when nothing may be reused the consumer
waits for upstream, and that wait is ``stats.stall_seconds``.

State: the thread reads ahead, so the live source is past items not yet emitted. The thread
sends ``source.state_dict()`` along with each item it reads; the stage's state holds the one that
came with the last item emitted fresh, plus the reuse buffer and its emission counts. A resume
re-reads the items that were queued but not emitted, once: no fresh item is lost or doubled
(the replay is not timing-identical). Cost: one ``state_dict()`` per item, on the thread.

``close()`` (also ``with``, ``reset()`` and garbage collection) stops the thread: at once if it
waits on the queue, else when the source call in progress returns (Python cannot interrupt it).
Once the stream ended, the next ``iter()`` (a new ``for`` loop) starts the next epoch, with a
new thread, like ``reset()``.

Example:
    >>> import time
    >>> def slow(n):
    ...     for i in range(n):
    ...         time.sleep(0.05)  # upstream slower than the consumer
    ...         yield i
    >>> with adaptive_echo(slow(4), max_factor=3) as stream:
    ...     out = list(stream)
    >>> sorted(set(out)) == [0, 1, 2, 3] and max(out.count(i) for i in range(4)) <= 3
    True
"""

from __future__ import annotations

import collections
import itertools
import math
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from dataecho import _validate
from dataecho.stages.base import Stage
from dataecho.stages.copying import copy_item
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_ADAPTIVE

T = TypeVar("T")

POLICIES = ("latest", "uniform", "fewest")
THREAD_PREFIX = "dataecho-adaptive"
_POLL_S = 0.1  # how often a blocked put/get rechecks for shutdown; only a safety net
_END, _ERROR = object(), object()  # queue markers: source exhausted / source raised
_thread_ids = itertools.count()


class _Producer:
    """The reader thread. It holds no reference to the stage, so dropping the stage stops it."""

    def __init__(self, source: BaseNode[Any], queue_size: int) -> None:
        self.source = source
        self.queue: queue.Queue[tuple[Any, Any]] = queue.Queue(maxsize=queue_size)
        self.stopping = threading.Event()
        name = f"{THREAD_PREFIX}-{next(_thread_ids)}"
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                item = next(self.source)
                entry = (item, self.source.state_dict())  # the state *after* this item
            except StopIteration:
                entry = (_END, None)
            except BaseException as exc:  # every failure belongs to the consumer
                entry = (_ERROR, exc)
            while not self.stopping.is_set():  # blocks only while the queue is full
                try:
                    self.queue.put(entry, timeout=_POLL_S)
                    break
                except queue.Full:
                    pass
            if self.stopping.is_set() or entry[0] is _END or entry[0] is _ERROR:
                return

    def stop(self, timeout: float | None) -> bool:
        """Ask the thread to stop and wait up to ``timeout``; True once it has exited."""
        self.stopping.set()
        try:  # emptying the queue wakes a thread blocked on put right away
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        return not self.thread.is_alive()


class AdaptiveEcho(Stage[T]):
    """Fresh items first, reuse only while upstream is late; see :func:`adaptive_echo`."""

    STAGE_ID = STAGE_ADAPTIVE

    def __init__(
        self,
        source: Iterable[T],
        *,
        max_factor: float,
        buffer_size: int = 1,
        policy: str = "latest",
        seed: int | None = None,
        copy: bool = True,
        queue_size: int = 16,
    ) -> None:
        self.max_factor = _validate.echo_factor(max_factor, name="max_factor")
        hint = "the reuse buffer keeps the last buffer_size fresh items; 1 reuses only the latest"
        self.buffer_size = _validate.positive_int(buffer_size, name="buffer_size", hint=hint)
        self.policy = _validate.one_of(policy, POLICIES, name="policy")
        hint = "the read-ahead queue needs room for at least one item, e.g. queue_size=16"
        self.queue_size = _validate.positive_int(queue_size, name="queue_size", hint=hint)
        super().__init__(source, seed=_validate.seed(seed))
        self.copy = bool(copy)
        self._limit = math.floor(self.max_factor)  # emissions allowed per item, fresh one included
        self._buffer: collections.deque[list[Any]] = collections.deque(maxlen=self.buffer_size)
        self._producer: _Producer | None = None
        self._source_state: Any = None  # source state after the last item emitted fresh
        self._done = False  # the source ended (or raised) and everything was emitted
        self._closed = False

    @property
    def queued(self) -> int:
        """Entries read ahead and waiting in the queue (a snapshot, for monitoring)."""
        return self._producer.queue.qsize() if self._producer is not None else 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        self.close()  # the source must be idle before it is reset
        super().reset(initial_state)
        self._closed = False
        self._source_state = self._source_state_now()
        if not self._done and not self._ended:  # a resumed end reads on only in the next epoch
            self._producer = _Producer(self.source, self.queue_size)

    def _start_epoch(self) -> None:
        self._buffer.clear()
        self._done = False

    def next(self) -> T:
        if self._done or self._closed or self._producer is None:
            raise StopIteration
        try:
            item, payload = self._producer.queue.get_nowait()  # fresh items always first
        except queue.Empty:
            allowed = [entry for entry in self._buffer if entry[1] < self._limit]
            if allowed:
                if self.policy == "fewest":  # copies spread evenly: a 2nd before any 3rd
                    fewest = min(entry[1] for entry in allowed)
                    allowed = [entry for entry in allowed if entry[1] == fewest]
                chosen = allowed[-1] if self.policy == "latest" else self._rng.choice(allowed)
                chosen[1] += 1
                self.stats.items_out += 1
                return copy_item(chosen[0]) if self.copy else chosen[0]
            item, payload = self._wait()
        if item is _END or item is _ERROR:
            self._done = True
            name = self._producer.thread.name
            self.close()  # the thread has returned already; this reaps it
            if item is _END:
                raise StopIteration
            if hasattr(payload, "add_note"):  # Python >= 3.11
                payload.add_note(f"(raised by adaptive_echo's source in thread {name!r})")
            raise payload  # the original object: its traceback still shows the source's frames
        self._source_state = payload
        self.stats.fresh_items += 1
        self.stats.items_out += 1
        if self._limit < 2:
            return item
        self._buffer.append([item, 1])
        # The buffer keeps the original pristine; every emission is its own copy.
        return copy_item(item) if self.copy else item

    def _wait(self) -> tuple[Any, Any]:
        """Block for the next queue entry. Only called when nothing may be reused: a stall."""
        producer, start = self._producer, time.perf_counter()
        assert producer is not None
        try:
            while True:
                try:
                    return producer.queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if not producer.thread.is_alive() and producer.queue.empty():
                        raise StopIteration from None  # closed from another thread
        finally:
            waited = time.perf_counter() - start
            self.stats.wait_seconds += waited
            self.stats.stall_seconds += waited

    def get_state(self) -> dict[str, Any]:
        # Not Stage.get_state: the live source belongs to the reader thread and is ahead.
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "source": copy_item(self._source_state),
            "rng": self._rng.getstate(),
            "stats": self.stats.state_dict(),
            "ended": self._ended,
            "buffer": pack([item for item, _ in self._buffer]),
            "counts": [count for _, count in self._buffer],
            "done": self._done,
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._buffer.clear()
        items = unpack(state["buffer"])
        self._buffer.extend([item, int(c)] for item, c in zip(items, state["counts"], strict=True))
        self._done = bool(state["done"])

    def close(self, timeout: float | None = None) -> bool:
        """Stop the reader thread; True once it has exited (``timeout`` None: wait for that).

        A thread inside a source call stops when the call returns. ``reset()`` starts anew.
        """
        self._closed = True
        if self._producer is not None and self._producer.stop(timeout):
            self._producer = None  # a thread still running stays referenced: reset() waits
        return self._producer is None

    def __enter__(self) -> AdaptiveEcho[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        producer = getattr(self, "_producer", None)
        if producer is not None:
            producer.stop(timeout=0)  # never block garbage collection; the thread exits soon


def adaptive_echo(
    source: Iterable[T],
    *,
    max_factor: float,
    buffer_size: int = 1,
    policy: str = "latest",
    seed: int | None = None,
    copy: bool = True,
    queue_size: int = 16,
) -> AdaptiveEcho[T]:
    """Read ``source`` on a background thread; reuse recent items only while fresh ones are late.

    Args:
        source: any iterable or torchdata node; read on one background thread.
        max_factor: most emissions of one item, fresh one included (floor of it; 1: never reuse).
        buffer_size: how many of the latest fresh items may be reused.
        policy: ``"latest"`` reuses the newest item still allowed, ``"uniform"`` a random one,
            ``"fewest"`` a random one among those emitted fewest times so far (copies spread
            evenly over the buffer, as a fixed factor spreads them).
        seed: seed of the random draws (None: fresh entropy, recorded in the state).
        copy: emit independent copies (see :mod:`dataecho.stages.copying`).
        queue_size: how many fresh items the thread may read ahead.

    Returns:
        A resumable ``torchdata.nodes.BaseNode`` with ``.stats``, ``close()`` and ``with`` support.
        An exception in the source reaches ``next()`` after the items read before it, as the
        original object with its traceback; the stream then ends.
    """
    return AdaptiveEcho(
        source,
        max_factor=max_factor,
        buffer_size=buffer_size,
        policy=policy,
        seed=seed,
        copy=copy,
        queue_size=queue_size,
    )
