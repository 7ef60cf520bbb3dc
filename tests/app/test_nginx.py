"""The real nginx on loopback: serving, rate cap, streaming shards, never a leftover process.

Runs only where nginx is installed (``apt-get install nginx-light``).
"""

from __future__ import annotations

import collections
import http.server
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import needs_nginx

from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, INSTALL_COMMAND, load_split
from dataecho.app.sources.nginx import (
    NginxNotFoundError,
    NginxServer,
    _direct,
    find_nginx,
    group_pids,
)
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.sources.shards import MANIFEST, ShardDataset, load_manifest
from dataecho.loader import EchoingDataLoader

REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pgid: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := group_pids(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """400 real Fashion-MNIST examples in 8 shards of 50."""
    if not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND})")
    images, labels = load_split(split="test")
    out = tmp_path_factory.mktemp("shards")
    write_image_shards(images[:400], labels[:400], out, examples_per_shard=50)
    return out, images[:400], labels[:400]


@needs_nginx
@pytest.mark.timeout(30)
def test_serves_files_and_stops_without_a_trace(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"hello")
    with NginxServer(tmp_path) as server:
        pid, prefix = server.pid, server.prefix
        assert server.url.startswith("http://127.0.0.1:")
        assert _direct.open(server.url + "/a.bin").read() == b"hello"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            _direct.open(server.url + "/missing.bin")
        assert alive(pid) and len(group_pids(pid)) == 2  # master + one worker
    assert not alive(pid) and group_pids(pid) == [] and not prefix.exists()
    with pytest.raises(RuntimeError, match="not running"):
        server.url  # noqa: B018
    assert server.describe().endswith("(not running) serving " + f"{tmp_path} (no cap)")
    with NginxServer(tmp_path, rate_limit_bytes_per_s=2_500_000) as again:
        assert again.pid != pid and "2.5 MB/s per connection" in again.describe()
        assert _direct.open(again.url + "/a.bin").read() == b"hello"


@needs_nginx
@pytest.mark.timeout(30)
def test_serves_only_regular_files_inside_the_folder(tmp_path):
    folder, outside = tmp_path / "shards", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the folder")
    (folder / "a.bin").write_bytes(b"hello")
    (folder / ".env").write_text("TOKEN=1")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[remote]")
    (folder / "out.bin").symlink_to(outside / "secret.txt")
    (folder / "in.bin").symlink_to(folder / "a.bin")  # inside, but it may be changed to point out
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    with NginxServer(folder) as server:
        assert _direct.open(server.url + "/a.bin").read() == b"hello"
        refused = {}
        for path in ("/out.bin", "/in.bin", "/linked/secret.txt", "/.env", "/.git/config"):
            with pytest.raises(urllib.error.HTTPError) as caught:
                _direct.open(server.url + path)
            refused[path] = caught.value.code
    # 403, or 404 for a linked folder (nginx opens it without following the link): not served.
    assert refused == {**dict.fromkeys(refused, 403), "/linked/secret.txt": 404}


@needs_nginx
@pytest.mark.timeout(30)
def test_rate_cap_holds_within_10_percent(tmp_path):
    size, cap = 3_000_000, 1_500_000  # a 2 s download
    (tmp_path / "big.bin").write_bytes(os.urandom(size))
    with NginxServer(tmp_path, total_rate_bytes_per_s=3_000_000, connections=2) as server:
        assert server.rate_limit == cap  # the total shared by two connections
        start = time.perf_counter()
        got = len(_direct.open(server.url + "/big.bin").read())
        rate = got / (time.perf_counter() - start)
    assert got == size
    assert 0.9 * cap <= rate <= 1.1 * cap, f"served {rate / 1e6:.3f} MB/s, cap 1.5 MB/s"


@needs_nginx
@pytest.mark.timeout(30)
def test_a_file_smaller_than_a_second_of_the_cap_is_paced_too(tmp_path):
    size, cap = 100_000, 400_000  # a quarter of a second's worth
    (tmp_path / "small.bin").write_bytes(os.urandom(size))
    with NginxServer(tmp_path, rate_limit_bytes_per_s=cap) as server:
        start = time.perf_counter()
        got = len(_direct.open(server.url + "/small.bin").read())
        seconds = time.perf_counter() - start
    assert got == size
    assert seconds >= 0.8 * size / cap, f"{size:,} bytes in {seconds:.3f} s at a cap of {cap:,}/s"


