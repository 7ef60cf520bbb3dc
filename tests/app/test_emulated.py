"""The storage emulation: its rate and latency, and shards streamed through it by webdataset.

Rates are checked over reads of about 1.5 s; the pacing is a schedule from the open, so a
late sleep is paid back by the next read and only the last one can overshoot.
"""

from __future__ import annotations

import collections
import importlib
import math
import os
import time

import numpy as np
import pytest

from dataecho.app.sources.emulated import EmulatedStorage, EmulatedStream, open_emulated
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.sources.shards import ShardDataset, shard_urls
from dataecho.loader import EchoingDataLoader

gopen = importlib.import_module("webdataset.gopen")


def read_all(stream, chunk: int) -> bytes:
    parts = []
    while block := stream.read(chunk):
        parts.append(block)
    stream.close()
    return b"".join(parts)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("chunk", [4096, 1 << 20])
def test_rate_is_the_set_bandwidth_within_10_percent(tmp_path, chunk):
    data = os.urandom(1_500_000)
    (tmp_path / "f.bin").write_bytes(data)
    storage = EmulatedStorage(tmp_path, bandwidth_bytes_per_s=1_000_000, latency_s=0.05)
    url = shard_urls(storage.url, {"shards": [{"name": "f.bin"}]})[0]
    start = time.perf_counter()
    stream = gopen.gopen(url)  # through webdataset's own opener table
    got = read_all(stream, chunk)
    elapsed = time.perf_counter() - start
    assert got == data and stream.bytes_read == len(data)
    rate = len(data) / (elapsed - 0.05)
    assert 0.9e6 <= rate <= 1.1e6, f"emulated rate {rate / 1e6:.3f} MB/s, set 1 MB/s"


@pytest.mark.timeout(30)
def test_latency_comes_before_the_first_byte_of_every_file(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"x" * 100)
    url = EmulatedStorage(tmp_path, bandwidth_bytes_per_s=math.inf, latency_s=0.2).url
    url = url.replace("?", "/small.bin?")
    for _ in range(2):
        start = time.perf_counter()
        stream = open_emulated(url)
        assert stream.read(1) == b"x"
        assert 0.2 <= time.perf_counter() - start < 1.5
        assert read_all(stream, 1000) == b"x" * 99


@pytest.mark.timeout(60)
def test_shards_through_the_emulator_into_the_loader_every_example_once(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (200, 28, 28), dtype=np.uint8), rng.integers(0, 10, 200)
    manifest = write_image_shards(images, labels, tmp_path, examples_per_shard=25)
    total = sum(s["bytes"] for s in manifest["shards"])
    bandwidth = 300_000  # per stream; two workers stream at once
    storage = EmulatedStorage(tmp_path, bandwidth_bytes_per_s=bandwidth, latency_s=0.01)
    loader = EchoingDataLoader(ShardDataset(storage.url), batch_size=32, num_workers=2, seed=0)
    want = collections.Counter((im.tobytes(), int(y)) for im, y in zip(images, labels, strict=True))
    got = collections.Counter()
    start = time.perf_counter()
    for x, y in loader:
        got.update((im[0].numpy().tobytes(), int(lab)) for im, lab in zip(x, y, strict=True))
    elapsed = time.perf_counter() - start
    assert got == want
    # Each worker streams half the bytes at `bandwidth`: never faster than that.
    assert elapsed >= 0.9 * (total / 2) / bandwidth


def test_describe_says_emulated_and_bad_settings_are_refused(tmp_path):
    storage = EmulatedStorage(tmp_path, bandwidth_bytes_per_s=2e6, latency_s=0.03)
    assert storage.describe().startswith("EMULATED storage (local files, no network)")
    assert "2 MB/s per stream, 30 ms latency" in storage.describe()
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s must be a number > 0, got 0.0"):
        EmulatedStorage(tmp_path, bandwidth_bytes_per_s=0)
    with pytest.raises(ValueError, match="latency_s must be a number >= 0, got -1.0"):
        EmulatedStorage(tmp_path, bandwidth_bytes_per_s=1, latency_s=-1)
    with pytest.raises(TypeError, match="must be a real number"):
        EmulatedStorage(tmp_path, bandwidth_bytes_per_s="fast")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        EmulatedStorage(tmp_path / "missing", bandwidth_bytes_per_s=1)
    with pytest.raises(ValueError, match="read-only"):
        open_emulated(storage.url, "wb")
    with pytest.raises(ValueError, match="bad bandwidth/latency"):
        open_emulated(f"emulated:{tmp_path}/f?bandwidth=fast")
    (tmp_path / "f").write_bytes(b"abc")
    with open_emulated(f"emulated:{tmp_path}/f") as stream:  # no query: no delays
        assert isinstance(stream, EmulatedStream) and stream.read() == b"abc"
