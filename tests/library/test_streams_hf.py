"""Hugging Face streams (``load_dataset(..., streaming=True)``) under EchoingDataLoader, their
JSON Lines files served by nginx on 127.0.0.1: every insertion point and kind of factor, exact
resume through the library's own state that reads again at most the file each worker was in,
and ranks: a stream not split by node is split, one already split is not split again."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

import pytest
from conftest import needs_nginx
from streams_data import (
    CASES,
    N,
    check_epochs,
    check_rest_reads,
    check_resume,
    children,
    echoing,
    epoch_ids,
    nginx_gets,
    write_jsonl,
)

from dataecho.app.sources.nginx import NginxServer
from dataecho.loader.streams.hf import ShuffleBufferLostWarning

if TYPE_CHECKING:
    import datasets

pytestmark = needs_nginx
FILES = 8


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory):
    with NginxServer(write_jsonl(tmp_path_factory.mktemp("hf"), files=FILES)) as server:
        yield server


def stream(nginx, shuffle: bool = False) -> datasets.IterableDataset:
    # datasets (with pandas and pyarrow) is imported by the tests that use it, not at
    # collection in every test process.
    import datasets

    files = [f"{nginx.url}/part-{s}.jsonl" for s in range(FILES)]
    ds = datasets.load_dataset("json", data_files=files, streaming=True, split="train")
    if shuffle:  # the library's own shuffle: of its files, and through a buffer
        ds = ds.shuffle(seed=7, buffer_size=16)
    return ds


@pytest.mark.parametrize(("where", "factor", "workers"), CASES)
def test_every_example_is_delivered_as_often_as_the_factor_says(nginx, where, factor, workers):
    with pytest.warns(ShuffleBufferLostWarning, match="shuffle_buffer="):
        loader = echoing(stream(nginx, shuffle=True), where, factor, workers)
    orders = check_epochs(loader, factor)
    assert orders[0] != orders[1], "the stream is told the epoch: a new shuffle each"


def test_workers_starting_together_read_the_epoch_the_loader_set(nginx, monkeypatch):
    # The library keeps a stream's epoch in memory it shares with the workers, and its
    # set_epoch reads that value, then adds the change: two workers setting it at once may both
    # add it and read their files in another epoch's order. The window is widened here (the
    # same read, then add) so that they always overlap.
    def set_epoch(self, epoch: int) -> None:
        change = epoch - self._epoch
        time.sleep(0.2)
        self._epoch += change

    import datasets

    monkeypatch.setattr(datasets.IterableDataset, "set_epoch", set_epoch)
    dataset = stream(nginx, shuffle=True)
    with pytest.warns(ShuffleBufferLostWarning, match="shuffle_buffer="):
        loader = echoing(dataset, "after_augment", 2, 2)
    for epoch in range(3):
        check_epochs(loader, 2, epochs=1) if epoch == 0 else epoch_ids(loader)
        assert int(dataset.epoch) == epoch, f"epoch {epoch}: the stream read epoch {dataset.epoch}"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_at_every_kind_of_position(nginx, workers):
    check_resume(
        lambda: echoing(stream(nginx), "before_augment", 2.5, workers, shuffle_buffer=16),
        positions=[0, 7, 30], batches=30,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_a_resume_reads_again_at_most_the_file_each_worker_was_in(nginx, workers):
    # The library reads a file in two requests (its size, then its bytes): files are counted.
    # Its own state can point at the end of the file before; the reader moves it on.
    per_file = N // FILES
    check_rest_reads(
        lambda: echoing(stream(nginx), "after_augment", 2, workers, shuffle_buffer=0),
        lambda: [name for name in nginx_gets(nginx) if name.endswith(".jsonl")],
        lambda i: f"part-{i // per_file}.jsonl", workers=workers, head=16, once=False,
    )  # fmt: skip


@pytest.mark.parametrize("head", [6, 7, 9])
def test_a_resume_at_a_files_end_through_a_map_opens_no_file_before(nginx, head):
    # 4 fresh examples a batch at e = 2 after augmentation, 12 a file: 6 batches end file 1,
    # 7 are inside file 2, 9 end it. The library's state then points at the end of the file
    # before the one it was in.
    per_file = N // FILES
    check_rest_reads(
        lambda: echoing(stream(nginx).map(lambda e: {"y": e["id"] * 2}), "after_augment", 2, 0, shuffle_buffer=0),
        lambda: [name for name in nginx_gets(nginx) if name.endswith(".jsonl")],
        lambda i: f"part-{i // per_file}.jsonl", workers=1, head=head, once=False,
    )  # fmt: skip


def test_a_filtered_stream_resumes_exactly_as_the_library_places_it(nginx):
    # A filter hands on fewer rows than it reads: where files end is not learned, and the
    # library's own state is used as it is.
    kept = lambda: stream(nginx).filter(lambda e: e["id"] % 3 != 0)  # noqa: E731
    check_resume(lambda: echoing(kept(), "after_augment", 2, 0), positions=[5, 15],
                 batches=16)  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_two_ranks_read_disjoint_halves_of_a_stream_not_split_by_node(nginx, workers, monkeypatch):
    # RANK / WORLD_SIZE as torchrun sets them (tests/library/test_streams_ranks.py runs it).
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        seen.append(collections.Counter(epoch_ids(echoing(stream(nginx), "after_augment", 2,
                                                          workers))))  # fmt: skip
    assert not set(seen[0]) & set(seen[1]), "no example on both ranks"
    assert set(seen[0]) | set(seen[1]) == set(range(N))
    assert all(set(count.values()) == {2} for count in seen)


def test_a_stream_already_split_by_node_is_not_split_again(nginx, monkeypatch):
    from datasets.distributed import split_dataset_by_node

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    split = split_dataset_by_node(stream(nginx), rank=1, world_size=2)
    got = collections.Counter(epoch_ids(echoing(split, "after_augment", 2, 0)))
    assert len(got) == N // 2 and set(got.values()) == {2}
    assert sorted(got) == sorted(i for b in split.iter(batch_size=8) for i in b["id"])


def test_no_worker_process_is_left_behind(nginx):
    epoch_ids(echoing(stream(nginx), "after_augment", 2, 2))
    assert children() == []
