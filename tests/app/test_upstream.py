"""The data of a run per upstream spec, and `prepare`: real Fashion-MNIST and Austen, real shards."""

from __future__ import annotations

import dataclasses
import itertools
import socket

import numpy as np
import pytest
import torch

from dataecho import augment
from dataecho.app.config import TrainConfig
from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR
from dataecho.app.sources.austen import INSTALL_COMMAND as AUSTEN_INSTALL
from dataecho.app.sources.emulated import EmulatedStorage
from dataecho.app.sources.fashion_mnist import (
    DEFAULT_DATA_DIR,
    FILES,
    INSTALL_COMMAND,
    DataNotFoundError,
    load_split,
    write_subset,
)
from dataecho.app.sources.shard_writer import write_text_shards
from dataecho.app.sources.shards import MANIFEST, ShardDataset
from dataecho.app.sources.throttled import Throttled
from dataecho.app.upstream import UpstreamError, build_data, prepare
from dataecho.app.workloads.char_lm import SplitChunk
from dataecho.app.workloads.image_augment import Augment

needs_fashion = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason=f"Fashion-MNIST not installed ({INSTALL_COMMAND})",
)
needs_austen = pytest.mark.skipif(
    not (DEFAULT_PACKAGE_DIR / "data" / "Rdata.rdx").is_file(),
    reason=f"janeaustenr not installed ({AUSTEN_INSTALL})",
)


@pytest.fixture(scope="module")
def fm_dir(tmp_path_factory):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND})")
    return write_subset(tmp_path_factory.mktemp("fm"), train=700, test=300)


@pytest.fixture(scope="module")
def fm_shards(fm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    manifest, written = prepare(out, data_dir=fm_dir, examples_per_shard=100)
    assert written
    return out, manifest


@needs_fashion
def test_in_memory_upstream_is_throttled_map_style_data(fm_dir):
    cfg = TrainConfig(data_dir=fm_dir, read_delay=0.001, train_examples=500, eval_examples=200)
    data = build_data(cfg)
    assert isinstance(data.train, Throttled) and data.train.delay == 0.001
    assert len(data.train) == 500 and data.identity.startswith("memory:cnn:500:")
    other = build_data(dataclasses.replace(cfg, train_examples=499))
    same = build_data(cfg)
    assert other.identity != data.identity == same.identity  # the content is named
    # Augmented batch by batch (shifted and flipped as uint8: the step normalises), except
    # after augmentation, where the copies must be identical.
    assert data.transform is None and isinstance(data.batch_transform, augment.ShiftFlip)
    after = build_data(dataclasses.replace(cfg, where="after_augment"))
    assert isinstance(after.transform, Augment) and after.batch_transform is None
    inputs, labels = data.eval_set
    assert inputs.dtype == torch.float32 and inputs.shape == (200, 1, 28, 28)
    assert abs(float(inputs.mean())) < 0.5  # normalised once, up front
    assert data.final_set[0].dtype == torch.uint8 and len(data.final_set[1]) == 300
    assert data.description == (
        "in memory: Fashion-MNIST train (500 examples), 1000 us delay per read "
        "(emulated slow storage)"
    )


@needs_fashion
def test_augment_pad_reaches_the_augmentation_and_an_impossible_one_is_refused_up_front(fm_dir):
    cfg = TrainConfig(data_dir=fm_dir, eval_examples=50, augment_pad=3)
    assert build_data(cfg).batch_transform.pad == 3
    flip_only = build_data(dataclasses.replace(cfg, augment_pad=0, where="after_augment"))
    image = torch.arange(28 * 28, dtype=torch.uint8).reshape(1, 28, 28)
    shifted = {flip_only.transform(image).flatten()[0].item() for _ in range(40)}
    assert len(shifted) == 2  # the first pixel: its own value or, flipped, the row's last
    with pytest.raises(ValueError, match=r"augment_pad must be below .*28 pixels.*got 28"):
        build_data(dataclasses.replace(cfg, augment_pad=28))


@needs_fashion
def test_prepare_round_trip_is_exact_and_a_second_call_writes_nothing(fm_dir, fm_shards):
    out, manifest = fm_shards
    assert manifest["total"] == 700 and len(manifest["shards"]) == 7
    images, labels = load_split(fm_dir, "train")
    got = list(ShardDataset(out))
    assert len(got) == 700
    for i, (image, label) in enumerate(got):  # in order, bit for bit
        assert np.array_equal(image[0].numpy(), images[i]) and label == labels[i], i
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again, written = prepare(out, data_dir=fm_dir, examples_per_shard=100)
    assert not written and again == manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


@needs_fashion
def test_prepare_rewrites_when_the_data_changes(fm_dir, tmp_path):
    prepare(tmp_path, data_dir=fm_dir, examples_per_shard=100)
    manifest, written = prepare(tmp_path, data_dir=fm_dir, examples=250, examples_per_shard=100)
    assert written and manifest["total"] == 250
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fashion-mnist-000000.tar", "fashion-mnist-000001.tar", "fashion-mnist-000002.tar",
        MANIFEST,
    ]  # fmt: skip