@needs_nginx
@pytest.mark.timeout(60)
@pytest.mark.parametrize("echo_factor", [1, 2])
def test_streams_shards_over_http_into_the_loader(shards, echo_factor):
    folder, images, labels = shards
    want = collections.Counter((im.tobytes(), int(y)) for im, y in zip(images, labels, strict=True))
    cap = 500_000  # per connection; each of the 2 workers reads half the bytes
    with NginxServer(folder, rate_limit_bytes_per_s=cap) as server:
        dataset = ShardDataset(server.url)  # the manifest comes over HTTP too
        assert dataset.manifest == load_manifest(folder)
        loader = EchoingDataLoader(
            dataset, batch_size=32, num_workers=2, echo_factor=echo_factor,
            where="after_augment", seed=1,
        )  # fmt: skip
        got = collections.Counter()
        start = time.perf_counter()
        for x, y in loader:
            got.update((im[0].numpy().tobytes(), int(lab)) for im, lab in zip(x, y, strict=True))
        elapsed = time.perf_counter() - start
        pid, expected_requests = server.pid, len(dataset.manifest["shards"]) + 1
        deadline = time.monotonic() + 5  # nginx logs a request just after its last byte
        while (traffic := server.traffic())["requests"] < expected_requests:
            assert time.monotonic() < deadline, traffic
            time.sleep(0.05)
    manifest = dataset.manifest
    # Every shard crossed the wire exactly once, whatever the echo factor; plus the manifest.
    assert traffic == {
        "requests": expected_requests,
        "bytes": sum(s["bytes"] for s in manifest["shards"]) + (folder / MANIFEST).stat().st_size,
    }
    assert got == collections.Counter({k: echo_factor for k in want})
    assert loader.stats.fresh_examples == 400
    assert elapsed >= 0.9 * (dataset.bytes_per_example * 400 / 2) / cap  # the cap held
    assert group_pids(pid) == []


@needs_nginx
@pytest.mark.timeout(30)
def test_an_http_proxy_in_the_environment_does_not_catch_loopback(shards, monkeypatch):
    folder, images, labels = shards
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # nothing listens there
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with NginxServer(folder) as server:
        assert [y for _, y in ShardDataset(server.url)] == labels.tolist()


@needs_nginx
@pytest.mark.timeout(30)
def test_a_server_started_from_a_thread_that_ends_keeps_serving(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"hello")
    server = NginxServer(tmp_path)
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    try:
        time.sleep(2)  # a parent-death signal tied to the thread would have fired by now
        assert _direct.open(server.url + "/a.bin", timeout=5).read() == b"hello"
        assert alive(server.pid)
    finally:
        pid = server.pid
        server.stop()
    assert wait_gone(pid, timeout=5) == []


def run_child(body: str, tmp: Path) -> subprocess.Popen:
    """A Python process running ``body``; its temp files (a SIGKILL leaves some) go to ``tmp``."""
    script = textwrap.dedent(
        """
        import sys, time
        from dataecho.app.sources.nginx import NginxServer
        """
    ) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def nginx_folders(tmp: Path, want: list[Path]) -> list[Path]:
    """The nginx temp folders in ``tmp``, once they are ``want`` (or after 5 s: as they are)."""
    deadline = time.monotonic() + 5
    while (found := sorted(tmp.glob("dataecho-nginx-*"))) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@needs_nginx
@pytest.mark.timeout(90)
def test_no_nginx_nor_its_temp_folder_outlives_its_python_process(tmp_path):
    # Three Python processes, started together (their imports are the slow part):
    # SIGINT -> KeyboardInterrupt runs __exit__; SIGKILL -> no Python cleanup at all, the
    # watcher stops nginx (started from a thread that has ended: the watcher does not depend
    # on which thread started nginx) and removes its temp folder; a server never stopped ->
    # atexit stops it.
    serve = f"""
        with NginxServer({str(tmp_path)!r}) as server:
            print(server.pid, flush=True)
            time.sleep(60)
        """
    from_thread = f"""
        import threading
        server = NginxServer({str(tmp_path)!r})
        starter = threading.Thread(target=server.start)
        starter.start()
        starter.join()
        time.sleep(1)  # time for a parent-death signal tied to the thread to stop nginx
        print(server.pid, flush=True)
        time.sleep(60)
        """
    children = {
        "SIGINT": run_child(serve, tmp_path),
        "SIGKILL": run_child(from_thread, tmp_path),
        "atexit": run_child(f"print(NginxServer({str(tmp_path)!r}).start().pid)", tmp_path),
    }
    try:
        pids = {}
        for name, child in children.items():
            line = child.stdout.readline()
            assert line.strip().isdigit(), f"{name} child: {line!r} {child.stderr.read()}"
            pids[name] = int(line)
        # The two servers still running have their config and logs there (atexit's: gone).
        assert len(list(tmp_path.glob("dataecho-nginx-*"))) >= 2
        for name in ("SIGINT", "SIGKILL"):
            assert alive(pids[name])
            children[name].send_signal(getattr(signal, name))
        for child in children.values():
            child.wait(timeout=30)
    finally:
        for child in children.values():
            child.kill()
            child.communicate()
    assert children["atexit"].returncode == 0
    for name, pid in pids.items():
        assert wait_gone(pid, timeout=5) == [], f"nginx left running after {name}"
    assert nginx_folders(tmp_path, []) == []  # the SIGKILLed one's too


