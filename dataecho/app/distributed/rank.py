"""One rank of a data-parallel run, as the training loop sees it: its place in the group, its
collectives (:class:`.group.Guard`), its signal handlers (:mod:`.signals`) and the helpers the
loop calls for what only ranks do: gather counters, stop together on a signal.

    with join_group(cfg) as rank:       # torchrun's environment; left on the way out
        ...  # dataecho.app.train.train's loop, with rank.info.rank, rank.gather(...), ...
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch.distributed as dist

from dataecho.app.checkpoint_file import list_checkpoints
from dataecho.app.config import TrainConfig
from dataecho.app.distributed.control import Control
from dataecho.app.distributed.group import (
    GroupInfo,
    Guard,
    init_group,
    local_rank,
    shutdown_group,
)
from dataecho.app.distributed.signals import StopSignals
from dataecho.app.distributed.sync import CommStats
from dataecho.app.training.device import training_device


@dataclass
class Rank:
    """This process's part in the group."""

    info: GroupInfo
    guard: Guard
    signals: StopSignals
    stats: CommStats = field(default_factory=CommStats)
    saved_at: int | None = None  # global steps of the latest checkpoint written or resumed

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, by rank (a collective: every rank calls it)."""
        out: list[Any] = [None] * self.info.world_size
        t0 = time.perf_counter()
        self.guard.run("gather", lambda: dist.all_gather_object(out, obj))
        self.stats.comm_seconds += time.perf_counter() - t0
        self.stats.other_calls += 1
        return out

    def comm_row(self) -> dict[str, float]:
        """The communication counters an evaluation's history row carries."""
        s = self.stats
        return {"allreduce_calls": s.allreduce_calls, "allreduce_bytes": s.allreduce_bytes,
                "comm_seconds": s.comm_seconds}  # fmt: skip

    def stop_on_signal(self, cfg: TrainConfig, global_steps: int, summed: Control,
                       say: Callable[[str], None]) -> NoReturn:  # fmt: skip
        """The ranks voted to stop in the exchange ``summed`` (:mod:`.signals`): say so, naming
        the final checkpoint (the loop wrote it at this exchange, at ``global_steps``, unless
        one was written or resumed there already; none if the exchange is void), and raise the
        signal's exception (every rank, so every ``finally`` runs: workers stop, the group is
        left)."""
        own = self.signals.signum
        stop = self.signals.exception(summed)
        what = signal.Signals(own).name if own else "a signal to another rank"
        found = list_checkpoints(cfg.checkpoint_dir) if self.rank == 0 else []
        if summed.void:
            latest = f"the latest, {found[-1][1]}" if found else "none yet: a fresh start"
            say(f"[{cfg.name}] {what}: a rank had no batch {self.signals.grace:g} s after it, "
                "so no state is consistent: stopped without a final checkpoint; --resume "
                f"continues from {latest}")  # fmt: skip
            raise stop
        path = next((p for step, p in found if step == global_steps), None)
        say(f"[{cfg.name}] {what}: the {self.world_size} ranks stopped after {global_steps:,} "
            f"steps in all: final checkpoint {path}; continue with --resume")  # fmt: skip
        raise stop


@contextmanager
def join_group(cfg: TrainConfig) -> Iterator[Rank]:
    """Join the group torchrun's environment describes, on this rank's training device
    (``cfg.device``; "cuda" is the local rank's GPU); leave it on the way out.

    The signal handlers go in before the loader's workers are forked (they then block both
    signals: see :mod:`.signals`) and come out after the group is left (a signal forwarded
    meanwhile only sets a flag)."""
    info = init_group(cfg.dist_timeout, training_device(cfg.device, local_rank=local_rank()))
    guard = Guard(info)
    with StopSignals(cfg.checkpoint_on_exit) as signals:
        try:
            yield Rank(info, guard, signals)
        finally:
            guard.close()
            shutdown_group()
