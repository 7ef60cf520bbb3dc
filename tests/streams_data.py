"""The streaming libraries' tests' data and servers: 96 examples ``{"id": i, "x": [i] * 4}``
written in 8 shards (or chunks) by each library's own writer, served over a real network (moto's
S3 server for mosaic and litdata, nginx for webdataset and Hugging Face streams) by the tests
that use them."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

N, SHARDS = 96, 8
PER_SHARD = N // SHARDS
BUCKET = "data"


def write_mds(folder: Path) -> Path:
    from mosaic_streaming import import_streaming

    streaming = import_streaming()
    out = folder / "mds"
    columns = {"id": "int", "x": "ndarray:float32:4"}
    # size_limit: a shard every 12 samples of these columns (45 bytes each in MDS).
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=PER_SHARD * 45) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(4, i, np.float32)})
    return out


def write_litdata(folder: Path) -> Path:
    from litdata.streaming.writer import BinaryWriter

    out = folder / "litdata"
    writer = BinaryWriter(str(out), chunk_size=PER_SHARD)
    for i in range(N):
        writer[i] = {"id": i, "x": np.full(4, i, np.float32)}
    writer.done()
    writer.merge()
    return out


def write_tars(folder: Path) -> Path:
    import webdataset as wds

    out = folder / "tars"
    out.mkdir()
    for s in range(SHARDS):
        with wds.TarWriter(str(out / f"shard-{s:02d}.tar")) as writer:
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                writer.write({"__key__": f"{i:04d}", "id.txt": str(i),
                              "x.npy": np.full(4, i, np.float32)})  # fmt: skip
    return out


def write_jsonl(folder: Path, files: int = 4) -> Path:
    out = folder / "jsonl"
    out.mkdir()
    per = N // files
    for s in range(files):
        lines = (json.dumps({"id": i, "x": [float(i)] * 4}) for i in range(s * per, (s + 1) * per))
        (out / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return out


def upload(s3: Any, folder: Path, prefix: str) -> str:
    """Every file of ``folder`` to ``s3://data/<prefix>/``; returns that URL."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    if BUCKET not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
    return f"s3://{BUCKET}/{prefix}"


def ids(batch: Any) -> list[int]:
    """The example ids of a batch: a dict's "id", or a tuple's first field."""
    field = batch["id"] if isinstance(batch, dict) else batch[0]
    if isinstance(field, torch.Tensor):
        return [int(i) for i in field.reshape(-1)]
    return [int(i) for i in field]


def epoch_ids(loader: Iterable[Any]) -> list[int]:
    return [i for batch in loader for i in ids(batch)]


def copies_per_example(got: list[int]) -> collections.Counter[int]:
    return collections.Counter(got)


# What every library's tests check, each given a way to build a fresh loader.

CASES = [  # every insertion point, every kind of factor, with and without workers
    ("before_augment", 2.5, 2), ("after_augment", 2, 0), ("batch", 2.5, 0),
    ("device", 2, 2), ("before_augment", "auto", 0), ("batch", "auto", 2),
]  # fmt: skip


def jitter(sample: Any) -> Any:
    """A per-copy augmentation of a dict or ``(id, x)`` sample: each copy its own draw."""
    noise = torch.rand(4).numpy()
    if isinstance(sample, dict):
        return {**sample, "x": np.asarray(sample["x"], np.float32) + noise}
    return (sample[0], np.asarray(sample[1], np.float32) + noise)


def echoing(dataset: Any, where: str, factor: Any, workers: int, **kwargs: Any) -> Any:
    """The loader the tests run: batches of 8, ``jitter`` on each copy before augmentation."""
    from dataecho import EchoingDataLoader

    transform = jitter if where == "before_augment" else None
    return EchoingDataLoader(dataset, batch_size=8, num_workers=workers, seed=0,
                             echo_factor=factor, where=where, transform=transform,
                             echo_device="cpu" if where == "device" else None, **kwargs)  # fmt: skip


def check_epochs(loader: Any, factor: Any, epochs: int = 2) -> list[list[int]]:
    """Each epoch delivers every example, and no other, as often as the factor says: a fixed
    factor's whole copies and its fixed number of extra ones (96 x 2.5 = 240 copies), "auto"
    between 1 and its most; the fresh examples are counted."""
    orders = []
    for e in range(epochs):
        got = epoch_ids(loader)
        counts = collections.Counter(got)
        assert set(counts) == set(range(N)), f"epoch {e}: every example, and no other"
        if factor == "auto":
            assert all(1 <= c <= 4 for c in counts.values()), counts
        else:
            whole = int(factor)
            assert all(c in (whole, whole + 1) for c in counts.values()), counts
            assert len(got) == round(factor * N), f"epoch {e}: {len(got)} copies"
        assert loader.stats.fresh_examples == N * (e + 1)
        orders.append(got)
    return orders


