"""Section 3: CPU seconds the loader worker spends per fresh batch, and the main process's.

An unpaced upstream (reads cost only the copy of one image), nothing but the loader in the
loop: the worker is busy whenever its queue has room, so its CPU per fresh batch is the cost
of reading, batching and (host modes) augmenting one. Cases: no echo (host, e = 1, augmented
in the worker), host-side example echo (``before_augment``, each copy augmented in the
worker), device-side echo (augmented in the main process, on the device). Target: device
echo's worker CPU at most 1.10 x no echo's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks import common
from benchmarks.device.throughput import Plan
from benchmarks.device.workload import build_loader

CEILING = 1.10


@dataclass
class Cost:
    """CPU seconds and fresh batches of one window, or their sum over rounds."""

    worker: float = 0.0
    main: float = 0.0
    fresh_batches: float = 0.0
    per_round: list[float] = field(default_factory=list)  # worker ms per fresh batch

    def __add__(self, other: Cost) -> Cost:
        return common.add_fields(self, other)

    def per_batch(self, seconds: float) -> float:
        return 1e3 * seconds / self.fresh_batches if self.fresh_batches else float("nan")


def window(plan: Plan, data: Any, mode: str, e: int, aug: Any) -> Cost:
    """Iterate ``mode``'s loader: warm up, then ``plan.duration`` s of CPU accounting."""
    loader = build_loader(plan.spec, data, mode, e, aug)
    it = iter(loader)
    try:
        warm_until = time.perf_counter() + plan.warmup
        while time.perf_counter() < warm_until:
            next(it)
        fresh0 = loader.stats.fresh_items
        worker0, main0 = common.children_cpu_seconds(), time.process_time()
        end = time.perf_counter() + plan.duration
        while time.perf_counter() < end and next(it, None) is not None:
            pass
        worker, main = common.children_cpu_seconds() - worker0, time.process_time() - main0
        batches = (loader.stats.fresh_items - fresh0) / plan.spec.batch_size
    finally:
        loader.close()
    cost = Cost(worker, main, batches)
    cost.per_round = [cost.per_batch(worker)]
    return cost


def run(
    plan: Plan, data: Any, cases: list[tuple[str, int]], aug: Any, log: Callable[[str], None]
) -> dict[tuple[str, int], Cost]:
    """Every case once per round, interleaved; the costs summed over rounds."""
    raw = common.interleaved(
        cases,
        plan.rounds,
        lambda c: window(plan, data, c[0], c[1], aug),
        log,
        lambda c: f"cpu: {c[0]} e={c[1]}",
    )
    return {case: sum(cs[1:], cs[0]) for case, cs in raw.items()}


HEADERS = [
    "echo",
    "e",
    "worker CPU ms / fresh batch (rounds)",
    "main CPU ms / fresh batch",
    "worker x no echo",
    "ceiling",
]
LABELS = {
    "host": "none (host, augment in worker)",
    "host_example": "host, before_augment",
    "device": "device",
}


def rows(costs: dict[tuple[str, int], Cost]) -> list[list[str]]:
    """One row per case; "worker x no echo" pairs round r with no echo's round r."""
    base = costs.get(("host", 1))
    out = []
    for (mode, e), c in costs.items():
        spread = f" ({min(c.per_round):.2f}-{max(c.per_round):.2f})" if len(c.per_round) > 1 else ""
        versus, ceiling = "-", "-"
        if base is not None and (mode, e) != ("host", 1):
            paired = [a / b for a, b in zip(c.per_round, base.per_round, strict=True)]
            versus = f"{statistics.fmean(paired):.2f}"
            ceiling = f"{CEILING:.2f}" if mode == "device" else "-"
        label = LABELS.get(mode, mode) if e > 1 or mode != "host" else LABELS["host"]
        out.append(
            [
                label,
                str(e),
                f"{c.per_batch(c.worker):.2f}{spread}",
                f"{c.per_batch(c.main):.2f}",
                versus,
                ceiling,
            ]
        )
    return out
