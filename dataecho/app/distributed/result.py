"""What a data-parallel run returns, and the counters its checkpoints carry."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataecho.app.train import TrainResult


@dataclass
class DistributedResult(TrainResult):
    """A :class:`~dataecho.app.train.TrainResult` (rank 0's view, global fresh examples) with
    every rank's counters: ``ranks[r]`` has the :class:`CommStats` keys plus fresh_examples,
    steps and rank."""

    sync: str = "ddp"
    world_size: int = 1
    rank: int = 0  # the rank that returned it (only rank 0's has the final evaluation)
    ranks: list[dict[str, float]] = field(default_factory=list)

    @property
    def rank_summary(self) -> list[str]:
        """One line per rank for the command's summary."""
        out = []
        for r in self.ranks:
            batches = r["fresh_examples"] / max(self.config.batch_size, 1)
            out.append(
                f"rank {r['rank']:.0f} ({self.sync}): {r['allreduce_calls']:,.0f} all-reduces "
                f"({r['allreduce_calls'] / max(batches, 1e-9):.2f} per fresh batch), "
                f"{r['allreduce_bytes'] / 1e6:,.1f} MB, {r['comm_seconds']:.1f} s in "
                f"communication, {r['fresh_examples']:,.0f} fresh examples, {r['steps']:,.0f} steps"
            )
        return out


@dataclass
class RunCounters:
    """The loop's counters: all of them go into a checkpoint."""

    steps: int = 0  # this rank's
    fresh: int = 0  # all ranks', at the last exchange
    global_steps: int = 0
    epoch: int = 0  # this rank's
    next_eval: int = 0
    seconds: float = 0.0
    step_seconds: float = 0.0
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    next_checkpoint: int = 0  # mean steps per rank
    loss_sum: float = 0.0
    loss_count: int = 0
    stop_vote: bool = False  # rank 0: the target was reached; voted at the next exchange
    to_target: list[float] | None = None
    done: bool = False
