"""What a run keeps and reports: its counters (checkpointed), one history row and log line
per evaluation, and the :class:`TrainResult` at the end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from dataecho.app import workloads
from dataecho.app.config import TrainConfig
from dataecho.app.training.recipe import metric_key
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader
from dataecho.stages import EchoStats


@dataclass
class TrainResult:
    """What one run cost and reached. ``history`` has one row per evaluation with the keys
    fresh, steps, seconds (wall since the start), accuracy (cnn) or val_loss (char-lm),
    train_loss, realized_factor and stall (the last three over the interval since the row
    before), and skipped_records (bad shard records skipped so far, with
    ``on_bad_record="skip"``)."""

    config: TrainConfig
    test_accuracy: float | None  # cnn: whole test set, at the end (None for char-lm)
    test_loss: float  # cross-entropy on the whole test (cnn) / validation (char-lm) split
    fresh_examples: int  # read from upstream and trained on (counted at the first copy)
    echoed_examples: int  # extra copies trained on
    steps: int
    wall_seconds: float  # evaluations and checkpoints included (module docstring)
    wait_seconds: float  # blocked on the loader
    step_seconds: float  # forward, backward, update; the loader's work on this thread
    eval_seconds: float
    checkpoint_seconds: float
    realized_factor: float  # examples trained on / fresh examples
    reached_target: bool | None  # None when no target was set
    fresh_to_target: int | None = None  # at the first evaluation that reached it
    steps_to_target: int | None = None
    seconds_to_target: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # training loss of every step
    skipped_records: int = 0  # bad shard records skipped (on_bad_record="skip"), all workers
    # Read but not yet trained on at the end: the examples waiting in the device's pool, or
    # in the workers' echo stages and shuffle buffers.
    waiting_examples: int = 0
    # CPU seconds of this process's loader workers over the run (counted as they end); None
    # where the platform does not count child processes.
    worker_cpu_seconds: float | None = None

    @property
    def read_examples(self) -> int:
        """Examples read from upstream: the fresh ones and those still waiting."""
        return self.fresh_examples + self.waiting_examples

    @property
    def worker_ms_per_fresh_batch(self) -> float | None:
        """The loader workers' CPU per fresh batch read, in milliseconds."""
        batches = self.fresh_examples / self.config.batch_size
        if self.worker_cpu_seconds is None or batches <= 0:
            return None
        return 1e3 * self.worker_cpu_seconds / batches

    @property
    def stall_fraction(self) -> float:
        """Share of the wall time the loop waited for data."""
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def val_loss(self) -> float | None:
        """char-lm: final validation cross-entropy, nats per character."""
        return self.test_loss if metric_key(self.config) == "val_loss" else None


@dataclass
class EvalMark:
    """The loader's counts and the wall time at the last evaluation: the next history row
    reports its realized factor and stall over the interval since."""

    fresh: int = 0
    examples_out: int = 0
    wait_seconds: float = 0.0  # this process's loader
    wall_seconds: float = 0.0

    @classmethod
    def now(cls, stats: EchoStats, wall_seconds: float) -> EvalMark:
        return cls(stats.fresh_examples, stats.examples_out, stats.wait_seconds, wall_seconds)


@dataclass
class TargetHit:
    """Where the run stood at the first evaluation that reached its target."""

    fresh: int
    steps: int
    seconds: float  # when the run learned the result


@dataclass
class RunCounters:
    """The loop's counters, single-process and data-parallel alike: all of them go into a
    checkpoint, so a resume continues them. ``fresh`` and ``global_steps`` are the run's, all
    ranks together, as of the last exchange (every step in a single process), so every rank
    takes the same decisions from them.

    The training loop owns them: a helper that changes them returns changed counters
    (``dataclasses.replace``) for the loop to keep, and leaves the ones it was given alone."""

    steps: int = 0  # this process's optimizer steps
    fresh: int = 0  # fresh examples read from upstream, all ranks
    global_steps: int = 0  # steps of all ranks
    epoch: int = 0  # this process's loader epochs
    next_eval: int = 0  # fresh examples at the next evaluation
    next_checkpoint: int = 0  # steps (mean per rank) at the next periodic checkpoint
    seconds: float = 0.0  # wall time up to the last checkpoint (a resume starts from it)
    step_seconds: float = 0.0
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    loss_sum: float = 0.0  # training loss since the last evaluation
    loss_count: int = 0
    mark: EvalMark = field(default_factory=EvalMark)
    stop_vote: bool = False  # data parallel: the target was reached, voted at the next exchange
    to_target: TargetHit | None = None
    done: bool = False

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> RunCounters:
        """The counters ``dataclasses.asdict`` wrote into a checkpoint."""
        hit = saved["to_target"]
        return cls(**{**saved, "mark": EvalMark(**saved["mark"]),
                      "to_target": None if hit is None else TargetHit(**hit)})  # fmt: skip


