"""The data of a training run: the upstream it trains from, and the split it evaluates on.

    data = build_data(TrainConfig(upstream="http://127.0.0.1:8080"))
    loader = EchoingDataLoader(data.train, transform=data.transform, ...)

Upstream specs (``TrainConfig.upstream``):

- ``None``: the training split in memory, each read slowed by ``Throttled(read_delay)``
  (emulated slow storage; ``read_delay=0`` is memory speed). Map-style: a resume is exact.
- ``http://HOST:PORT[/PATH]``: WebDataset shards served over HTTP (e.g. by
  :class:`~dataecho.app.sources.nginx.NginxServer`), ``manifest.json`` at that address.
- a folder: the same shards on local disk.
- ``emulated:/DIR?bandwidth=B&latency=L``: the local folder read through the storage emulator
  (:mod:`dataecho.app.sources.emulated`); labelled EMULATED in every description.

Shards are read by :class:`~dataecho.app.sources.shards.ShardDataset`: download and PNG decoding run
where the loader reads (its DataLoader workers), and so does the augmentation, which is the
loader's ``transform`` so that the echo stage can sit before or after it. Evaluation always
reads the test split (cnn) or the validation split (char-lm) from ``data_dir`` into memory: it
measures the model and is not part of the upstream under study.

``dataecho prepare`` (:func:`prepare`) writes the shards once; a second call with the same data
finds them intact and writes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from dataecho import _validate, augment
from dataecho.app.config import TrainConfig
from dataecho.app.sources import shards
from dataecho.app.sources.fashion_mnist import DataNotFoundError, FashionMNIST, load_split
from dataecho.app.sources.retrying import UpstreamError
from dataecho.app.sources.throttled import Throttled
from dataecho.app.workloads.image_augment import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    Augment,
    normalize,
)

DATASETS = ("fashion-mnist", "austen")
_KIND = {"cnn": "image", "char-lm": "tokens"}  # the shard kind each workload trains on


@dataclass
class Data:
    """What one run trains and evaluates on.

    Attributes:
        train: the training examples (map-style in memory, or an iterable ``ShardDataset``).
        transform: per-example transform the loader applies (cnn augmentation when echoing
            after augmentation: the copies must be identical).
        batch_transform: per-batch transform (cnn augmentation otherwise: each example of a
            batch drawn on its own in one call, much cheaper than a call per example).
        device_transform: with ``where="device"``, the cnn augmentation of every copy on the
            device (the worker then sends the batch as read, uint8).
        eval_set: ``(inputs, targets)`` for the periodic evaluations: ``eval_examples`` of them.
        final_set: the whole test (cnn) or validation (char-lm) split, for the last evaluation.
        identity: names the training data exactly; a checkpoint resumes only on the same.
        description: one line for logs (what, where, how fast; EMULATED when emulated).
        vocab_size: char-lm: ids per character, ``<unk>`` included.
    """

    train: Any
    transform: Any
    eval_set: tuple[torch.Tensor, torch.Tensor]
    final_set: tuple[torch.Tensor, torch.Tensor]
    identity: str
    description: str
    vocab_size: int | None = None
    batch_transform: Any = None
    device_transform: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Pick the shard order of ``epoch`` (shards are read in a new seeded order each epoch)."""
        if isinstance(self.train, shards.ShardDataset):
            self.train.set_epoch(epoch)


