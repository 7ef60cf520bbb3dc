"""litdata's ``StreamingDataset`` (optimized chunks in object storage or a folder).

Each worker iterates the dataset with litdata's own ``__iter__`` (its cache, its chunk
shuffle, its split by rank and worker, its chunk downloads ahead) and places a resumed one with
litdata's own replay (``_resume``), told the count this worker had read: the resume downloads
again at most the chunk the worker was in. The epoch is the loader's, handed on through
``set_epoch`` as litdata's ``StreamingDataLoader`` does (its epochs count from 1).
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from dataecho.loader.streams.base import Stream, defined_in


class LitdataReader(BaseNode[Any]):
    """A worker's pass over a litdata dataset. State: the items it has read."""

    CHEAP_STATE = True  # a read-ahead may take it after every item (loader.read_ahead)

    def __init__(self, dataset: Any, epoch: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.epoch = epoch
        self._pos = 0
        self._start()
        # This worker's items this epoch: its chunk intervals, known once litdata has split.
        self.share: int | None = int(dataset.stop_length)

    def _start(self) -> None:
        self.dataset.reset_state_dict()
        self.dataset.set_epoch(self.epoch + 1)
        iter(self.dataset)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        ds = self.dataset
        self._pos = int(initial_state["pos"]) if initial_state else 0
        self._start()
        if self._pos:
            workers, worker = ds.worker_env.world_size, ds.worker_env.rank
            chunks, intervals = ds.shuffler.get_chunks_and_intervals_per_workers(
                ds.distributed_env, workers, ds.batch_size, ds.current_epoch
            )
            # litdata's replay reads this worker's count out of a count of samples handed out
            # round-robin one at a time: k * workers + worker gives this worker k.
            ds._state_dict = {"num_workers": workers, "batch_size": 1,
                              "num_samples_yielded": self._pos * workers + worker}  # fmt: skip
            try:
                ds._resume(chunks, intervals)
            finally:
                ds._state_dict = None
            ds.global_index = self._pos  # its items read in all (the replay sets the chunk's)

    def next(self) -> Any:
        item = next(self.dataset)
        self._pos += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"pos": self._pos}


class LitdataStream(Stream):
    NAME = "litdata"

    @classmethod
    def matches(cls, dataset: Any) -> bool:
        return defined_in(dataset, "litdata", ("StreamingDataset",))

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        return LitdataReader(dataset, epoch)
