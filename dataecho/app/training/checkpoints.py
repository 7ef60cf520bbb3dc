"""The loop's checkpoints: what goes in (model, optimizer, loader state, counters, history,
RNG, the count of bad records skipped), the final one of a signalled run, and resuming, which
refuses a folder of another run. Before a run starts, its folder is checked: it can be created,
written to, and has room for the checkpoints to come (:func:`check_folder`), so a bad folder
fails at once, not after the training time is spent. Writes are atomic
(:mod:`dataecho.app.checkpoint`): a failed one raises, naming the file and why, and leaves the
earlier checkpoints loadable.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from typing import Any

import torch

from dataecho.app.checkpoint import (
    CheckpointError,
    check_checkpoint_dir,
    check_same,
    checkpoint_to_resume,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dataecho.app.config import TrainConfig
from dataecho.app.training.record import RunCounters
from dataecho.app.training.schedule import at_limit

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
    state["skipped_records"] = skipped_to_keep(loader, state["loader"])
    path = save_checkpoint(cfg.checkpoint_dir, state, step=run.steps, keep=cfg.keep_checkpoints)
    run.checkpoint_seconds += time.perf_counter() - t0
    return path


def save_on_exit(cfg, run, model, optimizer, loader, data, history, losses, start, state):  # noqa: ANN001, ANN202
    """The final checkpoint of a signalled run (:mod:`dataecho.app.shutdown`); a step already
    checkpointed (periodically, at the end, or the one resumed from) is not written again."""
    found = list_checkpoints(cfg.checkpoint_dir)
    if found and found[-1][0] == run.steps:
        return found[-1][1]
    run.seconds = time.perf_counter() - start
    return save(cfg, run, model, optimizer, loader, data, history, losses, state)


def resume_or_start(cfg, data, model, optimizer, loader, run, log):  # noqa: ANN001, ANN202
    """Check the folder (:func:`check_folder`); load the latest checkpoint when resuming;
    refuse to mix a new run into an old folder."""
    check_folder(cfg, model)
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
    resume_skipped(loader, ckpt.get("skipped_records", 0))
    torch.set_rng_state(ckpt["rng"]["torch"])
    random.setstate(ckpt["rng"]["python"])
    run = RunCounters(**ckpt["run"])
    # A finished run continues only if this config allows more (a larger budget or max_steps).
    reached = run.to_target is not None and cfg.stop_at_target and cfg.target is not None
    run.done = reached or at_limit(cfg, run, loader.stats.fresh_examples)
    log(f"[{cfg.name}] resumed from {path}: step {run.steps:,}, "
        f"{loader.stats.fresh_examples:,} fresh examples, {run.seconds:.1f} s")  # fmt: skip
    return run, list(ckpt["history"]), ckpt["losses"].tolist()


def check_folder(cfg: TrainConfig, model: torch.nn.Module, *, loaders: int = 1) -> None:
    """Raise :class:`CheckpointError` now if ``cfg.checkpoint_dir`` cannot take this run's
    checkpoints: it cannot be created or written to, or has less free space than the
    checkpoints still to be written need (:func:`checkpoint_bytes` each; ``keep_checkpoints``
    plus the one being written, less those already there). ``loaders``: loader states per
    checkpoint (one per rank in a data-parallel run)."""
    existing = len(list_checkpoints(cfg.checkpoint_dir))
    to_come = max(1, cfg.keep_checkpoints + 1 - existing)
    need = to_come * checkpoint_bytes(cfg, model, loaders=loaders)
    check_checkpoint_dir(cfg.checkpoint_dir, need_bytes=need)


def checkpoint_bytes(cfg: TrainConfig, model: torch.nn.Module, *, loaders: int = 1) -> int:
    """A generous estimate of one checkpoint's size in bytes.

    The weights three times (the model, and up to two optimizer moments per weight: AdamW's),
    every loader's buffered examples (shuffle buffer, a batch being echoed and one read ahead,
    per worker) at 4 bytes per value, the per-step losses, and 1 MiB for the rest (counters,
    history, RNG states).
    """
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    per_example = 4 * 28 * 28 if cfg.workload == "cnn" else 2 * 8 * cfg.seq_len
    shuffled = cfg.shuffle_buffer * (cfg.batch_size if cfg.where == "batch" else 1)
    buffered = (shuffled + 2 * cfg.batch_size) * per_example * max(1, cfg.num_workers)
    factor = cfg.max_echo_factor if cfg.echo_factor == "auto" else cfg.echo_factor
    steps = cfg.max_steps or math.ceil(cfg.budget * factor / cfg.batch_size)
    # A float64 per step; capped so that a huge budget, which a target usually cuts short,
    # does not refuse a folder that has room for the run as it will go.
    losses = 8 * min(steps, 1 << 20)
    return 3 * weights * loaders + buffered * loaders + losses + (1 << 20)


def skipped_to_keep(loader: Any, loader_state: dict[str, Any]) -> int:
    """The count of skipped bad records a checkpoint keeps (``ShardDataset.skipped_checkpoint``):
    a live epoch in ``loader_state`` recounts its own passes' skips on resume."""
    keep = getattr(loader.dataset, "skipped_checkpoint", None)
    return 0 if keep is None else int(keep(mid_pass=loader_state.get("root") is not None))


def resume_skipped(loader: Any, count: int) -> None:
    """Continue the loader's dataset's count of skipped bad records from a checkpoint's."""
    resume = getattr(loader.dataset, "resume_skipped", None)
    if resume is not None:
        resume(int(count))
