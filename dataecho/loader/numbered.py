"""Numbering the fresh batches of ``where="device"``, so the pool can count first deliveries.

The echo stage copies whole items, so every copy of a fresh batch carries the batch's number;
the example pool after it (:class:`~dataecho.stages.MixExamples` with ``numbered=True``) tells
by it which emitted examples are the first copies of their fresh example to leave, and counts
those fresh: an example counts when it is first trained on, not when it enters the pool.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

SOURCE_KEY = "source"
COUNT_KEY = "count"


class Numbered(BaseNode[tuple[int, Any]]):
    """``(n, batch)`` for the ``n``-th batch of ``source`` in the epoch (1, 2, ...). State:
    the source's and the count."""

    def __init__(self, source: BaseNode[Any]) -> None:
        super().__init__()
        self.source = source
        self._count = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
            self._count = 0
        else:
            self.source.reset(initial_state[SOURCE_KEY])
            self._count = int(initial_state[COUNT_KEY])

    def next(self) -> tuple[int, Any]:
        batch = next(self.source)
        self._count += 1
        return self._count, batch

    def get_state(self) -> dict[str, Any]:
        return {SOURCE_KEY: self.source.state_dict(), COUNT_KEY: self._count}
