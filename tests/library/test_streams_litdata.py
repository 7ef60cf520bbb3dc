"""litdata's StreamingDataset under EchoingDataLoader, read from optimized chunks on an S3
endpoint (moto's server on 127.0.0.1): every insertion point and kind of factor, exact resume
that downloads again at most the chunk each worker was in, and the user's own
StreamingDataLoader as the upstream of batch and device echo."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest
from s3_server import S3Server
from streams_data import (
    CASES,
    check_epochs,
    check_rest_reads,
    check_resume,
    check_users_loader,
    children,
    echoing,
    epoch_ids,
    skip_without,
    upload,
    write_litdata,
)

from dataecho import EchoingDataLoader

skip_without("litdata", "moto", "boto3")

if TYPE_CHECKING:
    import litdata


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("litdata")
    with S3Server(folder) as server, pytest.MonkeyPatch.context() as env:
        for key, value in server.env.items():
            env.setenv(key, value)
        server.chunks = write_litdata(folder)
        server.remote = upload(server, server.chunks, "litdata")
        server.caches = folder / "caches"
        yield server


def dataset(s3, shuffle: bool = True, cache: str | None = None) -> litdata.StreamingDataset:
    """A StreamingDataset over the chunks on S3 with a cache folder of its own (empty, so
    every chunk it reads is downloaded, and counted), unless ``cache`` names one. litdata is
    imported by the tests that use it, not at collection in every test process."""
    import litdata

    return litdata.StreamingDataset(s3.remote, shuffle=shuffle, seed=7,
                                    cache_dir=str(s3.caches / (cache or uuid.uuid4().hex)),
                                    storage_options={"endpoint_url": s3.url})  # fmt: skip


@pytest.mark.parametrize(("where", "factor", "workers"), CASES)
def test_every_example_is_delivered_as_often_as_the_factor_says(s3, where, factor, workers):
    orders = check_epochs(echoing(dataset(s3), where, factor, workers), factor)
    assert orders[0] != orders[1], "litdata's shuffle draws a new order each epoch"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2])  # the main process's reading: test_streams_hf, _webdataset
def test_resume_is_exact_at_every_kind_of_position(s3, workers):
    # One cache for all the loaders: each chunk is downloaded once.
    cache = f"resume{workers}"
    check_resume(lambda: echoing(dataset(s3, cache=cache), "before_augment", 2.5, workers,
                                 shuffle_buffer=16),
                 positions=[0, 7, 30], batches=30)  # fmt: skip


def chunk_names(s3) -> list[str]:
    """Each example's chunk (written in order), from the chunks' own index."""
    index = json.loads((s3.chunks / "index.json").read_text())
    return [chunk["filename"] for chunk in index["chunks"] for _ in range(chunk["chunk_size"])]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resume_downloads_again_at_most_the_chunk_each_worker_was_in(s3, workers):
    names = chunk_names(s3)
    check_rest_reads(
        lambda: echoing(dataset(s3, shuffle=False), "after_augment", 2, workers, shuffle_buffer=0),
        lambda: [p.rsplit("/", 1)[1] for p in s3.requests() if p.endswith(".bin")],
        names.__getitem__, workers=workers, head=12,
    )  # fmt: skip


@pytest.mark.parametrize("where", ["batch", "device"])
def test_the_users_own_streaming_dataloader_is_the_upstream_of_batch_echo(s3, where):
    # litdata's StreamingDataLoader, with its own workers and resume protocol (which resumes
    # a dataset with the cache folder it was saved with).
    def make() -> EchoingDataLoader:
        import litdata

        users = litdata.StreamingDataLoader(dataset(s3, cache=where), batch_size=8,
                                            num_workers=2)  # fmt: skip
        return EchoingDataLoader(users, echo_factor=2, where=where, seed=0,
                                 echo_device="cpu" if where == "device" else None)  # fmt: skip

    check_users_loader(make, batches=12 * 2)


def test_no_worker_process_is_left_behind(s3):
    epoch_ids(echoing(dataset(s3), "after_augment", 2, 2))
    assert children() == []
