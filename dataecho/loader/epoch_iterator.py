"""One epoch's iterator: started lazily, timed, counted, and released when dropped.

The iterator holds no reference to its loader once started, and the loader holds it weakly,
so dropping either stops the workers at once (persistent ones, once both are dropped); a
position dropped mid-epoch goes back to the loader through :class:`WeakCall`, so
``state_dict()`` still holds it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from torchdata.nodes import BaseNode

from dataecho.loader.chains import close_chain, drain_stage
from dataecho.loader.fresh_count import FreshCount
from dataecho.stages import EchoStats
from dataecho.stages.stats import batch_length


class WeakCall:
    """``obj.method(*args)`` while ``obj`` lives; nothing after (no reference cycle)."""

    def __init__(self, obj: Any, method: str) -> None:
        self._ref, self._method = weakref.ref(obj), method

    def __call__(self, *args: Any) -> None:
        obj = self._ref()
        if obj is not None:
            getattr(obj, self._method)(*args)


class EpochStart(NamedTuple):
    """What starting an epoch gives its iterator."""

    root: BaseNode[Any]
    fresh: FreshCount  # the epoch's fresh examples, counted as batches are handed out
    first: list[Any]  # a first batch already taken (a resumed epoch's), or none
    yielded: int = 0  # batches of this epoch handed out before (a resumed epoch's)


class EpochIterator:
    """One epoch's iterator: times the consumer's waits and counts what it hands out.

    ``start`` (the loader's) starts the epoch at the first ``next()`` (it raises
    ``StopIteration`` for an epoch with nothing left); after that it holds no
    reference to its loader, so dropping the loader (or this iterator, once the loader is gone)
    stops the workers at once. ``on_drop`` receives the position of an iterator dropped
    mid-epoch, so the loader's ``state_dict()`` still holds it.
    """

    def __init__(
        self,
        stats: EchoStats,
        start: Callable[[], EpochStart],
        on_drop: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.stats = stats
        self.root: BaseNode[Any] | None = None
        self.finished = False
        self.superseded = False
        self._start: Callable[[], Any] | None = start
        self._first: list[Any] = []
        self._count: FreshCount | None = None
        self._drain_stage: Any = None  # where drain() starts, once started (or None)
        self.yielded = 0  # batches of this epoch handed out, a resumed epoch's earlier ones too
        self._on_drop = on_drop
        self._closed = False

    @property
    def started(self) -> bool:
        return self.root is not None

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        if self.superseded:
            raise RuntimeError(
                "this EchoingDataLoader iterator was ended by a newer iter(loader) or by "
                "loader.load_state_dict(): a loader runs one epoch at a time (its state and "
                "workers belong to it); iterate the newest iterator, or use a second loader for "
                "a second stream"
            )
        if self.finished or self.drained:  # drained: the epoch is not over, its state says where
            raise StopIteration
        stats = self.stats
        start, worked = time.perf_counter(), self._work_seconds()
        try:
            if self._start is not None:
                begin, self._start = self._start, None
                epoch = begin()
                self.root, self._count = epoch.root, epoch.fresh
                self._drain_stage = drain_stage(self.root)
                self._first = epoch.first
                self.yielded = epoch.yielded
            assert self.root is not None  # begin() set it
            batch = self._first.pop() if self._first else next(self.root)
        except StopIteration:
            self.finished = True
            self.close()
            raise
        except BaseException:
            # The original exception (and its traceback) goes on; the workers stop now.
            self.finished = True
            self.close()
            raise
        finally:
            # Work the training thread did on the batch (a device transform) is no wait.
            worked = self._work_seconds() - worked
            stats.wait_seconds += time.perf_counter() - start - worked
            stats.work_seconds += worked
        assert self._count is not None  # begin() set it
        self._count.handed()
        stats.batches += 1
        self.yielded += 1
        stats.examples_out += batch_length(batch)
        return batch

    def drain(self) -> bool:
        """Start the chain's drain (:func:`~dataecho.loader.chains.drain_stage`); False where
        it has none (nothing changes) or the epoch has not started."""
        if self._drain_stage is None:
            return False
        self._drain_stage.drain()
        return True

    @property
    def drained(self) -> bool:
        return self._drain_stage is not None and self._drain_stage.drained

    def position(self) -> dict[str, Any]:
        """Where this started epoch is: its root's state and the batches handed out."""
        assert self.root is not None
        return {"root": self.root.state_dict(), "yielded": self.yielded}

    def _work_seconds(self) -> float:
        return getattr(self.root, "work_seconds", 0.0) if self.root is not None else 0.0

    def supersede(self) -> None:
        """A newer iterator (or a loaded state) took over: this one ends (see
        :meth:`__next__`)."""
        self.superseded = True
        self._on_drop = None
        self.close()

    def close(self) -> None:
        # Once only: the pipeline object is shared by the loader's epochs, and a late second
        # close (from garbage collection) must not reach a newer epoch's pipeline.
        self._start = None
        if not self._closed and self.root is not None:
            self._closed = True
            close_chain(self.root)

    def __del__(self) -> None:
        try:
            if self._on_drop is not None and self.started and not self.finished:
                self._on_drop(self.position())
            self.close()
        except Exception:  # interpreter shutdown: nothing left to clean
            pass
