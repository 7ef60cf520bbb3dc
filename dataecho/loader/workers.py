"""The worker boundary: the inner ``StatefulDataLoader`` as a node of the main-process chain.

Each worker runs its own pipeline (:mod:`dataecho.loader.pipeline`) and sends ``(batch,
fresh_count, (worker, waiting))``; this node unwraps the transport, batches the workers' last
short batches together once they all ended (:mod:`dataecho.loader.remainders`), adds the fresh
counts to the loader's stats (at once, or when an adaptive stage reading ahead hands the batch
on), keeps ``stats.waiting_items`` at the sum of the workers' latest waiting counts and the
remainders held, checkpoints through ``StatefulDataLoader.state_dict`` (the remainders held
beside it) and shuts the workers down at the epoch's end, or, with
``persistent_workers``, leaves them to :class:`PersistentWorkers`, which keeps them across
epochs.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torchdata.nodes import BaseNode
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho._structure import map_tensors
from dataecho.loader.chains import MAIN_PROCESS
from dataecho.loader.epoch_fields import EpochFields
from dataecho.loader.lifetime import signals_after_forks
from dataecho.loader.pipeline import PipelineDataset
from dataecho.loader.remainders import Remainder, Remainders, last_batch
from dataecho.loader.transport import from_wire
from dataecho.stages import EchoStats
from dataecho.stages.seeds import STAGE_TRANSFORM, derive_seed

# The key the main process's merged batches of the workers' remainders draw their seeds under
# (dataecho.loader.remainders): apart from every reader's index and from batch echoing's.
MERGED_BATCHES = MAIN_PROCESS + 1


class PersistentWorkers:
    """The inner loader's workers, kept across epochs (``persistent_workers=True``).

    Held by the loader and by each epoch's :class:`WorkersNode`: the workers stop at
    :meth:`stop`, or once the last holder is collected (even inside a reference cycle: the
    finalizer holds the inner loader, so its queues are alive when it stops the workers).
    """

    def __init__(self, loader: StatefulDataLoader, fields: EpochFields) -> None:
        self._loader = loader
        self._fields = fields
        self._running = False
        self._generation = fields.generation  # of the order buffer the running workers read
        # One thread at a time on the inner iterator: the reader thread of an adaptive stage
        # whose epoch ended may still be inside next() when the next epoch resets the workers.
        self.lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop_workers_of, loader)
        self._finalizer.atexit = False

    def start_epoch(self, initial_state: dict[str, Any] | None) -> Iterator[Any]:
        """The inner iterator of a new epoch: the running workers, reset by torchdata, or new
        ones when none run, for a resume from ``initial_state`` (torchdata restores workers
        as they start) or for a sampler's order that outgrew the buffer the running ones read
        (:mod:`dataecho.loader.epoch_fields`)."""
        with self.lock:
            outgrown = self._fields.generation != self._generation
            if not self._running or initial_state is not None or outgrown:
                self.stop()
                self._loader.load_state_dict(initial_state or {})  # {}: no iterator, no state
            try:
                with signals_after_forks():
                    it = iter(self._loader)
            except BaseException:  # a worker failed to start or to resume: none are reused
                self.stop()
                raise
            self._running, self._generation = True, self._fields.generation
            return it

    def stop(self) -> None:
        """Shut the workers down now; the next epoch starts new ones."""
        self._running = False
        _stop_workers_of(self._loader)


class DeferredCounts:
    """The fresh counts of batches read ahead of the consumer, for a node of fresh batches (the
    workers, or the user's own loader): ``pending`` until :meth:`settle` is told they reached
    it. A base of such nodes, which set ``_stats``, ``pending`` and ``_replays``."""

    _stats: EchoStats
    pending: collections.deque[int]
    _replays: int  # the first pending entries: a resume's replay, already counted

    def replaying(self, reads: int) -> None:
        """The first ``reads`` batches read since the reset are read again, not handed on: a
        resumed reader thread reads from its last saved position past the batches it had handed on
        (their fresh examples counted before the checkpoint)."""
        self._replays = reads

    def settle(self, batches: int) -> None:
        """``batches`` more read-ahead batches reached the consumer: count their fresh
        examples, after dropping the replayed ones read before them."""
        for _ in range(batches):
            # Only once a batch after them is handed on: the reader thread has read them all
            # by then.
            while self._replays:
                self.pending.popleft()
                self._replays -= 1
            self._stats.fresh_examples += self.pending.popleft()


class WorkersNode(DeferredCounts, BaseNode[Any]):
    """The inner StatefulDataLoader as a node: yields batches, counts their fresh examples.

    With ``deferred``, an adaptive stage's reader thread pulls batches ahead of the consumer:
    their fresh counts wait in ``pending`` until :meth:`settle` is told those batches reached it.
    A resumed reader thread may first read again batches handed on before the checkpoint (see
    :meth:`replaying`): counted then, they are dropped uncounted.
    With ``persistent`` (the loader's :class:`PersistentWorkers`), the workers outlive the
    epoch; a failure in it stops them. With ``counted_downstream``, a stage after it counts
    the fresh examples (the device's pool, as it first delivers them) and this node does not.
    """

    def __init__(
        self,
        loader: StatefulDataLoader,
        pipeline: PipelineDataset,
        stats: EchoStats,
        *,
        deferred: bool = False,
        persistent: PersistentWorkers | None = None,
        counted_downstream: bool = False,
    ) -> None:
        super().__init__()
        self._loader = loader
        self._pipeline = pipeline
        self._persistent = persistent
        self._lock = persistent.lock if persistent is not None else threading.Lock()
        self.batch_size = pipeline.options.batch_size  # its items are batches (stats.unit)
        self._stats = stats
        self.deferred = deferred
        self.counted_downstream = counted_downstream
        self.pending: collections.deque[int] = collections.deque()
        self._replays = 0  # the first pending entries: a resume's replay, already counted
        self._waiting: dict[int, int] = {}  # worker -> read, not yet delivered, as it last said
        # Only worker processes send small batches as pickled arrays (loader/transport.py).
        self._piped = loader.num_workers > 0 and pipeline.pipe_small_batches
        self._pinned = loader.pin_memory and torch.cuda.is_available()
        self._it: Iterator[Any] | None = None
        self._stop: weakref.finalize | None = None
        self._remainders: Remainders | None = None  # the workers' last short batches
        self._ended = False  # every worker has ended this epoch

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.close()
        self.pending.clear()  # a resume re-reads what was read ahead but not handed out
        self._replays = 0
        self._waiting.clear()
        fields, opts = self._pipeline.fields, self._pipeline.options
        seed = derive_seed(fields.seed, fields.epoch, MERGED_BATCHES, fields.rank, STAGE_TRANSFORM)
        last = last_batch(opts, pool_fills=self.counted_downstream)
        self._remainders = Remainders(opts, self._pipeline.collate_fn, seed=seed, last=last)
        self._ended = False
        if initial_state is not None:
            self._remainders.load_state_dict(initial_state["remainders"])
            self._ended = bool(initial_state["ended"])
            initial_state = initial_state["workers"]
        if self._persistent is not None:
            self._it = self._persistent.start_epoch(initial_state)
            return
        if initial_state is not None:
            self._loader.load_state_dict(initial_state)
        with signals_after_forks():
            self._it = iter(self._loader)
        # Collected as garbage (inside a cycle of the user's objects), the iterator's queues
        # would stop their feeder threads before any __del__ ran, and the workers would wait
        # 5 s each for a stop message never sent: the finalizer holds the iterator, so its
        # queues are alive when it shuts the workers down.
        self._stop = weakref.finalize(self, _shutdown_workers, self._it)
        self._stop.atexit = False

    def next(self) -> Any:
        with self._lock:
            it, remainders = self._it, self._remainders
            if it is None or remainders is None:  # closed: read by the reader thread of an
                raise StopIteration  # epoch that has ended
            while True:
                try:
                    batch, fresh, (worker, waiting) = self._next_of_workers(it)
                except StopIteration:
                    merged = remainders.next_batch()  # made here: nothing to unwrap
                    if merged is None:
                        if not self.counted_downstream:  # what is never delivered was not
                            self._stats.waiting_items = 0  # read for it
                        raise
                    batch, fresh = merged
                    if self._pinned:  # as the workers' batches come
                        batch = map_tensors(batch, torch.Tensor.pin_memory)
                    break
                self._waiting[worker] = waiting
                if isinstance(batch, Remainder):
                    items = from_wire(batch.items) if self._piped else batch.items
                    remainders.hold(Remainder(items, batch.firsts))
                    continue
                if self._piped:
                    batch = from_wire(batch)
                break
        if self.counted_downstream:
            return batch  # the device's pool counts, and says what waits in it
        if self.deferred:
            self.pending.append(fresh)  # deque.append is atomic: safe from the reader thread
        else:
            self._stats.fresh_examples += fresh
        self._stats.waiting_items = sum(self._waiting.values()) + remainders.waiting
        return batch

    def _next_of_workers(self, it: Iterator[Any]) -> Any:
        """The workers' next item; StopIteration once they all ended (asked once only: then
        the remainders are batched)."""
        if self._ended:
            raise StopIteration
        try:
            return next(it)
        except StopIteration:
            self._ended = True
            raise
        except BaseException:
            if self._persistent is not None:  # the inner iterator's state is unknown now
                self._persistent.stop()
            raise

    def get_state(self) -> dict[str, Any]:
        remainders = self._remainders
        assert remainders is not None, "reset() first"
        return {"workers": self._loader.state_dict(), "remainders": remainders.state_dict(),
                "ended": self._ended}  # fmt: skip

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
        self._it = None
        self._pipeline.close_iterators()


def _stop_workers_of(loader: StatefulDataLoader) -> None:
    if loader._iterator is not None:  # persistent workers: the loader holds their iterator
        _shutdown_workers(loader._iterator)


def _shutdown_workers(it: Any) -> None:
    shutdown = getattr(it, "_shutdown_workers", None)  # DataLoader's own, for worker processes
    if shutdown is not None:
        shutdown()
