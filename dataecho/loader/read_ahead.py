"""Read ahead of the echo stage on a background thread, so slow reads overlap the echo's work.

A worker that echoes examples at a fixed factor e does e times the downstream work (copies,
per-copy augmentation, collation) per fresh example. Read on the same thread, a slow read
(storage or network: time when the CPU is idle) waits for that work and the work waits for the
read, so the upstream delivers less than it could. A thread reading a few chunks ahead keeps
the reads going meanwhile, as ``AdaptiveEcho``'s reader thread does for "auto".

The thread is the one the adaptive stage reads on (:mod:`dataecho.stages.background`), and it
checkpoints exactly: its state is the source's after the last item handed over, so a resume
re-reads what was read ahead but not yet used. Chunks of :data:`CHUNK` examples make it one
queue hand-over per chunk, not per example.

Failures: a failure inside a chunk would lose the chunk's items read before it. So the
exception object travels as an item (:class:`_Failure`) and is raised again on the consumer's
side, after those items: the training loop gets the original, traceback and all, and the
reader thread stops at the first failure instead of reading past it.
"""

from __future__ import annotations

import threading
from typing import Any

from torchdata.nodes import BaseNode, Batcher, Unbatcher

from dataecho.stages.background import ThreadedNode

# Examples per hand-over from the read-ahead thread.
CHUNK = 16
THREAD_PREFIX = "dataecho-read-ahead"


def read_ahead(source: BaseNode[Any], examples: int) -> BaseNode[Any]:
    """``source`` read up to ``examples`` ahead on a background thread (0: ``source`` itself)."""
    if examples <= 0:
        return source
    chunk = min(CHUNK, examples)
    catch = _Catch(source)
    chunks = ThreadedNode(
        Batcher(catch, chunk, drop_last=False), -(-examples // chunk), name=THREAD_PREFIX
    )
    return _Raise(Unbatcher(chunks), catch, chunks)


def stop_read_ahead(node: Any, timeout: float | None = 5.0) -> None:
    """Stop ``node``'s read-ahead thread, if it is one: it reads nothing after the read in
    flight, which this waits up to ``timeout`` s for."""
    if isinstance(node, _Raise):
        node.stop(timeout)


class _Failure:
    """A read's exception, carried as an item across the thread."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Catch(BaseNode[Any]):
    """On the reader's thread: a failure becomes an item, and reading stops after it."""

    def __init__(self, source: BaseNode[Any]) -> None:
        super().__init__()
        self.source = source
        self._failed = False
        # Set from the consumer: torchdata's Batcher finishes a chunk without looking at the
        # thread's stop event, so the reader thread must be told here, between two reads.
        self.stopping = threading.Event()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state)
        self._failed = False
        self.stopping.clear()  # the previous reader thread has ended: _Raise.reset waited for it

    def next(self) -> Any:
        if self._failed or self.stopping.is_set():
            raise StopIteration
        try:
            return next(self.source)
        except StopIteration:
            raise
        except BaseException as error:  # noqa: BLE001  (the consumer raises it: see _Raise)
            self._failed = True
            return _Failure(error)

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()


class _Raise(BaseNode[Any]):
    """On the consumer's side: raise a carried failure; pass every other item through."""

    def __init__(self, source: BaseNode[Any], catch: _Catch, chunks: ThreadedNode) -> None:
        super().__init__()
        self.source = source
        self._catch, self._chunks = catch, chunks

    def stop(self, timeout: float | None) -> None:
        """Stop the reader thread after its read in flight; wait up to ``timeout`` s for that."""
        self._catch.stopping.set()
        self._chunks.stop(timeout)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        # A reader thread still inside a read would go on reading from the source reset under it.
        self.stop(None)
        self.source.reset(initial_state)

    def next(self) -> Any:
        item = next(self.source)
        if isinstance(item, _Failure):
            raise item.error
        return item

    def get_state(self) -> dict[str, Any]:
        return self.source.state_dict()
