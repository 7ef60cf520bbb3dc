"""The run's checkpoints, single-process and data-parallel: what goes in, when a signalled run
writes its last one, and resuming, which refuses a folder of another run.

In every checkpoint: the config, the data's identity, the model, the optimizer, the counters
(:class:`~dataecho.app.training.record.RunCounters`), the history, every step's loss and the
RNG states. Besides, a single process's loader state and its count of skipped bad records; a
data-parallel run's ``world_size``, ``averaging`` (local-echo's draws) and ``loaders``: every
rank's loader state, epoch and skipped records (with local-echo, whose momentum stays local,
its optimizer too), gathered at an exchange, when the models are equal on every rank; rank 0
writes it, with rank 0's optimizer and losses.

Resuming: a single process continues its loader exactly. Every rank loads the model; with the
same number of ranks each loader (and local-echo optimizer) continues exactly, with another
number every rank takes rank 0's optimizer and restarts the checkpoint's epoch (rank 0's) while
the global fresh-example count continues. A finished run continues only if this config allows
more (a larger budget or ``max_steps``). Each kind resumes only its own kind of checkpoint.

Before a run starts, its folder is checked (by rank 0 in a data-parallel run): it can be
created, written to, and has room for the checkpoints to come (:func:`check_folder`), so a bad
folder fails at once, not after the training time is spent. Writes are atomic
(:mod:`dataecho.app.checkpoint_file`): a failed one raises, naming the file and why, and leaves the
earlier checkpoints loadable. Each file carries its checksum: a resume skips a damaged one for
the newest intact one and says so; it does the same, with a warning naming the file and why,
for one whose checksum holds but whose contents do not load (another structure, a key missing,
a model, optimizer or loader state the run cannot take). A checkpoint of another run (other
settings, data or kind) stops the resume instead: falling back would continue the wrong run.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from dataecho.app import workloads
from dataecho.app.checkpoint_file import (
    CheckpointError,
    UnusableCheckpointError,
    check_checkpoint_dir,
    check_same,
    checkpoint_to_resume,
    error_line,
    list_checkpoints,
    resume_from,
    save_checkpoint,
)
from dataecho.app.config import TrainConfig
from dataecho.app.distributed.rank import Rank
from dataecho.app.distributed.strategy import SingleProcess
from dataecho.app.training.record import RunCounters
from dataecho.app.training.schedule import at_limit
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader

# Settings that shape the stream or the model: a checkpoint continues only a run that had them.
RESUME_MUST_MATCH = ("workload", "seq_len", "augment_pad", "train_examples", "echo_factor",
                     "max_echo_factor", "reuse_buffer", "reuse_policy", "where",
                     "shuffle_buffer", "batch_size", "lr", "momentum", "num_workers",
                     "seed")  # fmt: skip


@dataclasses.dataclass
class RunParts:
    """What a checkpoint holds besides the counters, history and losses; ``rank`` is None in a
    single process."""

    data: Data
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: EchoingDataLoader
    sync: SingleProcess
    rank: Rank | None


def save(cfg: TrainConfig, parts: RunParts, run: RunCounters, history: list, losses: list,
         loader_state: dict[str, Any] | None = None,
         ) -> tuple[Path | None, RunCounters]:  # fmt: skip
    """Write a checkpoint of ``run`` now (``loader_state``: the loader's, taken earlier).
    Returns its path and the counters with the write's time added to ``checkpoint_seconds``.
    Data parallel: every rank calls it (a gather); rank 0 writes and has the path, the others
    None; each rank records the global steps written at (``Rank.saved_at``)."""
    t0, rank, loader = time.perf_counter(), parts.rank, parts.loader
    mine = {"loader": loader.state_dict() if loader_state is None else loader_state}
    mine["skipped_records"] = skipped_to_keep(loader, mine["loader"])
    if rank is None:
        state = {**_state(cfg, parts, run, history, losses), **mine}
        path = save_checkpoint(cfg.checkpoint_dir, state, step=run.steps,
                               keep=cfg.keep_checkpoints)  # fmt: skip
    else:
        if parts.sync.keeps_local_optimizer:  # local-echo: momentum differs between ranks
            mine["optimizer"] = parts.optimizer.state_dict()
        every, path = rank.gather(mine), None
        if rank.rank == 0:
            state = {**_state(cfg, parts, run, history, losses), "world_size": rank.world_size,
                     "loaders": every, "averaging": parts.sync.state_dict()}  # fmt: skip
            path = save_checkpoint(cfg.checkpoint_dir, state, step=run.global_steps,
                                   keep=cfg.keep_checkpoints)  # fmt: skip
        rank.saved_at = run.global_steps
    spent = time.perf_counter() - t0
    return path, dataclasses.replace(run, checkpoint_seconds=run.checkpoint_seconds + spent)


def _state(cfg: TrainConfig, parts: RunParts, run: RunCounters, history: list, losses: list,
           ) -> dict[str, Any]:  # fmt: skip
    """What every checkpoint holds (module docstring)."""
    return {
        "config": cfg.to_dict(),
        "data": parts.data.identity,
        "model": {k: v.cpu() for k, v in parts.model.state_dict().items()},
        "optimizer": parts.optimizer.state_dict(),
        "run": dataclasses.asdict(run),
        "history": history,
        "losses": torch.tensor(losses, dtype=torch.float64),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }


def save_on_exit(cfg: TrainConfig, parts: RunParts, run: RunCounters, history: list,
                 losses: list, loader_state: dict[str, Any]) -> Path:  # fmt: skip
    """A single process's final checkpoint of a signalled run (:mod:`dataecho.app.shutdown`),
    of ``run`` as the loop had it (its wall time up to now in ``seconds``); a step already
    checkpointed (periodically, at the end, or the one resumed from) is not written again."""
    found = list_checkpoints(cfg.checkpoint_dir)
    if found and found[-1][0] == run.steps:
        return found[-1][1]
    path, _ = save(cfg, parts, run, history, losses, loader_state)
    assert path is not None  # a single process writes every checkpoint it takes
    return path


def resume_or_start(cfg: TrainConfig, parts: RunParts, run: RunCounters, log: Any,
                    ) -> tuple[RunCounters, list, list]:  # fmt: skip
    """Check the folder (:func:`check_folder`); load the latest checkpoint when resuming;
    refuse to mix a new run into an old folder. Returns the counters, history and losses."""
    rank, data = parts.rank, parts.data
    if rank is None or rank.rank == 0:  # the writer; the launcher stops the other ranks if it fails
        check_folder(cfg, parts.model, loaders=1 if rank is None else rank.world_size)
    checkpoint_to_resume(cfg.checkpoint_dir, cfg.resume)  # a new run refuses an old folder
    if not cfg.resume:
        return run, [], []
    loaded: list[RunCounters] = []

    def use(path: Path, ckpt: dict[str, Any]) -> None:
        """Load ``ckpt`` into the run; contents it cannot take raise UnusableCheckpointError
        (the resume falls back), a checkpoint of another run CheckpointError (it stops)."""
        _check_kind(ckpt, path, data_parallel=rank is not None)  # another kind of run: stop
        _check_structure(ckpt, path, data_parallel=rank is not None)
        check_same(ckpt["config"], cfg.to_dict(), RESUME_MUST_MATCH, path)
        if ckpt["data"] != data.identity:
            raise CheckpointError(
                f"{path} was trained on other data ({ckpt['data']}) than this upstream has "
                f"({data.identity}); point the upstream at the data it was trained on"
            )
        part = "model"  # what was being loaded, for the reason
        try:  # each load replaces all it sets: a fallback's loads overwrite a partial one
            parts.model.load_state_dict(ckpt["model"])
            part = "run counters"
            counters = RunCounters.from_dict(ckpt["run"])
            part = "optimizer and loader states"
            if rank is None:
                counters = _resume_process(ckpt, parts, counters)
            else:
                counters = _resume_rank(ckpt, parts, counters, rank)
            part = "RNG states"
            torch.set_rng_state(ckpt["rng"]["torch"])
            random.setstate(ckpt["rng"]["python"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as err:
            found = f"key {err} missing" if type(err) is KeyError else error_line(err)
            raise UnusableCheckpointError(path, f"its {part} cannot be loaded: {found}") from None
        loaded.append(counters)

    # Every rank picks the same file; rank 0 says which damaged or unusable ones it skipped.
    found = resume_from(cfg.checkpoint_dir, (lambda line: log(f"[{cfg.name}] {line}"))
                        if rank is None or rank.rank == 0 else (lambda line: None),
                        use)  # fmt: skip
    if found is None:
        log(f"[{cfg.name}] no checkpoint in {cfg.checkpoint_dir} yet: starting from the beginning")
        return run, [], []
    path, ckpt = found
    run = loaded[-1]
    if rank is None:
        log(f"[{cfg.name}] resumed from {path}: step {run.steps:,}, {run.fresh:,} fresh "
            f"examples, {run.seconds:.1f} s")  # fmt: skip
    else:
        log(f"[{cfg.name}] resumed from {path} ({len(ckpt['loaders'])} ranks then, "
            f"{rank.world_size} now): {run.fresh:,} fresh examples, {run.global_steps:,} steps")  # fmt: skip
    reached = run.to_target is not None and cfg.stop_at_target and cfg.target is not None
    done = reached or at_limit(cfg, run, 1 if rank is None else rank.world_size)
    run = dataclasses.replace(run, stop_vote=False, done=done)
    losses = ckpt["losses"].tolist() if rank is None or rank.rank == 0 else []  # rank 0's
    return run, list(ckpt["history"]), losses


# What every training checkpoint holds, and its kind: a state without one of them (or with
# another kind there) was not written by this run's save().
_STRUCTURE: dict[str, type] = {
    "config": dict, "data": str, "model": dict, "optimizer": dict, "run": dict,
    "history": list, "losses": torch.Tensor, "rng": dict,
}  # fmt: skip


def _check_structure(ckpt: dict[str, Any], path: Path, *, data_parallel: bool) -> None:
    """Raise :class:`UnusableCheckpointError` naming each key that is missing or of another
    kind than :func:`save` writes (``loader``, or data parallel ``loaders``, as well)."""
    want = dict(_STRUCTURE)
    if data_parallel:
        want["loaders"] = list
    else:
        want["loader"] = dict
    missing = [key for key in want if key not in ckpt]
    wrong = [f"{key} is a {type(ckpt[key]).__name__}" for key, kind in want.items()
             if key in ckpt and not isinstance(ckpt[key], kind)]  # fmt: skip
    if missing or wrong:
        found = ([f"missing {', '.join(missing)}"] if missing else []) + wrong
        raise UnusableCheckpointError(
            path, f"{'; '.join(found)} (keys: {', '.join(sorted(map(str, ckpt)))})"
        )


def _check_kind(ckpt: dict[str, Any], path: Path, *, data_parallel: bool) -> None:
    if data_parallel and "loaders" not in ckpt:
        raise CheckpointError(
            f"{path} was written by a single-process run; resume it without --nproc or "
            "torchrun (a data-parallel run resumes only data-parallel checkpoints)"
        )
    if not data_parallel and "loaders" in ckpt:
        raise CheckpointError(
            f"{path} was written by a data-parallel run of {ckpt.get('world_size')} ranks; "
            "resume it with --nproc N or under torchrun (a single process resumes only "
            "single-process checkpoints)"
        )


def _resume_process(ckpt: dict[str, Any], parts: RunParts, run: RunCounters) -> RunCounters:
    """Load a single process's optimizer and loader; the checkpoint's counters ``run`` with
    the loader's fresh examples, every step its own."""
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.loader.load_state_dict(ckpt["loader"])
    resume_skipped(parts.loader, ckpt.get("skipped_records", 0))
    return dataclasses.replace(run, fresh=parts.loader.stats.fresh_examples,
                               global_steps=run.steps)  # fmt: skip


def _resume_rank(ckpt: dict[str, Any], parts: RunParts, run: RunCounters,
                 rank: Rank) -> RunCounters:  # fmt: skip
    """Load this rank's optimizer, averaging and loader; the checkpoint's counters ``run``
    with this rank's epoch and share of the steps."""
    loaders, loader = ckpt["loaders"], parts.loader
    same = len(loaders) == rank.world_size  # the same shares: continue exactly
    mine = loaders[rank.rank] if same else loaders[0]
    parts.optimizer.load_state_dict(mine.get("optimizer", ckpt["optimizer"]) if same
                                    else ckpt["optimizer"])  # fmt: skip
    parts.sync.load_state_dict(ckpt["averaging"])
    epoch = int(mine["loader"]["next_epoch"])
    if same:
        loader.load_state_dict(mine["loader"])
        resume_skipped(loader, mine.get("skipped_records", 0))
    else:  # other shares: restart rank 0's epoch (module docstring)
        loader.load_state_dict({"epoch": epoch - 1, "seed": loader.seed, "root": None,
                                "stats": loader.stats.state_dict()})  # fmt: skip
        # The restarted epoch is read, and its bad records skipped, again: rank 0 carries
        # the finished epochs' skips of all ranks.
        carried = sum(int(r.get("skipped_records", 0)) for r in loaders)
        resume_skipped(loader, carried if rank.rank == 0 else 0)
    rank.saved_at = run.global_steps
    # This rank's share of the steps so far.
    return dataclasses.replace(run, epoch=epoch, steps=run.global_steps // len(loaders))


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
    per_example = workloads.get(cfg.workload).example_bytes(cfg)
    buffered = (cfg.shuffle_buffer + 2 * cfg.batch_size) * per_example * max(1, cfg.num_workers)
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
