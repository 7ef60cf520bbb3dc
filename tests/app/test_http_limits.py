"""Reading shards over HTTP from a server that misbehaves: the reader stops, with an error.

Each server here is real and on 127.0.0.1: a raw socket server where nginx cannot misbehave
the way needed (a body that goes on past its end or its announced length, a trickle), the
standard library's ``http.server`` for redirects, nginx for a huge manifest file. Every test
asserts the error names the URL and the limit, and that the reader did not read on.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import http.server
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import needs_nginx
from test_reliability_resume import synthetic

from dataecho.app.sources.nginx import NginxServer
from dataecho.app.sources.retrying import (
    BodyTooLarge,
    CrossHostRedirect,
    ShardReadError,
    UpstreamError,
    open_shard,
)
from dataecho.app.sources.shard_reader import TAR_TAIL_BYTES, ShardReader
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.sources.shards import MANIFEST, MAX_MANIFEST_BYTES, ShardDataset, load_manifest

N, PER_SHARD = 80, 40


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two real image shards of 40 records and their manifest."""
    out = tmp_path_factory.mktemp("shards")
    images, labels = synthetic(N, seed=3)
    write_image_shards(images, labels, out, examples_per_shard=PER_SHARD)
    return out, labels.tolist()


Answer = Callable[["RawServer", socket.socket, str], None]


class RawServer:
    """A TCP server on 127.0.0.1 that answers each request with ``answer(server, conn, path)``,
    which writes the raw answer (status line, headers, body) with :meth:`send`. ``sent``
    counts the bytes written per path; ``stop`` is set on exit, for answers without an end."""

    def __init__(self, answer: Answer, folder: Path | None = None) -> None:
        self.answer = answer
        self.folder = folder  # where the answers find the shards
        self.sent: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join()
        self._sock.close()

    def send(self, conn: socket.socket, path: str, data: bytes) -> None:
        conn.sendall(data)
        self.sent[path] += len(data)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            try:
                self.answer(self, conn, head.split(b" ", 2)[1].decode())
            except OSError:  # the client went away: what these tests want of it
                pass


def serve_folder(folder: Path, shard_answer: Answer) -> Answer:
    """The manifest as nginx sends it; each shard as ``shard_answer`` has it."""

    def answer(server: RawServer, conn: socket.socket, path: str) -> None:
        if path == "/" + MANIFEST:
            body = (folder / MANIFEST).read_bytes()
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            server.send(conn, path, head.encode() + body)
        else:
            shard_answer(server, conn, path)

    return answer


def endless(server: RawServer, conn: socket.socket, path: str, head: str = "") -> None:
    """The shard's tar, then more bytes for as long as the client reads them."""
    data = (server.folder / path.lstrip("/")).read_bytes()
    server.send(conn, path, f"HTTP/1.0 200 OK\r\n{head}\r\n".encode() + data)
    while not server.stop.is_set():
        server.send(conn, path, b"more" * 16384)


# --- 1. a shard's body that goes on after the tar's end --------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("announced", [False, True])
def test_a_shard_body_going_on_past_its_manifest_size_is_cut_off(shards, announced):
    folder, labels = shards
    size = (folder / "images-000000.tar").stat().st_size
    # No Content-Length (the body ends when the server closes: never), or one far too long.
    head = f"Content-Length: {size + 10**12}\r\n" if announced else ""
    with RawServer(serve_folder(folder, functools.partial(endless, head=head)), folder) as server:
        dataset = ShardDataset(server.url, retry_seconds=0)
        got = []
        start = time.monotonic()
        with pytest.raises(ShardReadError) as caught:
            for _, label in dataset:
                got.append(label)
        seconds = time.monotonic() - start
    message = str(caught.value)
    url = f"{server.url}/images-000000.tar"
    assert message.startswith(url) and f"the {size:,} bytes its manifest lists" in message
    assert "write the shards again (dataecho prepare)" in message
    if announced:  # refused before a byte of the body: no record came
        assert f"announces {size + 10**12:,} bytes (Content-Length)" in message
        assert "refused before reading the body" in message and got == []
    else:  # every record came, then the reader stopped one byte past the manifest's size
        assert "sends more than" in message and got == labels[:PER_SHARD]
    # Not read on: what the server got out is the shard and what the socket buffers held.
    assert server.sent[url[len(server.url) :]] < size + (64 << 20) and seconds < 5