@needs_fashion
def test_local_shards_upstream_reads_a_new_shard_order_each_epoch(fm_dir, fm_shards):
    out, manifest = fm_shards
    data = build_data(TrainConfig(data_dir=fm_dir, upstream=str(out), seed=3))
    assert isinstance(data.train, ShardDataset) and data.train.shuffle_shards
    assert data.identity == f"shards:{manifest['fingerprint']}"
    assert data.description.startswith(f"shards on local disk: {out} (7 shards, 700 examples")
    orders = []
    for epoch in (0, 1, 0):
        data.set_epoch(epoch)
        orders.append(data.train.shard_order())
    assert orders[0] == orders[2] != orders[1] and sorted(orders[0]) == sorted(orders[1])


@needs_fashion
def test_emulated_upstream_says_so_and_streams(fm_dir, fm_shards):
    storage = EmulatedStorage(fm_shards[0], bandwidth_bytes_per_s=50e6, latency_s=0.001)
    data = build_data(TrainConfig(data_dir=fm_dir, upstream=storage.url))
    assert data.description.startswith(
        f"EMULATED storage (local files, no network): {fm_shards[0]}, 50 MB/s per stream, "
        "1 ms latency"
    )
    first = list(itertools.islice(iter(data.train), 5))
    assert [len(x) for x in first] == [2] * 5 and first[0][0].shape == (1, 28, 28)


@needs_fashion
def test_missing_or_unreachable_upstreams_say_what_to_do(fm_dir, tmp_path):
    with pytest.raises(DataNotFoundError, match=r"no manifest.json in .*dataecho prepare --out"):
        build_data(TrainConfig(data_dir=fm_dir, upstream=str(tmp_path)))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(
        UpstreamError,
        match=f"cannot read {url}/manifest.json after retrying .*retry_seconds=0.3 sets how long"
        ".*check that the upstream is up",
    ):
        build_data(TrainConfig(data_dir=fm_dir, upstream=url, retry_seconds=0.3))
    write_text_shards([np.arange(5, dtype=np.uint8)], tmp_path / "text")
    with pytest.raises(UpstreamError, match="holds tokens shards, but workload='cnn' trains on"):
        build_data(TrainConfig(data_dir=fm_dir, upstream=str(tmp_path / "text")))


def test_missing_fashion_mnist_gives_the_install_command(tmp_path):
    with pytest.raises(DataNotFoundError, match="apt-get install dataset-fashion-mnist"):
        build_data(TrainConfig(data_dir=tmp_path))
    with pytest.raises(DataNotFoundError, match="--data-dir DIR"):
        prepare(tmp_path / "out", data_dir=tmp_path)


@needs_austen
@pytest.mark.timeout(120)
def test_austen_in_memory_and_as_text_shards_hold_the_same_chunks(tmp_path):
    manifest, written = prepare(
        tmp_path, "austen", examples=300, examples_per_shard=128, seq_len=32
    )
    assert written and manifest["kind"] == "tokens" and manifest["total"] == 300
    cfg = TrainConfig(workload="char-lm", seq_len=32, train_examples=300, eval_examples=50)
    memory = build_data(cfg)
    assert memory.vocab_size == 82 and memory.transform is None and len(memory.train) == 300
    assert memory.eval_set[0].shape == (50, 32) and memory.identity.startswith(
        "memory:char-lm:300:"
    )
    x, y = memory.eval_set
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert len(memory.final_set[0]) > 50  # the whole validation split
    shards = build_data(TrainConfig(workload="char-lm", seq_len=32, upstream=str(tmp_path)))
    assert isinstance(shards.transform, SplitChunk)
    for i, chunk in enumerate(ShardDataset(tmp_path)):  # unshuffled: in written order
        assert all(torch.equal(a, b) for a, b in zip(shards.transform(chunk), memory.train[i],
                                                     strict=True)), i  # fmt: skip
    with pytest.raises(ValueError, match="needs 65 ids; prepare with --seq-len 32"):
        SplitChunk(64)(chunk)
