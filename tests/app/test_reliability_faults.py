"""Upstream faults and bad records, with the real nginx on loopback (no mocks).

The server is stopped mid-shard (its connections drop) and started again, or frozen with
SIGSTOP (a stall), or stopped for good; shards are truncated or hold a broken PNG. Every
example comes out exactly once, or the error names the shard URL and the record.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import signal
import socket
import tarfile
import threading
import time
import urllib.error

import numpy as np
import pytest
from conftest import needs_nginx, torch_roundtrip
from test_reliability_resume import damage_png, shard_positions, synthetic

from dataecho.app.sources.nginx import NginxServer
from dataecho.app.sources.retrying import (
    Backoff,
    BadRecordError,
    ShardReadError,
    UpstreamError,
    is_transient,
)
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.sources.shards import MANIFEST, ShardDataset, load_manifest
from dataecho.loader import EchoingDataLoader

N, PER_SHARD = 120, 40


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    images, labels = synthetic(N, seed=1)
    write_image_shards(images, labels, out, examples_per_shard=PER_SHARD)
    return out, labels.tolist()


@pytest.fixture
def folder(pristine, tmp_path):
    """A private copy of the shards, free to damage."""
    src, labels = pristine
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path, labels


def shard_names(folder) -> list:
    return sorted(folder.glob("*.tar"))


def shard_of(message: str) -> str:
    """The shard a retry message names: ``reading http://.../NAME.tar at record K of N ...``."""
    return re.search(r"/(images-\d+\.tar) at record \d+ of 40 failed", message).group(1)


@needs_nginx
@pytest.mark.timeout(60)
def test_server_stopped_mid_shard_and_started_again_loses_nothing(folder, caplog):
    folder, labels = folder
    # Capped, so that the first shard is still on its way when the server stops.
    first = NginxServer(folder, rate_limit_bytes_per_s=50_000).start()
    again = NginxServer(folder, port=first.port)
    try:
        dataset = ShardDataset(first.url, retry_seconds=30)
        it = iter(dataset)
        got = [next(it) for _ in range(5)]
        first.stop()  # fast shutdown: the open connection drops mid-shard
        with caplog.at_level(logging.WARNING, logger="dataecho.shards"):
            # The reader retries in a thread; nginx starts here (it dies with its starter).
            rest = []
            reading = threading.Thread(target=lambda: rest.extend(it))
            reading.start()
            time.sleep(1.0)
            again.start()
            reading.join(timeout=30)
        got += rest
        log = (again.prefix / "access.log").read_text()
    finally:
        first.stop()
        again.stop()
    assert [y for _, y in got] == labels
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) >= 2, retries  # the dropped connection, then a refused one at least
    assert len({shard_of(m) for m in retries}) == 1, retries  # one shard broke, retried alone
    shard = shard_of(retries[0])
    assert "still to come" in retries[0] or "reset" in retries[0], retries[0]
    assert "Connection refused" in retries[-1]
    assert shard in log  # the broken shard was read again from the new server
    assert dataset.skipped == 0


@needs_nginx
@pytest.mark.timeout(60)
def test_a_stalled_server_is_retried_until_it_answers(folder, caplog):
    folder, labels = folder
    with NginxServer(folder, rate_limit_bytes_per_s=200_000) as server:
        dataset = ShardDataset(server.url, retry_seconds=30, timeout_s=0.3)
        it = iter(dataset)
        got = [next(it) for _ in range(45)]  # into the second shard
        os.killpg(server.pid, signal.SIGSTOP)  # master and worker: connections hang, no error
        resume = threading.Timer(1.5, os.killpg, (server.pid, signal.SIGCONT))
        resume.start()
        try:
            with caplog.at_level(logging.WARNING, logger="dataecho.shards"):
                got += list(it)
        finally:
            resume.join()
            os.killpg(server.pid, signal.SIGCONT)
    assert [y for _, y in got] == labels
    messages = [r.getMessage() for r in caplog.records]
    assert messages and "timed out" in messages[0], messages
    assert len({shard_of(m) for m in messages}) == 1, messages  # one shard stalled


