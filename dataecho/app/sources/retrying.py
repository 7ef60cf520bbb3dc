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

Limits, so that no server can hold a reader forever or fill its memory:

- ``deadline_s``: the most seconds one request may spend waiting for the server: connecting,
  the headers (redirects included) and every read of the body, added up; the reader's own time
  between reads (decoding, a full loader queue) does not count. A server that trickles (a byte
  every few seconds: never ``timeout_s`` without one) is cut off there with
  :class:`DeadlineExceeded`, a ``TimeoutError``, retried as a stall is. A watchdog thread
  shuts the connection's socket down, so the deadline holds while the headers trickle in too.
- ``ceiling``: the most bytes a body may hold (:class:`Ceiling`; a shard's size in its
  manifest, a few MiB for a manifest). A ``Content-Length`` above it is refused before a byte
  of the body is read, and a body without one is cut off one byte past it
  (:class:`BodyTooLarge`).
- Redirects: followed only to the same host and port; a redirect to another one raises
  :class:`CrossHostRedirect` naming both, unless ``allow_cross_host_redirects``.

Both refusals are :class:`RefusedAnswer`: lasting, never retried, their message complete.
"""

from __future__ import annotations

import functools
import http.client
import io
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import urlsplit

from dataecho.app.sources import emulated
from dataecho.errors import DataechoError, DataechoValueError

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_BUFFER = 1 << 16
DEFAULT_DEADLINE_S = 600.0
"""The default ``deadline_s``: ten minutes for one shard (a 100 MB shard at 170 KB/s)."""
log = logging.getLogger("dataecho.shards")


class UpstreamError(DataechoError, OSError):
    """The upstream cannot be reached or holds the wrong data; the message says what to do."""


class ShardReadError(UpstreamError):
    """A shard could not be read (after retrying, where that helps); names the URL and offset."""


class BadRecordError(DataechoError, ValueError):
    """A record that cannot be decoded, or a shard that ends early (truncated or damaged tar)."""


class TruncatedTransfer(DataechoError, ConnectionError):
    """The connection ended before the body's ``Content-Length``: the server went away."""


