"""What a data-parallel run returns: rank 0's view of the run, with every rank's counters."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dataecho.app.training.record import TrainResult, skipped_records


@dataclass
class DistributedResult(TrainResult):
    """A :class:`~dataecho.app.training.record.TrainResult` (rank 0's view, global fresh examples) with
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


def rank_counters(rank: Any, loader: Any, steps: int) -> dict[str, float]:
    """This rank's entry of :attr:`DistributedResult.ranks` (``rank``: a :class:`.rank.Rank`)."""
    s = loader.stats
    return {"rank": rank.rank, **rank.stats.as_dict(), "fresh_examples": s.fresh_examples,
            "echoed_examples": s.echoed_examples, "steps": steps,
            "skipped_records": skipped_records(loader)}  # fmt: skip


def distributed_result(result: TrainResult, ranks: list[dict[str, float]], *, fresh: int,
                       rank: int, sync: str) -> DistributedResult:  # fmt: skip
    """``result`` (this rank's) with the run's global counts: ``fresh`` examples of all ranks,
    the echoed copies and skipped records of ``ranks`` (every rank's counters) summed."""
    echoed = sum(int(r["echoed_examples"]) for r in ranks)
    mine = {f.name: getattr(result, f.name) for f in fields(TrainResult)}
    mine.update(fresh_examples=fresh, echoed_examples=echoed,
                realized_factor=(fresh + echoed) / max(fresh, 1),
                skipped_records=sum(int(r["skipped_records"]) for r in ranks))  # fmt: skip
    return DistributedResult(**mine, sync=sync, world_size=len(ranks), rank=rank, ranks=ranks)