@needs_nginx
@pytest.mark.timeout(60)
def test_a_server_gone_for_good_fails_naming_shard_and_record_then_resumes(folder):
    folder, labels = folder
    first = NginxServer(folder, rate_limit_bytes_per_s=50_000).start()
    try:
        port = first.port
        dataset = ShardDataset(first.url, retry_seconds=1.0)
        it = iter(dataset)
        got = [next(it) for _ in range(7)]
        first.stop()
        with pytest.raises(ShardReadError) as caught:
            for item in it:  # what had arrived before the stop, then the error
                got.append(item)
    finally:
        first.stop()
    assert 7 <= len(got) < PER_SHARD
    message = str(caught.value)
    assert f"http://127.0.0.1:{port}/images-000000.tar at record {len(got)} of 40" in message
    assert "after retrying for" in message and "retry_seconds=1 sets how long" in message
    # The half-read shard is not counted as read: the position is the last delivered record.
    state = torch_roundtrip(dataset.state_dict())
    assert (state["shard"], state["offset"]) == (0, len(got))
    with NginxServer(folder, port=port) as server:
        resumed = ShardDataset(server.url)
        resumed.load_state_dict(state)
        got += list(resumed)
    assert [y for _, y in got] == labels


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_nginx
@pytest.mark.timeout(30)
def test_the_manifest_is_retried_until_the_server_comes_up(folder, caplog):
    folder, labels = folder
    port = free_port()
    server = NginxServer(folder, port=port)
    late = threading.Timer(1.0, server.start)  # nobody listens on the port until then
    late.start()
    try:
        with caplog.at_level(logging.WARNING, logger="dataecho.shards"):
            start = time.monotonic()
            dataset = ShardDataset(f"http://127.0.0.1:{port}", retry_seconds=30)
            waited = time.monotonic() - start
        assert waited >= 0.9 and dataset.manifest == load_manifest(folder)
        assert [y for _, y in dataset] == labels
    finally:
        late.join()
        server.stop()
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries and f"reading http://127.0.0.1:{port}/{MANIFEST} failed" in retries[0]


@needs_nginx
@pytest.mark.timeout(30)
def test_a_manifest_server_that_never_comes_up_fails_naming_url_and_fix(folder):
    folder, _ = folder
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    start = time.monotonic()
    with pytest.raises(UpstreamError) as caught:
        load_manifest(url, retry_seconds=1.0)
    assert 1.0 <= time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith(f"cannot read {url}/{MANIFEST} after retrying for 1.")
    assert "retry_seconds=1 sets how long" in message and "Connection refused" in message
    assert message.endswith(
        "check that the upstream is up and serves the folder dataecho prepare wrote"
    )
    # A missing manifest is lasting: not retried (a retry would time the test out).
    (folder / MANIFEST).unlink()
    with NginxServer(folder) as server:
        with pytest.raises(UpstreamError, match=rf"{MANIFEST}: HTTPError: HTTP Error 404"):
            load_manifest(server.url, retry_seconds=600)


@needs_nginx
@pytest.mark.timeout(30)
def test_a_missing_shard_is_not_retried(folder):
    folder, _ = folder
    with NginxServer(folder) as server:
        dataset = ShardDataset(server.url, retry_seconds=600)  # a retry would time the test out
        shard_names(folder)[1].unlink()
        with pytest.raises(ShardReadError, match=r"images-000001.tar at record 0 of 40: HTTPError"):
            list(dataset)
    local = ShardDataset(folder)
    with pytest.raises(ShardReadError, match=r"images-000001.tar at record 0 of 40: FileNotFound"):
        list(local)


