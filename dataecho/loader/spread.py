"""Batches in which no example appears twice: the batcher of example echoing's stage chains.

After a shuffle buffer the copies of one example still meet in a batch often: a batch of 128
drawn from a buffer of 10 batches' worth at e = 4 holds two copies of some example almost every
time (the birthday problem). :class:`SpreadBatches` forms each batch of tagged items
``(read_number, item)`` in arrival order, but an item whose read number the batch holds already
waits: for a number of batches drawn from 1 to ``spread`` (a hash of the seed, its number and
the batch: no generator state), so the copies stay as far apart as the buffer put them, then
goes first. So no batch holds two copies of one example while others arrive; at the source's
end the waiting items fill the last batches as they come. At most ``spread`` batches' worth of
items wait: past that one joins its batch anyway, so a source that sends one example's copies
in a long row costs no memory.

State: the source's, the waiting items (packed, as a shuffle buffer's are) with the batch each
is due, and the batches formed.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from dataecho.stages.packing import pack, unpack


def _wait(seed: int, number: int, batch: int, spread: int) -> int:
    """Batches a copy waits, from 1 to ``spread``: a SplitMix64 hash of its keys."""
    x = (seed * 0x9E3779B97F4A7C15 + number * 0xBF58476D1CE4E5B9 + batch) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return 1 + (x ^ (x >> 31)) % spread


MASK = 2**64 - 1


class SpreadBatches(BaseNode[list[Any]]):
    """Lists of ``batch_size`` tagged items from ``source`` (the last one shorter), no read
    number twice in one while the source has others to give; a copy that waits does so for up
    to ``spread`` batches."""

    def __init__(
        self, source: BaseNode[Any], batch_size: int, *, spread: int = 1, seed: int = 0
    ) -> None:
        super().__init__()
        self.source = source
        self.batch_size = int(batch_size)
        self.spread = max(1, int(spread))
        self.seed = int(seed)
        self._waiting: list[tuple[int, Any]] = []  # (the batch it is due, tagged item)
        self._batches = 0
        self._ended = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        state = initial_state or {}
        self.source.reset(state.get("source"))
        waiting = [] if state.get("waiting") is None else unpack(state["waiting"])
        self._waiting = list(zip(state.get("due", []), waiting, strict=True))
        self._batches = int(state.get("batches", 0))
        self._ended = bool(state.get("ended", False))

    def next(self) -> list[Any]:
        size, now = self.batch_size, self._batches
        batch: list[Any] = []
        held: set[int] = set()
        waiting: list[tuple[int, Any]] = []
        for due, tagged in self._waiting:
            ready = due <= now and tagged[0] not in held
            if len(batch) < size and (ready or self._ended):
                batch.append(tagged)
                held.add(tagged[0])
            else:
                waiting.append((due, tagged))
        room = self.spread * size
        while len(batch) < size and not self._ended:
            try:
                tagged = next(self.source)
            except StopIteration:
                self._ended = True
                break
            number = tagged[0]
            if number in held and len(waiting) < room:
                waiting.append((now + _wait(self.seed, number, now, self.spread), tagged))
            else:
                batch.append(tagged)
                held.add(number)
        if self._ended and len(batch) < size and waiting:  # the end: nothing else will come
            free = size - len(batch)
            batch += [tagged for _, tagged in waiting[:free]]
            waiting = waiting[free:]
        self._waiting = waiting
        if not batch:
            raise StopIteration
        self._batches += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "waiting": pack([tagged for _, tagged in self._waiting]) if self._waiting else None,
            "due": [due for due, _ in self._waiting],
            "batches": self._batches,
            "ended": self._ended,
        }
