"""An *emulation* of remote storage: local shard files read at a set bandwidth and latency.

For machines without nginx (see :mod:`dataecho.app.sources.nginx` for the real server). Nothing
here touches a network: each file is read from local disk, and the reader sleeps so that the
first byte arrives ``latency_s`` after the open and the rest at ``bandwidth_bytes_per_s``,
as a per-connection-capped HTTP download would. The sleeps are what a network read looks
like to the host (time passes, the CPU is free); the emulation has no jitter, no congestion
and no server-side limit shared between readers: each open stream gets the full bandwidth,
like one nginx connection under ``limit_rate``.

webdataset opens non-file URLs through its ``gopen_schemes`` table (scheme -> opener); importing
this module adds the ``emulated:`` scheme to it, so plain ``webdataset.WebDataset`` reads::

    emulated:/abs/dir/shard-000000.tar?bandwidth=2000000&latency=0.02

The parameters travel inside the URL, so a DataLoader worker (forked or spawned) needs no
state from the parent: unpickling the dataset imports :mod:`dataecho.app.sources.shards`, which
imports this module, which registers the scheme there too.
"""

from __future__ import annotations

import importlib
import io
import math
import numbers
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from dataecho.errors import DataechoTypeError, DataechoValueError

# The module, not the function of the same name that ``webdataset`` exports.
_gopen = importlib.import_module("webdataset.gopen")

SCHEME = "emulated"


class EmulatedStream(io.RawIOBase):
    """A read-only file wrapper that paces reads (emulation of a slow remote read).

    After ``k`` bytes have been returned, the call does not return before
    ``open_time + latency_s + k / bandwidth_bytes_per_s``: the schedule is kept on one clock
    from the open, so a sleep that overshoots is paid back by the next read and the long-run
    rate is the one set. ``bytes_read`` counts what was handed out.
    """

    def __init__(
        self, raw: io.BufferedIOBase, *, bandwidth_bytes_per_s: float, latency_s: float
    ) -> None:
        super().__init__()
        self._raw = raw
        self.bandwidth = bandwidth_bytes_per_s
        self.latency = latency_s
        self.bytes_read = 0
        self._start = time.perf_counter()
        self.name = getattr(raw, "name", None)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 (any writable buffer)
        n = self._raw.readinto(buffer)
        self.bytes_read += n or 0
        due = self._start + self.latency
        if math.isfinite(self.bandwidth):
            due += self.bytes_read / self.bandwidth
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class EmulatedStorage:
    """Emulated remote storage over a local folder: ``.url`` is a base for ``shard_urls``.

    Args:
        root_dir: the folder holding the shards (written by ``write_image_shards``).
        bandwidth_bytes_per_s: bytes per second per open stream (> 0; ``math.inf`` for none).
            Like nginx's ``limit_rate``, it holds per stream, so ``n`` DataLoader workers
            reading at once get ``n`` times this in total.
        latency_s: seconds from opening a file to its first byte (>= 0).
    """

    def __init__(
        self, root_dir: str | Path, *, bandwidth_bytes_per_s: float, latency_s: float = 0.0
    ) -> None:
        self.root_dir = Path(root_dir).resolve()
        if not self.root_dir.is_dir():
            raise FileNotFoundError(
                f"emulated storage: root_dir {str(root_dir)!r} is not a folder; write the "
                "shards first (dataecho.app.sources.shard_writer.write_image_shards)"
            )
        self.bandwidth = _real(bandwidth_bytes_per_s, "bandwidth_bytes_per_s", zero_ok=False)
        self.latency = _real(latency_s, "latency_s", zero_ok=True)
        if math.isinf(self.latency):
            raise DataechoValueError("latency_s must be finite, got inf; use e.g. latency_s=0.05")

    @property
    def url(self) -> str:
        """``emulated:/abs/dir?bandwidth=...&latency=...``; shard names go before the query."""
        query = urlencode({"bandwidth": repr(self.bandwidth), "latency": repr(self.latency)})
        return f"{SCHEME}:{quote(str(self.root_dir))}?{query}"

    def describe(self) -> str:
        """One line for logs, saying plainly that this is an emulation."""
        return (
            f"EMULATED storage (local files, no network): {self.root_dir}, "
            f"{self.bandwidth / 1e6:.3g} MB/s per stream, {self.latency * 1e3:.3g} ms latency"
        )

    def __repr__(self) -> str:
        return (
            f"EmulatedStorage({str(self.root_dir)!r}, bandwidth_bytes_per_s={self.bandwidth!r}, "
            f"latency_s={self.latency!r})"
        )


def open_emulated(url: str, mode: str = "rb", bufsize: int = 8192, **kw: object) -> EmulatedStream:
    """Open an ``emulated:`` URL (the opener webdataset's ``gopen`` calls for that scheme)."""
    if mode not in ("rb", "r"):
        raise DataechoValueError(f"emulated storage is read-only: mode must be 'rb', got {mode!r}")
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise DataechoValueError(f"not an {SCHEME}: URL: {url!r}")
    query = parse_qs(parts.query)
    try:
        bandwidth = float(query.get("bandwidth", ["inf"])[0])
        latency = float(query.get("latency", ["0"])[0])
    except ValueError as err:
        raise DataechoValueError(
            f"{url!r}: bad bandwidth/latency ({err}); build it with EmulatedStorage"
        ) from err
    raw = open(unquote(parts.path), "rb")  # noqa: SIM115 (the stream owns and closes it)
    return EmulatedStream(raw, bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def _real(value: object, name: str, *, zero_ok: bool) -> float:
    low = ">= 0" if zero_ok else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(f"{name} must be a real number {low}, got {value!r}")
    value = float(value)
    if math.isnan(value) or value < 0 or (value == 0 and not zero_ok):
        raise DataechoValueError(f"{name} must be a number {low}, got {value!r}")
    return value


# webdataset's documented extension point: its opener table, keyed by URL scheme.
_gopen.gopen_schemes[SCHEME] = open_emulated
