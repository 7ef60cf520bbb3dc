"""The default post-echo shuffle buffer: how far copies spread, what the buffer holds, and
how long the first batch waits, per buffer size.

    python -m benchmarks spread            # ~1 min; writes bench-results/spread/
    python -m benchmarks spread --quick    # a few seconds

Example echoing (``where="before_augment"``, the default, with a per-copy transform, and
``"after_augment"``) at e = 2 and 4 over Fashion-MNIST-shaped examples (uint8
1x28x28), batch 128, one epoch of 12,800 examples, with post-echo shuffle buffers of 0 to 40
batches' worth. For each: the examples two of whose copies share a batch, the batches that
hold two copies of one example, how many batches apart an example's first and last copies are
(mean), the examples the buffer holds (the memory it costs per worker: before augmentation
each original once, for all its copies; after it each copy) and the first batch's wait over an upstream paced at one fresh
batch per 50 ms (the input-bound case echoing is for: the buffer fills before the first batch).
The fresh examples to a target per buffer size are ``benchmarks/augmentation``'s
(``--shuffle-batches N``), a training run each.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import common
from dataecho import EchoingDataLoader, IdenticalCopiesWarning

SIZES = (0, 1, 2, 5, 10, 20, 40)  # batches' worth
FACTORS = (2, 4)
# (where, whether each copy is augmented by a transform: before_augment with one)
KINDS = (("before_augment", True), ("after_augment", False))
HEADERS = ("where", "copies", "e", "buffer, batches", "examples with two copies in a batch",
           "batches with two copies", "copies span, batches", "examples held",
           "first batch, ms")  # fmt: skip


@dataclass(frozen=True)
class Row:
    where: str
    augmented: bool
    factor: int
    batches: int
    together: float  # share of examples with two copies in one batch
    doubled: float  # share of batches holding two copies of one example
    span: float  # mean batches between an example's first and last copies
    held: int  # originals the buffer holds once full
    first_ms: float  # the first batch's wait over a paced upstream


class Numbered(common.SyntheticImages):
    """:class:`~benchmarks.common.SyntheticImages` labelled with their index: a batch's ids."""

    def __getitem__(self, index: int):
        return super().__getitem__(index)[0], index


def identity(example):
    return example


def make(where: str, augmented: bool, factor: int, buffer: int, dataset,
         batch_size: int) -> EchoingDataLoader:  # fmt: skip
    return EchoingDataLoader(dataset, batch_size=batch_size, echo_factor=factor, where=where,
                             shuffle=True, seed=0, shuffle_buffer=buffer * batch_size,
                             transform=identity if augmented else None)  # fmt: skip


def spread(where: str, augmented: bool, factor: int, buffer: int, examples: int,
           batch_size: int) -> Row:  # fmt: skip
    """One epoch's batches, read as fast as they come, and the first batch over a pace."""
    ids = [b[1].tolist() for b in make(where, augmented, factor, buffer, Numbered(examples),
                                       batch_size)]  # fmt: skip
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, batch in enumerate(ids):
        for i in batch:
            first.setdefault(i, k)
            last[i] = k
    spans = [last[i] - first[i] for i in first]
    doubled = sum(len(set(b)) < len(b) for b in ids) / len(ids)
    together = len({i for b in ids for i, n in collections.Counter(b).items() if n > 1})
    paced = common.paced_upstream(0.05, batch_size, examples)
    start = time.perf_counter()
    next(iter(make(where, augmented, factor, buffer, paced, batch_size)))
    wait = time.perf_counter() - start
    # Before augmentation the pool keeps buffer + batch - 1 entries (see
    # dataecho.loader.example_batches), each original stored once for its copies' entries;
    # after it the shuffle stage keeps each copy as its own example.
    size = buffer * batch_size
    if size <= 1:
        held = 0
    elif where == "before_augment":
        held = -(-(size + batch_size - 1) // factor)
    else:
        held = size
    return Row(where, augmented, factor, buffer, together / len(first), doubled,
               float(np.mean(spans)), held, wait * 1e3)  # fmt: skip


def table(rows: list[Row]) -> str:
    cells = [[r.where, "augmented" if r.augmented else "identical", r.factor, r.batches,
              f"{r.together:.1%}", f"{r.doubled:.1%}", f"{r.span:.1f}", f"{r.held:,}",
              f"{r.first_ms:.0f}"] for r in rows]  # fmt: skip
    return common.markdown_table(HEADERS, cells)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks spread",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="fewer examples and sizes")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", type=Path, default=common.results_dir("spread"))
    a = p.parse_args(argv)
    if a.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {a.batch_size}")
    threads = common.pin_threads(1)
    examples = 100 * a.batch_size if not a.quick else 10 * a.batch_size
    sizes = SIZES if not a.quick else (0, 2, 10)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    # Identical copies before augmentation are one of the cases measured, not a mistake.
    warnings.filterwarnings("ignore", category=IdenticalCopiesWarning)
    rows = [spread(where, augmented, e, k, examples, a.batch_size)
            for where, augmented in KINDS for e in FACTORS for k in sizes]  # fmt: skip
    m = common.machine_summary()
    command = " ".join(["python -m benchmarks spread", *argv])
    text = (
        f"# Copies apart: the post-echo shuffle buffer\n\nCommand: `{command}`.\n"
        f"Machine: {m['cpu']}; torch {m['torch']}; {threads}. {examples:,} examples, batch "
        f"{a.batch_size}; the first batch over an upstream of one fresh batch per 50 ms.\n\n"
        f"{table(rows)}\n"
    )
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "spread.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
