"""mosaicml-streaming's StreamingDataset under EchoingDataLoader, read from MDS shards on an S3
endpoint (moto's server on 127.0.0.1): every insertion point and kind of factor, exact resume
that downloads again at most the shard each worker was in, and the user's own
StreamingDataLoader as the upstream of batch and device echo."""

from __future__ import annotations

import json
import os
import tempfile
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
    write_mds,
)

from dataecho import EchoingDataLoader

skip_without("streaming", "moto", "boto3")
from mosaic_streaming import import_streaming  # noqa: E402

if TYPE_CHECKING:
    import streaming

# mosaic hands its ndarray fields over read-only: torch's collate says so once.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("mosaic")
    with S3Server(folder) as server, pytest.MonkeyPatch.context() as env:
        for key, value in server.env.items():
            env.setenv(key, value)
        # mosaic leaves a lock file per dataset in the temp folder: this test's own, then.
        env.setattr(tempfile, "tempdir", str(folder))
        server.mds = write_mds(folder)
        server.remote = upload(server, server.mds, "mds")
        server.caches = folder / "caches"
        yield server


def dataset(s3, shuffle: bool = True) -> streaming.StreamingDataset:
    """A StreamingDataset over the shards on S3 with a cache folder of its own (empty, so
    every shard it reads is downloaded, and counted). mosaic is imported by the tests that use
    it, not at collection in every test process."""
    local = s3.caches / uuid.uuid4().hex
    return import_streaming().StreamingDataset(remote=s3.remote, local=str(local), batch_size=8,
                                             shuffle=shuffle, shuffle_seed=7)  # fmt: skip


@pytest.mark.parametrize(("where", "factor", "workers"), CASES)
def test_every_example_is_delivered_as_often_as_the_factor_says(s3, where, factor, workers):
    orders = check_epochs(echoing(dataset(s3), where, factor, workers), factor)
    assert orders[0] != orders[1], "mosaic's shuffle draws a new order each epoch"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2])  # the main process's reading: test_streams_hf, _webdataset
def test_resume_is_exact_at_every_kind_of_position(s3, workers):
    check_resume(lambda: echoing(dataset(s3), "before_augment", 2.5, workers, shuffle_buffer=16),
                 positions=[0, 7, 30], batches=30)  # fmt: skip


def shard_names(s3) -> list[str]:
    """Each example's shard (written in order), from the shards' own index."""
    index = json.loads((s3.mds / "index.json").read_text())
    return [shard["raw_data"]["basename"] for shard in index["shards"]
            for _ in range(shard["samples"])]  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resume_downloads_again_at_most_the_shard_each_worker_was_in(s3, workers):
    # In mosaic's own order, unshuffled, each worker reads its shards one after the other.
    names = shard_names(s3)
    check_rest_reads(
        lambda: echoing(dataset(s3, shuffle=False), "after_augment", 2, workers, shuffle_buffer=0),
        lambda: [p.rsplit("/", 1)[1] for p in s3.requests() if p.endswith(".mds")],
        names.__getitem__, workers=workers, head=12,
    )  # fmt: skip


@pytest.mark.parametrize("where", ["batch", "device"])
def test_the_users_own_streaming_dataloader_is_the_upstream_of_batch_echo(s3, where):
    # mosaic's StreamingDataLoader, with its own workers and resume protocol.
    def make() -> EchoingDataLoader:
        users = import_streaming().StreamingDataLoader(dataset(s3), batch_size=8, num_workers=2)
        return EchoingDataLoader(users, echo_factor=2, where=where, seed=0,
                                 echo_device="cpu" if where == "device" else None)  # fmt: skip

    check_users_loader(make, batches=24)


def test_no_worker_process_is_left_behind(s3):
    epoch_ids(echoing(dataset(s3), "after_augment", 2, 2))
    assert children() == []
    assert os.environ["S3_ENDPOINT_URL"] == s3.url
