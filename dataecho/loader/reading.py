"""The loader's upstream end: read examples once each, and count them.

A map-style dataset is read in a seeded per-epoch order (when ``shuffle=True``), split between
DataLoader workers by striding, so each example is read by exactly one worker per epoch. An
iterable dataset is read as it is; as with ``torch.utils.data.DataLoader``, an iterable dataset
used with workers must split itself between them (``torch.utils.data.get_worker_info``).

Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set, as ``webdataset.split_by_node`` reads them)
the stride runs over ranks x workers, so no example is read by two ranks, and each epoch's order
is cut to a multiple of that count: every reader gets the same number of examples, so the ranks
of a data-parallel run take the same number of steps (at most ranks x workers - 1 examples, a
different random few each epoch, are skipped).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode


class IndexedReader(BaseNode[Any]):
    """Reads ``dataset[i]`` for this worker's share of one epoch's order. State: the position."""

    def __init__(
        self, dataset: Any, *, order_seed: int | None, worker: int, num_workers: int
    ) -> None:
        super().__init__()
        self.dataset = dataset
        n = len(dataset)
        order = (
            np.random.default_rng(order_seed).permutation(n)
            if order_seed is not None
            else np.arange(n)
        )
        rank, world = data_parallel_rank()
        readers, reader = world * num_workers, rank * num_workers + worker
        if world > 1:  # equal shares: see the module docstring
            order = order[: n - n % readers]
        self._indices = order[reader::readers]
        self._pos = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._pos = int(initial_state["pos"]) if initial_state else 0

    def next(self) -> Any:
        if self._pos >= len(self._indices):
            raise StopIteration
        index = int(self._indices[self._pos])
        item = self.dataset[index]
        self._pos += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"pos": self._pos}


def data_parallel_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from torchrun's environment; ``(0, 1)`` outside one. Read from the
    environment, which DataLoader worker processes inherit, rather than torch.distributed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if not 0 <= rank < world:
        raise ValueError(
            f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world}); launch with torchrun "
            "or set both variables consistently"
        )
    return rank, world


class Counted(BaseNode[Any]):
    """Pass-through that counts the items read from upstream: the fresh examples."""

    def __init__(self, source: BaseNode[Any]) -> None:
        super().__init__()
        self.source = source
        self.count = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state["source"] if initial_state else None)
        self.count = int(initial_state["count"]) if initial_state else 0

    def next(self) -> Any:
        item = next(self.source)
        self.count += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"source": self.source.state_dict(), "count": self.count}
