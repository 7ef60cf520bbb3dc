"""Opening a shard's bytes, telling a passing upstream fault from a lasting one, and backing off.

    stream = open_shard("http://127.0.0.1:8080/images-000003.tar", timeout_s=30)
    backoff = Backoff(retry_seconds=60)
    delay = backoff.failed()        # None once the failures have lasted retry_seconds
    body = read_retrying("http://127.0.0.1:8080/manifest.json", retry_seconds=60, timeout_s=30)

An HTTP shard is read with ``urllib`` in the reading process (a DataLoader worker): a stalled
server is noticed by the socket timeout (``timeout_s`` without a byte), a dropped connection
by a body shorter than its ``Content-Length`` (:class:`TruncatedTransfer`), which ``urllib``
would otherwise hand on as a quiet end of file and a tar reader as a shorter shard. Local and
``emulated:`` shards are files: their errors are not retried (a disk does not come back).
"""

from __future__ import annotations

import http.client
import io
import logging
import math
import time
import urllib.error
import urllib.request
from typing import BinaryIO
from urllib.parse import urlsplit

from dataecho.app.sources import emulated
from dataecho.errors import DataechoError, DataechoValueError

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Loopback is never behind a proxy; elsewhere urllib honours http_proxy / no_proxy as usual.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_default = urllib.request.build_opener()
_BUFFER = 1 << 16
log = logging.getLogger("dataecho.shards")


class UpstreamError(DataechoError, OSError):
    """The upstream cannot be reached or holds the wrong data; the message says what to do."""


class ShardReadError(UpstreamError):
    """A shard could not be read (after retrying, where that helps); names the URL and offset."""


class BadRecordError(DataechoError, ValueError):
    """A record that cannot be decoded, or a shard that ends early (truncated or damaged tar)."""


class TruncatedTransfer(DataechoError, ConnectionError):
    """The connection ended before the body's ``Content-Length``: the server went away."""


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def open_shard(url: str, *, timeout_s: float) -> BinaryIO:
    """A buffered binary stream of the shard at ``url`` (HTTP, ``emulated:`` or a path)."""
    if is_http(url):
        opener = _direct if urlsplit(url).hostname in _LOOPBACK else _default
        response = opener.open(url, timeout=timeout_s)
        return io.BufferedReader(_HttpBody(response, url), _BUFFER)
    if url.startswith(emulated.SCHEME + ":"):
        return io.BufferedReader(emulated.open_emulated(url), _BUFFER)
    return open(url, "rb", buffering=_BUFFER)  # noqa: SIM115 (the caller closes it)


def is_transient(err: BaseException) -> bool:
    """Whether retrying could help: network errors and 5xx/408/429 answers, not 404 or 403."""
    if isinstance(err, urllib.error.HTTPError):
        return err.code >= 500 or err.code in (408, 429)
    return isinstance(
        err, (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)
    )


def read_retrying(url: str, *, retry_seconds: float, timeout_s: float) -> bytes:
    """The whole body at ``url``, read again while faults pass, as a shard read is.

    A transient fault (:func:`is_transient`) of an HTTP upstream is retried with
    :class:`Backoff` for ``retry_seconds``; a lasting one (404, or any error of a file) and
    one that outlasts the budget raise :class:`UpstreamError` with :func:`give_up_message`.
    """
    backoff = Backoff(retry_seconds)
    while True:
        try:
            with open_shard(url, timeout_s=timeout_s) as stream:
                return stream.read()
        except (OSError, http.client.HTTPException) as err:
            retrying = is_http(url) and is_transient(err)
            delay = backoff.failed() if retrying else None
            if delay is None:
                raise UpstreamError(give_up_message(url, err, backoff, retried=retrying)) from err
            log.warning("reading %s failed (%s); retrying in %.2f s", url, err, delay)
            time.sleep(delay)


def give_up_message(where: str, err: BaseException, backoff: Backoff, *, retried: bool) -> str:
    """Why reading ``where`` failed for good: how long it was retried, the error, the fix."""
    how_long = (
        f" after retrying for {backoff.elapsed():.1f} s ({backoff.attempts} attempts; "
        f"retry_seconds={backoff.retry_seconds:g} sets how long)"
        if retried
        else ""
    )
    return (
        f"cannot read {where}{how_long}: {type(err).__name__}: {err}; check that the upstream "
        "is up and serves the folder dataecho prepare wrote"
    )


class _HttpBody(io.RawIOBase):
    """An HTTP response body that raises :class:`TruncatedTransfer` on an early end."""

    def __init__(self, response: http.client.HTTPResponse, url: str) -> None:
        super().__init__()
        self._response = response
        self._url = url
        length = response.getheader("Content-Length")
        self._left = int(length) if length is not None else None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 (any writable buffer)
        n = self._response.readinto(buffer)
        if self._left is not None:
            if n == 0 and self._left > 0 and len(buffer) > 0:
                raise TruncatedTransfer(
                    f"{self._url}: connection closed with {self._left:,} bytes still to come"
                )
            self._left -= n
        return n

    def close(self) -> None:
        self._response.close()
        super().close()


class Backoff:
    """Exponential backoff within a time budget. State: when the current failures began.

    Args:
        retry_seconds: how long a run of failures may last before :meth:`failed` gives up
            (0: never retry).
        first_delay_s: the first wait; each further one doubles, up to ``max_delay_s``.
    """

    def __init__(
        self, retry_seconds: float, *, first_delay_s: float = 0.05, max_delay_s: float = 2.0
    ) -> None:
        if not isinstance(retry_seconds, (int, float)) or not 0 <= retry_seconds < math.inf:
            raise DataechoValueError(
                f"retry_seconds must be a finite number of seconds >= 0, got {retry_seconds!r}; "
                "e.g. 60 (0 fails at the first error)"
            )
        self.retry_seconds = float(retry_seconds)
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.since: float | None = None  # monotonic time of the first failure in this run
        self.attempts = 0

    def failed(self) -> float | None:
        """Record a failure: the seconds to wait before the next try, or None when time is up."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        self.attempts += 1
        delay = min(self.first_delay_s * 2 ** (self.attempts - 1), self.max_delay_s)
        left = self.since + self.retry_seconds - now
        if left <= 0:
            return None
        return min(delay, left)

    def elapsed(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def succeeded(self) -> None:
        """The upstream delivered something new: the next failure starts a new run."""
        self.since, self.attempts = None, 0
