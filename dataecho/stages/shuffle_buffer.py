"""A shuffle buffer: spreads echoed copies apart, then drains completely at the end.

The paper found that a larger post-echo shuffle buffer helped every echoing variant; without
one, copies sit next to each other (duplicates in one batch, no steps between repeats).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from dataecho import _validate
from dataecho.stages.base import Stage
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_SHUFFLE

T = TypeVar("T")


class Shuffle(Stage[T]):
    """Keep ``buffer_size`` items; emit a random one and put the next upstream item in its place.

    State: the buffer's items (so a checkpoint grows with the buffer, as tf.data's does), the
    source's state and the random state.
    """

    STAGE_ID = STAGE_SHUFFLE

    def __init__(self, source: Iterable[T], buffer_size: int, *, seed: int | None = None) -> None:
        self.buffer_size = _validate.buffer_size(
            buffer_size, low=0, hint="use 0 (or 1) for no shuffling"
        )
        super().__init__(source, seed=_validate.seed(seed))
        self._buffer: list[Any] = []
        self._exhausted = False
        self._draining = False  # drain(): nothing more is read

    def _start_epoch(self) -> None:
        self._buffer, self._exhausted, self._draining = [], False, False

    def drain(self) -> None:
        """Read nothing fresh: take the copies the source still owes of what it has read (its
        ``copies_due``: an echo stage's), then emit the buffer's items until :attr:`drained`,
        without ending the epoch."""
        while not self._draining and getattr(self.source, "copies_due", 0) > 0:
            self._buffer.append(self._pull())
            self.stats.fresh_items += 1
        self._draining = True

    @property
    def drained(self) -> bool:
        return self._draining and not self._buffer

    def next(self) -> T:
        if self.buffer_size <= 1 and not self._draining:
            item = self._pull()
            self.stats.fresh_items += 1
            self.stats.items_out += 1
            return item
        while not self._draining and not self._exhausted and len(self._buffer) < self.buffer_size:
            try:
                self._buffer.append(self._pull())
                self.stats.fresh_items += 1
            except StopIteration:
                self._exhausted = True
        if not self._buffer:
            raise StopIteration
        # Swap the chosen item to the end and pop it: O(1), order of the rest irrelevant.
        j = self._rng.randrange(len(self._buffer))
        buf = self._buffer
        buf[j], buf[-1] = buf[-1], buf[j]
        self.stats.items_out += 1
        return buf.pop()

    def _get_stage_state(self) -> dict[str, Any]:
        # Packed (a copy), so a consumer changing an item later cannot change a saved state.
        return {"buffer": pack(self._buffer), "exhausted": self._exhausted}

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._buffer = unpack(state["buffer"])
        self._exhausted = bool(state["exhausted"])


def shuffle(source: Iterable[T], buffer_size: int, *, seed: int | None = None) -> Shuffle[T]:
    """Shuffle ``source`` through a buffer of ``buffer_size`` items (0 or 1: pass-through).

    At the end of the source the buffer drains completely, so nothing is lost. Each epoch
    (``reset()``, or the next ``for`` loop once one ended) draws a new order from the seed.
    """
    return Shuffle(source, buffer_size, seed=seed)