def line_logger(cfg: TrainConfig, log: Callable[[str], None]) -> Callable[[str], None]:
    if not cfg.progress:
        return log

    def say(line: str) -> None:
        with tqdm.external_write_mode():  # the line goes above the live bar, not through it
            log(line)

    return say


def history_row(
    cfg: TrainConfig,
    run: RunCounters,
    loader: EchoingDataLoader,
    metric: float,
    screened: int,
    seconds: float,
    extra: dict[str, float] | None = None,
) -> tuple[dict[str, float], RunCounters]:
    """One evaluation's row (:class:`TrainResult`'s ``history``); ``extra``: more keys (a
    data-parallel run's communication counters). Returns it with the counters whose interval
    starts again at it (the mark moved to now, the training loss sum cleared)."""
    s = loader.stats
    mark = run.mark
    row = {
        "fresh": run.fresh,
        "steps": run.steps,
        "seconds": seconds,
        metric_key(cfg): metric,
        "train_loss": run.loss_sum / max(run.loss_count, 1),
        "realized_factor": (s.examples_out - mark.examples_out)
        / max(s.fresh_examples - mark.fresh, 1),
        "stall": (s.wait_seconds - mark.wait_seconds) / max(seconds - mark.wall_seconds, 1e-9),
        # Cumulative: R = time per step over compute per step, evaluations excluded, between
        # any two rows (what the demo's calibration measures on the real loop).
        "step_seconds": run.step_seconds,
        "eval_seconds": run.eval_seconds,
        "screened": screened,  # 1: only the cheap screen ran (see periodic_evaluation)
        "skipped_records": skipped_records(loader),  # this process's (rank 0's)
        **(extra or {}),
    }
    return row, replace(run, mark=EvalMark.now(s, seconds), loss_sum=0.0, loss_count=0)


def log_line(cfg: TrainConfig, row: dict[str, float]) -> str:
    workload = workloads.get(cfg.workload)
    metric = workload.describe_metric(row[workload.metric])
    skipped = row.get("skipped_records", 0)
    return (
        f"[{cfg.name}] step {row['steps']:6,d} | fresh {row['fresh']:8,d} | "
        f"echo {row['realized_factor']:4.2f}x | stall {row['stall']:4.0%} | "
        f"loss {row['train_loss']:.3f} | {metric} | {row['seconds']:6.1f} s"
        + (f" | {skipped:,} bad record(s) skipped" if skipped else "")
        + (f" | {row['allreduce_calls']:,} all-reduces" if "allreduce_calls" in row else "")
    )


def train_result(
    cfg: TrainConfig, run: RunCounters, loader: EchoingDataLoader, final: tuple, history: list,
    losses: list[float], worker_cpu_seconds: float | None = None,
) -> TrainResult:  # fmt: skip
    s = loader.stats
    reached = None if cfg.target is None else run.to_target is not None
    hit = run.to_target
    return TrainResult(
        config=cfg,
        test_accuracy=final[0],
        test_loss=final[1],
        fresh_examples=s.fresh_examples,
        echoed_examples=s.echoed_examples,
        steps=run.steps,
        wall_seconds=run.seconds,
        wait_seconds=s.wait_seconds,
        step_seconds=run.step_seconds,
        eval_seconds=run.eval_seconds,
        checkpoint_seconds=run.checkpoint_seconds,
        realized_factor=s.realized_factor,
        reached_target=reached,
        fresh_to_target=None if hit is None else hit.fresh,
        steps_to_target=None if hit is None else hit.steps,
        seconds_to_target=None if hit is None else hit.seconds,
        history=history,
        losses=losses,
        skipped_records=skipped_records(loader),
        waiting_examples=s.waiting_items,
        worker_cpu_seconds=worker_cpu_seconds,
    )


def ended_children_cpu_seconds() -> float | None:
    """User + system CPU seconds of this process's child processes that ended and were waited
    for (the loader's workers, once an epoch or the run closed them); None where the platform
    does not count them."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_since(before: float | None, now: float | None) -> float | None:
    """``now - before``, or None if either is unknown."""
    return None if before is None or now is None else now - before


def skipped_records(loader: EchoingDataLoader) -> int:
    """Bad records the loader's dataset skipped so far (``ShardDataset.skipped_total``, every
    worker's); 0 for a dataset that skips nothing."""
    return int(getattr(loader.dataset, "skipped_total", 0))


def dataset_size(data: Data) -> str:
    n = getattr(data.train, "num_examples", None)
    return f"{n if n is not None else len(data.train):,}"
