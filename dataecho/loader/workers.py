"""The worker boundary: the inner ``StatefulDataLoader`` as a node of the main-process chain.

Each worker runs its own pipeline (:mod:`dataecho.loader.pipeline`) and sends ``(batch,
fresh_count, (worker, waiting))``; this node unwraps the transport, batches the workers' last
short batches together once they all ended (:mod:`dataecho.loader.remainders`), hands each
batch's fresh count to the epoch's :class:`~dataecho.loader.fresh_count.FreshCount`, keeps
``stats.waiting_items`` at the sum of the workers' latest waiting counts and the
remainders held, checkpoints through ``StatefulDataLoader.state_dict`` (the remainders held
beside it) and shuts the workers down at the epoch's end, or, with
``persistent_workers``, leaves them to :class:`PersistentWorkers`, which keeps them across
epochs.
"""

from __future__ import annotations

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
from dataecho.loader.fresh_count import FreshCount
from dataecho.loader.lifetime import signals_after_forks
from dataecho.loader.pipeline import PipelineDataset
from dataecho.loader.remainders import Remainder, Remainders, last_batch
from dataecho.loader.transport import from_wire
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


class WorkersNode(BaseNode[Any]):
    """The inner StatefulDataLoader as a node: yields batches, their fresh counts to ``count``.

    With ``persistent`` (the loader's :class:`PersistentWorkers`), the workers outlive the
    epoch; a failure in it stops them.
    """

    def __init__(
        self,
        loader: StatefulDataLoader,
        pipeline: PipelineDataset,
        count: FreshCount,
        *,
        persistent: PersistentWorkers | None = None,
    ) -> None:
        super().__init__()
        self._loader = loader
        self._pipeline = pipeline
        self._persistent = persistent
        self._lock = persistent.lock if persistent is not None else threading.Lock()
        self.batch_size = pipeline.options.batch_size  # its items are batches (stats.unit)
        self.count = count
        self._stats = count.stats
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
        self.count.reset()
        self._waiting.clear()
        fields, opts = self._pipeline.fields, self._pipeline.options
        seed = derive_seed(fields.seed, fields.epoch, MERGED_BATCHES, fields.rank, STAGE_TRANSFORM)
        last = last_batch(opts, pool_fills=self.count.counted_downstream)
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
                        if not self.count.counted_downstream:  # what is never delivered was not
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
        self.count.read(fresh)
        if self.count.counted_downstream:
            return batch  # the device's pool says what waits in it
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
