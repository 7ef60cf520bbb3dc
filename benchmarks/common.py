"""Shared pieces of the benchmarks: data, a paced upstream, the consumer's step, threads, runner.

- :class:`SyntheticImages`, :class:`PacedImages`, :func:`paced_upstream`: Fashion-MNIST-shaped
  examples behind a storage emulation whose reads *sleep*, as a network or disk read does:
  time passes, the CPU stays free for the step.
- :class:`SyntheticStep`: the consumer every benchmark feeds, a fixed amount of compute per
  batch (one SGD step of :class:`dataecho.app.workloads.cnn.SmallCNN`); not a training loop.
- :func:`pin_threads`: torch thread settings, so the step and the upstream do not fight over
  the cores.
- :func:`interleaved`: run every case once per round, A B C ... A B C ..., so slow drift of the
  machine (other jobs, thermal state) hits every case alike instead of the last ones.
- :func:`markdown_table`, :func:`machine_summary`, :func:`results_dir`: reporting.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho.app.workloads.cnn import SmallCNN
from dataecho.app.workloads.image_augment import normalize

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")  # a dataclass of measurements

REPO = Path(__file__).resolve().parents[1]
# Generated reports, CSVs and plots; each benchmark's curated figures are its RESULTS.md.
RESULTS = REPO / "bench-results"
IMAGE_SHAPE = (1, 28, 28)


class SyntheticImages(Dataset):
    """``length`` examples shaped like Fashion-MNIST: (uint8 tensor (1, 28, 28), int label).

    The pixels come from a pool of ``pool`` random images, so any length costs no memory;
    a benchmark of throughput needs the shapes and the per-read work, not real pictures.
    """

    def __init__(self, length: int, *, pool: int = 1024, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.length = int(length)
        self._images = rng.integers(0, 256, size=(pool, *IMAGE_SHAPE), dtype=np.uint8)
        self._labels = rng.integers(0, 10, size=pool).tolist()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        j = index % len(self._labels)
        # A copy: the worker sends it to another process; a view would pin the whole pool.
        return torch.from_numpy(self._images[j].copy()), self._labels[j]


class PacedImages(SyntheticImages):
    """:class:`SyntheticImages` read at ``delay`` seconds per example, by *sleeping*.

    The sleep emulates storage or network latency: time passes, the CPU stays free for the
    training step. The pace is kept on a clock, so sleep overshoots are paid back on the next
    read, and a reader that was descheduled for up to ``slack`` seconds catches up at once, as
    if the storage had kept reading ahead meanwhile. On a loaded 2-core machine that keeps the
    upstream's rate the one asked for, rather than one that depends on when the worker
    process gets a core. (``dataecho.app.sources.throttled.Throttled`` is the same with 1 ms slack.)
    """

    def __init__(self, length: int, *, delay: float, slack: float) -> None:
        super().__init__(length)
        self.delay, self.slack = float(delay), float(slack)
        self._due = -math.inf  # when the previous read was due (perf_counter clock)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        now = time.perf_counter()
        due = max(self._due, now - self.slack) + self.delay
        if due > now:
            time.sleep(due - now)
        self._due = due
        return super().__getitem__(index)


def paced_upstream(batch_seconds: float, batch_size: int, length: int) -> PacedImages:
    """An upstream that delivers one batch of examples per ``batch_seconds``, by sleeping.

    Slack: one batch period (see :class:`PacedImages`).
    """
    return PacedImages(length, delay=batch_seconds / batch_size, slack=batch_seconds)


class SyntheticStep:
    """A step of fixed cost for the benchmarks to feed: a stand-in for the user's training step.

    Each call does the same work on a batch of the same shape: SmallCNN forward, cross-entropy,
    backward and an SGD update with momentum, on the calling thread. It is not a training
    loop: no epochs, schedule or evaluation, and the benchmarks time it, they do not tune it.
    It does update ``model`` (a benchmark of accuracy per fresh example evaluates it) and
    ``optimizer`` (the memory benchmark checkpoints both).
    """

    def __init__(self, seed: int = 0, lr: float = 0.01) -> None:
        torch.manual_seed(seed)
        self.model = SmallCNN()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        """Take one step; return the seconds it took."""
        start = time.perf_counter()
        if images.dtype == torch.uint8:  # the application's workers send them shifted, flipped
            images = normalize(images)
        loss = F.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return time.perf_counter() - start

    def measure(self, batch_size: int, steps: int = 30, warmup: int = 5) -> float:
        """t_down: median seconds per step on a synthetic batch, after ``warmup`` steps."""
        x = torch.randn(batch_size, *IMAGE_SHAPE)
        y = torch.randint(0, 10, (batch_size,))
        times = [self(x, y) for _ in range(warmup + steps)]
        return statistics.median(times[warmup:])


def pin_threads(threads: int = 1) -> str:
    """Run torch ops of this process on ``threads`` threads; return a description.

    On 2 cores the step gets one (intra-op) thread and the loader worker the other core;
    DataLoader workers already run torch with 1 thread each. Inter-op threads are set to 1 too
    where torch still allows it (only before the first parallel work of the process).
    """
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already started: keep what it is
        pass
    return (
        f"torch intra-op threads {torch.get_num_threads()}, inter-op "
        f"{torch.get_num_interop_threads()} in the training process; 1 in the loader worker"
    )


def interleaved(
    cases: Sequence[K],
    rounds: int,
    run: Callable[[K], V],
    log: Callable[[str], None] | None = None,
    describe: Callable[[K], str] = str,
) -> dict[K, list[V]]:
    """``run`` every case once per round, in the order given (A B C ... A B C ...)."""
    results: dict[K, list[V]] = {case: [] for case in cases}
    for r in range(rounds):
        for i, case in enumerate(cases):
            if log is not None:
                log(f"[round {r + 1}/{rounds}, case {i + 1}/{len(cases)}] {describe(case)}")
            results[case].append(run(case))
    return results


def add_fields(a: D, b: D) -> D:
    """The field-wise sum of two measurements of one dataclass type (counts, seconds, and
    lists of per-round figures, which concatenate): windows summed over rounds."""
    return type(a)(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a)})


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None
) -> str:
    """A Markdown table; ``align`` has one "l" or "r" per column (default: first "l", rest "r")."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(row, widths, align, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = [
        "-" * w if a == "l" else "-" * (w - 1) + ":" for w, a in zip(widths, align, strict=True)
    ]
    head = [line(cells[0]), "| " + " | ".join(rule) + " |"]
    return "\n".join(head + [line(r) for r in cells[1:]])


