"""WebDataset shards: bit-exact round trip, idempotent writes, worker/rank splits, shard order."""

from __future__ import annotations

import collections
import io
import json
import logging
import random
import tarfile
import warnings

import numpy as np
import pytest
import torch
from conftest import torch_roundtrip
from PIL import Image
from test_reliability_resume import damage_png

from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, INSTALL_COMMAND, load_split
from dataecho.app.sources.retrying import BadRecordError
from dataecho.app.sources.shard_writer import write_image_shards, write_text_shards
from dataecho.app.sources.shards import MANIFEST, ShardDataset, load_manifest, shard_urls
from dataecho.errors import DataechoError
from dataecho.loader import EchoingDataLoader

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file(),
    reason=f"Fashion-MNIST not installed ({INSTALL_COMMAND})",
)


@pytest.fixture(scope="module")
def fashion():
    """The first 600 Fashion-MNIST test images and labels: real data, small."""
    if not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND})")
    images, labels = load_split(split="test")
    return images[:600].copy(), labels[:600].copy()


def synthetic(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


@needs_data
def test_round_trip_is_bit_exact_and_in_order(fashion, tmp_path):
    images, labels = fashion
    manifest = write_image_shards(images, labels, tmp_path, examples_per_shard=128, prefix="fm")
    assert [s["count"] for s in manifest["shards"]] == [128, 128, 128, 128, 88]
    assert manifest["total"] == 600 and manifest["kind"] == "image"
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    for s in manifest["shards"]:
        assert (tmp_path / s["name"]).stat().st_size == s["bytes"]
    out = list(ShardDataset(tmp_path))
    assert len(out) == 600
    for i, (image, label) in enumerate(out):
        assert image.dtype == torch.uint8 and image.shape == (1, 28, 28)
        assert type(label) is int
        assert np.array_equal(image[0].numpy(), images[i]) and label == labels[i], f"example {i}"


@needs_data
@pytest.mark.timeout(60)
def test_two_workers_read_disjoint_shards_every_example_once(fashion, tmp_path):
    images, labels = fashion
    write_image_shards(images, labels, tmp_path, examples_per_shard=50)
    want = collections.Counter(
        (im.tobytes(), int(lab)) for im, lab in zip(images, labels, strict=True)
    )
    loader = EchoingDataLoader(ShardDataset(tmp_path), batch_size=64, num_workers=2, seed=0)
    got = collections.Counter()
    for x, y in loader:
        got.update((im[0].numpy().tobytes(), int(lab)) for im, lab in zip(x, y, strict=True))
    assert got == want
    assert loader.stats.fresh_examples == 600


def test_second_write_is_skipped_and_changes_are_rewritten(tmp_path):
    images, labels = synthetic(250)
    first = write_image_shards(images, labels, tmp_path, examples_per_shard=100)
    times = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = write_image_shards(images, labels, tmp_path, examples_per_shard=100)
    assert again == first
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == times  # untouched

    labels2 = labels.copy()
    labels2[7] = (labels2[7] + 1) % 10
    changed = write_image_shards(images, labels2, tmp_path, examples_per_shard=100)
    assert changed["fingerprint"] != first["fingerprint"]
    assert changed["shards"][0]["sha256"] != first["shards"][0]["sha256"]
    assert changed["shards"][1:] == first["shards"][1:]  # same bytes: tar mtimes are fixed

    bigger = write_image_shards(images, labels2, tmp_path, examples_per_shard=200)
    assert [s["count"] for s in bigger["shards"]] == [200, 50]
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == [s["name"] for s in bigger["shards"]]


def test_a_damaged_shard_is_rewritten(tmp_path):
    images, labels = synthetic(30)
    first = write_image_shards(images, labels, tmp_path, examples_per_shard=10)
    path = tmp_path / first["shards"][1]["name"]
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[600] ^= 0xFF
    path.write_bytes(bytes(data))
    again = write_image_shards(images, labels, tmp_path, examples_per_shard=10)
    assert again == first and path.read_bytes() != bytes(data)
    assert [int(y) for _, y in ShardDataset(tmp_path)] == labels.tolist()


def test_token_shards_round_trip_as_int64(tmp_path):
    rng = np.random.default_rng(1)
    chunks = [rng.integers(0, 30000, size=n).astype(np.int16) for n in (5, 64, 1, 17)]
    chunks.append(np.arange(300, dtype=np.uint16) * 200)
    manifest = write_text_shards(chunks, tmp_path, examples_per_shard=2)
    assert manifest["kind"] == "tokens" and [s["count"] for s in manifest["shards"]] == [2, 2, 1]
    out = list(ShardDataset(tmp_path))
    assert len(out) == len(chunks)
    for got, want in zip(out, chunks, strict=True):
        assert got.dtype == torch.int64 and got.tolist() == want.astype(np.int64).tolist()
    times = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert write_text_shards(chunks, tmp_path, examples_per_shard=2) == manifest
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == times


def test_shard_urls_for_paths_http_and_emulated_bases(tmp_path):
    manifest = {"shards": [{"name": "a-000000.tar"}, {"name": "a-000001.tar"}]}
    assert shard_urls(tmp_path, manifest) == [str(tmp_path / "a-000000.tar"),
                                              str(tmp_path / "a-000001.tar")]  # fmt: skip
    assert shard_urls("http://127.0.0.1:8080/", manifest)[1] == (
        "http://127.0.0.1:8080/a-000001.tar"
    )
    assert shard_urls("emulated:/d/x y?bandwidth=1.0&latency=0.0", manifest)[0] == (
        "emulated:/d/x y/a-000000.tar?bandwidth=1.0&latency=0.0"
    )


def test_workers_and_ranks_get_disjoint_shards(tmp_path, monkeypatch):
    images, labels = synthetic(70)
    write_image_shards(images, labels, tmp_path, examples_per_shard=10)  # 7 shards
    dataset = ShardDataset(tmp_path)
    # webdataset reads the worker and rank from these variables when they are set.
    parts = []
    for worker in range(3):
        monkeypatch.setenv("WORKER", str(worker))
        monkeypatch.setenv("NUM_WORKERS", "3")
        parts.append([y for _, y in dataset])
    assert [len(p) for p in parts] == [30, 20, 20]
    assert sorted(sum(parts, [])) == sorted(labels.tolist())
    monkeypatch.setenv("NUM_WORKERS", "1")
    monkeypatch.setenv("WORKER", "0")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert [y for _, y in dataset] == labels.reshape(7, 10)[1::2].ravel().tolist()
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "7")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(dataset) == []  # an idle rank, and a warning saying why
    assert any("7 shards for 8 rank(s)" in str(w.message) for w in caught)


