"""What ``persistent_workers=True`` saves at each epoch's start: ``iter()`` to the first batch.

    python -m benchmarks persistent_workers           # ~1 minute; bench-results/persistent_workers/
    python -m benchmarks persistent_workers --quick   # ~15 s; prints only

What is measured: for epochs 1..N of one loader (epoch 0 starts the workers either way), the
time from ``iter(loader)`` to its first batch, with workers started anew each epoch (the
default) and with persistent ones, at 1 and 2 workers, on two datasets:

- *in memory* (:class:`benchmarks.common.SyntheticImages`): a worker's start-up is only the
  process and dataecho's pipeline, the floor of what persistence saves;
- *opened per process* (:class:`OpenedPerProcess`): each process that reads the dataset first
  loads its file, a gzip-compressed array of images, as an HDF5, LMDB or Arrow dataset opens its
  file in each worker (an open handle does not survive a fork).

Also measured: each epoch's end (its last ``next()``, which shuts workers started anew down)
and how many times the file was opened. Cases run interleaved, every case once per round, so
each pair ran side by side. Results: ``benchmarks/persistent_workers/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gzip
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks import common
from dataecho import EchoingDataLoader

NAME = "persistent_workers"
DATASETS = ("in memory", "opened per process")
HEADERS = ["dataset", "workers", "epoch 0 start ms", "start ms, anew", "start ms, persistent",
           "anew / persistent (per round)", "end ms, anew / persistent", "opens"]  # fmt: skip


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    epochs: int = 5  # measured epochs, after epoch 0
    examples: int = 1024  # per epoch
    file_images: int = 60_000  # in the opened file: Fashion-MNIST's training set, 47 MB raw
    batch_size: int = 128
    echo_factor: float = 2.0
    workers: tuple[int, ...] = (1, 2)
    seed: int = 0


@dataclass(frozen=True)
class Case:
    dataset: str
    workers: int
    persistent: bool

    @property
    def name(self) -> str:
        kept = "persistent" if self.persistent else "anew"
        return f"{self.dataset}, {self.workers} worker(s), {kept}"


@dataclass
class Epochs:
    """One loader's epochs: seconds to the first batch and of the last ``next()``, opens."""

    first: list[float] = field(default_factory=list)  # epoch 0's start
    starts: list[float] = field(default_factory=list)  # epochs 1..N
    ends: list[float] = field(default_factory=list)
    opens: list[int] = field(default_factory=list)


def write_images(path: Path, count: int, seed: int) -> Path:
    """A gzip-compressed ``.npy`` of ``count`` 28x28 uint8 images in 16 grey levels (so it
    compresses about as well as real pictures do)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 16, size=(count, *common.IMAGE_SHAPE), dtype=np.uint8) * 17
    with gzip.open(path, "wb", compresslevel=1) as f:
        np.save(f, images)
    return path


def load_images(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.load(f)


class OpenedPerProcess(Dataset):
    """``length`` examples read from ``path``, which each process loads at its first read.

    ``opens`` (a shared counter) counts the loads, in every process."""

    def __init__(self, path: Path, length: int, opens: Any) -> None:
        self.path, self.length, self.opens = path, length, opens
        self._images: np.ndarray | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._pid != os.getpid():  # a new process: the parent's file is not its own
            self._images, self._pid = load_images(self.path), os.getpid()
            with self.opens.get_lock():
                self.opens.value += 1
        image = self._images[index % len(self._images)]
        return torch.from_numpy(image.copy()), index % 10


def run_case(case: Case, s: Settings, path: Path, opens: Any) -> Epochs:
    """One loader of ``case`` over epochs 0..N."""
    if case.dataset == "in memory":
        dataset: Dataset = common.SyntheticImages(s.examples, seed=s.seed)
    else:
        dataset = OpenedPerProcess(path, s.examples, opens)
    opened = opens.value
    loader = EchoingDataLoader(dataset, batch_size=s.batch_size, echo_factor=s.echo_factor,
                               where="after_augment", shuffle=True, num_workers=case.workers, seed=s.seed,
                               persistent_workers=case.persistent)  # fmt: skip
    out = Epochs()
    with loader:
        for epoch in range(s.epochs + 1):
            start = time.perf_counter()
            it = iter(loader)
            next(it)
            (out.first if epoch == 0 else out.starts).append(time.perf_counter() - start)
            while True:
                start = time.perf_counter()
                try:
                    next(it)
                except StopIteration:
                    break
            if epoch:
                out.ends.append(time.perf_counter() - start)
    out.opens.append(opens.value - opened)
    return out


def cases(s: Settings) -> list[Case]:
    return [Case(d, w, p) for d in DATASETS for w in s.workers for p in (False, True)]


def run(s: Settings, folder: Path, log=print) -> tuple[dict[Case, list[Epochs]], float]:
    """Each case's loaders, one per round, and the seconds one load of the file takes."""
    common.pin_threads(1)
    path = write_images(folder / "images.npy.gz", s.file_images, s.seed)
    start = time.perf_counter()
    load_images(path)
    open_seconds = time.perf_counter() - start
    opens = multiprocessing.Value("i", 0)
    raw = common.interleaved(cases(s), s.rounds, lambda c: run_case(c, s, path, opens), log,
                             lambda c: c.name)  # fmt: skip
    return raw, open_seconds


