"""The loop's checkpoints: what goes in (model, optimizer, loader state, counters, history,
RNG), the final one of a signalled run, and resuming, which refuses a folder of another run.
Writes are atomic (:mod:`dataecho.checkpoint`)."""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from dataecho.checkpoint import (
    CheckpointError,
    check_same,
    checkpoint_to_resume,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dataecho.training.record import RunCounters
from dataecho.training.schedule import at_limit

# Settings that shape the stream or the model: a checkpoint continues only a run that had them.
RESUME_MUST_MATCH = ("workload", "seq_len", "augment_pad", "train_examples", "echo_factor",
                     "max_echo_factor", "where", "shuffle_buffer", "batch_size", "lr",
                     "momentum", "num_workers", "seed")  # fmt: skip


def save(cfg, run, model, optimizer, loader, data, history, losses, loader_state=None):  # noqa: ANN001, ANN202
    t0 = time.perf_counter()
    state = {
        "config": cfg.to_dict(),
        "data": data.identity,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": loader.state_dict() if loader_state is None else loader_state,
        "run": dataclasses.asdict(run),
        "history": history,
        "losses": torch.tensor(losses, dtype=torch.float64),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    path = save_checkpoint(cfg.checkpoint_dir, state, step=run.steps, keep=cfg.keep_checkpoints)
    run.checkpoint_seconds += time.perf_counter() - t0
    return path


def save_on_exit(cfg, run, model, optimizer, loader, data, history, losses, start, state):  # noqa: ANN001, ANN202
    """The final checkpoint of a signalled run (:mod:`dataecho.shutdown`); a step already
    checkpointed (periodically, at the end, or the one resumed from) is not written again."""
    found = list_checkpoints(cfg.checkpoint_dir)
    if found and found[-1][0] == run.steps:
        return found[-1][1]
    run.seconds = time.perf_counter() - start
    return save(cfg, run, model, optimizer, loader, data, history, losses, state)


def resume_or_start(cfg, data, model, optimizer, loader, run, log):  # noqa: ANN001, ANN202
    """Load the latest checkpoint when resuming; refuse to mix a new run into an old folder."""
    path = checkpoint_to_resume(cfg.checkpoint_dir, cfg.resume)
    if not cfg.resume:
        return run, [], []
    if path is None:
        log(f"[{cfg.name}] no checkpoint in {cfg.checkpoint_dir} yet: starting from the beginning")
        return run, [], []
    ckpt = load_checkpoint(path)
    check_same(ckpt["config"], cfg.to_dict(), RESUME_MUST_MATCH, path)
    if ckpt["data"] != data.identity:
        raise CheckpointError(
            f"{path} was trained on other data ({ckpt['data']}) than this upstream has "
            f"({data.identity}); point the upstream at the data it was trained on"
        )
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    random.setstate(ckpt["rng"]["python"])
    run = RunCounters(**ckpt["run"])
    # A finished run continues only if this config allows more (a larger budget or max_steps).
    reached = run.to_target is not None and cfg.stop_at_target and cfg.target is not None
    run.done = reached or at_limit(cfg, run, loader.stats.fresh_examples)
    log(f"[{cfg.name}] resumed from {path}: step {run.steps:,}, "
        f"{loader.stats.fresh_examples:,} fresh examples, {run.seconds:.1f} s")  # fmt: skip
    return run, list(ckpt["history"]), ckpt["losses"].tolist()