def build_data(cfg: TrainConfig) -> Data:
    """The :class:`Data` of ``cfg``: errors name what is missing and how to get it."""
    novels = None
    if cfg.workload == "cnn":
        test = FashionMNIST(cfg.data_dir, "test")
        n = min(cfg.eval_examples, len(test))
        eval_set = (normalize(test.images[:n]), test.labels[:n])  # normalised once, not per eval
        final_set, vocab = (test.images, test.labels), None
        side = min(test.images.shape[-2:])
        if cfg.augment_pad >= side:  # checked here, not at the first image in a worker
            raise ValueError(
                f"augment_pad must be below the image side ({side} pixels), got "
                f"{cfg.augment_pad}; 2-4 is usual for 28x28 images"
            )
        transform = Augment(pad=cfg.augment_pad)
    else:
        from dataecho.app.sources.austen import AustenChars

        novels = _novels(cfg.data_dir)
        val = AustenChars("val", cfg.seq_len, package_dir=cfg.data_dir, novels=novels)
        # Evenly spaced chunks: the split is the end of each novel in turn, so the first N
        # would all come from the first novel.
        pick = torch.linspace(0, len(val) - 1, min(cfg.eval_examples, len(val))).long()
        eval_set = (val.chunks[pick, :-1], val.chunks[pick, 1:])
        final_set, transform, vocab = (val.chunks[:, :-1], val.chunks[:, 1:]), None, len(val.vocab)

    if cfg.upstream is None:
        train, identity, what = _in_memory(cfg, novels)
        delay = f"{cfg.read_delay * 1e6:.0f} us" if cfg.read_delay else "no"
        description = f"in memory: {what}, {delay} delay per read (emulated slow storage)"
        train = Throttled(train, delay=cfg.read_delay)
    else:
        train, identity, description = _shards(cfg)
        if cfg.workload == "char-lm":
            transform = SplitChunk(cfg.seq_len)
    batch_transform = device_transform = None
    if cfg.workload == "cnn" and cfg.where == "device":
        transform, device_transform = None, device_augment(cfg.augment_pad)
    elif cfg.workload == "cnn" and cfg.where != "after_augment":
        transform, batch_transform = None, transform
    return Data(train, transform, eval_set, final_set, identity, description, vocab,
                batch_transform, device_transform)  # fmt: skip


def device_augment(pad: int) -> augment.Compose:
    """The cnn augmentation as device ops: the same shift, flip and normalisation as
    :class:`~dataecho.app.workloads.image_augment.Augment`, drawn per copy on the training device."""
    return augment.Compose(
        [augment.ShiftFlip(pad), augment.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD)]
    )


def _in_memory(cfg: TrainConfig, novels: Any) -> tuple[Dataset, str, str]:
    if cfg.workload == "cnn":
        train = FashionMNIST(cfg.data_dir, "train", limit=cfg.train_examples)
        name, digest = "Fashion-MNIST train", _digest(train.images, train.labels)
    else:
        from dataecho.app.sources.austen import AustenChars

        train = AustenChars("train", cfg.seq_len, package_dir=cfg.data_dir, novels=novels)
        n = min(cfg.train_examples or len(train), len(train))
        digest = _digest(train.chunks[:n])
        if n < len(train):
            train = Subset(train, range(n))
        name = f"Austen train chunks of {cfg.seq_len} characters"
    identity = f"memory:{cfg.workload}:{len(train)}:{digest}"
    return train, identity, f"{name} ({len(train):,} examples)"


