"""The benchmark's servers, all on 127.0.0.1: moto's S3 server for mosaic and litdata, and a
rate-capped nginx in front of every library's files.

- webdataset's tars and the JSON Lines files: nginx serves their folder itself
  (:class:`~dataecho.app.sources.nginx.NginxServer`).
- mosaic's shards and litdata's chunks: uploaded to moto's S3 server (:class:`S3Server`, the
  S3 emulation mosaic streaming's own tests use, in a process of its own), with nginx in front
  as a reverse proxy (``NginxServer(proxy=s3.url)``): the libraries' endpoint is nginx, which
  passes each request to moto and sends the answer on at the cap.

Every library thus reads through an nginx whose access log counts the bytes it sent, file by
file (:meth:`NginxServer.requests`). Each server stops when its ``with`` block ends, and moto's
also when this process dies (the kernel's parent-death signal, tied to the thread that started
it: the benchmark starts it from its main thread).
"""

from __future__ import annotations

import ctypes
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BUCKET = "data"
# A request in moto's log: method, path, status.
REQUEST = re.compile(r'"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM once its parent is gone
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class S3Server:
    """``with S3Server(folder) as s3:`` runs moto's S3 server at ``s3.url`` (its log in
    ``folder``) and stops it on exit."""

    def __init__(self, folder: Path, *, startup_timeout_s: float = 30.0) -> None:
        self.log = Path(folder) / "s3-server.log"
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The variables the libraries read to reach it: credentials, endpoint, region."""
        return {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": self.url,  # boto3 and obstore (litdata)
            "S3_ENDPOINT_URL": self.url,  # mosaic streaming
            "AWS_ALLOW_HTTP": "true",  # obstore refuses plain HTTP otherwise
        }

    def requests(self, method: str = "GET") -> list[str]:
        """The paths of the requests answered so far (``/bucket/key``), in order."""
        text = self.log.read_text() if self.log.is_file() else ""
        return [m.group(2) for m in REQUEST.finditer(text)
                if m.group(1) == method and m.group(3).startswith("2")]  # fmt: skip

    def __enter__(self) -> S3Server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        with self.log.open("w") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"moto's S3 server exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"moto's S3 server did not answer in {self.startup_timeout_s} s")

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file of ``folder`` to ``s3://data/<prefix>/`` (straight to moto, not through
        a proxy); returns that URL."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing",
                              aws_secret_access_key="testing")  # fmt: skip
        if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=BUCKET)
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
        return f"s3://{BUCKET}/{prefix}"
