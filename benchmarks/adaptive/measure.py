"""The adaptive benchmark's cases: build each loader, warm it up, measure one window.

A case is (R, :class:`Config`). :func:`run_case` builds an ``EchoingDataLoader`` over a paced
upstream that delivers one batch per ``R * t_down`` (:func:`benchmarks.common.paced_upstream`)
in one worker, which also runs ``Augment`` per example, and trains
:class:`benchmarks.common.SyntheticStep` on it for a fixed wall time after a warm-up, counting
steps, fresh examples (``loader.stats``), time in ``next()``, the step's wall and CPU time and
the worker's CPU. :func:`run` measures ``t_down`` first and runs every case interleaved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from benchmarks import common
from dataecho import EchoingDataLoader
from dataecho.app.workloads.image_augment import Augment


@dataclass(frozen=True)
class Config:
    """One loader configuration; ``echo_factor=None`` reads the upstream alone (no step)."""

    echo_factor: float | str | None
    where: str = "batch"

    @property
    def name(self) -> str:
        if self.echo_factor is None:
            return "upstream alone"
        if self.echo_factor == 1:
            return "no echo"
        e = self.echo_factor if self.echo_factor == "auto" else f"e={self.echo_factor:g}"
        return f"{e} ({self.where})"


@dataclass(frozen=True)
class Settings:
    ratios: tuple[float, ...] = (1, 2, 4, 8)
    factors: tuple[float, ...] = (2, 4, 8)
    where: str = "batch"  # insertion point of the fixed factors
    auto_wheres: tuple[str, ...] = ("batch", "before_augment")
    max_echo_factor: float = 16
    batch_size: int = 128
    duration: float = 4.0  # measured seconds per case and round
    warmup: float = 1.0  # seconds (and >= 2 fresh batches) before measuring
    rounds: int = 3
    threads: int = 1
    seed: int = 0

    def configs(self) -> list[Config]:
        fixed = [Config(float(e), self.where) for e in self.factors]
        auto = [Config("auto", w) for w in self.auto_wheres]
        return [Config(None), Config(1.0), *fixed, *auto]


@dataclass
class Window:
    """Counts over one measured window (or the sum of several)."""

    wall: float = 0.0
    steps: int = 0
    fresh: int = 0  # examples read from upstream
    out: int = 0  # examples handed to the step, echoes included
    wait: float = 0.0  # seconds the step loop spent in next(loader)
    compute: float = 0.0  # seconds in the training step
    compute_cpu: float = 0.0  # CPU seconds of the step's thread in the step (< compute: preempted)
    worker_cpu: float = 0.0  # CPU seconds of the loader worker process
    # Fresh examples between the first and the last fresh arrival seen in the window, and the
    # seconds between them: a rate free of the +-1 batch a fixed window cuts off (at R=8 a 4 s
    # window holds ~20 fresh batches, so counting alone would be off by up to 5%).
    arrivals: int = 0
    arrival_seconds: float = 0.0
    per_round: list[float] = field(default_factory=list)  # steps/s of each round

    def __add__(self, other: Window) -> Window:
        return common.add_fields(self, other)


def run_case(
    ratio: float, config: Config, t_down: float, s: Settings, step: common.SyntheticStep
) -> Window:
    """Run one case: build the loader, warm up, then measure ``s.duration`` seconds."""
    batch_seconds = ratio * t_down
    # Long enough that no case reaches the end of the epoch (which would restart the worker).
    length = int(s.batch_size * (s.warmup + s.duration + 30) / batch_seconds) + 8 * s.batch_size
    loader = EchoingDataLoader(
        common.paced_upstream(batch_seconds, s.batch_size, length),
        batch_size=s.batch_size,
        echo_factor=1.0 if config.echo_factor is None else config.echo_factor,
        max_echo_factor=s.max_echo_factor,
        where=config.where,
        transform=Augment(),
        num_workers=1,
        seed=s.seed,
        drop_last=True,
    )
    train = config.echo_factor is not None
    try:
        it = iter(loader)
        warm_until = time.perf_counter() + s.warmup
        # Warm-up: the worker starts, and auto's reuse buffer holds a fresh item.
        while time.perf_counter() < warm_until or loader.stats.fresh_examples < 2 * s.batch_size:
            images, labels = next(it)
            if train:
                step(images, labels)
        fresh0, out0 = loader.stats.fresh_examples, loader.stats.examples_out
        w = Window()
        worker0 = common.children_cpu_seconds()
        start = time.perf_counter()
        seen, first, last = fresh0, None, None  # (time, fresh count) at the first/last arrival
        while (now := time.perf_counter()) < start + s.duration:
            images, labels = next(it)
            got = time.perf_counter()
            w.wait += got - now
            if (fresh := loader.stats.fresh_examples) != seen:
                seen, last = fresh, (got, fresh)
                first = first or last
            if train:
                cpu = time.thread_time()
                w.compute += step(images, labels)
                w.compute_cpu += time.thread_time() - cpu
            w.steps += 1
        w.wall = time.perf_counter() - start
        w.worker_cpu = common.children_cpu_seconds() - worker0
        w.fresh = loader.stats.fresh_examples - fresh0
        w.out = loader.stats.examples_out - out0
        w.per_round = [w.steps / w.wall]
        if first is not None and last[0] > first[0]:
            w.arrivals, w.arrival_seconds = last[1] - first[1], last[0] - first[0]
    finally:
        loader.close()
    return w


def run(s: Settings, log=print) -> dict:
    """Calibrate t_down, run every case interleaved; the raw results and the context."""
    threads = common.pin_threads(s.threads)
    load_before = common.load_average()
    step = common.SyntheticStep(seed=s.seed)
    t_down = step.measure(s.batch_size)
    log(f"t_down = {t_down * 1e3:.2f} ms per step ({threads}); load {load_before}")
    cases = [(r, c) for r in s.ratios for c in s.configs()]

    def one(case: tuple[float, Config]) -> Window:
        w = run_case(case[0], case[1], t_down, s, step)
        log(f"    {w.steps / w.wall:7.2f} steps/s, {w.fresh / w.wall:8.0f} fresh/s")
        return w

    raw = common.interleaved(
        cases, s.rounds, one, log, describe=lambda c: f"R={c[0]:g} {c[1].name}"
    )
    windows = {case: sum(ws[1:], ws[0]) for case, ws in raw.items()}
    return {
        "settings": s,
        "t_down": t_down,
        "threads": threads,
        "machine": common.machine_summary() | {"load_before": load_before},
        "windows": windows,
    }
