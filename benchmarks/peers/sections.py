"""The six sections of the peers benchmark, and :func:`run`, which runs those asked for.

Every section trains (or iterates) each loader of :mod:`benchmarks.peers.loaders` on the same
upstream and :class:`benchmarks.common.SyntheticStep`; sections 4-6 live in their own modules
(:mod:`~benchmarks.peers.memory`, :mod:`~benchmarks.peers.snapshots`,
:mod:`~benchmarks.peers.target`). The package docstring says what each section measures.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks import common
from benchmarks.peers import memory, snapshots, target
from benchmarks.peers.loaders import Case, build
from benchmarks.peers.settings import Settings
from dataecho.app.sources.fashion_mnist import FashionMNIST
from dataecho.app.sources.throttled import Throttled
from dataecho.app.workloads.cnn import evaluate
from dataecho.app.workloads.image_augment import Augment
from dataecho.stages import echo


@dataclass
class Window:
    """One measured window of one case (or the sum over rounds)."""

    wall: float = 0.0
    steps: int = 0
    fresh: int = 0  # distinct examples first seen by the step in the window
    wait: float = 0.0  # seconds in next(loader)
    compute: float = 0.0  # seconds in the training step
    per_round: list[float] = field(default_factory=list)  # steps/s of each round

    def __add__(self, other: Window) -> Window:
        return common.add_fields(self, other)


@dataclass
class Context:
    """What every section shares: settings, data, augmentation, step and t_down."""

    s: Settings
    train: Any
    test: Any
    augment: Augment
    step: common.SyntheticStep
    t_down: float


def train_window(ctx: Context, case: Case, data: Any) -> Window:
    """Train on ``case``'s loader: warm up, then count ``ctx.s.duration`` seconds."""
    s = ctx.s
    run = build(case, data, ctx.augment, batch_size=s.batch_size, seed=s.seed, shuffle=True,
                max_echo_factor=s.max_echo_factor)  # fmt: skip
    seen: set[int] = set()  # example indices the step has received: fresh = first sightings
    try:
        warm_until, steps = time.perf_counter() + s.warmup, 0
        while time.perf_counter() < warm_until or steps < 2:
            images, labels, index = next(run)
            seen.update(index.tolist())
            ctx.step(images, labels)
            steps += 1
        w, fresh0 = Window(), len(seen)
        start = time.perf_counter()
        while (now := time.perf_counter()) < start + s.duration:
            try:
                images, labels, index = next(run)
            except StopIteration:  # the epoch ran out: the window ends here
                break
            w.wait += time.perf_counter() - now
            seen.update(index.tolist())
            w.compute += ctx.step(images, labels)
            w.steps += 1
        w.wall = time.perf_counter() - start
        w.fresh = len(seen) - fresh0
        w.per_round = [w.steps / w.wall]
    finally:
        run.close()
    return w


def overhead(ctx: Context, log) -> dict[Case, Window]:
    """Section 1: e = 1 on the unthrottled upstream, interleaved rounds."""
    cases = [Case("dataloader"), Case("dataecho", 1, "before_augment"),
             Case("monai", 1), Case("adjacent", 1)]  # fmt: skip
    rounds = ctx.s.overhead_rounds
    raw = common.interleaved(
        cases, rounds, lambda c: train_window(ctx, c, ctx.train), log, lambda c: c.name
    )
    return {c: sum(ws[1:], ws[0]) for c, ws in raw.items()}


def raw_throughput(s: Settings) -> list[dict]:
    """Section 1b: items/s out of each echo stage alone, on items already in memory."""
    from monai.data.thread_buffer import buffer_iterator

    g = torch.Generator().manual_seed(s.seed)
    examples = [(torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8, generator=g), i % 10)
                for i in range(4096)]  # fmt: skip
    batches = [(torch.randint(0, 256, (s.batch_size, 1, 28, 28), dtype=torch.uint8, generator=g),
                torch.arange(s.batch_size)) for _ in range(32)]  # fmt: skip
    e = s.raw_factor

    def adjacent(items):
        for item in items:
            for _ in range(e):
                yield item

    stages = [
        ("example", "dataecho Echo", True, lambda: echo(examples, e, seed=0, copy=True)),
        ("example", "dataecho Echo", False, lambda: echo(examples, e, seed=0, copy=False)),
        ("example", "adjacent repeats (generator)", False, lambda: adjacent(examples)),
        ("batch", "dataecho Echo", True, lambda: echo(batches, e, seed=0, copy=True)),
        ("batch", "dataecho Echo", False, lambda: echo(batches, e, seed=0, copy=False)),
        (
            "batch",
            "MONAI buffer_iterator",
            False,
            lambda: buffer_iterator(batches, buffer_size=1, repeats=e),
        ),  # fmt: skip
    ]
    rows = []
    for level, name, copy, make in stages:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < s.raw_seconds:
            for _ in make():
                count += 1
        seconds = time.perf_counter() - start
        per = s.batch_size if level == "batch" else 1
        rows.append({"level": level, "stage": name, "copy": copy, "items/s": count / seconds,
                     "examples/s": count * per / seconds, "us/item": 1e6 * seconds / count})  # fmt: skip
    return rows


