"""The loader's upstream end: read each example once, tag it, and count it.

A map-style dataset is read in one order per epoch: the ``sampler``'s when one is given (a
``DistributedSampler`` already holds this rank's share), else a seeded permutation
(``shuffle=True``) or ``range(len(dataset))``. The order is split between the DataLoader
workers by striding, so each example is read by exactly one worker per epoch. Without a
sampler, a data-parallel run strides the order over the ranks first, as ``DistributedSampler``
does, so no example is read by two ranks, and each epoch's order is cut to a multiple of the
ranks: every rank gets the same number of examples, so the ranks take the same number of steps
(at most ranks - 1 examples, a different random few each epoch, are skipped), whatever the
workers.

An iterable dataset is read as it is; as with ``torch.utils.data.DataLoader``, one used with
workers or ranks must split itself (``torch.utils.data.get_worker_info``). Its own state, if it
has one (``state_dict``/``load_state_dict``), is restored in ``StatefulDataLoader``'s order: the
dataset's state, then ``iter()``, then the iterator's state; without either it fast-forwards.
A streaming library's dataset is read by its adapter instead (:mod:`dataecho.loader.streams`).

The rank comes from an initialised ``torch.distributed`` process group (what Lightning and
accelerate set up, without always setting ``RANK``), else from torchrun's ``RANK`` and
``WORLD_SIZE``. It is read once in the training process at ``iter()`` and handed to the workers.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import numpy as np
import torch.distributed as dist
from torch.utils.data import IterableDataset
from torchdata.nodes import BaseNode

from dataecho.errors import DataechoValueError


def data_parallel_rank() -> tuple[int, int]:
    """``(rank, world_size)``: the initialised process group's, else torchrun's environment,
    else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if not 0 <= rank < world:
        raise DataechoValueError(
            f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world}); launch with torchrun "
            "or set both variables consistently"
        )
    return rank, world


def is_map_style(dataset: Any) -> bool:
    """Indexed by ``dataset[i]`` with a length, as DataLoader's map-style datasets are."""
    return (
        hasattr(dataset, "__getitem__")
        and hasattr(dataset, "__len__")
        and not isinstance(dataset, IterableDataset)
    )


def reader_index(rank: int, worker: int, num_workers: int) -> int:
    """Which of a data-parallel run's ``world * num_workers`` readers worker ``worker`` of rank
    ``rank`` is: the key its echo, shuffle and augmentation seeds derive from."""
    return rank * num_workers + worker


Order = TypeVar("Order", np.ndarray, range)


def reader_share(order: Order, *, index: int, readers: int, equal: bool) -> Order:
    """The indices of ``order`` that reader number ``index`` of ``readers`` reads (a stride);
    ``equal`` cuts the order to a multiple of ``readers`` first (equal shares for ranks). A
    ``range`` gives a ``range``: the share's size without making the order."""
    if equal and readers > 1:
        order = order[: len(order) - len(order) % readers]
    return order[index::readers]


def epoch_order(n: int, order_seed: int | None) -> np.ndarray:
    """One epoch's read order of ``n`` examples: a seeded permutation, or ``arange``."""
    if order_seed is None:
        return np.arange(n)
    return np.random.default_rng(order_seed).permutation(n)


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps a state of its own (``state_dict`` / ``load_state_dict``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


class IndexedReader(BaseNode[Any]):
    """Reads ``dataset[i]`` for each ``i`` of ``indices``. State: the position (and the
    dataset's own state when it keeps one)."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        super().__init__()
        self.dataset = dataset
        self._indices = indices
        self._pos = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._pos = int(initial_state["pos"]) if initial_state else 0
        if initial_state and initial_state.get("dataset") is not None:
            self.dataset.load_state_dict(initial_state["dataset"])

    def next(self) -> Any:
        if self._pos >= len(self._indices):
            raise StopIteration
        item = self.dataset[int(self._indices[self._pos])]
        self._pos += 1
        return item

    def get_state(self) -> dict[str, Any]:
        dataset = self.dataset.state_dict() if is_stateful(self.dataset) else None
        return {"pos": self._pos, "dataset": dataset}


class IterableReader(BaseNode[Any]):
    """Iterates an iterable dataset; resumes it through its own state, else by fast-forward."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.dataset = dataset
        self._it: Any = None
        self._yielded = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        state = initial_state or {}
        if state.get("dataset") is not None:
            self.dataset.load_state_dict(state["dataset"])
        self._it = iter(self.dataset)
        self._yielded = int(state.get("yielded", 0))
        if state.get("iterator") is not None:
            self._it.load_state_dict(state["iterator"])
        elif state.get("dataset") is None:
            for _ in range(self._yielded):  # nothing to restore from: replay the items
                next(self._it)

    def next(self) -> Any:
        item = next(self._it)
        self._yielded += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {
            "yielded": self._yielded,
            "dataset": self._dataset_state(),
            "iterator": self._it.state_dict() if is_stateful(self._it) else None,
        }

    def _dataset_state(self) -> Any:
        # A dataset that is its own iterator builds its position in __iter__: its state is
        # the iterator's, restored after iter() (as StatefulDataLoader does).
        if is_stateful(self.dataset) and self._it is not self.dataset:
            return self.dataset.state_dict()
        return None


class Tagged(BaseNode[Any]):
    """Pass-through that numbers the items read from upstream: ``(read_number, item)``, from 0.

    The number travels with every echoed copy, so the end that counts fresh examples tells a
    first copy from the rest: in a worker, when an example's first copy reaches a batch
    (:mod:`dataecho.loader.delivery`); on the device, when a fresh batch's examples first leave
    the pool (:class:`~dataecho.stages.MixExamples` with ``numbered=True``).
    """

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
        tagged = (self.count, item)
        self.count += 1
        return tagged

    def get_state(self) -> dict[str, Any]:
        return {"source": self.source.state_dict(), "count": self.count}


def finish_restored_pass(dataset: Any, saved: Any) -> None:
    """Restore an iterable dataset's state saved after its pass ended, so that its next
    ``iter()`` is the next pass. A state that restores the end of the pass itself (a position)
    is run to that end first, as it was before it was saved; one that restores the start of
    the next pass (an epoch counter) is restored again after the item that showed it."""
    dataset.load_state_dict(saved)
    try:
        next(iter(dataset))
    except StopIteration:
        return
    dataset.load_state_dict(saved)
