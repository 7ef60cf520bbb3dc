"""Checkpoints of a data-parallel run: rank 0 writes them, every rank resumes from them.

The rule (also in :mod:`dataecho.distributed.loop`): written at an exchange, when the models
are equal on every rank: the model, rank 0's optimizer, every rank's loader state (gathered),
the global counters. Every rank loads the model and rank 0's optimizer; with the same number
of ranks each loader continues exactly, with another number each rank restarts the
checkpoint's epoch (rank 0's) while the global fresh-example count continues.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import torch

from dataecho.checkpoint import (
    CheckpointError,
    check_same,
    checkpoint_to_resume,
    load_checkpoint,
    save_checkpoint,
)
from dataecho.distributed.result import RunCounters
from dataecho.train import RESUME_MUST_MATCH


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

    def _gather(self, obj: Any) -> list[Any]:  # the loop's
        raise NotImplementedError

    def _checkpoint(self) -> None:
        t0 = time.perf_counter()
        mine = {"loader": self.loader.state_dict(), "epoch": self.run_.epoch}
        every = self._gather(mine)
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
            save_checkpoint(self.cfg.checkpoint_dir, state, step=self.run_.global_steps,
                            keep=self.cfg.keep_checkpoints)  # fmt: skip
        self.run_.checkpoint_seconds += time.perf_counter() - t0

    def _resume_or_start(self) -> None:
        cfg = self.cfg
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
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.averaging is not None and ckpt["averaging"]:
            self.averaging.load_state_dict(ckpt["averaging"])
        run = RunCounters(**ckpt["run"])
        loaders, world, rank = ckpt["loaders"], self.info.world_size, self.info.rank
        if len(loaders) == world:  # the same shares: continue exactly
            self.loader.load_state_dict(loaders[rank]["loader"])
            run.epoch = int(loaders[rank]["epoch"])
        else:  # other shares: restart rank 0's epoch (module docstring)
            run.epoch = int(loaders[0]["epoch"])
            self.loader.load_state_dict({"epoch": run.epoch - 1, "seed": self.loader.seed,
                                         "root": None, "stats": self.loader.stats.state_dict()})  # fmt: skip
        torch.set_rng_state(ckpt["rng"]["torch"])
        random.setstate(ckpt["rng"]["python"])
        run.steps = run.global_steps // len(loaders)  # this rank's share of the steps so far
        run.done, run.stop_vote = False, False
        if run.fresh >= cfg.budget or (run.to_target is not None and cfg.stop_at_target):
            run.done = True
        self.run_, self.history, self.losses = run, list(ckpt["history"]), []
        self.say(f"[{cfg.name}] resumed from {path} ({len(loaders)} ranks then, {world} now): "
                 f"{run.fresh:,} fresh examples, {run.global_steps:,} steps")  # fmt: skip
