"""Adaptive echoing: echo only while fresh data is late.

A background thread (:class:`~dataecho.stages.background.BackgroundReader`, the loader's
read-ahead thread too) reads ``source`` into a bounded queue and blocks only when it is full, so
echoing never slows upstream. ``next()`` returns a fresh item when one is ready; otherwise it
re-emits one of the last ``buffer_size`` fresh items rather than wait. No item is emitted more
than ``max_factor`` times (the fresh emission counts); when nothing may be reused the consumer
waits for upstream, and that wait is ``stats.stall_seconds``.

The reader thread does nothing but read and hand over: the consumer's reuse decisions cost
O(log buffer_size) each (:mod:`dataecho.stages.reuse_buffer`), and the thread asks the source for
its state only now and then, because in one process the two threads share the interpreter lock:
whatever the consumer (or the thread itself) spends beyond the read is time the read may wait.

State: the thread reads ahead, so the live source is past items not yet emitted. The thread
sends ``source.state_dict()`` (an *anchor*) along with every :data:`ANCHOR_EVERY`-th item it
reads and with the end of the stream; the stage's state holds the last anchor that came with an
item emitted fresh, how many fresh items followed it, and the reuse buffer with its emission
counts. A resume restores the anchor and reads past those items again, then re-reads the items
that were queued but not emitted: no fresh item is lost or doubled, for any source that replays
its items from a restored state (the replay is not timing-identical). Cost: one
``state_dict()`` per :data:`ANCHOR_EVERY` items on the thread; a resume reads up to
``ANCHOR_EVERY - 1`` items twice.

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

import math
import queue
import time
from collections.abc import Iterable
from typing import Any, TypeVar

from dataecho import _validate
from dataecho.stages.background import END, ERROR, BackgroundReader
from dataecho.stages.base import Stage
from dataecho.stages.copying import copy_item, copy_pinned
from dataecho.stages.packing import pack, unpack
from dataecho.stages.reuse_buffer import ReuseBuffer
from dataecho.stages.seeds import STAGE_ADAPTIVE

T = TypeVar("T")

POLICIES = ("latest", "uniform", "fewest")
THREAD_PREFIX = "dataecho-adaptive"
# Items between two anchors: a state_dict() per item is a visible share of a fast reader's time
# per item (a shard reader's, say); one per 32 items is not, and a resume re-reads at most 31.
ANCHOR_EVERY = 32


class AdaptiveEcho(Stage[T]):
    """Fresh items first, reuse only while upstream is late; see :func:`adaptive_echo`.

    ``pinned``: a copy of a pinned tensor is pinned too (:func:`~dataecho.stages.copy_pinned`;
    main process only)."""

    STAGE_ID = STAGE_ADAPTIVE
    STATE_KEYS = ("skip", "buffer", "counts", "done")
    STATE_HOLDS = "reuse buffer"

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
        pinned: bool = False,
    ) -> None:
        self.max_factor = _validate.echo_factor(max_factor, name="max_factor")
        hint = "the reuse buffer keeps the last buffer_size fresh items; 1 reuses only the latest"
        self.buffer_size = _validate.buffer_size(buffer_size, low=1, hint=hint)
        self.policy = _validate.one_of(policy, POLICIES, name="policy")
        hint = "the read-ahead queue needs room for at least one item, e.g. queue_size=16"
        self.queue_size = _validate.buffer_size(queue_size, low=1, name="queue_size", hint=hint)
        super().__init__(source, seed=_validate.seed(seed))
        self.copy = bool(copy)
        self._copy_item = copy_pinned if pinned else copy_item
        self._limit = math.floor(self.max_factor)  # emissions allowed per item, fresh one included
        self._buffer = ReuseBuffer(self.buffer_size, self._limit, self.policy)
        self._producer: BackgroundReader | None = None
        self._source_state: Any = None  # the last anchor that came with an item emitted fresh
        self._since_anchor = 0  # fresh items emitted after it
        self._done = False  # the source ended (or raised) and everything was emitted
        self._closed = False
        self.replayed_reads = 0  # see reset()

    @property
    def queued(self) -> int:
        """Entries read ahead and waiting in the queue (a snapshot, for monitoring)."""
        return self._producer.queue.qsize() if self._producer is not None else 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start the next epoch, or resume from ``initial_state``. ``replayed_reads``: how many
        of the source's first reads since then re-read items emitted before the state was
        saved (those after its anchor), never to be emitted again."""
        self.close()  # the source must be idle before it is reset
        super().reset(initial_state)
        self._closed = False
        self._source_state = self._source_state_now()
        self.replayed_reads = 0
        if not self._done and not self._ended:  # a resumed end reads on only in the next epoch
            self.replayed_reads = self._since_anchor
            self._producer = BackgroundReader(
                self.source, self.queue_size, name=THREAD_PREFIX,
                anchor_every=ANCHOR_EVERY, skip=self._since_anchor,
            )  # fmt: skip

    def _start_epoch(self) -> None:
        self._buffer.clear()
        self._since_anchor = 0
        self._done = False

    def next(self) -> T:
        if self._done or self._closed or self._producer is None:
            raise StopIteration
        try:
            item, payload = self._producer.queue.get_nowait()  # fresh items always first
        except queue.Empty:
            chosen = self._buffer.pick(self._rng)  # O(log buffer_size): see ReuseBuffer
            if chosen is not None:
                self.stats.items_out += 1
                return self._copy_item(chosen) if self.copy else chosen
            item, payload = self._wait()
        if item is END or item is ERROR:
            if item is END:
                self._source_state, self._since_anchor = payload, 0
            self._done = True
            name = self._producer.thread.name
            self.close()  # the thread has returned already; this reaps it
            if item is END:
                raise StopIteration
            if hasattr(payload, "add_note"):  # Python >= 3.11
                payload.add_note(f"(raised by adaptive_echo's source in thread {name!r})")
            raise payload  # the original object: its traceback still shows the source's frames
        if payload is None:
            self._since_anchor += 1
        else:
            self._source_state, self._since_anchor = payload, 0
        self.stats.fresh_items += 1
        self.stats.items_out += 1
        if self._limit < 2:
            return item
        self._buffer.add(item)
        # The buffer keeps the original pristine; every emission is its own copy.
        return self._copy_item(item) if self.copy else item

    def _wait(self) -> tuple[Any, Any]:
        """Block for the next queue entry. Only called when nothing may be reused: a stall."""
        producer, start = self._producer, time.perf_counter()
        assert producer is not None
        try:
            return producer.get()  # StopIteration: closed from another thread
        finally:
            waited = time.perf_counter() - start
            self.stats.wait_seconds += waited
            self.stats.stall_seconds += waited

    def get_state(self) -> dict[str, Any]:
        # Not Stage.get_state: the live source belongs to the reader thread and is ahead.
        entries = self._buffer.entries
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "source": copy_item(self._source_state),
            "skip": self._since_anchor,
            "rng": self._rng.getstate(),
            "stats": self.stats.state_dict(),
            "ended": self._ended,
            "buffer": pack([item for item, _ in entries]),
            "counts": [count for _, count in entries],
            "done": self._done,
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._buffer.load(unpack(state["buffer"]), state["counts"])
        self._since_anchor = int(state["skip"])
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
