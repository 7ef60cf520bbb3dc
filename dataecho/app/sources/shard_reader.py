"""One reader's pass over its shards: explicit position, retries, and a bad-record policy.

    reader = ShardReader(urls, counts, decode, state={"shard": 2, "offset": 17, ...})
    for example in reader: ...
    reader.get_state()   # {"epoch", "reader", "readers", "shard", "offset", "skipped"}

Position: ``shard`` indexes this reader's list of shards (its share of the epoch's order) and
``offset`` counts the records of that shard already consumed (delivered or skipped). A reader
built from a state opens shard ``shard`` and passes over its first ``offset`` records without
decoding them; earlier shards are not opened at all. The same path serves a retry: after an
upstream fault the shard is opened again and read past what was already delivered, so a
partially read shard is never counted as read and no record comes out twice.

Records: tar members grouped by key with webdataset's ``tar_file_iterator`` and
``group_by_keys`` (``00000042.png`` + ``00000042.cls``
make the sample ``{"__key__": "00000042", "png": ..., "cls": ...}``). A shard that ends before
the manifest's count (a truncated or damaged tar: Python's tar reader takes a broken header
for the end of the archive) is a bad record, like one that fails to decode; ``on_bad_record``
says what happens: "raise" (:class:`BadRecordError`, naming the shard, the record and the fix)
or "skip" (counted in ``skipped``, the records a shard lost included, logged, and reported to
``on_skip``: :class:`~dataecho.app.sources.shards.ShardDataset` adds them up over its passes and
workers, so that a run can report them).

Bounds on an HTTP shard (see :mod:`~dataecho.app.sources.retrying`): its body may not go past
the size its manifest lists (``sizes``): a server that sends more, after the tar's end too, is
cut off there with :class:`ShardReadError` naming the URL, never read to its end. Without
``sizes``, what follows the tar's end is read up to ``TAR_TAIL_BYTES`` (its end-of-archive
padding), and a body that goes on past that fails the same way. ``deadline_s`` bounds the
time each request waits for the server, and a redirect to another host is refused unless
``allow_cross_host_redirects``.
"""

from __future__ import annotations

import http.client
import logging
import math
import tarfile
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from webdataset.tariterators import group_by_keys, tar_file_iterator

from dataecho.app.sources.retrying import (
    DEFAULT_DEADLINE_S,
    Backoff,
    BadRecordError,
    Ceiling,
    RefusedAnswer,
    ShardReadError,
    give_up_message,
    is_http,
    is_transient,
    open_shard,
)

POLICIES = ("raise", "skip")
STATE_KEYS = ("epoch", "reader", "readers", "shard", "offset", "skipped")
TAR_TAIL_BYTES = 1 << 20
"""Bytes read after a tar's end when its size is not known: far more than any end padding
(a record: 10 KiB for Python's and GNU tar's default blocking factor)."""
log = logging.getLogger("dataecho.shards")