def input_bound(ctx: Context, log) -> dict[tuple[float, Case], Window]:
    """Section 2: every (R, loader) case, interleaved over rounds."""
    s = ctx.s
    cases = [(r, c) for r in s.ratios for c in s.input_bound_cases(r)]

    def one(case: tuple[float, Case]) -> Window:
        delay = case[0] * ctx.t_down / s.batch_size
        w = train_window(ctx, case[1], Throttled(ctx.train, delay=delay))
        log(f"    {w.steps / w.wall:7.2f} steps/s, {w.fresh / w.wall:7.0f} fresh/s")
        return w

    raw = common.interleaved(cases, s.rounds, one, log, lambda c: f"R={c[0]:g} {c[1].name}")
    return {case: sum(ws[1:], ws[0]) for case, ws in raw.items()}


def quality(ctx: Context, log) -> list[dict]:
    """Section 3: train once through ``quality_budget`` fresh examples; test accuracy."""
    s = ctx.s
    rows = []
    for case in s.quality_cases():
        accs, steps = [], 0
        for seed in s.quality_seeds:
            log(f"quality: {case.name}, seed {seed}")
            order = torch.randperm(len(ctx.train), generator=torch.Generator().manual_seed(seed))
            subset = torch.utils.data.Subset(ctx.train, order[: s.quality_budget].tolist())
            step = common.SyntheticStep(seed=seed)
            run = build(case, subset, ctx.augment, batch_size=s.batch_size, seed=seed,
                        shuffle=True, max_echo_factor=s.max_echo_factor)  # fmt: skip
            seen, steps = set(), 0
            try:
                for images, labels, index in run:
                    seen.update(index.tolist())
                    step(images, labels)
                    steps += 1
            finally:
                run.close()
            accs.append(evaluate(step.model, (ctx.test.images, ctx.test.labels)).accuracy)
        rows.append({"case": case, "fresh": len(seen), "steps": steps, "accs": accs})
    return rows


def run(s: Settings, log=print) -> dict:
    """Every section; the raw results and the context."""
    threads = common.pin_threads(s.threads)
    load_before = common.load_average()
    train = FashionMNIST(split="train", limit=s.train_limit)
    test = FashionMNIST(split="test", limit=s.test_limit)
    step = common.SyntheticStep(seed=s.seed)
    t_down = step.measure(s.batch_size)
    log(f"t_down = {t_down * 1e3:.2f} ms per step ({threads}); load {load_before}")
    ctx = Context(s, train, test, Augment(), step, t_down)
    result: dict[str, Any] = {"settings": s, "t_down": t_down, "threads": threads}
    sections = {
        "overhead": lambda: overhead(ctx, log),
        "raw": lambda: raw_throughput(s),
        "input_bound": lambda: input_bound(ctx, log),
        "quality": lambda: quality(ctx, log),
        "memory": lambda: memory.measure_all(s.memory_cases(), train, ctx.augment, s, log),
        "snapshots": lambda: snapshots.measure_all(train, ctx.augment, s, log),
        "target": lambda: target.run_all(ctx, log),
    }
    result["seconds"], result["failed"] = {}, {}
    for name, section in sections.items():
        if name not in s.sections:
            continue
        log(f"section {name}")
        start = time.perf_counter()
        try:
            result[name] = section()
        except Exception as err:  # noqa: BLE001  (the other sections still count; exit 1)
            log(f"section {name} FAILED: {type(err).__name__}: {err}")
            result["failed"][name] = f"{type(err).__name__}: {err}"
        result["seconds"][name] = time.perf_counter() - start
    result["machine"] = common.machine_summary() | {
        "load_before": load_before,
        "load_after": common.load_average(),
        "threads_alive": threading.active_count(),
    }
    return result