@pytest.mark.timeout(30)
def test_without_sizes_a_body_past_the_tar_end_stops_after_its_padding(shards):
    folder, labels = shards
    with RawServer(serve_folder(folder, endless), folder) as server:
        url = f"{server.url}/images-000000.tar"
        reader = ShardReader([url], [PER_SHARD], lambda r: int(r["cls"]), retry_seconds=0)
        got = []
        with pytest.raises(ShardReadError) as caught:
            for label in reader:
                got.append(label)
    assert got == labels[:PER_SHARD]
    message = str(caught.value)
    assert (
        message.startswith(url) and f"more than {TAR_TAIL_BYTES:,} bytes after the tar" in message
    )
    assert server.sent["/images-000000.tar"] < TAR_TAIL_BYTES + (64 << 20)


# --- 2. a manifest too large to be one -------------------------------------------------------


@needs_nginx
@pytest.mark.timeout(30)
def test_a_huge_manifest_is_refused_before_its_body_is_read(tmp_path):
    huge = 400 << 20
    with open(tmp_path / MANIFEST, "wb") as f:
        f.truncate(huge)  # a sparse file: 400 MiB to nginx, nothing on the disk
    with NginxServer(tmp_path) as server:
        url = server.url
        start = time.monotonic()
        with pytest.raises(BodyTooLarge) as caught:
            load_manifest(url, retry_seconds=30)  # refused at once, not retried
        seconds = time.monotonic() - start
        deadline = time.monotonic() + 5  # nginx logs a request once it has given up on it
        while not [r for r in server.requests() if r.uri == "/" + MANIFEST]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [request] = [r for r in server.requests() if r.uri == "/" + MANIFEST]
    message = str(caught.value)
    assert message.startswith(f"{url}/{MANIFEST}: the server announces {huge:,} bytes")
    assert "the 16 MiB a manifest may hold (MAX_MANIFEST_BYTES)" in message
    assert "refused before reading the body" in message and seconds < 2
    assert request.bytes < 64 << 20  # what went out before the reader hung up: socket buffers
    # The same file on the disk is refused by its size, unread.
    with pytest.raises(ValueError, match=rf"{huge:,} bytes, more than the 16 MiB a manifest"):
        load_manifest(tmp_path)


@pytest.mark.timeout(30)
def test_a_manifest_without_a_length_is_cut_off_at_the_ceiling(tmp_path):
    def answer(server: RawServer, conn: socket.socket, path: str) -> None:
        server.send(conn, path, b"HTTP/1.0 200 OK\r\n\r\n" + b'{"shards": [')
        while not server.stop.is_set():
            server.send(conn, path, b'{"name": "x"}, ' * 4096)

    with RawServer(answer) as server:
        with pytest.raises(BodyTooLarge, match=rf"^{server.url}/{MANIFEST}: the server sends "
                           r"more than the 16 MiB a manifest may hold"):  # fmt: skip
            load_manifest(server.url, retry_seconds=30)
    assert MAX_MANIFEST_BYTES < server.sent["/" + MANIFEST] < MAX_MANIFEST_BYTES + (64 << 20)


# --- 3. a trickling server -------------------------------------------------------------------


def trickle(server: RawServer, conn: socket.socket, path: str, *, head: bool) -> None:
    """A byte every 0.1 s, of the status line (``head``) or of the body: never a pause long
    enough for the socket timeout."""
    body = (server.folder / path.lstrip("/")).read_bytes()
    answer = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    if not head:
        server.send(conn, path, answer[: answer.index(b"\r\n\r\n") + 4])
        answer = body
    for i in range(len(answer)):
        if server.stop.wait(0.1):
            return
        server.send(conn, path, answer[i : i + 1])


@pytest.mark.timeout(30)
def test_a_trickling_shard_fails_at_its_deadline_naming_url_and_limit(shards):
    folder, _ = shards
    with RawServer(serve_folder(folder, functools.partial(trickle, head=False)), folder) as server:
        dataset = ShardDataset(server.url, retry_seconds=0, timeout_s=1.0, deadline_s=0.6)
        start = time.monotonic()
        with pytest.raises(ShardReadError) as caught:
            next(iter(dataset))
        seconds = time.monotonic() - start
    message = str(caught.value)
    assert f"cannot read {server.url}/images-000000.tar at record 0 of 40" in message
    assert "DeadlineExceeded" in message and "more than the 0.6 s deadline" in message
    assert "deadline_s=0.6" in message and 0.6 <= seconds < 3


