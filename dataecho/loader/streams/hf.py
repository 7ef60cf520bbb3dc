"""Hugging Face ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``).

Each worker reads its part as the library splits it over workers (by shard), resumed through
the dataset's own ``state_dict`` / ``load_state_dict``. That state can point at the end of a
file already read to its end (a position the library takes before it opens the next file, and
a resume opens that file again to skip through it): where the stages hand on each row they read
as one item, the reader learns where each file ends as it reads, and a state taken at a file's
end names the next file's start instead, so a resume reads again at most the file it was in.
The epoch is the loader's, handed on through ``set_epoch`` (the library's shuffle seeds by it). On several ranks a stream not yet split by node is split here,
with the library's own ``split_dataset_by_node``, so no two ranks read the same examples; one
already split is read as it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
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


# A position in one of the library's file lists: a file's index and the rows read from it.
LEAVES = frozenset({"ArrowExamplesIterable", "ExamplesIterable"})
# Stages that hand on every row they read as one item, in order. Others (filter, batched map,
# take/skip, a shuffle buffer, a split by rank that steps over rows) turn learning off.
ONE_TO_ONE = LEAVES | {
    "RebatchedArrowExamplesIterable", "FormattedExamplesIterable", "SelectColumnsIterable",
    "MappedExamplesIterable",
}  # fmt: skip


def stages(dataset: Any) -> Iterator[Any]:
    """The stages of a ``datasets.IterableDataset``, from the last to its file list."""
    node = getattr(dataset, "_ex_iterable", None)
    while node is not None:
        yield node
        node = getattr(node, "ex_iterable", None)


def hands_on_each_row(dataset: Any) -> bool:
    """Whether every stage of ``dataset`` hands on each row it reads as one item, in order."""
    return all(
        type(node).__name__ in ONE_TO_ONE
        and not (type(node).__name__ == "MappedExamplesIterable" and node.batched)
        for node in stages(dataset)
    )


def live_position(state: dict[str, Any]) -> tuple[int, int] | None:
    """The file index and rows read of the position the stream reads at now (the chain of
    ``examples_iterable`` down to its file list), or None through a stage not one-to-one."""
    node: Any = state.get("examples_iterable")
    while isinstance(node, dict):
        if node.get("type") not in ONE_TO_ONE:
            return None
        if node["type"] in LEAVES:
            return int(node["shard_idx"]), int(node["shard_example_idx"])
        node = node.get("examples_iterable")
    return None


def past_ended_files(state: Any, ends: dict[int, int]) -> Any:
    """``state`` with every position at the end of a file in ``ends`` moved to the next
    file's start: the same place, reached without opening the ended file again."""
    if isinstance(state, list):
        return [past_ended_files(s, ends) for s in state]
    if not isinstance(state, dict):
        return state
    if state.get("type") in LEAVES and ends.get(state["shard_idx"]) == state["shard_example_idx"]:
        return {**state, "shard_idx": state["shard_idx"] + 1, "shard_example_idx": 0}
    return {k: past_ended_files(v, ends) for k, v in state.items()}


class HFReader(IterableReader):
    """A worker's part of the stream, through the library's own state."""

    # The library's state is a few positions (copied as it is taken): a read-ahead may take
    # it after every item (loader.read_ahead), so a resume starts past what it handed on.
    CHEAP_STATE = True

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        # File index -> its rows, learned as the stream moves on from it (None: not learned).
        self._ends: dict[int, int] | None = {} if hands_on_each_row(dataset) else None
        self._seen: tuple[int, int] | None = None  # the position after the item before
        # The library's state after the item last read, taken to learn from (its count of
        # items, the state): a state asked for then is that one, not a second copy.
        self._taken: tuple[int, Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._seen = self._taken = None

    def next(self) -> Any:
        item = super().next()
        if self._ends is not None:
            own = self.dataset.state_dict()
            self._taken = (self._yielded, own)
            self._learn(live_position(own))
        return item

    def _dataset_state(self) -> Any:
        if self._taken is not None and self._taken[0] == self._yielded:
            return self._taken[1]
        return super()._dataset_state()

    def _learn(self, now: tuple[int, int] | None) -> None:
        assert self._ends is not None
        before, self._seen = self._seen, now
        # One more row read since the position before, and it lay in a later file: every row of
        # that position's file had been read, so the position was the file's end.
        if before is not None and now is not None and now[0] > before[0]:
            self._ends[before[0]] = before[1]

    def get_state(self) -> dict[str, Any]:
        return self.refine_state(super().get_state())

    def refine_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state``, taken after some item, with the ends of files learned since applied
        (a read-ahead calls this for a state it took earlier)."""
        if not self._ends or state["dataset"] is None:
            return state
        return {**state, "dataset": past_ended_files(state["dataset"], self._ends)}


def shuffles_through_a_buffer(dataset: Any) -> bool:
    """Whether a ``datasets.IterableDataset`` has a shuffle buffer among its stages."""
    return any(type(node).__name__ == "BufferShuffledExamplesIterable" for node in stages(dataset))


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

    def start_epoch(self, epoch: int) -> None:
        # The library keeps the epoch in memory shared with the workers (for persistent ones),
        # and set_epoch adds the change to it: two workers setting it at once may both add it
        # (2 -> 3 for epoch 2), and read their files in another epoch's order. Set here, before
        # the workers start, it is each worker's already: their set_epoch adds nothing.
        self.dataset.set_epoch(epoch)

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        dataset = split_by_node(dataset, rank=rank, world=world)
        dataset.set_epoch(epoch)
        return HFReader(dataset)