@needs_nginx
@pytest.mark.timeout(30)
def test_the_next_start_stops_an_orphaned_nginx_and_removes_its_folder(tmp_path, monkeypatch):
    # The watcher dies with its owner (a kill of the whole session or cgroup): nothing stops
    # that nginx nor removes its folder, until the next server starts in that temp directory.
    # The owner is forked from this process, so that it starts without an import.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "served").mkdir()
    read_end, write_end = os.pipe()
    owner = os.fork()
    if owner == 0:  # the owner: start a server, say where it is, wait to be killed
        try:
            os.close(read_end)
            server = NginxServer(tmp_path / "served").start()
            os.write(write_end, f"{server.pid} {server._watcher.pid} {server.prefix}\n".encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        nginx, watcher, folder = pipe.readline().split()
        os.kill(int(watcher), signal.SIGKILL)
        os.kill(owner, signal.SIGKILL)
    os.waitpid(owner, 0)
    nginx, folder = int(nginx), Path(folder)
    try:
        time.sleep(0.2)  # time for a watcher, were it alive, to begin its work
        assert alive(nginx) and nginx_folders(tmp_path, [folder]) == [folder]
        with NginxServer(tmp_path / "served") as server:
            assert wait_gone(nginx, timeout=5) == [], "the orphaned nginx still runs"
            assert nginx_folders(tmp_path, [server.prefix]) == [server.prefix]
        assert nginx_folders(tmp_path, []) == []
    finally:
        if group_pids(nginx):  # a failed check leaves no nginx behind
            os.killpg(nginx, signal.SIGKILL)


@needs_nginx
@pytest.mark.timeout(30)
def test_a_taken_port_fails_with_nginx_log_and_leaves_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = NginxServer(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="(?s)nginx failed to start.*Address already in use"):
            server.start()
    assert server.pid is None and server.prefix is None


def test_missing_nginx_names_the_install_command(tmp_path):
    server = NginxServer(tmp_path, binary=tmp_path / "no-such-nginx")
    with pytest.raises(NginxNotFoundError, match="apt-get install nginx-light"):
        server.start()
    with pytest.raises(NginxNotFoundError, match="EmulatedStorage"):
        find_nginx("/nonexistent/nginx")


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at most one of rate_limit_bytes_per_s"):
        NginxServer(tmp_path, rate_limit_bytes_per_s=1, total_rate_bytes_per_s=2)
    with pytest.raises(ValueError, match="rate_limit_bytes_per_s must be >= 1, got 0"):
        NginxServer(tmp_path, rate_limit_bytes_per_s=0)
    with pytest.raises(ValueError, match="connections must be >= 1"):
        NginxServer(tmp_path, total_rate_bytes_per_s=10, connections=0)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        NginxServer(tmp_path / "missing")
    assert NginxServer(tmp_path, total_rate_bytes_per_s=10, connections=3).rate_limit == 3
    assert NginxServer(tmp_path).rate_limit is None  # no cap


# --- reverse proxy mode: nginx in front of another server, the cap on what it sends back ---


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A real upstream in a thread: answers GET /echo with the request's Host header."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.seen.append(self.headers.get("Host", ""))
        body = self.headers.get("Host", "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@needs_nginx
@pytest.mark.timeout(30)
def test_a_proxy_passes_requests_on_and_caps_what_it_sends_back(tmp_path):
    size, cap = 2_000_000, 1_000_000  # a 2 s download through the proxy
    data = os.urandom(size)
    (tmp_path / "big.bin").write_bytes(data)
    with NginxServer(tmp_path) as origin, NginxServer(proxy=origin.url,
                                                      rate_limit_bytes_per_s=cap) as proxy:  # fmt: skip
        assert proxy.root_dir is None and proxy.proxy == origin.url
        assert proxy.describe() == (f"nginx at {proxy.url} proxying {origin.url} "
                                    "(1 MB/s per connection)")  # fmt: skip
        start = time.perf_counter()
        got = _direct.open(proxy.url + "/big.bin").read()
        rate = len(got) / (time.perf_counter() - start)
        ranged = urllib.request.Request(proxy.url + "/big.bin", headers={"Range": "bytes=10-19"})
        with _direct.open(ranged) as answer:
            assert answer.status == 206 and answer.read() == data[10:20]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            _direct.open(proxy.url + "/missing.bin")
        deadline = time.monotonic() + 5  # nginx logs a request just after its last byte
        while len(logged := proxy.requests()) < 4:  # its readiness probe, then the three above
            assert time.monotonic() < deadline, logged
            time.sleep(0.05)
        pid = proxy.pid
    assert got == data
    assert 0.9 * cap <= rate <= 1.1 * cap, f"served {rate / 1e6:.3f} MB/s, cap 1 MB/s"
    # The proxy's own log: every request, any status, and the body bytes sent for each.
    assert [(r.status, r.uri) for r in logged[-3:]] == [
        (200, "/big.bin"), (206, "/big.bin"), (404, "/missing.bin")]  # fmt: skip
    assert [r.bytes for r in logged[-3:-1]] == [size, 10]
    assert group_pids(pid) == []


@needs_nginx
@pytest.mark.timeout(30)
def test_a_proxy_hands_on_the_clients_host_header(tmp_path):
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{upstream.server_address[1]}"
        with NginxServer(proxy=url) as proxy:
            assert _direct.open(proxy.url + "/echo").read() == f"127.0.0.1:{proxy.port}".encode()
    finally:
        upstream.shutdown()
        upstream.server_close()
    # What a client signed (S3's SigV4 signs the host) is what the upstream sees.
    assert _Recorder.seen[-1] == f"127.0.0.1:{proxy.port}"


@needs_nginx
@pytest.mark.timeout(60)
def test_an_s3_client_reads_through_a_capped_proxy(tmp_path):
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from s3_server import S3Server

    body = os.urandom(300_000)
    with S3Server(tmp_path) as s3, NginxServer(proxy=s3.url,
                                               rate_limit_bytes_per_s=1_000_000) as proxy:  # fmt: skip
        keys = dict(region_name="us-east-1", aws_access_key_id="testing",
                    aws_secret_access_key="testing")  # fmt: skip
        direct = boto3.client("s3", endpoint_url=s3.url, **keys)
        direct.create_bucket(Bucket="data")
        direct.put_object(Bucket="data", Key="shard.bin", Body=body)
        client = boto3.client("s3", endpoint_url=proxy.url, **keys)
        start = time.perf_counter()
        got = client.get_object(Bucket="data", Key="shard.bin")["Body"].read()
        seconds = time.perf_counter() - start
        assert client.head_object(Bucket="data", Key="shard.bin")["ContentLength"] == len(body)
        listed = client.list_objects_v2(Bucket="data")["Contents"]
        deadline = time.monotonic() + 5
        while not any(r.uri == "/data/shard.bin" and r.status == 200 and r.bytes
                      for r in proxy.requests()):  # fmt: skip
            assert time.monotonic() < deadline, proxy.requests()
            time.sleep(0.05)
        sent = [r.bytes for r in proxy.requests() if r.uri == "/data/shard.bin" and r.bytes]
    assert got == body and [o["Key"] for o in listed] == ["shard.bin"]
    assert seconds >= 0.8 * len(body) / 1_000_000, "the proxy's cap held the object back"
    assert sent == [len(body)], "the object's bytes went out once, counted in the proxy's log"
    assert s3.requests("GET").count("/data/shard.bin") == 1  # moto answered the proxy once


def test_proxy_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="exactly one of root_dir .* and proxy"):
        NginxServer(tmp_path, proxy="http://127.0.0.1:9000")
    with pytest.raises(ValueError, match="exactly one of root_dir .* and proxy"):
        NginxServer()
    for bad in ("https://127.0.0.1:9000", "http://127.0.0.1:9000/bucket", "127.0.0.1:9000",
                "http://a b:1", "http://127.0.0.1:1;"):  # fmt: skip
        with pytest.raises(ValueError, match="proxy must be an upstream server as http://host"):
            NginxServer(proxy=bad)
    server = NginxServer(proxy="http://127.0.0.1:9000/", total_rate_bytes_per_s=10, connections=2)
    assert server.proxy == "http://127.0.0.1:9000" and server.rate_limit == 5
    assert (
        server.describe()
        == "nginx at (not running) proxying http://127.0.0.1:9000 (5e-06 MB/s per connection)"
    )