def ms(seconds: list[float]) -> str:
    return f"{1e3 * statistics.median(seconds):.0f}"


def rows(raw: dict[Case, list[Epochs]]) -> list[list[str]]:
    out = []
    for case, anew in raw.items():
        if case.persistent:
            continue
        kept = raw[replace(case, persistent=True)]
        joined = {name: [sum((getattr(r, name) for r in runs), []) for runs in (anew, kept)]
                  for name in ("first", "starts", "ends", "opens")}  # fmt: skip
        ratios = [statistics.median(a.starts) / statistics.median(k.starts)
                  for a, k in zip(anew, kept, strict=True)]  # fmt: skip
        first, starts, ends, opens = (joined[n] for n in ("first", "starts", "ends", "opens"))
        out.append([
            case.dataset, str(case.workers), f"{ms(first[0])} / {ms(first[1])}",
            ms(starts[0]), ms(starts[1]),
            f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})",
            f"{ms(ends[0])} / {ms(ends[1])}",
            f"{sum(opens[0])} / {sum(opens[1])}",
        ])  # fmt: skip
    return out


def report(raw: dict[Case, list[Epochs]], s: Settings, open_seconds: float, command: str,
           load: str) -> str:  # fmt: skip
    m = common.machine_summary()
    return (
        f"Command: `{command}`.\nMachine: {m['cpu']}; torch {m['torch']}. Load before: {load}; "
        f"after: {common.load_average()}.\n{s.rounds} round(s) of {s.epochs} measured epochs "
        f"(after epoch 0) per case, interleaved; {s.examples:,} examples per epoch, batches "
        f"of {s.batch_size}, e = {s.echo_factor:g} (where='after_augment'). One load of the "
        f"opened file ({s.file_images:,} images): {1e3 * open_seconds:.0f} ms.\n\n"
        f"{common.markdown_table(HEADERS, rows(raw), align='lrrrrlrr')}\n\n"
        "start: iter() to the first batch, median over the measured epochs of every round; "
        "anew / persistent: the median (and range) over rounds of each round's ratio of "
        "medians; epoch 0 start and end: anew / persistent; opens: the file's loads over all "
        "rounds, anew / persistent.\n"
    )


def parse(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="1 round of 3 epochs, a 10,000-image file; prints only")  # fmt: skip
    p.add_argument("--rounds", type=int, help="interleaved rounds (3)")
    p.add_argument("--epochs", type=int, help="measured epochs per loader, after epoch 0 (5)")
    p.add_argument("--examples", type=int, help="examples per epoch (1024)")
    p.add_argument("--file-images", type=int, help="images in the opened file (60,000)")
    p.add_argument("--workers", type=int, nargs="+", help="worker counts (1 2)")
    p.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"write the report to --out/{NAME}.md (default: unless --quick)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=common.results_dir(NAME),
        help=f"where {NAME}.md goes (default: bench-results/{NAME})",
    )
    a = p.parse_args(argv)
    s = Settings(rounds=1, epochs=3, file_images=10_000) if a.quick else Settings()
    given = {
        "rounds": a.rounds,
        "epochs": a.epochs,
        "examples": a.examples,
        "file_images": a.file_images,
        "workers": tuple(a.workers) if a.workers else None,
    }
    s = replace(s, **{k: v for k, v in given.items() if v is not None})  # fmt: skip
    if a.write is None:
        a.write = not a.quick
    return s, a


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    s, a = parse(args)
    load = common.load_average()
    with tempfile.TemporaryDirectory() as folder:
        raw, open_seconds = run(s, Path(folder), log=lambda m: print(m, file=sys.stderr,
                                                                      flush=True))  # fmt: skip
    text = report(raw, s, open_seconds, " ".join([f"python -m benchmarks {NAME}", *args]), load)
    print(text)
    if a.write:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / f"{NAME}.md"
        path.write_text(f"# Persistent workers: epoch start\n\n{text}")
        print(f"written: {path}", file=sys.stderr)
    return 0
