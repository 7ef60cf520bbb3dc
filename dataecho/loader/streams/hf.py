"""Hugging Face ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``).

Each worker reads its part as the library splits it over workers (by shard), resumed through
the dataset's own ``state_dict`` / ``load_state_dict`` (it reads again at most the rest of
the shard it was in). The epoch is the loader's, handed on through ``set_epoch`` (the
library's shuffle seeds by it). On several ranks a stream not yet split by node is split here,
with the library's own ``split_dataset_by_node``, so no two ranks read the same examples; one
already split is read as it is.
"""

from __future__ import annotations

import warnings
from typing import Any

from torchdata.nodes import BaseNode

from dataecho.loader.reading import IterableReader
from dataecho.loader.streams.base import Stream, defined_in


def split_by_node(dataset: Any, *, rank: int, world: int) -> Any:
    """``dataset`` as rank ``rank`` of ``world`` reads it: split there unless it already is."""
    if world == 1 or getattr(dataset, "_distributed", None) is not None:
        return dataset
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(dataset, rank=rank, world_size=world)


class ShuffleBufferLostWarning(UserWarning):
    """A Hugging Face stream shuffles through a buffer, whose examples its resume loses."""


class HFReader(IterableReader):
    """A worker's part of the stream, through the library's own state."""

    # The library's state is a few positions (copied as it is taken): a read-ahead may take
    # it after every item (loader.read_ahead), so a resume starts past what it handed on.
    CHEAP_STATE = True


def shuffles_through_a_buffer(dataset: Any) -> bool:
    """Whether a ``datasets.IterableDataset`` has a shuffle buffer among its stages."""
    node = getattr(dataset, "_ex_iterable", None)
    while node is not None:
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        node = getattr(node, "ex_iterable", None)
    return False


class HFStream(Stream):
    NAME = "hf"

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        if shuffles_through_a_buffer(dataset):
            warnings.warn(
                "this Hugging Face stream shuffles through a buffer (.shuffle(buffer_size=...)), "
                "and the library's own resume loses the examples in it: a resumed run skips "
                "them. Shuffle its files only (.shuffle() before, or none) and spread examples "
                "with the loader's shuffle_buffer=, which resumes exactly",
                ShuffleBufferLostWarning,
                stacklevel=4,
            )

    @classmethod
    def matches(cls, dataset: Any) -> bool:
        return defined_in(dataset, "datasets", ("IterableDataset",))

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        dataset = split_by_node(dataset, rank=rank, world=world)
        dataset.set_epoch(epoch)
        return HFReader(dataset)
