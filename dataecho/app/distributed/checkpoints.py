"""Checkpoints of a data-parallel run: rank 0 writes them, every rank resumes from them.

The rule (also in :mod:`dataecho.app.distributed.loop`): written at an exchange, when the models
are equal on every rank: the model, rank 0's optimizer, every rank's loader state (gathered;
with local-echo, whose momentum stays local, its optimizer too), the global counters, rank
0's losses. Every rank loads the model; with the same number of ranks each loader (and
local-echo optimizer) continues exactly, with another number every rank takes rank 0's
optimizer and restarts the checkpoint's epoch (rank 0's) while the global fresh-example
count continues.

With ``checkpoint_on_exit`` a signal adds one at the exchange the ranks agreed to stop after
(:mod:`dataecho.app.distributed.signals`), unless one was written there already; none when a
rank joined that exchange void.

Rank 0 checks the folder before the run starts (it can be created and written to, and has room:
:func:`dataecho.app.training.checkpoints.check_folder`); a rank's count of skipped bad records goes
with its loader state.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from dataecho.app.checkpoint import (
    CheckpointError,
    check_same,
    checkpoint_to_resume,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dataecho.app.distributed.result import RunCounters
from dataecho.app.distributed.signals import void
from dataecho.app.training.checkpoints import (
    RESUME_MUST_MATCH,
    check_folder,
    resume_skipped,
    skipped_to_keep,
)


class CheckpointMixin:
    """``_checkpoint`` and ``_resume_or_start`` of the loop's ``_Rank`` (its attributes)."""

    cfg: Any
    info: Any
    data: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    averaging: Any
    run_: RunCounters
    history: list[dict[str, float]]
    losses: list[float]
    say: Any
    signals: Any
    start: float
    saved_at: int | None = None  # global steps of the latest checkpoint written or resumed

    def _gather(self, obj: Any) -> list[Any]:  # the loop's
        raise NotImplementedError

    def _checkpoint(self) -> Path | None:
        """Write one (every rank calls it: a gather); rank 0 returns its path."""
        t0 = time.perf_counter()
        mine = {"loader": self.loader.state_dict(), "epoch": self.run_.epoch}
        mine["skipped_records"] = skipped_to_keep(self.loader, mine["loader"])
        if self.averaging is not None:  # local-echo: momentum differs between ranks
            mine["optimizer"] = self.optimizer.state_dict()
        every = self._gather(mine)
        path = None
        if self.info.rank == 0:
            state = {
                "config": self.cfg.to_dict(),
                "data": self.data.identity,
                "world_size": self.info.world_size,
                "model": {k: v.cpu() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "loaders": every,
                "averaging": self.averaging.state_dict() if self.averaging else {},
                "run": dataclasses.asdict(self.run_),
                "history": self.history,
                "losses": torch.tensor(self.losses, dtype=torch.float64),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            }
            path = save_checkpoint(self.cfg.checkpoint_dir, state, step=self.run_.global_steps,
                                   keep=self.cfg.keep_checkpoints)  # fmt: skip
        self.run_.checkpoint_seconds += time.perf_counter() - t0
        self.saved_at = self.run_.global_steps
        return path

    def _stop_on_signal(self, summed: list[float]) -> None:
        """The ranks voted to stop in the exchange ``summed`` (:mod:`.signals`): write the
        final checkpoint there (not twice; none if it is void), say so, raise the signal's
        exception (every rank, so every ``finally`` runs: workers stop, the group is left)."""
        cfg, run, own = self.cfg, self.run_, self.signals.signum
        stop = self.signals.exception(summed)
        what = signal.Signals(own).name if own else "a signal to another rank"
        found = list_checkpoints(cfg.checkpoint_dir) if self.info.rank == 0 else []
        if void(summed):
            latest = f"the latest, {found[-1][1]}" if found else "none yet: a fresh start"
            self.say(f"[{cfg.name}] {what}: a rank had no batch {self.signals.grace:g} s after "
                     "it, so no state is consistent: stopped without a final checkpoint; "
                     f"--resume continues from {latest}")  # fmt: skip
            raise stop
        if self.saved_at == run.global_steps:  # written at this exchange, or resumed from
            path = next((p for step, p in found if step == run.global_steps), None)
        else:
            run.seconds = time.perf_counter() - self.start
            path = self._checkpoint()
        self.say(f"[{cfg.name}] {what}: the {self.info.world_size} ranks stopped after "
                 f"{run.global_steps:,} steps in all: final checkpoint {path}; continue with "
                 "--resume")  # fmt: skip
        raise stop

    def _resume_or_start(self) -> None:
        cfg = self.cfg
        if self.info.rank == 0:  # the writer; the launcher stops the other ranks if it fails
            check_folder(cfg, self.model, loaders=self.info.world_size)
        path = checkpoint_to_resume(cfg.checkpoint_dir, cfg.resume)
        if not cfg.resume:
            return
        if path is None:
            self.say(f"[{cfg.name}] no checkpoint in {cfg.checkpoint_dir} yet: starting afresh")
            return
        ckpt = load_checkpoint(path)
        if "loaders" not in ckpt:
            raise CheckpointError(
                f"{path} was written by a single-process run; resume it without --nproc or "
                "torchrun (a data-parallel run resumes only data-parallel checkpoints)"
            )
        check_same(ckpt["config"], cfg.to_dict(), RESUME_MUST_MATCH, path)
        if ckpt["data"] != self.data.identity:
            raise CheckpointError(f"{path} was trained on other data ({ckpt['data']})")
        self.model.load_state_dict(ckpt["model"])
        loaders, world, rank = ckpt["loaders"], self.info.world_size, self.info.rank
        same = len(loaders) == world  # the same shares: continue exactly
        self.optimizer.load_state_dict(loaders[rank].get("optimizer", ckpt["optimizer"])
                                       if same else ckpt["optimizer"])  # fmt: skip
        if self.averaging is not None and ckpt["averaging"]:
            self.averaging.load_state_dict(ckpt["averaging"])
        run = RunCounters(**ckpt["run"])
        if same:
            self.loader.load_state_dict(loaders[rank]["loader"])
            resume_skipped(self.loader, loaders[rank].get("skipped_records", 0))
            run.epoch = int(loaders[rank]["epoch"])
        else:  # other shares: restart rank 0's epoch (module docstring)
            run.epoch = int(loaders[0]["epoch"])
            self.loader.load_state_dict({"epoch": run.epoch - 1, "seed": self.loader.seed,
                                         "root": None, "stats": self.loader.stats.state_dict()})  # fmt: skip
            # The restarted epoch is read, and its bad records skipped, again: rank 0 carries
            # the finished epochs' skips of all ranks.
            carried = sum(int(r.get("skipped_records", 0)) for r in loaders)
            resume_skipped(self.loader, carried if rank == 0 else 0)
        torch.set_rng_state(ckpt["rng"]["torch"])
        random.setstate(ckpt["rng"]["python"])
        run.steps = run.global_steps // len(loaders)  # this rank's share of the steps so far
        run.done, run.stop_vote = False, False
        if run.fresh >= cfg.budget or (run.to_target is not None and cfg.stop_at_target):
            run.done = True
        self.run_, self.history = run, list(ckpt["history"])
        self.losses = ckpt["losses"].tolist() if rank == 0 else []  # rank 0's, as written
        self.saved_at = run.global_steps
        self.say(f"[{cfg.name}] resumed from {path} ({len(loaders)} ranks then, {world} now): "
                 f"{run.fresh:,} fresh examples, {run.global_steps:,} steps")  # fmt: skip
