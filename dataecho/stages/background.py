"""One background reader thread: reads a node into a bounded queue, with the node's state.

Both threads that read ahead of their consumer use it: the adaptive stage's
(:mod:`dataecho.stages.adaptive`) and the loader's read-ahead
(:mod:`dataecho.loader.read_ahead`, through :class:`ThreadedNode`).

:class:`BackgroundReader` puts one entry per read: ``(item, anchor)``, where the anchor is
``source.state_dict()`` after that item every ``anchor_every``-th read (else None), then
``(END, state at the end)`` or ``(ERROR, the exception object)``, after which the thread
returns. It blocks only while the queue is full (or, with ``bound_reads``, before a read while
``queue_size`` entries are read and not yet taken); :meth:`BackgroundReader.stop` ends it at
once if it waits on the queue, else when the source call in progress returns (Python cannot
interrupt it). It holds no reference to its consumer, so dropping the consumer stops it.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

from torchdata.nodes import BaseNode

END, ERROR = object(), object()  # queue markers: source exhausted / source raised
POLL_S = 0.1  # how often a blocked put/get rechecks for shutdown; only a safety net
_thread_ids = itertools.count()


class BackgroundReader:
    """A daemon thread reading ``source`` into ``queue`` (see the module docstring).

    ``skip``: the first reads are read but not queued (a resume past items already used).
    ``bound_reads``: the read in flight counts against ``queue_size`` (the thread waits before a
    read, not after it), as torchdata's ``Prefetcher`` counts; else up to ``queue_size`` entries
    wait in the queue while the thread holds the next one read.
    """

    def __init__(
        self,
        source: BaseNode[Any],
        queue_size: int,
        *,
        name: str,
        anchor_every: int,
        skip: int = 0,
        bound_reads: bool = False,
    ) -> None:
        self.source = source
        self.skip = skip
        self.anchor_every = anchor_every
        self.queue: queue.Queue[tuple[Any, Any]] = queue.Queue(maxsize=queue_size)
        self.stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(queue_size) if bound_reads else None
        self.thread = threading.Thread(
            target=self._run, name=f"{name}-{next(_thread_ids)}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        read = 0
        while True:
            if self._slots is not None:
                while not self._slots.acquire(timeout=POLL_S):
                    if self.stopping.is_set():
                        return
            try:
                item = next(self.source)
                read += 1
                if read <= self.skip:
                    if self._slots is not None:
                        self._slots.release()
                    continue
                # The anchor is the state *after* this item; None between anchors.
                every = self.anchor_every
                anchor = self.source.state_dict() if read % every == 0 else None
                entry = (item, anchor)
            except StopIteration:
                entry = (END, None)
            except BaseException as exc:  # every failure belongs to the consumer
                entry = (ERROR, exc)
            if entry[0] is END:
                try:  # the end's own state: a loader's says "next epoch"
                    entry = (END, self.source.state_dict())
                except BaseException as exc:
                    entry = (ERROR, exc)
            while not self.stopping.is_set():  # blocks only while the queue is full
                try:
                    self.queue.put(entry, timeout=POLL_S)
                    break
                except queue.Full:
                    pass
            if self.stopping.is_set() or entry[0] is END or entry[0] is ERROR:
                return

    def get(self) -> tuple[Any, Any]:
        """The next entry, waiting for it; ``StopIteration`` once the thread is gone and the
        queue empty (stopped from another thread)."""
        while True:
            try:
                entry = self.queue.get(timeout=POLL_S)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise StopIteration from None
                continue
            if self._slots is not None:
                self._slots.release()
            return entry

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


class ThreadedNode(BaseNode[Any]):
    """``source`` read ahead on a :class:`BackgroundReader`, up to ``queue_size`` items (the
    read in flight included).

    Its state is the source's after the last item handed over (an anchor with every item), so
    a resume re-reads what was read ahead but not yet used. A failure in the source is raised
    here, as the original object, after the items read before it; the stream then ends.
    """

    def __init__(self, source: BaseNode[Any], queue_size: int, *, name: str) -> None:
        super().__init__()
        self.source = source
        self.queue_size = queue_size
        self.name = name
        self._reader: BackgroundReader | None = None
        self._state: Any = None
        self._done = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        # A thread still inside a read would go on reading from the source reset under it.
        self.stop(None)
        self.source.reset(initial_state)
        self._state = self.source.state_dict()  # the thread has not started: safe to ask
        self._done = False
        self._reader = BackgroundReader(
            self.source, self.queue_size, name=self.name, anchor_every=1, bound_reads=True
        )

    def next(self) -> Any:
        if self._done or self._reader is None:
            raise StopIteration
        item, payload = self._reader.get()
        if item is END or item is ERROR:
            self._done = True
            self._reader.stop(None)  # the thread has returned already; this reaps it
            if item is END:
                raise StopIteration
            raise payload
        self._state = payload
        return item

    def stop(self, timeout: float | None) -> bool:
        """Stop the thread after its read in flight; wait up to ``timeout`` s for that. True
        once no thread runs."""
        if self._reader is not None and self._reader.stop(timeout):
            self._reader = None
        return self._reader is None

    def get_state(self) -> Any:
        return self._state
