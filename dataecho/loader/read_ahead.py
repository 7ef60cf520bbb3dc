"""Read ahead of the echo stage on a background thread, so slow reads overlap the echo's work.

A worker that echoes examples at a fixed factor e does e times the downstream work (copies,
per-copy augmentation, collation) per fresh example. Read on the same thread, a slow read
(storage or network: time when the CPU is idle) waits for that work and the work waits for the
read, so the upstream delivers less than it could. A thread reading a few chunks ahead keeps
the reads going meanwhile, as ``AdaptiveEcho``'s reader thread does for "auto".

The thread is the one the adaptive stage reads on (:mod:`dataecho.stages.background`), and it
checkpoints exactly: its state is the source's after the last item handed over, so a resume
re-reads what was read ahead but not yet used. Chunks of :data:`CHUNK` examples make it one
queue hand-over per chunk, not per example; each side is one node (the chunks on the thread,
the examples on the consumer's side), so an example costs its read and one node call more.

Failures: a failure inside a chunk would lose the chunk's items read before it. So the
exception object travels as an item (:class:`_Failure`) and is raised again on the consumer's
side, after those items: the training loop gets the original, traceback and all, and the
reader thread stops at the first failure instead of reading past it.
"""

from __future__ import annotations

import threading
from typing import Any

from torchdata.nodes import BaseNode

from dataecho import _validate
from dataecho.stages.background import ThreadedNode

# Examples per hand-over from the read-ahead thread.
CHUNK = 16
THREAD_PREFIX = "dataecho-read-ahead"


def read_ahead(source: BaseNode[Any], examples: int) -> BaseNode[Any]:
    """``source`` read up to ``examples`` ahead on a background thread (0: ``source`` itself)."""
    return ReadAhead(source, examples) if examples > 0 else source


def stop_read_ahead(node: Any, timeout: float | None = 5.0) -> None:
    """Stop ``node``'s read-ahead thread, if it is one: it reads nothing after the read in
    flight, which this waits up to ``timeout`` s for."""
    if isinstance(node, ReadAhead):
        node.stop(timeout)


class _Failure:
    """A read's exception, carried as an item across the thread."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Chunk(list[Any]):
    """Reads in a row; ``states``: the source's state after each, where it is cheap."""

    states: list[Any] | None = None


class _Chunks(BaseNode[list[Any]]):
    """On the reader's thread: lists of up to ``size`` reads; a failure is a chunk's last item,
    and reading stops after it."""

    def __init__(self, source: BaseNode[Any], size: int) -> None:
        super().__init__()
        self.source = source
        self.size = size
        self._failed = False
        # Set from the consumer, looked at between two reads: a chunk in progress stops too.
        self.stopping = threading.Event()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)
        self._failed = False
        self.stopping.clear()  # the previous reader thread has ended: ReadAhead.reset waited

    def next(self) -> list[Any]:
        chunk = _Chunk()
        stopping, source = self.stopping, self.source
        # A source whose state is a few numbers (a streaming library's reader) gives its state
        # after each item: a resume then starts past the items handed on, reading none again.
        per_item = getattr(source, "CHEAP_STATE", False)
        if per_item:
            chunk.states = []
        try:
            while len(chunk) < self.size and not (self._failed or stopping.is_set()):
                chunk.append(next(source))
                if chunk.states is not None:
                    chunk.states.append(source.state_dict())
        except StopIteration:
            pass
        except BaseException as error:  # noqa: BLE001  (the consumer raises it: see ReadAhead)
            self._failed = True
            chunk.append(_Failure(error))
        if not chunk:
            raise StopIteration
        return chunk

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()


class ReadAhead(BaseNode[Any]):
    """``source``'s items, read up to ``examples`` ahead on a thread; a carried failure is
    raised here, as the original object. State: the chunks' state before the chunk in hand,
    and the place in it (a resume reads that chunk again and skips what was handed on)."""

    def __init__(self, source: BaseNode[Any], examples: int) -> None:
        super().__init__()
        self.source = source
        size = min(CHUNK, examples)
        self._chunks = _Chunks(source, size)
        self._thread = ThreadedNode(self._chunks, -(-examples // size), name=THREAD_PREFIX)
        self._chunk: list[Any] = []
        self._place = 0
        self._chunk_state: Any = None  # the thread's state before the chunk in hand

    def stop(self, timeout: float | None) -> None:
        """Stop the reader thread after its read in flight; wait up to ``timeout`` s for that."""
        self._chunks.stopping.set()
        self._thread.stop(timeout)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        # A reader thread still inside a read would go on reading from the source reset under it.
        self.stop(None)
        self._chunk, self._place = [], 0
        if initial_state is None:
            self._thread.reset()
            self._chunk_state = None
            return
        _validate.saved_state(initial_state, ("source", "place"), holds="read-ahead position")
        self._thread.reset(initial_state["source"])
        self._chunk_state = initial_state["source"]
        try:
            self._chunk = next(self._thread)
            self._place = int(initial_state["place"])
        except StopIteration:  # raised again, in its place, by the next call
            pass

    def next(self) -> Any:
        while self._place >= len(self._chunk):
            self._chunk_state = self._thread.state_dict()
            self._chunk, self._place = next(self._thread), 0
        item = self._chunk[self._place]
        self._place += 1
        if type(item) is _Failure:
            raise item.error
        return item

    def get_state(self) -> dict[str, Any]:
        if self._chunk_state is None:
            self._chunk_state = self._thread.state_dict()
        states = getattr(self._chunk, "states", None)
        if states and self._place:  # the source's own state after the item last handed on
            state = states[self._place - 1]
            # Taken when that item was read; the source may since know a shorter way to it.
            refine = getattr(self.source, "refine_state", None)
            return {"source": refine(state) if refine else state, "place": 0}
        return {"source": self._chunk_state, "place": self._place}