def machine_summary() -> dict[str, str]:
    """Where a benchmark ran: CPU, cores usable, torch, Python, load average."""
    model = platform.processor() or platform.machine()
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": f"{model}, {cores} cores usable",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load": load_average(),
    }


def children_cpu_seconds() -> float:
    """CPU seconds used so far by this process's live child processes (the loader workers).

    Read from ``/proc`` (Linux); NaN where that is not available.
    """
    pids: list[str] = []
    try:
        for path in Path("/proc/self/task").glob("*/children"):
            pids += path.read_text().split()
    except OSError:
        return math.nan
    ticks = 0
    for pid in pids:
        try:  # fields after the command name: state is 0, utime 11, stime 12
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        ticks += int(stat[11]) + int(stat[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def results_dir(name: str) -> Path:
    """Where benchmark ``name`` writes its generated report by default: ``bench-results/NAME``."""
    return RESULTS / name


NO_SNAPSHOTS = 10**9  # a snapshot interval no benchmark window reaches


def ready_loader(batches: IterableDataset, workers: int) -> StatefulDataLoader:
    """A plain ``StatefulDataLoader`` over an iterable of ready batches (no batching of its own,
    no state snapshots): what torch alone costs per batch, beside a pipeline's loader."""
    with warnings.catch_warnings():
        # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on.
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(
            batches, batch_size=None, num_workers=workers, snapshot_every_n_steps=NO_SNAPSHOTS
        )


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (the loader workers inherit it), restored after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
