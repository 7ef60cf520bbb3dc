"""The benchmark's data: real Fashion-MNIST images, written by each library's own writer.

Every library gets the same ``n`` examples, ``{"id": i, "image": uint8 (28, 28), "label": y}``
(the first ``n`` training images, in order), ``per_shard`` examples to a shard (mosaic's
shards are cut by bytes, so theirs hold about that many):

=============  =================================  ==================================
library        files                              an example's bytes
=============  =================================  ==================================
mosaic         MDS shards (``MDSWriter``)         the raw image and two ints
litdata        chunks (litdata's ``BinaryWriter``)  the same, with litdata's headers
webdataset     tar shards (``TarWriter``)         ``image.npy`` and ``cls`` members
hf             JSON Lines files                   the image in base64, two ints
=============  =================================  ==================================

:class:`Shards` says which file holds which example and how big each file is, so a resume's
bytes can be set against the files the rest of the epoch needs.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dataecho.app.sources.fashion_mnist import load_split


@dataclass(frozen=True)
class Shards:
    """One library's written files: their names in order, examples and bytes per file."""

    folder: Path
    names: tuple[str, ...]
    examples: tuple[int, ...]  # per file, in id order
    sizes: dict[str, int]  # every file the folder holds (index files too), in bytes

    @property
    def count(self) -> int:
        return sum(self.examples)

    @property
    def shard_bytes(self) -> int:
        """The bytes of the shard files (index files left out)."""
        return sum(self.sizes[n] for n in self.names)

    @property
    def bytes_per_example(self) -> float:
        return self.shard_bytes / self.count

    def shard_of(self, example_id: int) -> str:
        """The file that holds example ``example_id``."""
        ends = list(itertools.accumulate(self.examples))
        return self.names[bisect.bisect_right(ends, int(example_id))]


def examples(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` Fashion-MNIST training images (uint8 (n, 28, 28)) and labels."""
    images, labels = load_split(split="train")
    if n > len(labels):
        raise ValueError(f"--examples {n}: Fashion-MNIST's training split has {len(labels)}")
    return images[:n], labels[:n]


def _sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}


def write_mds(folder: Path, images: np.ndarray, labels: np.ndarray, per_shard: int) -> Shards:
    from benchmarks.streaming.mosaic_import import import_streaming

    streaming = import_streaming()
    columns = {"id": "int", "image": "ndarray:uint8:28,28", "label": "int"}
    # An MDS sample here: 784 image bytes, two 8-byte ints and a 4-byte offset; and a header.
    limit = per_shard * (784 + 16 + 4) + 1024
    with streaming.MDSWriter(out=str(folder), columns=columns, size_limit=limit) as writer:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            writer.write({"id": i, "image": image, "label": int(label)})
    index = json.loads((folder / "index.json").read_text())["shards"]
    names = tuple(s["raw_data"]["basename"] for s in index)
    return Shards(folder, names, tuple(s["samples"] for s in index), _sizes(folder))


def write_litdata(folder: Path, images: np.ndarray, labels: np.ndarray, per_shard: int) -> Shards:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(folder), chunk_size=per_shard)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        writer[i] = {"id": i, "image": image, "label": int(label)}
    writer.done()
    writer.merge()
    index = json.loads((folder / "index.json").read_text())["chunks"]
    names = tuple(c["filename"] for c in index)
    return Shards(folder, names, tuple(c["chunk_size"] for c in index), _sizes(folder))


def write_tars(folder: Path, images: np.ndarray, labels: np.ndarray, per_shard: int) -> Shards:
    import webdataset as wds

    names, counts = [], []
    for s, start in enumerate(range(0, len(labels), per_shard)):
        name = f"shard-{s:04d}.tar"
        ids = range(start, min(start + per_shard, len(labels)))
        # A whole-second mtime: the same bytes every run, and no PAX header per member.
        with wds.TarWriter(str(folder / name), mtime=0) as writer:
            for i in ids:
                writer.write({"__key__": f"{i:06d}", "image.npy": images[i],
                              "cls": int(labels[i])})  # fmt: skip
        names.append(name)
        counts.append(len(ids))
    return Shards(folder, tuple(names), tuple(counts), _sizes(folder))


def write_jsonl(folder: Path, images: np.ndarray, labels: np.ndarray, per_shard: int) -> Shards:
    names, counts = [], []
    for s, start in enumerate(range(0, len(labels), per_shard)):
        name = f"part-{s:04d}.jsonl"
        ids = range(start, min(start + per_shard, len(labels)))
        lines = (
            json.dumps(
                {
                    "id": i,
                    "image": base64.b64encode(images[i].tobytes()).decode(),
                    "label": int(labels[i]),
                }
            )  # fmt: skip
            for i in ids
        )
        (folder / name).write_text("\n".join(lines) + "\n")
        names.append(name)
        counts.append(len(ids))
    return Shards(folder, tuple(names), tuple(counts), _sizes(folder))


def decode_json_example(example: dict[str, Any]) -> dict[str, Any]:
    """A JSON Lines example as the others are: the image back to uint8 (28, 28)."""
    image = np.frombuffer(base64.b64decode(example["image"]), np.uint8).reshape(28, 28)
    return {"id": example["id"], "image": image, "label": example["label"]}


WRITERS: dict[str, Callable[[Path, np.ndarray, np.ndarray, int], Shards]] = {
    "mosaic": write_mds,
    "litdata": write_litdata,
    "webdataset": write_tars,
    "hf": write_jsonl,
}


def write(library: str, folder: Path, n: int, per_shard: int) -> Shards:
    """``n`` examples in ``library``'s format, into the new folder ``folder``."""
    folder.mkdir(parents=True)
    images, labels = examples(n)
    return WRITERS[library](folder, images, labels, per_shard)
