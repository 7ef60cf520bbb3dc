"""The streaming libraries a loader reads from, by name: each module knows one library's
dataset and reads a worker's share of it at an explicit position, so a resume reads again at
most the shard (or chunk) each worker was in, never the epoch.

=============  ====================================  =========================================
name           dataset                               a worker's position
=============  ====================================  =========================================
mosaic         ``streaming.StreamingDataset``        the sample ids of its own partition
litdata        ``litdata.StreamingDataset``          its own chunk intervals (litdata's resume)
webdataset     ``webdataset.WebDataset(urls)``       shard and sample in it
hf             ``datasets.IterableDataset``          its own ``state_dict`` (split by rank)
=============  ====================================  =========================================

Each library splits by rank and worker itself; the loader uses that split and never splits
again. A dataset is matched by its class's module, so no library is imported until one of its
datasets is passed. Any other iterable dataset is read as it is
(:class:`~dataecho.loader.reading.IterableReader`).
"""

from __future__ import annotations

from typing import Any

from dataecho.loader.streams.base import Stream
from dataecho.loader.streams.hf import HFStream
from dataecho.loader.streams.litdata import LitdataStream
from dataecho.loader.streams.mosaic import MosaicStream
from dataecho.loader.streams.webdataset import WebDatasetStream

REGISTRY: dict[str, type[Stream]] = {
    "mosaic": MosaicStream,
    "litdata": LitdataStream,
    "webdataset": WebDatasetStream,
    "hf": HFStream,
}


def find_stream(dataset: Any) -> Stream | None:
    """The streaming library's adapter for ``dataset``, or None for any other dataset."""
    for kind in REGISTRY.values():
        if kind.matches(dataset):
            return kind(dataset)
    return None


__all__ = ["REGISTRY", "Stream", "find_stream"]
