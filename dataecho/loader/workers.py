"""The worker boundary: the inner ``StatefulDataLoader`` as a node of the main-process chain.

Each worker runs its own pipeline (:mod:`dataecho.loader.pipeline`) and sends ``(batch,
fresh_count)``; this node unwraps the transport, adds the fresh counts to the loader's stats
(at once, or when an adaptive stage reading ahead hands the batch on), checkpoints through
``StatefulDataLoader.state_dict`` and shuts the workers down.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho.loader.pipeline import PipelineDataset
from dataecho.loader.transport import from_wire
from dataecho.stages import EchoStats


class WorkersNode(BaseNode[Any]):
    """The inner StatefulDataLoader as a node: yields batches, counts their fresh examples.

    With ``deferred``, an adaptive stage's reader thread pulls batches ahead of the consumer:
    their fresh counts wait in ``pending`` until :meth:`settle` is told those batches reached it.
    A resumed reader may first read again batches handed on before the checkpoint (see
    :meth:`replaying`): counted then, they are dropped uncounted.
    """

    def __init__(
        self,
        loader: StatefulDataLoader,
        pipeline: PipelineDataset,
        stats: EchoStats,
        *,
        deferred: bool = False,
    ) -> None:
        super().__init__()
        self._loader = loader
        self._pipeline = pipeline
        self.batch_size = pipeline.options.batch_size  # its items are batches (stats.unit)
        self._stats = stats
        self.deferred = deferred
        self.pending: collections.deque[int] = collections.deque()
        self._replays = 0  # the first pending entries: a resume's replay, already counted
        # Only worker processes send small batches as pickled arrays (loader/transport.py).
        self._piped = loader.num_workers > 0 and pipeline.pipe_small_batches
        self._it: Iterator[Any] | None = None
        self._stop: weakref.finalize | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.close()
        if initial_state is not None:
            self._loader.load_state_dict(initial_state)
        self._it = iter(self._loader)
        # Collected as garbage (inside a cycle of the user's objects), the iterator's queues
        # would stop their feeder threads before any __del__ ran, and the workers would wait
        # 5 s each for a stop message never sent: the finalizer holds the iterator, so its
        # queues are alive when it shuts the workers down.
        self._stop = weakref.finalize(self, _shutdown_workers, self._it)
        self._stop.atexit = False
        self.pending.clear()  # a resume re-reads what was read ahead but not handed out
        self._replays = 0

    def next(self) -> Any:
        batch, fresh = next(self._it)
        if self._piped:
            batch = from_wire(batch)
        if self.deferred:
            self.pending.append(fresh)  # deque.append is atomic: safe from the reader thread
        else:
            self._stats.fresh_examples += fresh
        return batch

    def replaying(self, reads: int) -> None:
        """The first ``reads`` batches read since the reset are read again, not handed on: a
        resumed reader reads from its last saved position past the batches it had handed on
        (their fresh examples counted before the checkpoint)."""
        self._replays = reads

    def settle(self, batches: int) -> None:
        """``batches`` more read-ahead batches reached the consumer: count their fresh
        examples, after dropping the replayed ones read before them."""
        for _ in range(batches):
            # Only once a batch after them is handed on: the reader has read them all by then.
            while self._replays:
                self.pending.popleft()
                self._replays -= 1
            self._stats.fresh_examples += self.pending.popleft()

    def get_state(self) -> dict[str, Any]:
        return self._loader.state_dict()

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
        self._it = None
        self._pipeline.close_iterators()


def _shutdown_workers(it: Any) -> None:
    shutdown = getattr(it, "_shutdown_workers", None)  # DataLoader's own, for worker processes
    if shutdown is not None:
        shutdown()
