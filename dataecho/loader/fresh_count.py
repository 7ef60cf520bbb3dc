"""Fresh examples, counted in one place (``stats.fresh_examples``).

The rule: a fresh example counts once the batch that holds its first copy is on its way to the
training loop, that is when the first main-process stage that may hold batches back hands it
on, or, with none, as the workers deliver it; with the device's pool, once its first copy
leaves the pool.

Who marks the first copies: each worker counts, per batch, the examples it delivers for the
first time (:mod:`dataecho.loader.delivery`); the main process's merged last short batches carry
their count (:mod:`dataecho.loader.remainders`); a user's ``DataLoader`` hands over fresh
batches only; the device's pool counts its examples' first deliveries
(:attr:`~dataecho.stages.MixExamples.first_deliveries`). What this module does with them, in the
insertion point's mode (:meth:`~dataecho.loader.points.base.InsertionPoint.counting`):

- at once: the workers node's batches go straight to the consumer, or through stages that
  hold none of them back from the count (a fixed factor's batch echo, a shuffle of batches);
- ``deferred``: a main-process stage reads fresh batches ahead of the consumer (a device copy
  in flight, ``"auto"``'s reader thread); their counts wait, in order, until that stage hands
  the batch on. A resumed reader thread first reads again batches handed on before the
  checkpoint: counted then, they are dropped uncounted;
- ``counted_downstream``: the device's pool counts examples as it first delivers them.
"""

from __future__ import annotations

import collections
from typing import Any

from dataecho.stages import EchoStats, MixExamples


def handed_on(counting: Any) -> int:
    """What the counting stage has handed on so far: examples first delivered by a pool,
    else fresh batches."""
    if isinstance(counting, MixExamples):
        return counting.first_deliveries
    return int(counting.stats.fresh_items)


class FreshCount:
    """One epoch's count, in one of the modes of the module docstring. The upstream node (the
    workers', or a user's loader) calls :meth:`reset` as it is reset and :meth:`read` per fresh
    batch; the loader calls :meth:`start` once the epoch's chain is reset, and the epoch's
    iterator :meth:`handed` per batch it hands out."""

    def __init__(
        self, stats: EchoStats, *, deferred: bool = False, counted_downstream: bool = False
    ) -> None:
        self.stats = stats
        self.deferred = deferred
        self.counted_downstream = counted_downstream
        # Read ahead, not yet handed on. deque.append is atomic: safe from a reader thread.
        self._pending: collections.deque[int] = collections.deque()
        self._replays = 0  # the first pending entries: a resume's replay, already counted
        self._counting: Any = None  # the stage whose hand-overs settle the count, or None
        self._settled = 0  # what it had handed on when last asked

    def reset(self) -> None:
        """The upstream node starts (or resumes) the epoch: a resume reads again what was read
        ahead but not handed on."""
        self._pending.clear()
        self._replays = 0

    def read(self, fresh: int) -> None:
        """The upstream node hands on a batch with ``fresh`` first copies."""
        if self.counted_downstream:
            return  # the pool counts, as it first delivers them
        if self.deferred:
            self._pending.append(fresh)
        else:
            self.stats.fresh_examples += fresh

    def start(self, counting: Any) -> None:
        """The epoch's chain is reset (a resumed one from its state): ``counting`` is its
        counting stage (None: counted at once)."""
        self._counting = counting
        self._settled = handed_on(counting) if counting is not None else 0
        # An adaptive stage's resume reads again what it had handed on.
        self._replays = int(getattr(counting, "replayed_reads", 0))

    def handed(self) -> None:
        """A batch went to the training loop: count what the counting stage handed on since."""
        counting = self._counting
        if counting is None:
            return
        handed = handed_on(counting)
        if self.counted_downstream:  # examples, as the pool first delivered them
            self.stats.fresh_examples += handed - self._settled
            self.stats.waiting_items = counting.waiting
        else:  # fresh batches, whose counts wait here
            for _ in range(handed - self._settled):
                # Only once a batch after them is handed on: the reader thread has read them
                # all by then.
                while self._replays:
                    self._pending.popleft()
                    self._replays -= 1
                self.stats.fresh_examples += self._pending.popleft()
        self._settled = handed
