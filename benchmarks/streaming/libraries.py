"""Each library's dataset over its rate-capped server, its own loader, and dataecho's.

A :class:`Library` builds, each time it is asked, a *fresh* dataset: mosaic and litdata cache
the shards they download in a local folder, so every loader gets an empty folder of its own
(every shard it reads then crosses the network, capped and counted), as a new job on a new
machine would. Shuffled where the library shuffles with a resume dataecho can place:

- mosaic: ``shuffle_algo="py1s"`` (the shards in a new order each epoch, the samples within
  each shard), one canonical node, so one worker reads shard after shard;
- litdata: ``shuffle=True`` (its chunks in a new order, the samples within each);
- webdataset: the shard list, ``detshuffle`` (a sample ``shuffle`` stage would mix shards,
  which a position cannot place: dataecho reads such a pipeline but replays it on resume);
- hf: not shuffled: the library's ``shuffle`` always adds a sample buffer, whose examples its
  own resume loses (dataecho warns); the files are read in order.

The library's own loader without echo: mosaic's and litdata's ``StreamingDataLoader``, torch's
``DataLoader`` for webdataset and hf.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.streaming.data import Shards, decode_json_example
from benchmarks.streaming.servers import CREDENTIALS
from dataecho import EchoingDataLoader
from dataecho.app.sources.nginx import NginxServer

NAMES = ("mosaic", "litdata", "webdataset", "hf")
SEED = 7  # the libraries' shuffle seed


class Library:
    """One library's data (``shards``) behind a capped nginx: the folder itself, or, with
    ``s3`` (moto's URL) and ``remote`` (the ``s3://`` URL of the upload), a proxy to S3."""

    def __init__(
        self,
        name: str,
        shards: Shards,
        *,
        s3: str | None = None,
        remote: str | None = None,
        caches: Path,
        batch_size: int,
        workers: int,
    ) -> None:
        self.name, self.shards, self.s3, self.remote = name, shards, s3, remote
        self.caches, self.batch_size, self.workers = caches, batch_size, workers
        self.nginx: NginxServer | None = None
        self.cap = 0  # bytes/s, all workers together
        self._hf: Any = None  # the Hugging Face stream, built once (see dataset())

    @property
    def server(self) -> NginxServer:
        if self.nginx is None:
            raise RuntimeError(f"{self.name}: not served yet; call serve(cap) first")
        return self.nginx

    def serve(self, cap: int) -> NginxServer:
        """Serve at ``cap`` bytes/s: start nginx, or start it again on the same port (so the
        URLs the datasets hold stay valid) at the new cap. One reader at a time per worker:
        the cap is split between the workers."""
        port = None
        if self.nginx is not None:
            port = self.nginx.port
            self.nginx.stop()
        self.cap = cap
        share = {"total_rate_bytes_per_s": cap, "connections": self.workers, "port": port}
        if self.s3 is not None:
            self.nginx = NginxServer(proxy=self.s3, **share)
        else:
            self.nginx = NginxServer(self.shards.folder, **share)
        return self.nginx.start()

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()

    # --- datasets ---------------------------------------------------------------------------

    def cache(self) -> Path:
        """A new, empty local cache folder (mosaic's ``local``, litdata's ``cache_dir``)."""
        return self.caches / uuid.uuid4().hex

    def dataset(self) -> Any:
        """A fresh dataset over the capped server (a new, empty cache where it has one).

        A Hugging Face stream keeps nothing locally: it is built once (``load_dataset`` reads
        the first file in this process, to learn the columns) and each loader gets a copy.
        Building it again for every loader also hung now and then: fsspec's HTTP client in
        this process waited for an answer that had come (a connection from an earlier
        ``load_dataset``, its answer unread), until aiohttp's 5-minute timeout.
        """
        if self.name == "mosaic":
            from benchmarks.streaming.mosaic_import import import_streaming

            streaming = import_streaming()
            locks = self.caches.parent / "mosaic-locks"  # kept until the run's folder goes
            locks.mkdir(parents=True, exist_ok=True)
            with temp_folder(locks):
                return streaming.StreamingDataset(
                    remote=self.remote, local=str(self.cache()), batch_size=self.batch_size,
                    shuffle=True, shuffle_seed=SEED, shuffle_algo="py1s", num_canonical_nodes=1,
                )  # fmt: skip
        if self.name == "litdata":
            import litdata

            return litdata.StreamingDataset(
                self.remote, cache_dir=str(self.cache()), shuffle=True, seed=SEED,
                storage_options={"endpoint_url": self.server.url},
            )  # fmt: skip
        urls = [f"{self.server.url}/{name}" for name in self.shards.names]
        if self.name == "webdataset":
            import webdataset as wds

            pipeline = wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, seed=SEED,
                                      nodesplitter=None)  # fmt: skip
            return pipeline.decode().to_tuple("image.npy", "cls", "__key__")
        if self.name == "hf":
            if self._hf is None:
                import datasets

                stream = datasets.load_dataset("json", data_files=urls, streaming=True,
                                               split="train")  # fmt: skip
                self._hf = stream.map(decode_json_example)
            return copy.deepcopy(self._hf)
        raise ValueError(f"unknown library {self.name!r}; choose from {', '.join(NAMES)}")

    # --- loaders ----------------------------------------------------------------------------

    def own_loader(self) -> Any:
        """The library's own loader, without echo, over a fresh dataset."""
        ds, b, w = self.dataset(), self.batch_size, self.workers
        if self.name == "mosaic":
            from benchmarks.streaming.mosaic_import import import_streaming

            return import_streaming().StreamingDataLoader(ds, batch_size=b, num_workers=w)
        if self.name == "litdata":
            import litdata

            return litdata.StreamingDataLoader(ds, batch_size=b, num_workers=w)
        return DataLoader(ds, batch_size=b, num_workers=w)

    def echoing_loader(
        self, echo_factor: float | str, where: str, **options: Any
    ) -> EchoingDataLoader:
        """dataecho's loader at ``echo_factor`` over a fresh dataset; ``options``: more of its
        keywords (``read_ahead``, ``reuse_buffer``), where given."""
        return EchoingDataLoader(self.dataset(), batch_size=self.batch_size,
                                 num_workers=self.workers, echo_factor=echo_factor,
                                 where=where, seed=0, **options)  # fmt: skip

    def clear_caches(self) -> None:
        """Remove the local caches of the loaders built so far."""
        shutil.rmtree(self.caches, ignore_errors=True)


def split(batch: Any) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A batch of any of the libraries as (uint8 images (B, 1, 28, 28), labels, example ids)."""
    if isinstance(batch, dict):
        images, labels, ids = batch["image"], batch["label"], batch["id"]
    else:  # webdataset's tuple: the id is the sample's key
        images, labels, ids = batch
    images = torch.as_tensor(images)
    if images.dim() == 3:
        images = images.unsqueeze(1)
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    return images, torch.as_tensor(labels, dtype=torch.int64), ids


@contextmanager
def temp_folder(path: Path) -> Iterator[None]:
    """``tempfile``'s folder set to ``path`` for the block, then as before: mosaic takes the
    folder of its lock files (one pair per dataset, left behind) from it as it builds a
    dataset. Only that long: the loader workers' own sockets go in the temp folder too, and a
    long path there would exceed a socket's 108 characters."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def s3_environment(mosaic_endpoint: str | None) -> dict[str, str]:
    """What mosaic and litdata read from the environment: test credentials, and mosaic's
    endpoint (``S3_ENDPOINT_URL``; litdata is given its own in ``storage_options``)."""
    values = dict(CREDENTIALS)
    if mosaic_endpoint is not None:
        values["S3_ENDPOINT_URL"] = mosaic_endpoint
    return values
