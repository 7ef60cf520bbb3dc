"""Section 2: steps/s of host-side vs device-side echoing at e = 1, 2, 4, 8 on a paced upstream.

The upstream delivers one fresh batch per R x t_down (t_down: the median step, measured
first), so without echoing the step waits (R - 1) / R of the time. *host*: ``where="batch"``,
the worker augments each fresh batch and every echoed copy goes to the device again; *device*:
``where="device"``, the fresh batch goes to the device once and each copy is augmented there.
The reference is host at e = 1 (no echo), and the target is 0.95 x min(e, R) of its steps/s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks import common
from benchmarks.device.workload import DeviceStep, GpuTimed, LoaderSpec, build_loader, to_device

TARGET = 0.95


@dataclass
class Window:
    """One measured window of one case, or their sum over rounds."""

    wall: float = 0.0
    steps: int = 0
    fresh: int = 0  # fresh examples the loader counted in the window
    out: int = 0  # examples it emitted, copies included
    in_next: float = 0.0  # seconds in next(loader) and the host-to-device call
    wait: float = 0.0  # of those, the loader's own count of waiting for data (stats)
    compute: float = 0.0  # seconds in the step
    gpu_aug: float = 0.0  # on CUDA, the device transform's GPU seconds (CUDA events)
    per_round: list[float] = field(default_factory=list)  # steps/s of each round

    def __add__(self, other: Window) -> Window:
        return common.add_fields(self, other)

    @property
    def rate(self) -> float:
        return self.steps / self.wall if self.wall else 0.0


@dataclass(frozen=True)
class Plan:
    """How long to measure, and the loaders' shared settings."""

    spec: LoaderSpec
    warmup: float
    duration: float
    rounds: int


def window(plan: Plan, data: Any, mode: str, e: float, aug: Any, step: DeviceStep) -> Window:
    """Train ``step`` on ``mode``'s loader at ``e``: warm up, then count ``plan.duration`` s."""
    device = plan.spec.device
    timed = GpuTimed(aug) if device.type == "cuda" and mode.startswith("device") else None
    loader = build_loader(plan.spec, data, mode, e, aug if timed is None else timed)
    it = iter(loader)
    try:
        warm_until, steps = time.perf_counter() + plan.warmup, 0
        while time.perf_counter() < warm_until or steps < 2:
            step(*to_device(next(it), device))
            steps += 1
        w = Window()
        if timed is not None:
            timed.take()  # the warm-up's
        stats = loader.stats
        fresh0, out0, wait0 = stats.fresh_items, stats.items_out, stats.wait_seconds
        start = time.perf_counter()
        while (now := time.perf_counter()) < start + plan.duration:
            try:
                batch = to_device(next(it), device)
            except StopIteration:  # the stream ran out: the window ends here
                break
            w.in_next += time.perf_counter() - now
            w.compute += step(*batch)
            w.steps += 1
        w.wall = time.perf_counter() - start
        if timed is not None:
            w.gpu_aug = timed.take()
        w.fresh, w.out = stats.fresh_items - fresh0, stats.items_out - out0
        w.wait = stats.wait_seconds - wait0
        w.per_round = [w.rate]
    finally:
        loader.close()
    return w


def run(
    plan: Plan,
    data: Any,
    cases: list[tuple[str, int]],
    aug: Any,
    step: DeviceStep,
    log: Callable[[str], None],
) -> dict[tuple[str, int], Window]:
    """Every (mode, e) case once per round, interleaved; the windows summed over rounds."""
    raw = common.interleaved(
        cases,
        plan.rounds,
        lambda c: window(plan, data, c[0], c[1], aug, step),
        log,
        lambda c: f"{c[0]} e={c[1]}",
    )
    return {case: sum(ws[1:], ws[0]) for case, ws in raw.items()}


HEADERS = [
    "echo",
    "e",
    "steps/s (rounds)",
    "step ms",
    "aug ms",
    "wait %",
    "fresh ex/s",
    "realized e",
    "x no echo",
    "target",
    "x / target",
]
LEGEND = (
    "step ms: the step's mean time in the run; aug ms: time per step in next(loader) that was "
    "not waiting for data (the device transform, on the training thread), or on CUDA for the "
    "device modes the device transform's GPU time (CUDA events), which the step ms, waiting "
    "for its stream, also holds; wait %: the "
    "loader's count of waiting for data (stats.wait_seconds), of the wall time; x no echo: "
    "steps/s over host e = 1's, paired by round; target: 0.95 x min(e, R)."
)


def rows(windows: dict[tuple[str, int], Window], ratio: float) -> list[list[str]]:
    """One row per case, in the order run."""
    base = windows.get(("host", 1))
    out = []
    for (mode, e), w in windows.items():
        spread = f" ({min(w.per_round):.1f}-{max(w.per_round):.1f})" if len(w.per_round) > 1 else ""
        target = TARGET * min(e, ratio)
        speedup, versus = "-", "-"
        if base is not None and base.rate:
            paired = [a / b for a, b in zip(w.per_round, base.per_round, strict=True)]
            value = statistics.fmean(paired)
            speedup, versus = f"{value:.2f}", f"{value / target:.2f}"
        steps = max(1, w.steps)
        out.append(
            [
                mode,
                str(e),
                f"{w.rate:.1f}{spread}",
                f"{1e3 * w.compute / steps:.2f}",
                f"{1e3 * (w.gpu_aug or max(0.0, w.in_next - w.wait)) / steps:.2f}",
                f"{100 * w.wait / w.wall:.1f}",
                f"{w.fresh / w.wall:,.0f}",
                f"{w.out / w.fresh:.2f}" if w.fresh else "-",
                speedup,
                f"{target:.2f}",
                versus,
            ]
        )
    return out
