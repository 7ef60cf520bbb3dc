"""An S3 endpoint on 127.0.0.1 for the object-store libraries' tests: moto's server (the S3
emulation mosaic streaming's own tests use) in a process of its own, its requests counted from
its log, stopped when the test is done or this process dies."""

from __future__ import annotations

import ctypes
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REQUEST = re.compile(r'"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM once its parent is gone
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class S3Server:
    """``with S3Server(folder) as s3:`` serves S3 at ``s3.url``; ``s3.env`` holds the
    variables the libraries read (credentials, endpoint, region)."""

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
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,  # boto3 and obstore (litdata)
            "S3_ENDPOINT_URL": self.url,  # mosaic streaming
            "AWS_ALLOW_HTTP": "true",  # obstore refuses plain HTTP otherwise
        }

    def __enter__(self) -> S3Server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        log = self.log.open("w")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto's S3 server exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"moto's S3 server did not answer in {self.startup_timeout_s} s")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def requests(self, method: str = "GET") -> list[str]:
        """The paths of the requests answered so far (``/bucket/key``), in order."""
        text = self.log.read_text() if self.log.is_file() else ""
        return [m.group(2) for m in REQUEST.finditer(text)
                if m.group(1) == method and m.group(3).startswith("2")]  # fmt: skip
