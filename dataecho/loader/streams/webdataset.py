"""webdataset's ``WebDataset(urls)``: tar shards over HTTP, from object storage or a folder.

A ``WebDataset`` is a list of stages. Those before the URL opener make each worker's list of
shards (the shard list, the node and worker splitters, a shard shuffle); those after it read a
shard's samples (open, expand the tar, group by key, and per-sample stages: ``decode``,
``to_tuple``, ``map``, ``map_dict``, ``map_tuple``, ``rename``, ``select``...). Each worker
runs the first part once per epoch (no shard is opened) and the second part shard by shard,
so its position is a shard and a sample in it: a resume opens again only the shard it was in.
A ``detshuffle`` of the shards is told the loader's epoch.

A pipeline whose stages mix samples across shards (a sample ``shuffle``, ``batched``, a stage
of the user's own), that resamples its shards or repeats, or that is no ``WebDataset`` at all
cannot be placed this way: it is read as it is, and a resume replays its epoch up to the saved
position (:class:`ReplayOnResumeWarning`, once).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode

from dataecho.loader.reading import IterableReader
from dataecho.loader.streams.base import Stream, defined_in

# Stages that turn each sample into at most one, on its own: run shard by shard, they give
# what the whole pipeline gives.
PER_SAMPLE = {
    "_decode", "_xdecode", "_map", "_map_dict", "_map_tuple", "_to_tuple", "_rename",
    "_rename_keys", "_select", "_extract_keys", "tar_file_expander", "group_by_keys",
}  # fmt: skip
SHARD_LIST = ("SimpleShardList",)
OPENERS = ("StreamingOpen", "FileCache")


class ReplayOnResumeWarning(UserWarning):
    """A stream dataecho cannot place at a saved position: a resume reads its epoch again."""


def _name(stage: Any) -> str:
    fn = getattr(stage, "f", stage)  # a curried filter keeps its function as .f
    return getattr(fn, "__name__", type(stage).__name__)


def split_stages(dataset: Any) -> tuple[list[Any], list[Any]] | None:
    """The stages that make a worker's shard list and those that read one shard, or None
    where the pipeline cannot be read shard by shard."""
    stages = list(getattr(dataset, "pipeline", []))
    if getattr(dataset, "repetitions", 1) != 1 or getattr(dataset, "nsamples", 0) > 0:
        return None
    if not stages or type(stages[0]).__name__ not in SHARD_LIST:
        return None
    opener = next((i for i, s in enumerate(stages) if type(s).__name__ in OPENERS), None)
    if opener is None:
        return None
    rest = [s for s in stages[opener + 1 :] if _name(s) != "check_empty"]
    if not all(_name(s) in PER_SAMPLE for s in rest):
        return None
    return stages[:opener], [stages[opener], *rest]


def _run(dataset: Any, stages: list[Any], source: Any) -> Iterator[Any]:
    it = source
    for stage in stages:
        it = dataset.invoke(stage, it)
    return iter(it)


class ShardReader(BaseNode[Any]):
    """A worker's shards, read one at a time. State: the shard and the samples read of it."""

    CHEAP_STATE = True  # a read-ahead may take it after every item (loader.read_ahead)

    def __init__(self, dataset: Any, stages: tuple[list[Any], list[Any]], epoch: int) -> None:
        super().__init__()
        self.dataset = dataset
        self._shard_stages, self._sample_stages = stages
        self.epoch = epoch
        self.share: int | None = None
        self._shards: list[Any] = []
        self._shard = 0
        self._offset = 0
        self._it: Iterator[Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        for stage in self._shard_stages:
            if type(stage).__name__ == "detshuffle":
                stage.epoch = self.epoch - 1  # it counts one up as it runs
        first = self.dataset.invoke(self._shard_stages[0])
        self._shards = list(_run(self.dataset, self._shard_stages[1:], first))
        state = initial_state or {}
        self._shard, self._offset = int(state.get("shard", 0)), 0
        self._it = self._open()
        for _ in range(int(state.get("offset", 0))):  # its shard's samples read before
            self.next()

    def _open(self) -> Iterator[Any] | None:
        if self._shard >= len(self._shards):
            return None
        return _run(self.dataset, self._sample_stages, iter([dict(self._shards[self._shard])]))

    def next(self) -> Any:
        while self._it is not None:
            try:
                item = next(self._it)
            except StopIteration:
                self._shard, self._offset = self._shard + 1, 0
                self._it = self._open()
                continue
            self._offset += 1
            return item
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"shard": self._shard, "offset": self._offset}


class WebDatasetStream(Stream):
    NAME = "webdataset"

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self.stages = split_stages(dataset)
        if self.stages is None:
            warnings.warn(
                f"this webdataset pipeline ({type(dataset).__name__}) cannot be read shard by "
                "shard (it resamples or repeats, or a stage such as shuffle or batched mixes "
                "samples across shards): a resume reads its epoch again up to the saved "
                "position. Build it as WebDataset(urls) with per-sample stages (decode, "
                "to_tuple, map) and shuffle with the loader's shuffle_buffer= instead",
                ReplayOnResumeWarning,
                stacklevel=4,
            )

    @classmethod
    def matches(cls, dataset: Any) -> bool:
        return defined_in(dataset, "webdataset", ("DataPipeline",))

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        stages = split_stages(dataset)  # the worker's copy's own stages
        if stages is None:
            return IterableReader(dataset)
        return ShardReader(dataset, stages, epoch)
