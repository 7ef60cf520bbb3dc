"""The delivery end of a worker's pipeline: untag each batch and count its fresh examples.

Every item carries the number it was read under (:class:`dataecho.loader.reading.Tagged`), and
every echoed copy carries its original's. A fresh example counts when its first copy reaches
a delivered batch: with a shuffle buffer a later copy may arrive first, so counting at the read would count examples
nobody got yet. The worker's last short batch goes to the main process uncounted, with the
copies that first deliver their example marked (:attr:`Delivery.firsts`): merged with the other
workers' there, it counts as its batches are delivered (:mod:`dataecho.loader.remainders`).

Which numbers were delivered: all below ``low``, and those in ``ahead`` (delivered out of
order). ``ahead`` holds only what a shuffle buffer moved ahead of a still-buffered example, so
the state stays small.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from torchdata.nodes import BaseNode

_NUMBER, _ITEM = itemgetter(0), itemgetter(1)


class Delivery(BaseNode[list[Any]]):
    """Lists of ``(read_number, item)`` in, lists of items out; ``fresh`` is the last list's
    count of first deliveries, and ``firsts``, for a short list, which of its items they are."""

    def __init__(self, source: BaseNode[list[Any]], batch_size: int) -> None:
        super().__init__()
        self.source = source
        self.batch_size = batch_size
        self.fresh = 0
        self.firsts: list[bool] = []
        self._low = 0
        self._ahead: set[int] = set()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        state = initial_state or {}
        self.source.reset(state.get("source"))
        self._low = int(state.get("low", 0))
        self._ahead = {int(i) for i in state.get("ahead", ())}
        self.fresh = 0

    def next(self) -> list[Any]:
        tagged = next(self.source)
        # Set operations at C speed: the numbers not delivered before (each once), at or
        # above low; below it all were.
        numbers = set(map(_NUMBER, tagged)) - self._ahead  # a scan of the batch's, not of ahead
        if numbers and min(numbers) < self._low:
            numbers = set(filter(self._low.__le__, numbers))
        self._ahead |= numbers
        while self._low in self._ahead:
            self._ahead.remove(self._low)
            self._low += 1
        self.fresh = len(numbers)
        if len(tagged) < self.batch_size:  # the last: each example's first copy in it, marked
            self.firsts = []
            for number in map(_NUMBER, tagged):
                self.firsts.append(number in numbers)
                numbers.discard(number)
        return list(map(_ITEM, tagged))

    @property
    def delivered(self) -> int:
        """How many fresh examples have reached a delivered batch so far."""
        return self._low + len(self._ahead)

    def get_state(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "low": self._low,
            "ahead": sorted(self._ahead),
        }
