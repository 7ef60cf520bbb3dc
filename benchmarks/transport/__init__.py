"""How a batch should cross from a loader worker: pickled through the pipe or shared memory.

Every batch a worker emits crosses to the training process, and with example-level echoing
every copy does, so the crossing is paid e times per fresh batch. ``dataecho.loader.transport``
pipes batches of up to ``PIPE_LIMIT`` bytes and leaves larger ones to torch's shared memory;
this benchmark measures both ways at each batch size, side by side in one run:

- ``pipe``: the worker stacks 128 rows into plain memory and sends the bytes pickled
  (``to_wire``); the training process unpickles them (one copy out of the pipe).
- ``shared memory``: the worker's ``default_collate`` stacks the rows into a new shared-memory
  segment and torch sends its file descriptor; the training process maps the segment and
  unmaps it when the batch is dropped.

Per batch: the worker process's CPU and the training process's CPU (receiving the batch and
dropping it; nothing else runs there), over a window of a stream of batches of one size. The
training process's figure decides the limit: its core runs the step.

    python -m benchmarks transport            # ~1 min; bench-results/transport/transport.md
    python -m benchmarks transport --quick    # ~10 s, one short round
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, default_collate

from benchmarks import common
from dataecho.loader.transport import PIPE_LIMIT, from_wire, to_wire

ROWS = 128  # examples per batch
WAYS = ("pipe", "shared memory")

Case = tuple[int, str]  # (batch bytes, way)


class Batches(IterableDataset):
    """A worker's endless stream of batches of ``nbytes`` (``ROWS`` uint8 rows), made and sent
    ``way``; four distinct sets of rows in turn, so that no batch repeats another's memory."""

    def __init__(self, nbytes: int, way: str) -> None:
        self.nbytes, self.way = nbytes, way

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(0)
        width = max(1, self.nbytes // ROWS)
        sets = [[torch.randint(0, 256, (width,), dtype=torch.uint8, generator=g)
                 for _ in range(ROWS)] for _ in range(4)]  # fmt: skip
        i = 0
        while True:
            rows = sets[i % 4]
            i += 1
            if self.way == "pipe":
                yield to_wire(torch.stack(rows), limit=math.inf)
            else:  # in a worker, default_collate stacks into a new shared-memory segment
                yield default_collate(rows)


def window(case: Case, warmup: float, duration: float) -> tuple[float, float]:
    """CPU ms per batch of one case: (the worker's, the training process's)."""
    loader = common.ready_loader(Batches(*case), workers=1)
    it = iter(loader)
    try:
        warm_until = time.perf_counter() + warmup
        while time.perf_counter() < warm_until:
            from_wire(next(it))
        worker0, main0, batches = common.children_cpu_seconds(), time.process_time(), 0
        end = time.perf_counter() + duration
        while time.perf_counter() < end:
            from_wire(next(it))  # received, then dropped: a shared segment is unmapped here
            batches += 1
        worker, main = common.children_cpu_seconds() - worker0, time.process_time() - main0
    finally:
        del it  # shuts the worker down
    return 1e3 * worker / batches, 1e3 * main / batches


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks transport", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512, 1024, 2048, 8192],
                   help="batch sizes in KiB (64 256 512 1024 2048 8192)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="one round of short windows")
    p.add_argument("--rounds", type=int, help="interleaved rounds (3; 1 with --quick)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round (2)")
    p.add_argument("--out", default=str(common.results_dir("transport")))
    a = p.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.duration = a.duration or (0.4 if a.quick else 2.0)
    return a


def rows(costs: dict[Case, list[tuple[float, float]]], sizes: list[int]) -> list[list[str]]:
    """One row per size: each way's medians and the training process's pipe / shared ratio."""
    out = []
    for kib in sizes:
        worker, main = {}, {}
        for way in WAYS:
            worker[way] = statistics.median(w for w, _ in costs[(kib * 1024, way)])
            main[way] = statistics.median(m for _, m in costs[(kib * 1024, way)])
        ratio = main["pipe"] / main["shared memory"]
        mark = " (piped)" if kib * 1024 <= PIPE_LIMIT else ""
        out.append([f"{kib}{mark}", f"{worker['pipe']:.2f}", f"{main['pipe']:.2f}",
                    f"{worker['shared memory']:.2f}", f"{main['shared memory']:.2f}",
                    f"{ratio:.2f}"])  # fmt: skip
    return out


HEADERS = ["batch KiB", "pipe: worker ms", "pipe: training ms", "shared: worker ms",
           "shared: training ms", "training, pipe / shared"]  # fmt: skip


def main(argv: list[str]) -> int:
    a = parse(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = common.pin_threads(1)
    load = common.load_average()
    cases: list[Case] = [(kib * 1024, way) for kib in a.sizes for way in WAYS]
    warmup = min(0.5, a.duration)
    costs = common.interleaved(cases, a.rounds, lambda c: window(c, warmup, a.duration), log,
                               lambda c: f"{c[0] // 1024} KiB, {c[1]}")  # fmt: skip
    m = common.machine_summary()
    text = (
        f"# Batch transport: pipe or shared memory\n\nCommand: `python -m benchmarks transport "
        f"{' '.join(argv)}`.\nMachine: {m['cpu']}; torch {m['torch']}; {threads}. Load before: "
        f"{load}; after: {common.load_average()}.\nOne loader worker, batches of {ROWS} uint8 "
        f"rows; {a.rounds} round(s) of {a.duration:g} s per case, interleaved. CPU ms per batch "
        f"(medians over rounds); dataecho pipes batches up to {PIPE_LIMIT // 1024} KiB.\n\n"
        + common.markdown_table(HEADERS, rows(costs, a.sizes))
        + "\n"
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "transport.md").write_text(text)
    print(text)
    return 0