@pytest.mark.timeout(30)
def test_a_manifest_whose_headers_trickle_fails_at_its_deadline(shards):
    folder, _ = shards
    with RawServer(functools.partial(trickle, head=True), folder) as server:
        start = time.monotonic()
        with pytest.raises(UpstreamError) as caught:
            load_manifest(server.url, retry_seconds=0, timeout_s=1.0, deadline_s=0.5)
        seconds = time.monotonic() - start
    message = str(caught.value)
    assert message.startswith(f"cannot read {server.url}/{MANIFEST} after retrying for 0.")
    assert f"DeadlineExceeded: {server.url}/{MANIFEST}: the server took more" in message
    assert "more than the 0.5 s deadline" in message and 0.5 <= seconds < 3


@needs_nginx
@pytest.mark.timeout(30)
def test_the_deadline_counts_waiting_for_the_server_not_a_slow_reader(tmp_path):
    data = os.urandom(3 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    with NginxServer(tmp_path) as server:
        with open_shard(server.url + "/big.bin", timeout_s=5, deadline_s=0.5) as stream:
            got = stream.read(1 << 20)
            time.sleep(0.8)  # the reader is busy past the deadline; the server is not to blame
            got += stream.read()
    assert got == data


# --- 4. redirects ----------------------------------------------------------------------------


class Redirects(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; ``/moved/X`` redirects to ``/X`` here, ``/away/X`` to
    ``http://localhost:<this port>/X``: the same server under another host name."""

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        away = f"http://localhost:{self.server.server_port}"
        for prefix, to in (("/moved/", ""), ("/away/", away)):
            if self.path.startswith(prefix):
                self.send_response(302)
                self.send_header("Location", to + "/" + self.path[len(prefix) :])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def redirecting(folder: Path) -> Iterator[http.server.ThreadingHTTPServer]:
    """:class:`Redirects` over ``folder`` on 127.0.0.1, stopped at the end."""
    handler = functools.partial(Redirects, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(30)
def test_a_redirect_to_another_host_is_refused_unless_allowed(shards):
    folder, labels = shards
    with redirecting(folder) as server:
        url, port = f"http://127.0.0.1:{server.server_port}", server.server_port
        # A redirect on the same host and port is followed, for the manifest and every shard.
        assert [y for _, y in ShardDataset(url + "/moved")] == labels
        start = time.monotonic()
        with pytest.raises(CrossHostRedirect) as caught:
            ShardDataset(url + "/away", retry_seconds=30)  # refused at once, not retried
        assert time.monotonic() - start < 2
        message = str(caught.value)
        assert message.startswith(f"{url}/away/{MANIFEST} redirects (302) to "
                                  f"http://localhost:{port}/{MANIFEST}")  # fmt: skip
        assert f"another host: localhost:{port} instead of 127.0.0.1:{port}" in message
        assert "allow_cross_host_redirects=True" in message
        # A shard redirected away (the manifest given): refused too, naming the shard.
        manifest = load_manifest(folder)
        with pytest.raises(ShardReadError, match=r"/away/images-000000.tar redirects \(302\) "
                           rf"to http://localhost:{port}/images-000000.tar"):  # fmt: skip
            next(iter(ShardDataset(url + "/away", manifest, retry_seconds=30)))
        allowed = ShardDataset(url + "/away", allow_cross_host_redirects=True)
        assert [y for _, y in allowed] == labels


@pytest.mark.timeout(30)
def test_a_run_refuses_a_redirect_away_unless_its_flag_allows_it(shards):
    from dataecho.app.config import TrainConfig
    from dataecho.app.upstream import build_data

    folder, labels = shards
    with redirecting(folder) as server:
        away = f"http://127.0.0.1:{server.server_port}/away"
        with pytest.raises(CrossHostRedirect, match="allow_cross_host_redirects"):
            build_data(TrainConfig(upstream=away, retry_seconds=5))
        data = build_data(TrainConfig(upstream=away, allow_cross_host_redirects=True,
                                      http_deadline=60))  # fmt: skip
        assert data.train.deadline_s == 60
        assert sorted(y for _, y in data.train) == sorted(labels)


def test_http_limit_settings_are_checked(shards):
    folder, _ = shards
    with pytest.raises(ValueError, match=r"deadline_s must be a finite number of seconds > 0, "
                       "got 0"):  # fmt: skip
        ShardDataset(folder, deadline_s=0)
    with pytest.raises(TypeError, match="allow_cross_host_redirects must be True or False"):
        ShardDataset(folder, allow_cross_host_redirects="yes")
    assert ShardDataset(folder, deadline_s=None).deadline_s is None