def test_shard_shuffle_is_seeded_per_epoch_and_complete(tmp_path):
    images, labels = synthetic(100)
    write_image_shards(images, labels, tmp_path, examples_per_shard=10)
    dataset = ShardDataset(tmp_path, shuffle_shards=True, seed=3)
    orders = []
    for epoch in (0, 1, 0):
        dataset.set_epoch(epoch)
        orders.append(dataset.shard_order())
        random.seed(5)
        got = [y for _, y in dataset]
        assert random.random() == random.Random(5).random()  # Python's global RNG untouched
        assert sorted(got) == sorted(labels.tolist())
    assert orders[0] == orders[2] != orders[1]
    assert sorted(orders[0]) == sorted(ShardDataset(tmp_path).shard_order())
    assert ShardDataset(tmp_path, shuffle_shards=True, seed=4).shard_order() != orders[0]


def test_bad_inputs_name_the_value_and_the_fix(tmp_path):
    images, labels = synthetic(4)
    with pytest.raises(ValueError, match=r"uint8 of shape \(N, 28, 28\), got float64"):
        write_image_shards(images.astype(float), labels, tmp_path)
    with pytest.raises(ValueError, match="4 images, labels"):
        write_image_shards(images, labels[:3], tmp_path)
    with pytest.raises(ValueError, match="examples_per_shard must be >= 1, got 0"):
        write_image_shards(images, labels, tmp_path, examples_per_shard=0)
    with pytest.raises(ValueError, match="prefix must be a plain file-name stem"):
        write_image_shards(images, labels, tmp_path, prefix="a/b")
    with pytest.raises(ValueError, match="nothing to write"):
        write_image_shards(images[:0], labels[:0], tmp_path)
    with pytest.raises(ValueError, match="token chunk 1 must be a 1-D array"):
        write_text_shards([np.zeros(3, np.int32), np.zeros(3, np.float32)], tmp_path)
    with pytest.raises(FileNotFoundError, match="write the shards first"):
        load_manifest(tmp_path / "nowhere")
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "other", "version": 9}))
    with pytest.raises(ValueError, match="not a dataecho-webdataset-shards v1 manifest"):
        ShardDataset(tmp_path)
    (tmp_path / MANIFEST).write_text('{"format": "dataecho-webdataset-')  # cut short
    with pytest.raises(DataechoError, match=r"manifest.json: the manifest is not JSON .*prepare"):
        load_manifest(tmp_path)


