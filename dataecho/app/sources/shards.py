"""WebDataset tar shards: write them once (with a manifest), stream them back with ``webdataset``.

An image sample is ``{"__key__": "00000042", "png": <lossless PNG>, "cls": b"7"}``; a token
sample holds one ``.npy`` array. ``manifest.json`` lists every shard with its example count,
size and sha256, plus a fingerprint of the source data, so a second write of the same data is
skipped. Tar adds a 512-byte header per member and pads each to 512 bytes: a 28x28 image
sample (a ~0.6 KB PNG and a label) takes about 2.3 KB on disk and on the wire.

Writing: :mod:`dataecho.app.sources.shard_writer`. Reading: :class:`ShardDataset` streams shards from a local folder, an ``http://`` server
(:class:`dataecho.app.sources.nginx.NginxServer`) or emulated storage
(:class:`dataecho.app.sources.emulated.EmulatedStorage`) through
:class:`dataecho.app.sources.shard_reader.ShardReader`, which hands each rank and then each
DataLoader worker a disjoint subset of the shards (as ``webdataset``'s ``split_by_node`` and
``split_by_worker`` do), so every example is read once per epoch across all workers; it keeps
its position as explicit state (exact resume), retries HTTP faults and applies the
``on_bad_record`` policy. Records skipped under ``on_bad_record="skip"`` are added up over
every pass and every DataLoader worker in :attr:`ShardDataset.skipped_total`, which the
training process reads (the workers count in shared memory).
"""

from __future__ import annotations

import functools
import io
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import IterableDataset

from dataecho import _validate
from dataecho.app.sources import emulated  # registers the emulated: URL scheme with webdataset
from dataecho.app.sources.retrying import DEFAULT_DEADLINE_S, Ceiling, read_retrying
from dataecho.app.sources.shard_reader import POLICIES, STATE_KEYS, ShardReader
from dataecho.errors import DataechoTypeError, DataechoValueError

FORMAT = "dataecho-webdataset-shards"
VERSION = 1
MANIFEST = "manifest.json"
SAMPLES = {
    "image": {"png": "28x28 grayscale uint8 image, PNG (lossless)", "cls": "label, ASCII int"},
    "tokens": {"npy": "1-D integer token array, numpy .npy"},
}
TOKEN_DTYPES = ("uint8", "int16", "uint16", "int32", "int64")
SKIP_SLOTS = 1024  # DataLoader workers per process whose skipped records are counted
MAX_MANIFEST_BYTES = 16 << 20
"""The most bytes a manifest may hold: about 100,000 shards' entries. A larger body is not a
manifest dataecho prepare wrote, and is refused before it is read."""
_MANIFEST_CEILING = Ceiling(
    MAX_MANIFEST_BYTES,
    f"the {MAX_MANIFEST_BYTES >> 20} MiB a manifest may hold (MAX_MANIFEST_BYTES)",
    "This is not a manifest dataecho prepare wrote: check that the upstream names the folder "
    "it wrote (its manifest.json lists every shard in about 150 bytes)",
)


def load_manifest(
    base: str | Path,
    *,
    retry_seconds: float = 60.0,
    timeout_s: float = 30.0,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    allow_cross_host_redirects: bool = False,
) -> dict[str, Any]:
    """The manifest under ``base``: a folder, an ``http(s)://`` URL or an ``emulated:`` URL.

    Over HTTP it is read as a shard is (:func:`~dataecho.app.sources.retrying.read_retrying`):
    a server down or stalled is retried for ``retry_seconds``, ``timeout_s`` without a byte
    or ``deadline_s`` of waiting for the whole answer counts as stalled, a redirect to another
    host is refused unless ``allow_cross_host_redirects``, and a lasting fault raises
    ``UpstreamError`` naming the URL and the fix. A manifest over ``MAX_MANIFEST_BYTES`` is
    refused before its body is read.
    """
    base = str(base)
    if base.startswith(("http://", "https://")):
        url = urlsplit(base)
        url = url._replace(path=url.path.rstrip("/") + "/" + MANIFEST).geturl()
        body = read_retrying(
            url, retry_seconds=retry_seconds, timeout_s=timeout_s, deadline_s=deadline_s,
            ceiling=_MANIFEST_CEILING, allow_cross_host_redirects=allow_cross_host_redirects,
        )  # fmt: skip
        manifest = _parse_manifest(body, url)
    else:
        if base.startswith(emulated.SCHEME + ":"):  # metadata is read without emulated delays
            base = unquote(urlsplit(base).path)
        path = Path(base) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST} in {base}; write the shards first")
        if (size := path.stat().st_size) > MAX_MANIFEST_BYTES:
            c = _MANIFEST_CEILING
            raise DataechoValueError(f"{path}: {size:,} bytes, more than {c.what}. {c.fix}")
        manifest = _parse_manifest(path.read_text(), str(path))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DataechoValueError(
            f"{base}: not a {FORMAT} v{VERSION} manifest (format {manifest.get('format')!r}, "
            f"version {manifest.get('version')!r}); rewrite the shards with this version"
        )
    return manifest