class RefusedAnswer(UpstreamError):
    """An answer dataecho will not read on: lasting (never retried); the message is complete.

    ``message`` keeps the text as raised (a tar reader may append to ``args`` on the way).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BodyTooLarge(RefusedAnswer):
    """A body over its :class:`Ceiling`, announced (refused unread) or sent (cut off)."""


class CrossHostRedirect(RefusedAnswer):
    """A redirect to another host or port, without ``allow_cross_host_redirects``."""


class DeadlineExceeded(DataechoError, TimeoutError):
    """A request outlasted ``deadline_s`` (a stalled or trickling server); retried as a stall."""


class Ceiling(NamedTuple):
    """The most bytes a body may hold, and the words for an error when it holds more.

    ``what``: the ceiling in words ("the 92,160 bytes its manifest lists");
    ``fix``: the likely cause and fix, ending the message.
    """

    bytes: int
    what: str
    fix: str


def is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def open_shard(
    url: str,
    *,
    timeout_s: float,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    ceiling: Ceiling | None = None,
    allow_cross_host_redirects: bool = False,
) -> BinaryIO:
    """A buffered binary stream of the shard at ``url`` (HTTP, ``emulated:`` or a path).

    Over HTTP: ``timeout_s`` without a byte is a stall (``TimeoutError``); ``deadline_s``
    bounds the whole request (None: no bound), ``ceiling`` the body's size, and a redirect to
    another host is refused unless ``allow_cross_host_redirects`` (module docstring).
    """
    if is_http(url):
        return io.BufferedReader(
            _open_http(url, timeout_s, deadline_s, ceiling, allow_cross_host_redirects), _BUFFER
        )
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


def read_retrying(
    url: str,
    *,
    retry_seconds: float,
    timeout_s: float,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    ceiling: Ceiling | None = None,
    allow_cross_host_redirects: bool = False,
) -> bytes:
    """The whole body at ``url``, read again while faults pass, as a shard read is.

    A transient fault (:func:`is_transient`, a missed ``deadline_s`` included) of an HTTP
    upstream is retried with :class:`Backoff` for ``retry_seconds``; a lasting one (404, or
    any error of a file) and one that outlasts the budget raise :class:`UpstreamError` with
    :func:`give_up_message`. A :class:`RefusedAnswer` (over ``ceiling``, a redirect to another
    host) is raised as it is, at once.
    """
    backoff = Backoff(retry_seconds)
    while True:
        try:
            with open_shard(
                url, timeout_s=timeout_s, deadline_s=deadline_s, ceiling=ceiling,
                allow_cross_host_redirects=allow_cross_host_redirects,
            ) as stream:  # fmt: skip
                return stream.read()
        except RefusedAnswer:
            raise
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


def _open_http(
    url: str,
    timeout_s: float,
    deadline_s: float | None,
    ceiling: Ceiling | None,
    allow_cross_host_redirects: bool,
) -> _HttpBody:
    deadline = _Deadline(url, deadline_s)
    # Loopback is never behind a proxy; elsewhere urllib honours http_proxy / no_proxy as usual.
    direct = [urllib.request.ProxyHandler({})] if urlsplit(url).hostname in _LOOPBACK else []
    opener = urllib.request.build_opener(
        *direct,
        _WatchedHTTPHandler(deadline),
        _WatchedHTTPSHandler(deadline),
        _SameHostRedirects(allow_cross_host_redirects),
    )
    try:
        response = opener.open(url, timeout=timeout_s)
    except BaseException as err:
        deadline.cancel()
        if deadline.expired:
            raise deadline.error(0) from err
        raise
    deadline.wait_ends()
    try:
        return _HttpBody(response, url, deadline, ceiling)
    except BaseException:
        deadline.cancel()
        response.close()
        raise


class _HttpBody(io.RawIOBase):
    """An HTTP response body under its limits: it raises :class:`TruncatedTransfer` on an early
    end, :class:`DeadlineExceeded` once the deadline cut the connection, :class:`BodyTooLarge`
    past the ceiling (and at once, for a ``Content-Length`` above it)."""

    def __init__(
        self,
        response: http.client.HTTPResponse,
        url: str,
        deadline: _Deadline,
        ceiling: Ceiling | None,
    ) -> None:
        super().__init__()
        self._response = response
        self._url = url
        self._deadline = deadline
        self._ceiling = ceiling
        self.received = 0
        length = response.getheader("Content-Length")
        self._left = int(length) if length is not None and length.isdigit() else None
        if ceiling is not None and self._left is not None and self._left > ceiling.bytes:
            raise BodyTooLarge(
                f"{url}: the server announces {self._left:,} bytes (Content-Length), more than "
                f"{ceiling.what}; refused before reading the body. {ceiling.fix}"
            )

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 (any writable buffer)
        view = memoryview(buffer).cast("B")
        if self._ceiling is not None:
            # Up to the ceiling, and then one byte to tell whether the body goes on: only
            # once everything below the ceiling was asked for, so all of it can be used.
            view = view[: max(self._ceiling.bytes - self.received, 1)]
        self._deadline.wait_begins()
        try:
            n = self._response.readinto(view)
        except Exception as err:
            if self._deadline.expired:  # the watchdog shut the socket down under the read
                raise self._deadline.error(self.received) from err
            raise
        finally:
            self._deadline.wait_ends()
        if n == 0 and len(view) > 0:
            if self._deadline.expired and self._left != 0:
                raise self._deadline.error(self.received)
            if self._left:
                raise TruncatedTransfer(
                    f"{self._url}: connection closed with {self._left:,} bytes still to come"
                )
        self.received += n
        if self._left is not None:
            self._left -= n
        if self._ceiling is not None and self.received > self._ceiling.bytes:
            raise BodyTooLarge(
                f"{self._url}: the server sends more than {self._ceiling.what}; reading "
                f"stopped there. {self._ceiling.fix}"
            )
        return n

    def close(self) -> None:
        self._deadline.cancel()  # first: the watchdog never touches a socket being closed
        self._response.close()
        super().close()


class _Deadline:
    """One request's deadline on the time spent waiting for the server, and its watchdog.

    Waiting is the opening (connecting, the request, the headers, redirects) and each body
    read; the time a reader spends on its records between reads does not count, so a slow
    consumer is never cut off, while a trickling server is. When the waits add up to
    ``seconds`` the watchdog thread shuts the request's sockets down: that ends a read under
    way at once (an end of file or an error), which the reader then reports as
    :class:`DeadlineExceeded`, asking :attr:`expired`.
    """

    def __init__(self, url: str, seconds: float | None) -> None:
        self.url, self.seconds = url, seconds
        self.expired = False
        self._spent = 0.0  # seconds of finished waits
        self._since: float | None = time.monotonic()  # start of the wait under way: opening
        self._sockets: list[socket.socket] = []
        self._done = False
        self._cond = threading.Condition()
        if seconds is not None:
            threading.Thread(target=self._watchdog, name="dataecho-deadline", daemon=True).start()

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the deadline passes (at once, if it has passed)."""
        with self._cond:
            if self._done:
                return
            self._sockets.append(sock)
            if self.expired:
                _shut_down(sock)

    def wait_begins(self) -> None:
        with self._cond:
            self._since = time.monotonic()

    def wait_ends(self) -> None:
        with self._cond:
            if self._since is not None:
                self._spent += time.monotonic() - self._since
                self._since = None

    def cancel(self) -> None:
        """The request is over: the watchdog stops and forgets its sockets."""
        with self._cond:
            self._done = True
            self._sockets.clear()
            self._cond.notify_all()

    def error(self, received: int) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"{self.url}: the server took more than the {self.seconds:g} s deadline to answer "
            f"(deadline_s={self.seconds:g}, the time spent waiting on it; {received:,} bytes of "
            "the body had come): it is stalled or trickling; raise deadline_s only for a slow "
            "link with large shards"
        )

    def _watchdog(self) -> None:
        assert self.seconds is not None
        with self._cond:  # held but while waiting: cancel() (and so a close) waits for it
            while not self._done:
                spent = self._spent
                if self._since is not None:
                    spent += time.monotonic() - self._since
                left = self.seconds - spent
                if left <= 0:
                    self.expired = True
                    for sock in self._sockets:
                        _shut_down(sock)
                    return
                # The earliest the waits could add up; between reads nothing is spent, and the
                # watchdog sleeps again (at least 10 ms: no busy loop near the end).
                self._cond.wait(max(left, 0.01))


