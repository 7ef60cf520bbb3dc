"""webdataset's WebDataset(urls) under EchoingDataLoader, its tar shards served by nginx on
127.0.0.1: every insertion point and kind of factor, exact resume that opens again at most the
shard each worker was in, and the pipelines it cannot place (a sample shuffle), which replay
and say so once."""

from __future__ import annotations

import pytest
from conftest import needs_nginx
from streams_data import (
    CASES,
    PER_SHARD,
    SHARDS,
    N,
    check_epochs,
    check_rest_reads,
    check_resume,
    children,
    echoing,
    epoch_ids,
    nginx_gets,
    write_tars,
)

from dataecho.app.sources.nginx import NginxServer
from dataecho.loader.streams.webdataset import ReplayOnResumeWarning

wds = pytest.importorskip("webdataset")
pytestmark = needs_nginx


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory):
    with NginxServer(write_tars(tmp_path_factory.mktemp("webdataset"))) as server:
        yield server


def dataset(nginx, **kwargs) -> wds.WebDataset:
    urls = [f"{nginx.url}/shard-{s:02d}.tar" for s in range(SHARDS)]
    options = dict(shardshuffle=SHARDS, detshuffle=True, seed=7, nodesplitter=None)
    return wds.WebDataset(urls, **{**options, **kwargs}).decode().to_tuple("id.txt", "x.npy")


@pytest.mark.parametrize(("where", "factor", "workers"), CASES)
def test_every_example_is_delivered_as_often_as_the_factor_says(nginx, where, factor, workers):
    orders = check_epochs(echoing(dataset(nginx), where, factor, workers), factor)
    assert orders[0] != orders[1], "detshuffle is told the epoch: a new shard order each"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_at_every_kind_of_position(nginx, workers):
    check_resume(
        lambda: echoing(dataset(nginx), "before_augment", 2.5, workers, shuffle_buffer=16),
        positions=[0, 7, 30], batches=30,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resume_opens_again_at_most_the_shard_each_worker_was_in(nginx, workers):
    check_rest_reads(
        lambda: echoing(dataset(nginx, shardshuffle=False), "after_augment", 2, workers, shuffle_buffer=0),
        lambda: [name for name in nginx_gets(nginx) if name.endswith(".tar")],
        lambda i: f"shard-{i // PER_SHARD:02d}.tar", workers=workers, head=12,
    )  # fmt: skip


def test_a_pipeline_that_mixes_shards_replays_and_says_so_once(nginx):
    mixed = dataset(nginx).shuffle(20)
    with pytest.warns(ReplayOnResumeWarning, match="shuffle_buffer") as caught:
        loader = echoing(mixed, "after_augment", 2, 0)
    assert len(caught) == 1
    assert sorted(set(epoch_ids(loader))) == list(range(N))


def test_no_worker_process_is_left_behind(nginx):
    epoch_ids(echoing(dataset(nginx), "after_augment", 2, 2))
    assert children() == []