def test_a_png_that_is_not_grayscale_is_a_bad_record_naming_its_mode(tmp_path, caplog):
    images, labels = synthetic(3)
    write_image_shards(images, labels, tmp_path)
    shard = next(tmp_path.glob("*.tar"))
    color = io.BytesIO()
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(color, format="PNG")
    members = []
    with tarfile.open(shard) as tar:
        for m in tar.getmembers():
            data = tar.extractfile(m).read()
            members.append((m, color.getvalue() if m.name == "00000001.png" else data))
    with tarfile.open(shard, "w") as tar:
        for m, data in members:
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    with pytest.raises(BadRecordError, match="key '00000001'.*got a 28x28 image of mode RGB"):
        list(ShardDataset(tmp_path))
    kept = ShardDataset(tmp_path, on_bad_record="skip")
    with quiet_skips(caplog):
        assert [y for _, y in kept] == [labels[0], labels[2]] and kept.skipped == 1


# --- bad records skipped: counted over every pass and worker ---------------------------------


@pytest.fixture
def three_bad(tmp_path):
    """120 records in 6 shards of 20; one record of shards 0, 3 and 4 has a broken PNG."""
    images, labels = synthetic(120, seed=1)
    write_image_shards(images, labels, tmp_path, examples_per_shard=20)
    shards = sorted(tmp_path.glob("*.tar"))
    for shard, record in ((shards[0], 3), (shards[3], 5), (shards[4], 1)):
        shard.chmod(0o644)
        damage_png(shard, record)
    return tmp_path


def quiet_skips(caplog):
    """The skip warnings off (one per bad record), here and in forked loader workers."""
    return caplog.at_level(logging.ERROR, logger="dataecho.shards")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipped_records_add_up_over_workers_and_epochs(three_bad, num_workers, caplog):
    dataset = ShardDataset(three_bad, on_bad_record="skip", shuffle_shards=True)
    loader = EchoingDataLoader(dataset, batch_size=8, num_workers=num_workers, seed=0)
    totals = []
    with quiet_skips(caplog):
        for epoch in range(2):
            dataset.set_epoch(epoch)  # as the training loop does, before each epoch
            assert sum(len(y) for _, y in loader) == 117  # every good record, once
            totals.append(dataset.skipped_total)
    assert totals == [3, 6]  # in the training process, whichever worker skipped them
    assert dataset.skipped_checkpoint(mid_pass=True) == 3  # the finished epoch's
    assert dataset.skipped_checkpoint(mid_pass=False) == 6
    assert ShardDataset(three_bad).skipped_total == 0  # "raise" skips nothing


@pytest.mark.timeout(60)
def test_a_resumed_loader_counts_each_skipped_record_once(three_bad, caplog):
    """A checkpoint mid-epoch, from a worker state a few batches old (so the resume replays):
    the resumed count equals the uninterrupted one, none lost, none twice."""

    def make():
        dataset = ShardDataset(three_bad, on_bad_record="skip")
        return dataset, EchoingDataLoader(dataset, batch_size=8, num_workers=1, seed=0,
                                          snapshot_every_n_steps=4)  # fmt: skip

    with quiet_skips(caplog):
        whole, loader = make()
        for epoch in range(2):
            whole.set_epoch(epoch)
            list(loader)
        assert whole.skipped_total == 6
        dataset, loader = make()
        list(loader)  # epoch 0: 3 skipped, a finished pass
        dataset.set_epoch(1)
        it = iter(loader)
        for _ in range(9):  # 72 good records: past shard 3's bad one, not yet shard 4's
            next(it)  # (which the worker, reading ahead, may well have skipped already)
        state = torch_roundtrip(loader.state_dict())
        kept = dataset.skipped_checkpoint(mid_pass=state["root"] is not None)
        loader.close()
        resumed, loader = make()
        loader.load_state_dict(state)
        resumed.resume_skipped(kept)
        resumed.set_epoch(1)
        rest = sum(len(y) for _, y in loader)
    assert kept == 3 and rest == 117 - 72
    assert resumed.skipped_total == whole.skipped_total == 6
