"""The epoch's fields that the worker pipelines read: epoch, seed, rank, world size and order.

The training process writes them before each ``iter()`` of the inner loader; a worker reads
them when it builds that epoch's pipeline. Workers started anew each epoch get them with the
pickled dataset. Persistent workers get the dataset once, at start-up, so the fields live in
shared memory (``share_memory_``, before any worker starts): a forked worker inherits the
mapping, and torch's reducers hand a spawned one a handle to the same memory. Writes and reads
never overlap: a worker builds its pipeline at start-up or when torchdata resumes it, and the
inner loader's ``iter()`` returns only once every worker has done so.

The sampler's order may change length between epochs. Its buffer has the size of the longest
order seen; a longer one needs a new buffer, which running workers cannot see: ``generation``
counts the buffers made, so the loader starts its workers anew when it changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataecho.loader.reading import data_parallel_rank

_EPOCH, _SEED, _RANK, _WORLD, _LENGTH = range(5)
_NO_ORDER = -1  # the order's length without a sampler


class EpochFields:
    """One epoch's fields, as attributes; in shared memory with ``shared``."""

    def __init__(self, *, shared: bool) -> None:
        self.shared = shared
        self._header = self._tensor(5)
        self._header[_WORLD] = 1
        self._header[_LENGTH] = _NO_ORDER
        self._order = self._tensor(0)
        self.generation = 0  # order buffers made: a worker sees the one made before it started

    def _tensor(self, length: int) -> torch.Tensor:
        tensor = torch.zeros(length, dtype=torch.int64)
        return tensor.share_memory_() if self.shared else tensor

    @property
    def epoch(self) -> int:
        return int(self._header[_EPOCH])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._header[_EPOCH] = value

    @property
    def seed(self) -> int:
        # Seeds are up to 64 bits (torch.Generator's range): stored as the same bits, unsigned.
        return int(self._header.numpy().view(np.uint64)[_SEED])

    @seed.setter
    def seed(self, value: int) -> None:
        self._header.numpy().view(np.uint64)[_SEED] = value

    @property
    def rank(self) -> int:
        return int(self._header[_RANK])

    @rank.setter
    def rank(self, value: int) -> None:
        self._header[_RANK] = value

    @property
    def world(self) -> int:
        return int(self._header[_WORLD])

    @world.setter
    def world(self, value: int) -> None:
        self._header[_WORLD] = value

    @property
    def indices(self) -> np.ndarray | None:
        """The sampler's order for this epoch (a copy), or None without a sampler."""
        length = int(self._header[_LENGTH])
        return None if length == _NO_ORDER else self._order.numpy()[:length].copy()

    @indices.setter
    def indices(self, order: np.ndarray | None) -> None:
        if order is None:
            self._header[_LENGTH] = _NO_ORDER
            return
        if len(order) > len(self._order):
            self._order = self._tensor(len(order))
            self.generation += 1
        self._order.numpy()[: len(order)] = order
        self._header[_LENGTH] = len(order)

    def prepare(self, epoch: int, seed: int, sampler: Any, saved: torch.Tensor | None) -> None:
        """Set epoch ``epoch``'s fields: its seed, this process's rank and (with a sampler) the
        read order: ``saved``, the order a checkpoint was read in, else the sampler's now."""
        self.epoch, self.seed = epoch, seed
        rank, world = data_parallel_rank()
        # A sampler already chose this rank's share: the ranks keep their own seeds, but the
        # loader does not split the data a second time.
        self.rank, self.world = (rank, 1) if sampler is not None else (rank, world)
        if sampler is None:
            self.indices = None
        elif saved is not None:
            self.indices = saved.numpy()
        else:
            self.indices = np.fromiter((int(i) for i in sampler), dtype=np.int64)