def _digest(*tensors: torch.Tensor) -> str:
    """A short content hash of the tensors' bytes: same data, same checkpoint."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()[:16]


def _shards(cfg: TrainConfig) -> tuple[shards.ShardDataset, str, str]:
    spec = cfg.upstream
    try:
        manifest = shards.load_manifest(
            spec, retry_seconds=cfg.retry_seconds, timeout_s=cfg.http_timeout
        )
    except UpstreamError:  # already names the URL, the retrying and the fix
        raise
    except FileNotFoundError as err:
        raise DataNotFoundError(
            f"{err}. Write them with:  dataecho prepare --out DIR"
            + ("" if cfg.workload == "cnn" else " --dataset austen")
        ) from None
    except (urllib.error.URLError, OSError) as err:
        raise UpstreamError(
            f"cannot read {spec}/{shards.MANIFEST}: {getattr(err, 'reason', err)}; is the "
            "server running and serving the folder dataecho prepare wrote?"
        ) from None
    if manifest["kind"] != _KIND[cfg.workload]:
        raise UpstreamError(
            f"{spec} holds {manifest['kind']} shards, but workload={cfg.workload!r} trains on "
            f"{_KIND[cfg.workload]} shards; prepare them with dataecho prepare --dataset "
            f"{'fashion-mnist' if cfg.workload == 'cnn' else 'austen'}"
        )
    data = shards.ShardDataset(
        spec, manifest, shuffle_shards=True, seed=cfg.seed,
        on_bad_record=cfg.on_bad_record, retry_seconds=cfg.retry_seconds,
        timeout_s=cfg.http_timeout,
    )  # fmt: skip
    size = sum(s["bytes"] for s in manifest["shards"]) / 1e6
    what = f"{len(data.urls)} shards, {data.num_examples:,} examples, {size:.1f} MB"
    if spec.startswith("emulated:"):
        parts = urlsplit(spec)
        query = {k: float(v[0]) for k, v in parse_qs(parts.query).items()}
        where = (
            f"EMULATED storage (local files, no network): {unquote(parts.path)}, "
            f"{query.get('bandwidth', float('inf')) / 1e6:.3g} MB/s per stream, "
            f"{query.get('latency', 0.0) * 1e3:.3g} ms latency"
        )
    elif spec.startswith(("http://", "https://")):
        where = f"shards over HTTP: {spec}"
    else:
        where = f"shards on local disk: {spec}"
    return data, f"shards:{manifest['fingerprint']}", f"{where} ({what})"


class SplitChunk:
    """A token chunk of ``seq_len + 1`` ids -> ``(input, target)``, the target shifted by one."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __call__(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if chunk.shape != (self.seq_len + 1,):
            raise ValueError(
                f"a shard holds a chunk of shape {tuple(chunk.shape)}, but seq_len={self.seq_len} "
                f"needs {self.seq_len + 1} ids; prepare with --seq-len {len(chunk) - 1} or train "
                f"with seq_len={len(chunk) - 1}"
            )
        return chunk[:-1].clone(), chunk[1:].clone()


def prepare(
    out_dir: str | Path,
    dataset: str = "fashion-mnist",
    *,
    data_dir: str | Path | None = None,
    examples: int | None = None,
    examples_per_shard: int = 1000,
    seq_len: int = 64,
) -> tuple[dict[str, Any], bool]:
    """Write the training split of ``dataset`` as shards + manifest; ``(manifest, written)``.

    ``written`` is False when the folder already held these exact shards (nothing rewritten).
    ``examples``: the first N only (default: all). Austen is written as chunks of
    ``seq_len + 1`` character ids (uint8), the training split of :class:`AustenChars`.
    """
    _validate.one_of(dataset, DATASETS, name="dataset")
    if examples is not None:
        examples = _validate.positive_int(examples, name="examples", hint="or None for all")
    out = Path(out_dir)
    stamp = _mtime(out / shards.MANIFEST)
    if dataset == "fashion-mnist":
        from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR

        images, labels = load_split(data_dir or DEFAULT_DATA_DIR, "train")
        images, labels = images[:examples], labels[:examples]
        manifest = shards.write_image_shards(
            images, labels, out, examples_per_shard=examples_per_shard, prefix="fashion-mnist"
        )
    else:
        from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR, AustenChars

        package = data_dir or DEFAULT_PACKAGE_DIR
        train = AustenChars("train", seq_len, package_dir=package, novels=_novels(package))
        if len(train.vocab) > 256:
            raise ValueError(f"{len(train.vocab)} character ids do not fit in uint8")
        chunks = train.chunks[:examples].numpy().astype(np.uint8)
        manifest = shards.write_text_shards(
            list(chunks), out, examples_per_shard=examples_per_shard, prefix="austen"
        )
    return manifest, _mtime(out / shards.MANIFEST) != stamp


@functools.lru_cache(maxsize=2)
def _novels(package_dir: Path) -> dict[str, list[str]]:
    """The six novels, read once per process (parsing the R database is slow)."""
    from dataecho.app.sources.austen import load_novels  # imports rdata: only for char-lm

    return load_novels(package_dir)


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
