"""The reuse buffer of adaptive echoing: the latest fresh items, their emission counts, a pick.

``adaptive_echo``'s consumer picks a copy whenever the read-ahead queue is empty, so a pick runs
once per echoed item, in the same process as (and holding the interpreter lock against) the
thread that reads fresh items. It must not cost time in proportion to the buffer: the buffer keeps
the items that may still be emitted in arrival order (for ``"latest"`` and ``"uniform"``), or
grouped by emission count (for ``"fewest"``), and updates them in O(log size) per pick, where a
scan of the whole buffer would cost O(size).

The picks are those of the plain definitions, random draws included, so a state saved as items
and counts in arrival order resumes the same stream: ``"latest"`` takes the newest item still
allowed; ``"uniform"`` draws one of the allowed items (in arrival order) with ``rng.choice``;
``"fewest"`` draws one of those emitted fewest times so far (in arrival order) the same way.
"""

from __future__ import annotations

import bisect
import collections
import random
from collections.abc import Sequence
from typing import Any

_ARRIVAL = 2  # an entry is [item, emissions so far, arrival number]


def _arrival(entry: list[Any]) -> int:
    return entry[_ARRIVAL]


class ReuseBuffer:
    """The last ``size`` fresh items; each may be emitted up to ``limit`` times in all.

    ``add`` records a fresh emission (its first), ``pick`` chooses an item to emit again (or
    None when every buffered item reached ``limit``), ``entries`` lists ``[item, emissions]``
    pairs in arrival order (for a checkpoint) and ``load`` restores them.
    """

    def __init__(self, size: int, limit: int, policy: str) -> None:
        self.size, self.limit, self.policy = size, limit, policy
        self._entries: collections.deque[list[Any]] = collections.deque()
        self._allowed: list[list[Any]] = []  # "latest", "uniform": entries below the limit
        self._levels: dict[int, list[list[Any]]] = {}  # "fewest": emissions -> entries, non-empty
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> list[tuple[Any, int]]:
        """``(item, emissions)`` for every buffered item, oldest first."""
        return [(entry[0], entry[1]) for entry in self._entries]

    def clear(self) -> None:
        self._entries.clear()
        self._allowed.clear()
        self._levels.clear()

    def load(self, items: Sequence[Any], counts: Sequence[int]) -> None:
        """Replace the buffer with ``items`` (oldest first) emitted ``counts`` times so far."""
        self.clear()
        for item, count in zip(items, counts, strict=True):
            self._insert(item, int(count))

    def add(self, item: Any) -> None:
        """Record ``item``'s fresh emission; the oldest item leaves a full buffer."""
        if len(self._entries) == self.size:
            oldest = self._entries.popleft()
            if oldest[1] < self.limit:  # still allowed: it is the oldest wherever it is listed
                group = self._levels[oldest[1]] if self.policy == "fewest" else self._allowed
                del group[0]
                if not group and self.policy == "fewest":
                    del self._levels[oldest[1]]
        self._insert(item, 1)

    def pick(self, rng: random.Random) -> Any | None:
        """An item to emit once more, counted; None when none may be (nothing is drawn then)."""
        if self.policy == "fewest":
            if not self._levels:
                return None
            group = self._levels[min(self._levels)]  # few distinct counts: a short scan
            entry = rng.choice(group)
        elif not self._allowed:
            return None
        else:
            group = self._allowed
            entry = group[-1] if self.policy == "latest" else rng.choice(group)
        entry[1] += 1
        if self.policy == "fewest":
            self._remove(group, entry)
            if not group:
                del self._levels[entry[1] - 1]
            if entry[1] < self.limit:
                self._place(entry)
        elif entry[1] >= self.limit:
            self._remove(group, entry)
        return entry[0]

    def _insert(self, item: Any, count: int) -> None:
        entry = [item, count, self._arrivals]
        self._arrivals += 1
        self._entries.append(entry)
        if count < self.limit:
            self._place(entry)

    def _place(self, entry: list[Any]) -> None:
        """List an allowed entry in its group, keeping the group in arrival order."""
        if self.policy == "fewest":
            group = self._levels.setdefault(entry[1], [])
        else:
            group = self._allowed
        if not group or _arrival(group[-1]) < _arrival(entry):
            group.append(entry)  # the usual case: the newest
        else:
            group.insert(bisect.bisect(group, _arrival(entry), key=_arrival), entry)

    @staticmethod
    def _remove(group: list[list[Any]], entry: list[Any]) -> None:
        del group[bisect.bisect_left(group, _arrival(entry), key=_arrival)]