def _shut_down(sock: socket.socket) -> None:
    try:
        # The plain socket's own call, also for TLS: the kernel ends a read blocked in another
        # thread, where SSLSocket.shutdown would first drop the TLS state under it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # closed already: nothing to end
        pass


class _WatchConnect:
    """Mixed into an ``http.client`` connection: its socket is watched by ``_deadline``."""

    _deadline: _Deadline

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # the connection class it is mixed into
        self._deadline.watch(self.sock)  # type: ignore[attr-defined]


@functools.cache
def _watched(base: type) -> type:
    return type(f"Watched{base.__name__}", (_WatchConnect, base), {})


class _WatchHandler:
    """Mixed into urllib's HTTP(S) handler: each connection it opens is watched."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def do_open(self, http_class: type, req: urllib.request.Request, **kwargs: Any) -> Any:
        def connection(*args: Any, **kw: Any) -> Any:
            conn = _watched(http_class)(*args, **kw)
            conn._deadline = self._deadline
            return conn

        return super().do_open(connection, req, **kwargs)  # type: ignore[misc]


class _WatchedHTTPHandler(_WatchHandler, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPSHandler(_WatchHandler, urllib.request.HTTPSHandler):
    pass


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same host and port, unless ``allow`` (any host)."""

    def __init__(self, allow: bool) -> None:
        super().__init__()
        self._allow = allow

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201
        old, new = _host(req.full_url), _host(newurl)
        if old != new and not self._allow:
            fp.close()
            raise CrossHostRedirect(
                f"{req.full_url} redirects ({code}) to {newurl}, on another host: {new} "
                f"instead of {old}; a redirect to another host is not followed unless asked "
                "for: pass allow_cross_host_redirects=True to follow it, or point the upstream "
                f"at {new} directly"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _host(url: str) -> str:
    """``host:port`` of ``url``, the scheme's default port written out."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