@needs_nginx
@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", ["truncated", "cut_between_records", "bad_png"])
def test_bad_records_raise_or_are_skipped_and_counted(folder, damage, caplog):
    folder, labels = folder
    shard = shard_names(folder)[1]
    data = shard.read_bytes()
    if damage == "truncated":
        shard.write_bytes(data[: len(data) // 3])  # about 13 of its 40 records survive
    elif damage == "cut_between_records":
        # Python's tar reader takes a missing header for the end of the archive: only the
        # manifest's count can tell that 30 records are gone.
        with tarfile.open(shard) as tar:
            cut = tar.getmembers()[2 * 10].offset  # the header of record 10's first member
        shard.write_bytes(data[:cut])
    else:
        damage_png(shard, record=6)
    with NginxServer(folder) as server:
        with pytest.raises(BadRecordError) as caught:
            list(ShardDataset(server.url))
        skipping = ShardDataset(server.url, on_bad_record="skip")
        with caplog.at_level(logging.WARNING, logger="dataecho.shards"):
            got = [y for _, y in skipping]
    message = str(caught.value)
    assert "images-000001.tar" in message and "on_bad_record='skip'" in message
    if damage == "cut_between_records":
        assert "shard ends after 10 of its 40 records (the tar archive ends there)" in message
    if damage != "bad_png":
        assert "shard ends after" in message and "of its 40 records" in message
        kept = len(got) - 2 * PER_SHARD
        assert 5 <= kept < PER_SHARD and got == labels[: PER_SHARD + kept] + labels[-PER_SHARD:]
        assert skipping.skipped == PER_SHARD - kept
    else:
        assert "record 6 (key '00000046')" in message
        assert got == labels[:46] + labels[47:] and skipping.skipped == 1
    assert f"({skipping.skipped} skipped by this reader" in caplog.records[-1].getMessage()


@pytest.mark.timeout(60)
def test_skips_in_a_worker_are_in_its_checkpointed_position(folder):
    folder, labels = folder
    damage_png(shard_names(folder)[0], record=3)
    loader = EchoingDataLoader(
        ShardDataset(folder, on_bad_record="skip"), batch_size=8, num_workers=1, seed=0,
        snapshot_every_n_steps=1,
    )  # fmt: skip
    it = iter(loader)
    got = [int(y) for _ in range(6) for y in next(it)[1]]
    positions = shard_positions(loader.state_dict())
    loader.close()
    assert got == labels[:3] + labels[4:49]
    assert positions and all(p["skipped"] == 1 for p in positions), positions


def test_policy_and_times_are_validated(folder):
    folder, _ = folder
    with pytest.raises(ValueError, match="on_bad_record must be one of"):
        ShardDataset(folder, on_bad_record="ignore")
    with pytest.raises(ValueError, match="retry_seconds must be a finite number .* got -1"):
        ShardDataset(folder, retry_seconds=-1)
    with pytest.raises(ValueError, match="timeout_s must be a finite number .*> 0, got 0"):
        ShardDataset(folder, timeout_s=0)
    assert np.isfinite(ShardDataset(folder, retry_seconds=0).retry_seconds)


def test_backoff_doubles_within_its_time_budget_and_faults_are_sorted():
    backoff = Backoff(retry_seconds=60, first_delay_s=0.1, max_delay_s=0.5)
    assert [backoff.failed() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.succeeded()
    assert backoff.failed() == 0.1 and backoff.attempts == 1
    assert Backoff(retry_seconds=0).failed() is None  # 0: the first error is final
    with pytest.raises(ValueError, match="retry_seconds must be a finite number .* got inf"):
        Backoff(float("inf"))
    assert is_transient(ConnectionRefusedError()) and is_transient(TimeoutError())
    assert is_transient(urllib.error.URLError("refused"))
    assert is_transient(http.client.IncompleteRead(b""))
    for code, transient in ((503, True), (429, True), (404, False), (403, False)):
        err = urllib.error.HTTPError("http://h/x.tar", code, "", None, None)
        assert is_transient(err) is transient, code
    assert not is_transient(FileNotFoundError())