def check_resume(make: Any, *, positions: list[int], batches: int) -> None:
    """Exact resume from states taken mid-epoch, at the last batch and between epochs (through
    ``torch.save`` / ``torch.load(weights_only=True)``), in this epoch and the next."""
    from conftest import run_test_save_load_state

    recorded = run_test_save_load_state(
        make,
        positions=positions,
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    assert [len(e) for e in recorded] == [batches] * 3


def check_rest_reads(
    make: Any,
    gets: Any,
    shard_of: Any,
    *,
    workers: int,
    head: int,
    once: bool = True,
    per_worker: int = 1,
) -> None:
    """Resumed after ``head`` batches, a fresh loader (an empty cache; ``make`` builds one
    without a shuffle buffer, whose examples the state holds) gives the rest of the epoch
    exactly and fetches from the server (``gets()``: the shard names it answered so far)
    each shard the rest reads, once, and besides them at most the shard each worker was in
    (a worker that had just read a shard's last sample was still in it): none of the shards
    read to their end before, which a replay would fetch again. ``shard_of(i)`` names example
    ``i``'s shard; ``once=False`` for a library that reads a file in several requests;
    ``per_worker``: the shards a worker may read again (more where the library's own resume
    starts further back)."""
    from conftest import assert_same_stream, torch_roundtrip

    loader, start = make(), len(gets())
    it = iter(loader)
    first = [ids(next(it)) for _ in range(head)]
    state = torch_roundtrip(loader.state_dict())
    before = set(gets()[start:])
    rest = [ids(b) for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    start = len(gets())  # what the resumed loader reads, not what building a dataset reads
    assert_same_stream([ids(b) for b in resumed], rest, "the rest after a resume")
    fetched = gets()[start:]
    assert not once or len(fetched) == len(set(fetched)), f"each shard once: {fetched}"
    of_head = {shard_of(i) for batch in first for i in batch}
    of_rest = {shard_of(i) for batch in rest for i in batch}
    again = set(fetched) - of_rest
    assert of_rest <= set(fetched) and again <= of_head, (fetched, of_rest)
    assert len(again | (of_head & of_rest)) <= workers * per_worker, (
        f"at most {per_worker} shard(s) each worker was in: {fetched}"
    )
    done = of_head - of_rest - again
    assert done and done <= before, (
        "shards read to their end before: a replay fetches them",
        fetched,
        of_head,
        of_rest,
    )


def check_users_loader(make: Any, *, batches: int, head: int = 9) -> None:
    """Echo over the user's own loader at e = 2: every example twice, counted once, and one
    ``state_dict()`` (theirs and the echo's) resumes the rest exactly."""
    from conftest import assert_same_stream, torch_roundtrip

    loader = make()
    assert collections.Counter(epoch_ids(loader)) == {i: 2 for i in range(N)}
    assert loader.stats.fresh_examples == N and len(loader) == batches
    it = iter(loader)
    first = [next(it) for _ in range(head)]
    state = torch_roundtrip(loader.state_dict())
    rest = [ids(b) for b in it]
    assert len(first) + len(rest) == batches
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_stream([ids(b) for b in resumed], rest, "the rest after a resume")


def children(exclude: tuple[str, ...] = ("moto", "nginx", "resource_tracker")) -> list[str]:
    """The command lines of this process's children, less its servers and the standard
    library's resource tracker (started once, for the process's life, by shared memory)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat, cmdline = (proc / "stat").read_text(), (proc / "cmdline").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and not any(word in cmdline for word in exclude):
            found.append(cmdline.replace("\0", " "))
    return found


def nginx_gets(server: Any) -> list[str]:
    """The file names nginx has sent so far (a body, 200 or 206: no HEAD), in order."""
    log = server.prefix / "access.log"
    lines = [line.split(" ", 2) for line in (log.read_text().splitlines() if log.is_file() else [])]
    return [uri.rsplit("/", 1)[1] for status, sent, uri in lines
            if status in ("200", "206") and int(sent) > 0]  # fmt: skip


def skip_without(*modules: str) -> None:
    """Skip the calling test module unless each of ``modules`` is installed (``make compat``
    installs none of the streaming libraries; ``make test`` installs them all)."""
    import importlib.util

    import pytest

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}", allow_module_level=True)