class ShardReader:
    """Iterator over the examples of ``urls`` (one reader's shards, in order), from a state.

    Args:
        urls: this reader's shards in reading order; ``counts``: records each holds.
        decode: record dict -> example; any exception it raises marks a bad record.
        state: a :meth:`get_state` to continue from (None: the start of the epoch).
        epoch, reader, readers: where this pass sits (stored so a resume can be checked).
        on_bad_record: "raise" or "skip" (module docstring).
        retry_seconds: how long HTTP faults are retried before :class:`ShardReadError`.
        timeout_s: seconds without a byte from an HTTP server before it counts as a fault.
        on_skip: called with this reader after each skip (``skipped`` already counts it).
        sizes: bytes each shard holds (its manifest's ``bytes``), the most an HTTP body may
            send; None: unknown (module docstring).
        deadline_s: the most seconds one HTTP request may spend waiting for the server (None:
            no bound); a request past it is a fault, retried as a stall is.
        allow_cross_host_redirects: follow an HTTP redirect to another host (or port).
    """

    def __init__(
        self,
        urls: list[str],
        counts: list[int],
        decode: Callable[[dict[str, Any]], Any],
        *,
        state: dict[str, Any] | None = None,
        epoch: int = 0,
        reader: int = 0,
        readers: int = 1,
        on_bad_record: str = "raise",
        retry_seconds: float = 60.0,
        timeout_s: float = 30.0,
        on_skip: Callable[[ShardReader], None] | None = None,
        sizes: list[int] | None = None,
        deadline_s: float | None = DEFAULT_DEADLINE_S,
        allow_cross_host_redirects: bool = False,
    ) -> None:
        self.urls, self.counts, self.decode = urls, counts, decode
        self.sizes = sizes
        self.deadline_s = deadline_s
        self.allow_cross_host_redirects = allow_cross_host_redirects
        self.on_skip = on_skip
        self.on_bad_record = on_bad_record
        self.timeout_s = timeout_s
        self.epoch, self.reader, self.readers = epoch, reader, readers
        self.shard = self.offset = self.skipped = 0
        if state is not None:
            self.shard, self.offset = int(state["shard"]), int(state["offset"])
            self.skipped = int(state["skipped"])
        self._backoff = Backoff(retry_seconds)
        self._stream: BinaryIO | None = None
        self._records: Iterator[dict[str, Any]] | None = None
        self._seen = 0  # records passed in the current opening of the shard

    def get_state(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in STATE_KEYS}

    def __iter__(self) -> ShardReader:
        return self

    def __next__(self) -> Any:
        while self.shard < len(self.urls):
            url, count = self.urls[self.shard], self.counts[self.shard]
            try:
                if self._records is None:
                    self._open(url)
                record = next(self._records)
            except StopIteration:
                self._end_of_shard(url, count, "the tar archive ends there")
                continue
            except (tarfile.TarError, EOFError) as err:
                self._end_of_shard(url, count, f"{type(err).__name__}: {err}")
                continue
            except (OSError, http.client.HTTPException) as err:
                self._fault(url, count, err)
                continue
            self._seen += 1
            if self._seen <= self.offset:
                continue  # delivered before this opening (a resume or a retry)
            if self._seen > count:
                self.close()
                raise ShardReadError(
                    f"{url} holds more than the {count} records its manifest lists: the shards "
                    "changed after the manifest was written; write them again (dataecho prepare)"
                )
            self.offset += 1
            self._backoff.succeeded()
            try:
                return self.decode(record)
            except Exception as err:  # any decoding failure is this record's fault
                self._bad(f"{url}: record {self.offset - 1} (key {record.get('__key__')!r})", err)
        raise StopIteration

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = self._records = None

    def _open(self, url: str) -> None:
        self._seen = 0
        ceiling = None
        if self.sizes is not None:
            ceiling = Ceiling(
                self.sizes[self.shard],
                f"the {self.sizes[self.shard]:,} bytes its manifest lists",
                "The shard changed after the manifest was written, or the server adds to it "
                "(the body goes on after the tar's end); write the shards again (dataecho "
                "prepare) and serve the folder as it was written",
            )
        self._stream = open_shard(
            url, timeout_s=self.timeout_s, deadline_s=self.deadline_s, ceiling=ceiling,
            allow_cross_host_redirects=self.allow_cross_host_redirects,
        )  # fmt: skip
        self._records = _records(self._stream, url)

    def _end_of_shard(self, url: str, count: int, why: str) -> None:
        if self.offset < count:
            lost = count - self.offset
            self._bad(
                f"{url}: shard ends after {self.offset} of its {count} records ({why}); "
                f"{lost} record(s) lost",
                None,
                lost=lost,
            )
        if self._stream is not None and is_http(url):
            try:  # the whole body: what nginx logs is what the shard holds
                _drain(self._stream, url, known_size=self.sizes is not None)
            except RefusedAnswer as err:
                self.close()
                raise ShardReadError(err.message) from err
        self.close()
        self.shard, self.offset = self.shard + 1, 0

    def _fault(self, url: str, count: int, err: Exception) -> None:
        """An upstream error: retry while the backoff allows, else a clear error."""
        self.close()
        if isinstance(err, RefusedAnswer):  # lasting, and the message says it all
            raise ShardReadError(f"{err.message} (at record {self.offset} of {count})") from err
        where = f"{url} at record {self.offset} of {count}"
        retrying = is_http(url) and is_transient(err)
        delay = self._backoff.failed() if retrying else None
        if delay is None:
            message = give_up_message(where, err, self._backoff, retried=retrying)
            raise ShardReadError(message) from err
        log.warning("reading %s failed (%s); retrying in %.2f s", where, err, delay)
        time.sleep(delay)

    def _bad(self, what: str, err: Exception | None, *, lost: int = 1) -> None:
        reason = f": {type(err).__name__}: {err}" if err is not None else ""
        if self.on_bad_record == "raise":
            self.close()
            raise BadRecordError(
                f"bad record in {what}{reason}; write the shards again (dataecho prepare), or "
                "pass on_bad_record='skip' (--on-bad-record skip) to skip such records"
            ) from err
        self.skipped += lost
        log.warning("skipped bad record in %s%s (%d skipped by this reader in epoch %d)",
                    what, reason, self.skipped, self.epoch)  # fmt: skip
        if self.on_skip is not None:
            self.on_skip(self)


def _records(stream: BinaryIO, url: str) -> Iterator[dict[str, Any]]:
    """The samples of a tar stream, by webdataset's own tar iterator and key grouping."""
    files = tar_file_iterator(stream)
    return group_by_keys({**f, "__url__": url} for f in files)


def _drain(stream: BinaryIO, url: str, *, known_size: bool) -> None:
    """Read what is left (tar padding), within the body's ceiling (``known_size``) or else
    ``TAR_TAIL_BYTES``; past it, :class:`RefusedAnswer`. Any other fault here loses nothing
    (every record has come), so it is ignored."""
    left = math.inf if known_size else TAR_TAIL_BYTES
    try:
        while chunk := stream.read(_DRAIN):
            left -= len(chunk)
            if left < 0:
                raise RefusedAnswer(
                    f"{url}: the body goes on for more than {TAR_TAIL_BYTES:,} bytes after the "
                    "tar archive's end (TAR_TAIL_BYTES, more than its end padding); reading "
                    "stopped there. The server adds to the shard; serve the folder dataecho "
                    "prepare wrote"
                )
    except RefusedAnswer:
        raise
    except OSError:
        pass


_DRAIN = 1 << 16