def _parse_manifest(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
    except ValueError as err:  # a truncated or overwritten file: name it and the fix
        raise DataechoValueError(
            f"{where}: the manifest is not JSON ({err}); rewrite the shards (dataecho prepare)"
        ) from err
    if not isinstance(manifest, dict):
        raise DataechoValueError(f"{where}: the manifest is not a JSON object; rewrite the shards")
    return manifest


def shard_urls(base: str | Path, manifest: dict[str, Any]) -> list[str]:
    """One URL (or path) per shard: ``base`` + shard name, any ``?query`` kept at the end."""
    names = [s["name"] for s in manifest["shards"]]
    base = str(base)
    if ":" not in base.split("/", 1)[0]:  # a plain path
        return [str(Path(base) / n) for n in names]
    parts = urlsplit(base)
    return [parts._replace(path=parts.path.rstrip("/") + "/" + quote(n)).geturl() for n in names]


class ShardDataset(IterableDataset):
    """Stream examples from shards; image shards give ``(uint8 tensor 1x28x28, int label)``.

    Token shards give an int64 tensor per sample. Decoding runs where the dataset is iterated:
    in the DataLoader worker. Each rank and then each worker reads its own shards (the epoch's
    order split as ``webdataset``'s ``split_by_node`` and ``split_by_worker`` would). More
    workers x ranks than shards leaves some idle.

    Resume: :meth:`state_dict` is the position of the latest pass in this process (which
    shard of this reader's share, how many of its records consumed, records skipped);
    ``torchdata`` checkpoints it per worker (``IterableWrapper`` calls it), and after
    :meth:`load_state_dict` the next ``iter()`` continues there: finished shards are not read
    again, and the current one is read past its consumed records without decoding them.
    See :mod:`dataecho.app.sources.shard_reader` for faults and bad records.

    Args:
        base: folder, ``http://host:port`` (e.g. ``NginxServer.url``) or ``EmulatedStorage.url``.
        manifest: the manifest (default: :func:`load_manifest` of ``base``).
        shuffle_shards: read shards in a seeded order that changes with :meth:`set_epoch`.
        seed: the shard-order seed.
        on_bad_record: "raise" (default) or "skip" (counted in :attr:`skipped` and
            :attr:`skipped_total`, logged).
        retry_seconds: how long HTTP faults (server down, stalled, connection dropped) are
            retried, with backoff, before an error naming the shard and record; the
            manifest read (when ``manifest`` is not given) is retried the same way.
        timeout_s: seconds without a byte from an HTTP server before it counts as stalled.
        deadline_s: the most seconds one HTTP request (a shard, the manifest) may spend
            waiting for the server, however it trickles, before it counts as stalled (None: no
            bound; the reader's own time between reads does not count).
        allow_cross_host_redirects: follow an HTTP redirect to another host or port (by
            default refused with an error naming both).

    Over HTTP a shard's body may not go past the size its manifest lists: one that does (after
    the tar's end too) fails with ``ShardReadError`` naming the URL, and is not read further.
    """

    def __init__(
        self,
        base: str | Path,
        manifest: dict[str, Any] | None = None,
        *,
        shuffle_shards: bool = False,
        seed: int = 0,
        on_bad_record: str = "raise",
        retry_seconds: float = 60.0,
        timeout_s: float = 30.0,
        deadline_s: float | None = DEFAULT_DEADLINE_S,
        allow_cross_host_redirects: bool = False,
    ) -> None:
        self.retry_seconds = _seconds(retry_seconds, "retry_seconds", zero_ok=True)
        self.timeout_s = _seconds(timeout_s, "timeout_s", zero_ok=False)
        self.deadline_s = (
            None if deadline_s is None else _seconds(deadline_s, "deadline_s", zero_ok=False)
        )
        if not isinstance(allow_cross_host_redirects, bool):
            raise DataechoTypeError(
                f"allow_cross_host_redirects must be True or False, got "
                f"{allow_cross_host_redirects!r}"
            )
        self.allow_cross_host_redirects = allow_cross_host_redirects
        if manifest is None:
            manifest = load_manifest(
                base, retry_seconds=self.retry_seconds, timeout_s=self.timeout_s,
                deadline_s=self.deadline_s,
                allow_cross_host_redirects=self.allow_cross_host_redirects,
            )  # fmt: skip
        self.manifest = manifest
        self.kind = _validate.one_of(self.manifest["kind"], tuple(SAMPLES), name="manifest kind")
        self.urls = shard_urls(base, self.manifest)
        self.counts = [int(s["count"]) for s in self.manifest["shards"]]
        self.sizes = [int(s["bytes"]) for s in self.manifest["shards"]]
        self.shuffle_shards = bool(shuffle_shards)
        self.seed = _validate.non_negative_int(seed, name="seed")
        self.on_bad_record = _validate.one_of(on_bad_record, POLICIES, name="on_bad_record")
        self.epoch = 0
        self._reader: ShardReader | None = None  # the latest pass in this process
        self._resume: dict[str, Any] | None = None  # loaded, for the next iter()
        # Nothing is skipped under "raise": only "skip" needs the shared counts.
        self._tally = _SkipTally() if self.on_bad_record == "skip" else None

    @property
    def num_examples(self) -> int:
        """Examples in all shards (all ranks and workers together)."""
        return int(self.manifest["total"])

    @property
    def bytes_per_example(self) -> float:
        """Mean stored (and transferred) bytes per example, tar overhead included."""
        return sum(s["bytes"] for s in self.manifest["shards"]) / max(1, self.num_examples)

    @property
    def skipped(self) -> int:
        """Bad records skipped by the latest pass in this process (one worker's, with workers)."""
        return self._reader.skipped if self._reader is not None else 0

    @property
    def skipped_total(self) -> int:
        """Bad records skipped so far by every pass of this dataset, in this process and in
        its DataLoader workers (as they read: a worker reading ahead counts before its
        batches are trained on), plus those a resume carried over (:meth:`resume_skipped`)."""
        return 0 if self._tally is None else self._tally.total()

    def skipped_checkpoint(self, *, mid_pass: bool) -> int:
        """What a checkpoint keeps of :attr:`skipped_total`, for :meth:`resume_skipped`.

        ``mid_pass``: the checkpoint's loader state continues the passes under way. Their
        readers then start again from the skip counts in their own positions and count up to
        the checkpoint's as they replay, so only finished passes are kept here; otherwise the
        current passes' counts are kept too.
        """
        return 0 if self._tally is None else self._tally.finished(current=not mid_pass)

    def resume_skipped(self, count: int) -> None:
        """Continue :attr:`skipped_total` from a checkpoint's :meth:`skipped_checkpoint`."""
        count = _validate.non_negative_int(count, name="skipped records")
        if self._tally is not None:
            self._tally.carried = count

    def set_epoch(self, epoch: int) -> None:
        """Pick the epoch's shard order (with ``shuffle_shards``); call before iterating."""
        epoch = _validate.non_negative_int(epoch, name="epoch")
        if epoch != self.epoch and self._tally is not None:
            # Between epochs no reader runs, so every pass so far is finished. Counted as
            # finished here rather than only as each worker's next pass starts, a checkpoint
            # taken before a slow worker has started keeps that worker's last-epoch skips too.
            self._tally.finish_passes()
        if self._resume is not None and self._resume["epoch"] != epoch:
            # A loaded position belongs to its own epoch (a state saved at a pass's end, say):
            # another epoch starts from its beginning.
            self._resume = None
        self.epoch = epoch

    def shard_order(self, epoch: int | None = None) -> list[str]:
        """This epoch's shard URLs, before the split: identical in every worker and rank."""
        return [self.urls[i] for i in self._order(self.epoch if epoch is None else epoch)]

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle_shards:
            return list(range(len(self.urls)))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.urls)).tolist()

    def __iter__(self) -> Iterator[Any]:
        rank, world, worker, workers = wds.utils.pytorch_worker_info()
        if len(self.urls) < world * workers:
            warnings.warn(
                f"{len(self.urls)} shards for {world} rank(s) x {workers} worker(s): some "
                "readers get none; write smaller shards (examples_per_shard) for more of them",
                stacklevel=2,
            )
        reader, readers = rank * workers + worker, world * workers
        state, self._resume = self._resume, None
        if state is not None and (state["reader"], state["readers"]) != (reader, readers):
            raise DataechoValueError(
                f"this shard position belongs to reader {state['reader']} of "
                f"{state['readers']} (rank x worker), but it was loaded into reader {reader} of "
                f"{readers}; resume with the same number of ranks and workers"
            )
        epoch = self.epoch if state is None else int(state["epoch"])
        mine = self._order(epoch)[rank::world][worker::workers]  # as split_by_node/_worker
        if self._tally is not None:
            if worker >= SKIP_SLOTS:
                raise DataechoValueError(
                    f"on_bad_record='skip' counts skipped records for up to {SKIP_SLOTS} "
                    f"DataLoader workers, but this is worker {worker} of {workers}; use fewer "
                    "workers (num_workers)"
                )
            self._tally.start_pass(worker, None if state is None else int(state["skipped"]))
        if self._reader is not None:
            self._reader.close()
        self._reader = ShardReader(
            [self.urls[i] for i in mine],
            [self.counts[i] for i in mine],
            _decode_image if self.kind == "image" else _decode_tokens,
            state=state,
            epoch=epoch,
            reader=reader,
            readers=readers,
            on_bad_record=self.on_bad_record,
            retry_seconds=self.retry_seconds,
            timeout_s=self.timeout_s,
            sizes=[self.sizes[i] for i in mine],
            deadline_s=self.deadline_s,
            allow_cross_host_redirects=self.allow_cross_host_redirects,
            on_skip=None if self._tally is None else functools.partial(self._count_skip, worker),
        )
        return self._reader

    def _count_skip(self, worker: int, reader: ShardReader) -> None:
        # A replaced pass may still be read on by a read-ahead thread: only the latest counts.
        if reader is self._reader and self._tally is not None:
            self._tally.count(worker, reader.skipped)

    def state_dict(self) -> dict[str, int]:
        """The position of the latest pass (or the loaded one not yet iterated); plain ints."""
        if self._resume is not None:
            return dict(self._resume)
        if self._reader is not None:
            return self._reader.get_state()
        rank, world, worker, workers = wds.utils.pytorch_worker_info()
        return {"epoch": self.epoch, "reader": rank * workers + worker,
                "readers": world * workers, "shard": 0, "offset": 0, "skipped": 0}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` at the next ``iter()``."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise DataechoValueError(
                f"not a ShardDataset state: missing {missing} in {sorted(state)}; pass what "
                "ShardDataset.state_dict() returned"
            )
        self._resume = {k: int(state[k]) for k in STATE_KEYS}
        self.epoch = self._resume["epoch"]  # the position is in that epoch's shard order

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into each DataLoader worker: an open pass (files, sockets) stays here.
        return {**self.__dict__, "_reader": None}


class _SkipTally:
    """Bad records skipped by one dataset's readers, per DataLoader worker, in shared memory.

    Each worker writes only its own slot (worker 0 is the process itself without workers):
    ``[finished, current]``, the skips of its finished passes and of the pass under way. The
    workers are forked or spawned with the dataset, and the memory is shared with them, so the
    training process reads every worker's counts as they change, without asking the workers.
    """

    def __init__(self) -> None:
        self.counts = torch.zeros((SKIP_SLOTS, 2), dtype=torch.int64).share_memory_()
        self.carried = 0  # from a checkpoint (this process's slots start at zero)

    def start_pass(self, slot: int, resumed: int | None) -> None:
        """A pass begins in ``slot``: a new one (``resumed`` None) or one continued from a
        position whose reader had skipped ``resumed`` records (that pass's count so far)."""
        row = self.counts[slot]
        if resumed is None:
            row[0] += row[1]
        row[1] = 0 if resumed is None else resumed

    def count(self, slot: int, skipped: int) -> None:
        self.counts[slot, 1] = skipped

    def finish_passes(self) -> None:
        self.counts[:, 0] += self.counts[:, 1]
        self.counts[:, 1] = 0

    def finished(self, *, current: bool) -> int:
        counts = self.counts if current else self.counts[:, 0]
        return self.carried + int(counts.sum())

    def total(self) -> int:
        return self.finished(current=True)


def _seconds(value: object, name: str, *, zero_ok: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        raise DataechoValueError(
            f"{name} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}, "
            f"got {value!r}; e.g. {name}=30"
        )
    return float(value)


def _decode_image(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    with Image.open(io.BytesIO(sample["png"]), formats=("PNG",)) as img:  # no format probing
        if img.mode != "L":  # an RGB image would become a tensor of the wrong shape
            raise DataechoValueError(
                f"expected a grayscale (mode L) PNG, got a {img.size[0]}x{img.size[1]} image of "
                f"mode {img.mode}; write the shards from Fashion-MNIST with dataecho prepare"
            )
        width, height = img.size
        # One copy of the pixels, writable so the tensor may be changed in place (numpy's
        # array interface would copy them twice).
        pixels = bytearray(img.tobytes())
    array = np.frombuffer(pixels, dtype=np.uint8).reshape(1, height, width)
    return torch.from_numpy(array), int(sample["cls"])


def _decode_tokens(sample: dict[str, Any]) -> torch.Tensor:
    array = np.load(io.BytesIO(sample["npy"]), allow_pickle=False)
    return torch.from_numpy(array.astype(np.int64))
