"""Writing WebDataset shards once, with a manifest (:mod:`dataecho.app.sources.shards`).

The manifest lists every shard with its example count, size and sha256, plus a fingerprint of
the source data and the layout, so a second write of the same data is skipped; shards are
written as new files (a reader still streaming an old one is unharmed) and the manifest last,
by an atomic rename.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds
from PIL import Image

from dataecho import _validate
from dataecho.app.sources.shards import FORMAT, MANIFEST, SAMPLES, TOKEN_DTYPES, VERSION
from dataecho.errors import DataechoValueError


def write_image_shards(
    images: np.ndarray,
    labels: Iterable[int],
    out_dir: str | Path,
    *,
    examples_per_shard: int = 1000,
    prefix: str = "images",
) -> dict[str, Any]:
    """Write uint8 ``images`` (N, 28, 28) and their labels as shards; return the manifest."""
    images = np.asarray(images)
    labels = np.asarray(labels, dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataechoValueError(
            f"images must be uint8 of shape (N, 28, 28), got {images.dtype} {images.shape}; "
            "pass the arrays from dataecho.app.sources.fashion_mnist.load_split"
        )
    if labels.shape != (len(images),):
        raise DataechoValueError(
            f"need one label per image: {len(images)} images, labels {labels.shape}"
        )
    samples = (
        {"__key__": f"{i:08d}", "png": _png(img), "cls": int(lab)}
        for i, (img, lab) in enumerate(zip(images, labels, strict=True))
    )
    digest = [images.tobytes(), labels.tobytes()]
    return _write("image", samples, len(images), digest, out_dir, examples_per_shard, prefix)


def write_text_shards(
    token_chunks: Iterable[np.ndarray],
    out_dir: str | Path,
    *,
    examples_per_shard: int = 1000,
    prefix: str = "tokens",
) -> dict[str, Any]:
    """Write 1-D integer token arrays (one per sample, dtype kept) as shards; return manifest."""
    chunks = [np.asarray(c) for c in token_chunks]
    for i, c in enumerate(chunks):
        if c.ndim != 1 or c.dtype.name not in TOKEN_DTYPES:
            raise DataechoValueError(
                f"token chunk {i} must be a 1-D array of dtype {'/'.join(TOKEN_DTYPES)}, "
                f"got {c.dtype} {c.shape}"
            )
    samples = ({"__key__": f"{i:08d}", "npy": _npy(c)} for i, c in enumerate(chunks))
    digest = [f"{c.dtype.name}:{len(c)}".encode() + c.tobytes() for c in chunks]
    return _write("tokens", samples, len(chunks), digest, out_dir, examples_per_shard, prefix)


def _png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")  # uint8 2-D: mode "L", lossless
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _up_to_date(out: Path, fingerprint: str) -> dict[str, Any] | None:
    """The existing manifest if it describes this data and every shard is intact, else None."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("fingerprint") != fingerprint or manifest.get("version") != VERSION:
        return None
    for s in manifest["shards"]:
        path = out / s["name"]
        if not path.is_file() or path.stat().st_size != s["bytes"] or _sha256(path) != s["sha256"]:
            return None
    return manifest


def _write(
    kind: str,
    samples: Iterable[dict[str, Any]],
    total: int,
    digest: list[bytes],
    out_dir: str | Path,
    examples_per_shard: int,
    prefix: str,
) -> dict[str, Any]:
    """Write ``samples`` unless the manifest in ``out_dir`` already describes this data."""
    per_shard = _validate.positive_int(examples_per_shard, name="examples_per_shard")
    if total < 1:
        raise DataechoValueError(f"nothing to write: got {total} examples; pass at least one")
    if not prefix or "/" in prefix or "%" in prefix:
        raise DataechoValueError(
            f"prefix must be a plain file-name stem like 'images', got {prefix!r}"
        )
    h = hashlib.sha256(json.dumps([FORMAT, VERSION, kind, total, per_shard, prefix]).encode())
    for part in digest:
        h.update(part)
    fingerprint = h.hexdigest()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (manifest := _up_to_date(out, fingerprint)) is not None:
        return manifest
    stale = _listed_shards(out)
    (out / MANIFEST).unlink(missing_ok=True)  # no valid manifest while shards are half-written

    def opener(name: str):  # a new file, so a reader still streaming the old one is unharmed
        Path(name).unlink(missing_ok=True)
        return open(name, "wb")  # noqa: SIM115 (the TarWriter closes it)

    pattern = str(out / f"{prefix}-%06d.tar")
    # mtime=0: the same data gives the same bytes, so hashes are stable across rewrites.
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0, opener=opener, mtime=0) as w:
        for sample in samples:
            w.write(sample)
    n_shards = -(-total // per_shard)
    shards = []
    for i in range(n_shards):
        path = Path(pattern % i)
        count = min(per_shard, total - i * per_shard)
        size = path.stat().st_size
        shards.append({"name": path.name, "count": count, "bytes": size, "sha256": _sha256(path)})
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind, "sample": SAMPLES[kind],
                "fingerprint": fingerprint, "examples_per_shard": per_shard, "total": total,
                "shards": shards}  # fmt: skip
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / MANIFEST)  # atomic: a reader sees the old manifest or the new one
    for name in stale - {s["name"] for s in shards}:  # left over from a larger earlier write
        (out / name).unlink(missing_ok=True)
    return manifest


def _listed_shards(out: Path) -> set[str]:
    try:
        return {s["name"] for s in json.loads((out / MANIFEST).read_text())["shards"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
