"""mosaicml-streaming's ``StreamingDataset`` (MDS shards in object storage or a folder).

Each worker reads the sample ids mosaic's own partition gives it (its shuffle, its split by
node, rank and worker: ``streaming.base.batching.generate_work``), each through the dataset's
``__getitem__`` (a subclass's included), which downloads the sample's shard when it is not in
the local cache. A worker's state is its position in its ids, so a resume downloads again at
most the shard it was in (when the cache no longer holds it) and never goes through the epoch.
The epoch is the loader's: mosaic's own epoch counter (in shared memory) is not used, and
neither is a state loaded into the dataset with its ``load_state_dict``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from dataecho.loader.streams.base import PositionReader, Stream, defined_in


def _worker_ids(dataset: Any, *, epoch: int, worker: int, num_workers: int) -> np.ndarray:
    """The sample ids worker ``worker`` of this rank reads in ``epoch``, as mosaic's own
    ``__iter__`` would give it (its padding, -1, left out)."""
    from streaming.base.batching import generate_work
    from streaming.base.world import World

    ranks = dataset._parallel_rank_world
    world = World(
        num_nodes=ranks.num_nodes,
        ranks_per_node=ranks.ranks_per_node,
        workers_per_rank=num_workers,
        worker=ranks.rank * num_workers + worker,
    )
    if not dataset.num_canonical_nodes:  # mosaic's own default, as its __iter__ sets it
        per_node = 64 if dataset.shuffle_algo in ("py1s", "py2s") else 1
        dataset.num_canonical_nodes = per_node * world.num_nodes
    dataset._set_shuffle_block_size(world)
    work = generate_work(dataset.batching_method, dataset, world, epoch, 0)
    ids = work[world.node, world.rank_of_node, world.worker_of_rank].flatten()
    return ids[ids >= 0]


class MosaicStream(Stream):
    NAME = "mosaic"

    @classmethod
    def matches(cls, dataset: Any) -> bool:
        return defined_in(dataset, "streaming", ("StreamingDataset",))

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        ids = _worker_ids(dataset, epoch=epoch, worker=worker, num_workers=num_workers)
        return PositionReader(ids, lambda sample_id: dataset[int(sample_id)])
