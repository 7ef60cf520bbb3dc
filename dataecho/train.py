"""The training loop: a small CNN on Fashion-MNIST through ``EchoingDataLoader``, slow upstream.

    dataecho demo                                  # e=1 and e=4 side by side, then a table
    dataecho demo --echo-factor 2 --target 0.85    # other settings: dataecho demo --help

or from Python::

    from dataecho.train import TrainConfig, train
    result = train(TrainConfig(echo_factor=4, read_delay=0.0002, target_accuracy=0.85))

Data flows: Fashion-MNIST in memory -> :class:`~dataecho.sources.Throttled` (each read sleeps,
emulating slow storage) -> ``EchoingDataLoader`` worker (read, echo, shuffle, augment, batch)
-> this loop (one SGD step per batch). The paper's measure of cost is *fresh examples*: those
read from upstream; echoed copies are extra steps, not extra data.

Threads: on the 2-core target machine the step runs on 1 torch thread in the main process and
the upstream in 1 loader worker on the other core. Measured with ``dataecho demo --read-delay
0.0006 --target off --budget 18000`` (2 cores shared with other jobs, so rough), wall seconds
of the e=1 / e=4 runs:

    1 thread,  1 worker    12.7 / 19.9   <- chosen
    2 threads, 1 worker    12.5 / 54.0   (step and worker fight for the cores)
    1 thread,  0 workers   14.1 / 28.7   (reads and augmentation stall the step)
    2 threads, 0 workers   18.3 / 26.0
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from dataecho import _validate
from dataecho.loader import EchoingDataLoader
from dataecho.sources.fashion_mnist import DEFAULT_DATA_DIR, FashionMNIST, check_files
from dataecho.sources.throttled import Throttled
from dataecho.workloads.augment import Augment, normalize
from dataecho.workloads.cnn import SmallCNN, evaluate


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Budgets and schedules count fresh examples, as the paper does."""

    data_dir: Path = DEFAULT_DATA_DIR
    train_examples: int | None = None  # use only the first N training examples (None: 60,000)
    budget: int = 180_000  # stop after this many fresh examples (3 epochs of 60k)
    target_accuracy: float | None = None  # ... or once a periodic evaluation reaches this
    echo_factor: float = 1.0
    where: str = "before_augment"
    shuffle_buffer: int = 0  # post-echo shuffle buffer, in examples
    batch_size: int = 128
    lr: float = 0.05
    momentum: float = 0.9
    read_delay: float = 0.0  # seconds per upstream read (Throttled); 0 = as fast as memory
    num_workers: int = 1
    threads: int = 1  # torch threads for the step
    eval_every: int = 6_000  # fresh examples between evaluations (and log lines)
    eval_examples: int = 10_000  # first N test examples for those; the final one uses all
    seed: int = 0

    def __post_init__(self) -> None:
        # The loader and Throttled check their own arguments; these are the loop's.
        for name in ("budget", "eval_every", "eval_examples", "threads"):
            _validate.positive_int(getattr(self, name), name=name)
        target = self.target_accuracy
        if target is not None and not 0 < target <= 1:
            raise ValueError(
                f"target_accuracy must be in (0, 1] or None (no target), got {target!r}"
            )


@dataclass
class TrainResult:
    """What one run cost and reached.

    ``wall_seconds`` is the training loop's wall-clock time *without* the periodic evaluations
    (a measurement, not training; ``eval_seconds`` holds them). The loader's worker keeps
    prefetching during an evaluation, at most ``prefetch_factor`` batches: a small head start
    that favours runs with more evaluations, i.e. the run without echoing.
    """

    config: TrainConfig
    test_accuracy: float  # on the whole test set, at the end
    test_loss: float
    fresh_examples: int  # read from upstream
    echoed_examples: int  # extra copies trained on
    steps: int
    wall_seconds: float  # the loop, evaluations excluded
    wait_seconds: float  # blocked on the loader
    step_seconds: float  # computing steps (forward, backward, update)
    eval_seconds: float
    reached_target: bool | None  # None when no target was set
    history: list[dict[str, float]] = field(default_factory=list)  # one row per evaluation

    @property
    def ratio(self) -> float:
        """Measured R = t_up / t_down: (wait + step time) per step over step time per step.

        Only meaningful without echoing, where each step waits for one fresh batch.
        """
        return (self.wait_seconds + self.step_seconds) / self.step_seconds


