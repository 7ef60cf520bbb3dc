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

import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import torch
from torch.utils.data import Dataset

from dataecho import _validate
from dataecho.app import workloads
from dataecho.app.config import TrainConfig
from dataecho.app.sources import shards
from dataecho.app.sources.fashion_mnist import DataNotFoundError
from dataecho.app.sources.retrying import UpstreamError
from dataecho.app.sources.throttled import Throttled

DATASETS = tuple(w.dataset for w in workloads.REGISTRY.values())  # dataecho prepare --dataset


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
    workload = workloads.get(cfg.workload)
    splits = workload.eval_splits(cfg)
    if cfg.upstream is None:
        train, identity, what = _in_memory(cfg, workload)
        delay = f"{cfg.read_delay * 1e6:.0f} us" if cfg.read_delay else "no"
        description = f"in memory: {what}, {delay} delay per read (emulated slow storage)"
        train = Throttled(train, delay=cfg.read_delay)
    else:
        train, identity, description = _shards(cfg, workload)
    t = workload.transforms(cfg, sharded=cfg.upstream is not None)
    return Data(train, t.transform, splits.eval_set, splits.final_set, identity, description,
                splits.vocab_size, t.batch_transform, t.device_transform)  # fmt: skip


def _in_memory(cfg: TrainConfig, workload: workloads.Workload) -> tuple[Dataset, str, str]:
    train, name, digest = workload.in_memory(cfg)
    identity = f"memory:{cfg.workload}:{len(train)}:{digest}"
    return train, identity, f"{name} ({len(train):,} examples)"


def _shards(cfg: TrainConfig, workload: workloads.Workload) -> tuple[shards.ShardDataset, str, str]:
    spec = cfg.upstream
    try:
        manifest = shards.load_manifest(
            spec, retry_seconds=cfg.retry_seconds, timeout_s=cfg.http_timeout,
            deadline_s=cfg.http_deadline,
            allow_cross_host_redirects=cfg.allow_cross_host_redirects,
        )  # fmt: skip
    except UpstreamError:  # already names the URL, the retrying and the fix
        raise
    except FileNotFoundError as err:
        raise DataNotFoundError(
            f"{err}. Write them with:  dataecho prepare --out DIR"
            + ("" if workload.dataset == DATASETS[0] else f" --dataset {workload.dataset}")
        ) from None
    except (urllib.error.URLError, OSError) as err:
        raise UpstreamError(
            f"cannot read {spec}/{shards.MANIFEST}: {getattr(err, 'reason', err)}; is the "
            "server running and serving the folder dataecho prepare wrote?"
        ) from None
    if manifest["kind"] != workload.shard_kind:
        raise UpstreamError(
            f"{spec} holds {manifest['kind']} shards, but workload={cfg.workload!r} trains on "
            f"{workload.shard_kind} shards; prepare them with dataecho prepare --dataset "
            f"{workload.dataset}"
        )
    data = shards.ShardDataset(
        spec, manifest, shuffle_shards=True, seed=cfg.seed,
        on_bad_record=cfg.on_bad_record, retry_seconds=cfg.retry_seconds,
        timeout_s=cfg.http_timeout, deadline_s=cfg.http_deadline,
        allow_cross_host_redirects=cfg.allow_cross_host_redirects,
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
    workload = next(w for w in workloads.REGISTRY.values() if w.dataset == dataset)
    manifest = workload.write_shards(
        out, data_dir or workload.default_data_dir(), examples=examples,
        examples_per_shard=examples_per_shard, seq_len=seq_len,
    )  # fmt: skip
    return manifest, _mtime(out / shards.MANIFEST) != stamp


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