def train(config: TrainConfig, log: Callable[[str], None] = print) -> TrainResult:
    """Train :class:`SmallCNN` as ``config`` says; log one line per evaluation."""
    cfg = config
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    # Data: the training split behind a slow "storage", the test split as plain tensors.
    train_set = FashionMNIST(cfg.data_dir, "train", limit=cfg.train_examples)
    test_set = FashionMNIST(cfg.data_dir, "test")
    eval_subset = (
        normalize(test_set.images[: cfg.eval_examples]),
        test_set.labels[: cfg.eval_examples],
    )
    upstream = Throttled(train_set, delay=cfg.read_delay)
    loader = EchoingDataLoader(
        upstream,
        batch_size=cfg.batch_size,
        echo_factor=cfg.echo_factor,
        where=cfg.where,
        shuffle_buffer=cfg.shuffle_buffer,
        transform=Augment(),
        num_workers=cfg.num_workers,
        seed=cfg.seed,
        shuffle=True,
        drop_last=True,
        # This loop saves no checkpoints, so the workers need not send their state (shuffle
        # buffer included) to the main process every few batches.
        snapshot_every_n_steps=1 << 30,
    )

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)

    steps, step_seconds, eval_seconds, next_eval = 0, 0.0, 0.0, cfg.eval_every
    loss_sum, loss_count = 0.0, 0  # training loss since the last log line
    reached = None if cfg.target_accuracy is None else False
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    done = False
    try:
        while not done:  # each pass over the loader is one epoch of fresh data
            for images, labels in loader:
                t0 = time.perf_counter()
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step_seconds += time.perf_counter() - t0
                steps += 1
                loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1

                fresh = loader.stats.fresh_examples
                if fresh >= next_eval or fresh >= cfg.budget:
                    t0 = time.perf_counter()
                    acc = evaluate(model, eval_subset).accuracy
                    eval_seconds += time.perf_counter() - t0
                    next_eval = (fresh // cfg.eval_every + 1) * cfg.eval_every
                    elapsed = time.perf_counter() - start - eval_seconds
                    history.append(
                        {"fresh": fresh, "steps": steps, "accuracy": acc, "seconds": elapsed}
                    )
                    s = loader.stats
                    log(
                        f"e={cfg.echo_factor:g} step {steps:5d} | fresh {fresh:7,d} | "
                        f"echoed {s.echoed_examples:7,d} | loss {loss_sum / loss_count:.3f} | "
                        f"eval acc {acc:.4f} | waited {s.wait_seconds / elapsed:4.0%} | "
                        f"{fresh / elapsed:6,.0f} fresh/s | {elapsed:5.1f} s"
                    )
                    loss_sum, loss_count = 0.0, 0
                    if reached is not None and acc >= cfg.target_accuracy:
                        reached = True
                    done = bool(reached) or fresh >= cfg.budget
                    if done:
                        break
            if loader.stats.fresh_examples == 0:
                raise ValueError(
                    f"the loader gave no batch of {cfg.batch_size}: the training set has "
                    f"{len(train_set)} examples; use a smaller --batch-size or more examples"
                )
    finally:
        loader.close()
    wall = time.perf_counter() - start - eval_seconds

    final = evaluate(model, (test_set.images, test_set.labels))
    return TrainResult(
        config=cfg,
        test_accuracy=final.accuracy,
        test_loss=final.loss,
        fresh_examples=loader.stats.fresh_examples,
        echoed_examples=loader.stats.echoed_examples,
        steps=steps,
        wall_seconds=wall,
        wait_seconds=loader.stats.wait_seconds,
        step_seconds=step_seconds,
        eval_seconds=eval_seconds,
        reached_target=reached,
        history=history,
    )


def measure_step_seconds(batch_size: int = 128, threads: int = 1, steps: int = 15) -> float:
    """Seconds per training step of :class:`SmallCNN` on a synthetic batch (t_down), median."""
    torch.set_num_threads(threads)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
    times = []
    for _ in range(steps + 3):  # 3 warm-up steps: first calls allocate and pick kernels
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def compare(
    base: TrainConfig,
    echo_factors: tuple[float, ...] = (1.0, 4.0),
    *,
    upstream_ratio: float | None = 4.0,
    log: Callable[[str], None] = print,
) -> list[TrainResult]:
    """Train once per echo factor, same settings otherwise; the demo's side-by-side runs.

    With ``upstream_ratio`` set, the read delay is calibrated so that reading one batch takes
    that many training steps (R = t_up / t_down), whatever the machine's speed; otherwise
    ``base.read_delay`` is used as is. Runs with echo factor 1 get no shuffle buffer (there
    are no copies to spread apart).
    """
    check_files(base.data_dir)  # fail now, not after the calibration
    delay = base.read_delay
    if upstream_ratio is not None:
        t_down = measure_step_seconds(base.batch_size, base.threads)
        delay = upstream_ratio * t_down / base.batch_size
        log(
            f"calibration: one step takes {t_down * 1e3:.1f} ms on {base.threads} thread(s); "
            f"reads set to {delay * 1e6:.0f} us/example so a batch reads in "
            f"~{upstream_ratio:g} steps' time (R ~ {upstream_ratio:g})"
        )
    results = []
    for e in echo_factors:
        buffer = base.shuffle_buffer if e > 1 else 0
        cfg = dataclasses.replace(base, echo_factor=e, read_delay=delay, shuffle_buffer=buffer)
        results.append(train(cfg, log))
    return results


def format_results(results: list[TrainResult]) -> str:
    """A plain-text table of the runs, then R and the echoed runs' savings against the first."""
    head = ("echo", "where", "target", "test acc", "fresh", "echoed", "steps", "wall s", "waited")
    rows = [head]
    for r in results:
        c = r.config
        target = "-" if r.reached_target is None else ("reached" if r.reached_target else "missed")
        rows.append(
            (
                f"{c.echo_factor:g}",
                c.where if c.echo_factor > 1 else "-",
                target,
                f"{r.test_accuracy:.4f}",
                f"{r.fresh_examples:,}",
                f"{r.echoed_examples:,}",
                f"{r.steps:,}",
                f"{r.wall_seconds:.1f}",
                f"{r.wait_seconds / r.wall_seconds:.0%}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "wall s: the training loop's wall-clock time, evaluations excluded; "
        "waited: its share spent blocked on the loader"
    )
    base = results[0]
    if base.config.echo_factor == 1 and base.steps:
        t_down = base.step_seconds / base.steps
        lines.append(
            f"R = t_up/t_down ~ {base.ratio:.1f}, measured in the e=1 run: a step waited "
            f"{base.wait_seconds / base.steps * 1e3:.1f} ms for data and computed "
            f"{t_down * 1e3:.1f} ms"
        )
        for r in results[1:]:
            lines.append(
                f"e={r.config.echo_factor:g} against e=1: "
                f"{base.fresh_examples / max(r.fresh_examples, 1):.2f}x fewer fresh examples, "
                f"{base.wall_seconds / r.wall_seconds:.2f}x less wall time"
            )
    return "\n".join(lines)
