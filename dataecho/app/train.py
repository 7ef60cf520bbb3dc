"""``dataecho train``: train through ``EchoingDataLoader`` from a slow upstream, to a target.

    dataecho prepare --out shards/                        # Fashion-MNIST as WebDataset shards
    dataecho train --upstream shards/ --echo-factor 4 --shuffle-buffer 1280 --progress
    dataecho train --config run.toml --checkpoint-dir ckpt/ --resume   # every option: --help

or from Python::

    from dataecho.app.train import TrainConfig, train
    result = train(TrainConfig(echo_factor=4, read_delay=0.0006, target_accuracy=0.85))

Data flows: the upstream (in memory behind ``Throttled``, or shards over HTTP, on disk or on
emulated storage: :mod:`dataecho.app.upstream`) -> an ``EchoingDataLoader`` worker (read, decode,
echo, shuffle, augment, batch) -> this loop (one optimizer step per batch). The paper's measure
of cost is *fresh examples*, those read from upstream; echoed copies are extra steps, not data.

Time: ``wall_seconds`` runs from the first batch request to the last step, the periodic
evaluations and checkpoint writes included: they are part of what a user waits for. Building
the data before and the final whole-split evaluation after are outside it.

Device: the model and the step run on ``device`` (CUDA where it is available, else the CPU),
whatever the insertion point: with ``where="device"`` the loader echoes there, otherwise each
batch is copied there in the loop (``non_blocking``, from pinned memory on CUDA). Evaluation
runs on the CPU, on a copy of the weights.

Threads: the step runs on ``threads`` torch threads (default 1) and the upstream in
``num_workers`` loader workers (default 1), so that on a small machine the step and the
worker each have a core rather than fight for them.

Data parallel (``nproc`` > 1, or started by torchrun): the same loop on every rank, the
sync mode a strategy it calls after the backward pass and after each step
(:mod:`dataecho.app.distributed.strategy`: ``ddp`` exchanges in every step's gradient round,
``local-echo`` at each fresh batch's model average; one process exchanges with itself after
every step). Decisions are taken after an exchange, from counts summed in it, so every rank
takes the same one there: stop at the budget (global fresh examples) or ``max_steps`` (mean
steps per rank), evaluate and log (rank 0), checkpoint (rank 0 writes every rank's state). A
target rank 0 reaches is voted in the next exchange, as is a SIGINT/SIGTERM with
``checkpoint_on_exit`` (:mod:`dataecho.app.distributed.signals`). Each rank reads its own
share of the upstream, epoch after epoch on its own; the final model is the same on every
rank. ``nproc`` > 1 outside torchrun launches the ranks (:mod:`dataecho.app.distributed.launch`)
and returns rank 0's :class:`~dataecho.app.distributed.result.DistributedResult`.

Checkpoints (``checkpoint_dir``): every ``checkpoint_every`` steps and at the end, the model,
optimizer, loader state, counters, history and the loop's RNG, written atomically
(:mod:`dataecho.app.training.save_resume`). ``resume`` continues from the latest one. With
``checkpoint_on_exit``, SIGINT or SIGTERM also writes one at the step reached (the step under
way finishes first; a wait for data is cut short) before the run stops
(:mod:`dataecho.app.shutdown`). An in-memory upstream is map-style and resumes exactly where the
checkpoint was without re-reading anything; a shard upstream resumes from its own
checkpointed position (per worker): finished shards are not read again, and the current one
is read past its consumed records without decoding them.
With a fixed seed and ``num_workers`` 0 or 1, a resumed run's batches and losses equal those
of the uninterrupted run. ``echo_factor="auto"`` depends on timing: a resume continues its
stream without losing or doubling fresh examples, but not identically. Wall time after a
resume continues from the checkpoint's; the time between that checkpoint and the crash is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from dataecho.app.config import TrainConfig
from dataecho.app.distributed.control import Control, Tally
from dataecho.app.distributed.group import in_torchrun
from dataecho.app.distributed.launch import launch_ranks
from dataecho.app.distributed.rank import Rank, join_group
from dataecho.app.distributed.result import distributed_result, rank_counters
from dataecho.app.distributed.signals import StopSignals
from dataecho.app.distributed.strategy import make_sync
from dataecho.app.evaluation import BackgroundEvaluator
from dataecho.app.shutdown import ExitCheckpoint
from dataecho.app.training.device import training_device
from dataecho.app.training.loader import make_loader
from dataecho.app.training.recipe import (
    build_model,
    evaluate_split,
    measure_step_seconds,
    on_cpu,
    step_loss,
    to_device,
    torch_threads,
)
from dataecho.app.training.record import (
    EvalMark,
    RunCounters,
    TrainResult,
    cpu_since,
    dataset_size,
    ended_children_cpu_seconds,
    line_logger,
    train_result,
)
from dataecho.app.training.save_resume import (
    RESUME_MUST_MATCH,
    RunParts,
    resume_or_start,
    save,
    save_on_exit,
)
from dataecho.app.training.schedule import (
    checkpoint_due,
    count_exchange,
    next_checkpoint,
    periodic_evaluation,
    run_evaluations,
)
from dataecho.app.upstream import Data, build_data
from dataecho.errors import DataechoValueError
from dataecho.loader import EchoingDataLoader
from dataecho.profiling import ProfileReport, profile
from dataecho.progress import TrainingProgress

__all__ = [
    "RESUME_MUST_MATCH",
    "TrainConfig",
    "TrainResult",
    "make_loader",
    "measure_step_seconds",
    "profile_run",
    "train",
]


def train(config: TrainConfig, log: Callable[[str], None] = print) -> TrainResult:
    """Train as ``config`` says; log one line per evaluation. See the module docstring.

    The loop's state is its locals: ``run`` (the counters a checkpoint holds), ``history`` and
    ``losses``. Helpers take what they need and return what they change; only the loop
    assigns them."""
    cfg = config
    if cfg.nproc > 1 and not in_torchrun():
        training_device(cfg.device, local_rank=cfg.nproc - 1)  # refused here, not in a rank
        return launch_ranks(cfg, train)  # every rank runs this function under torchrun
    with contextlib.ExitStack() as stack:
        rank = stack.enter_context(join_group(cfg)) if in_torchrun() else None
        device = training_device(cfg.device) if rank is None else rank.info.device
        stack.enter_context(torch_threads(cfg.threads))  # why 1: the module docstring
        me, world = (None, 1) if rank is None else (rank.rank, rank.world_size)
        say = line_logger(cfg, log) if me in (None, 0) else (lambda line: None)
        torch.manual_seed(cfg.seed)  # the model's initial weights, the same on every rank
        data = build_data(cfg)
        model, optimizer = build_model(cfg, data)
        model.to(device)
        loader = make_loader(cfg, data, device=device)
        sync = make_sync(cfg, model, rank)  # none, ddp or local-echo
        parts = RunParts(data, model, optimizer, loader, sync, rank)
        run = RunCounters(next_eval=cfg.eval_every, next_checkpoint=cfg.checkpoint_every)
        history: list[dict[str, float]] = []
        losses: list[float] = []
        if cfg.checkpoint_dir is not None:
            run, history, losses = resume_or_start(cfg, parts, run, say)
        sync.start(loader.stats.fresh_examples)  # every rank from rank 0's model
        group = "" if rank is None else (f"{world} ranks ({rank.info.backend}, sync "
                                         f"{cfg.sync}); rank 0 ")  # fmt: skip
        say(f"[{cfg.name}] {group}upstream: {data.description}; training on {device}")

        bar = TrainingProgress(loader, desc=cfg.name, batch_size=cfg.batch_size,
                               disable=not cfg.progress or rank is not None,
                               total_steps=cfg.max_steps)  # fmt: skip
        start = time.perf_counter() - run.seconds  # after a resume: the checkpoint's wall time
        children_before = ended_children_cpu_seconds()
        if rank is not None:  # a rank's first row measures from here, resumed or not
            run.mark = EvalMark.now(loader.stats, run.seconds)

        def save_on_signal(loader_state: dict[str, Any]) -> Path:
            # One process on SIGINT/SIGTERM (dataecho.app.shutdown): the loop's state as it is
            # when the signal stops it, read here and changed nowhere.
            now = dataclasses.replace(run, seconds=time.perf_counter() - start)
            return save_on_exit(cfg, parts, now, history, losses, loader_state)

        on_exit = ExitCheckpoint(loader, save_on_signal if cfg.checkpoint_on_exit and rank is None
                                 else None, log=say, label=cfg.name)  # fmt: skip
        signals = rank.signals if rank is not None else StopSignals(enabled=False)
        comm_row = None if rank is None else rank.comm_row  # more keys in evaluation rows
        evaluate_copy = functools.partial(periodic_evaluation, cfg, split=data.eval_set)
        evaluator = (
            BackgroundEvaluator(model, evaluate_copy)
            if cfg.eval_in_background and rank is None
            else None
        )
        probe = functools.partial(_probe, cfg, data.eval_set, device)
        tally = Tally(signals, loader.stats.fresh_examples)  # for the next exchange
        batches = on_exit.batches(_epochs(cfg, data, loader, bar, rank))
        with (
            bar,
            loader,
            on_exit,
            evaluator or contextlib.nullcontext(),
            contextlib.closing(batches),
        ):  # on the way out: batches, evaluation thread, handlers, workers, bar
            while not run.done:
                work_before = loader.stats.work_seconds
                got = signals.fetch(batches)
                if got is None:  # signalled, and no batch within the grace: stop
                    summed = sync.void_exchange(tally.void(), probe, optimizer)
                    _stop(cfg, rank, run.global_steps, summed, say)
                run.epoch, batch = got
                t0 = time.perf_counter()
                loss = step_loss(cfg, sync.net, to_device(batch, device))
                optimizer.zero_grad(set_to_none=True)
                now = loader.stats.fresh_examples
                tally.step(now)
                summed = sync.backward(loss, tally.control(run.stop_vote))  # ddp: an exchange
                if summed is not None and summed.void:  # a rank has no step: none is taken
                    _stop(cfg, rank, run.global_steps, summed, say)
                optimizer.step()
                # The training thread's compute per step: the step, and the loader's work on
                # this thread (where=device: augmenting the copy), so R's t_down holds it all.
                worked = loader.stats.work_seconds - work_before
                run.step_seconds += time.perf_counter() - t0 + worked
                run.steps += 1
                losses.append(loss.item())
                run.loss_sum, run.loss_count = run.loss_sum + losses[-1], run.loss_count + 1
                if summed is None:  # local-echo: at a sync point; one process: every step
                    summed = sync.after_step(now, tally.control(run.stop_vote))

                if summed is not None:  # an exchange: the same decisions on every rank
                    if summed.void:
                        _stop(cfg, rank, run.global_steps, summed, say)
                    tally.exchanged()
                    run = count_exchange(cfg, run, summed)
                    run, rows = run_evaluations(cfg, run, model, loader, data, start, say,
                                                evaluator, rank=me, world=world,
                                                extra=comm_row)  # fmt: skip
                    history.extend(rows)
                    if cfg.checkpoint_dir is not None and checkpoint_due(run, world):
                        run.next_checkpoint = next_checkpoint(cfg, run, world)
                        run = _checkpoint(cfg, parts, run, history, losses, start)
                    if summed.stopping:  # after the exchange, as a periodic checkpoint
                        # The final checkpoint, unless written (or resumed from) at this one.
                        if rank is not None and rank.saved_at != run.global_steps:
                            run = _checkpoint(cfg, parts, run, history, losses, start)
                        _stop(cfg, rank, run.global_steps, summed, say)
                on_exit.after_step()  # one process: a signal during the step stops it here
            run.seconds = time.perf_counter() - start
            counters = None if rank is None else rank.gather(rank_counters(rank, loader, run.steps))
        # The workers have stopped (and were waited for): their CPU is counted now.
        worker_cpu = cpu_since(children_before, ended_children_cpu_seconds())
        # Stopped at a target found in the background: the final figures are those of the
        # weights that reached it (the evaluator's copy), as they are in line.
        at_target = evaluator is not None and run.to_target is not None and cfg.stop_at_target
        weights = evaluator.weights if at_target else model
        final = (evaluate_split(cfg, on_cpu(weights), data.final_set, full=True)
                 if me in (None, 0) else (None, float("nan")))  # fmt: skip
    result = train_result(cfg, run, loader, final, history, losses, worker_cpu)
    if rank is None:
        return result
    assert counters is not None
    return distributed_result(result, counters, fresh=run.fresh, rank=rank.rank, sync=cfg.sync)


def _checkpoint(cfg: TrainConfig, parts: RunParts, run: RunCounters, history: list,
                losses: list, start: float) -> RunCounters:  # fmt: skip
    """A checkpoint at an exchange, with the wall time so far (from ``start``) in it; the
    counters after it (its time in ``checkpoint_seconds``)."""
    _, run = save(cfg, parts, dataclasses.replace(run, seconds=time.perf_counter() - start),
                  history, losses)  # fmt: skip
    return run


def _stop(cfg: TrainConfig, rank: Rank | None, global_steps: int, summed: Control,
          say: Callable[[str], None]) -> NoReturn:  # fmt: skip
    """The exchange ``summed`` voted to stop (or was void): every rank stops after it
    (:meth:`.Rank.stop_on_signal`; the loop wrote the final checkpoint). One process never
    votes: its signals stop it in :class:`~dataecho.app.shutdown.ExitCheckpoint`."""
    assert rank is not None
    rank.stop_on_signal(cfg, global_steps, summed, say)


def _probe(cfg: TrainConfig, split: tuple, device: torch.device,
           net: torch.nn.Module) -> torch.Tensor:  # fmt: skip
    """A loss without a batch of ours (one example of ``split``): a void gradient round's."""
    inputs, targets = split
    return step_loss(cfg, net, to_device((inputs[:1], targets[:1]), device))


def _epochs(cfg: TrainConfig, data: Data, loader: EchoingDataLoader, bar: TrainingProgress,
            rank: Rank | None) -> Iterator[tuple[int, Any]]:  # fmt: skip
    """This process's ``(epoch, batch)`` pairs, epoch after epoch, without end (each rank's
    epochs end on their own, so unequal shares cannot leave a rank waiting in a collective)."""
    while True:
        # From the loader, not counted here: a signal in the wait for an epoch's first batch
        # checkpoints the loader as it was before the wait (at the last epoch's end).
        epoch = loader.next_epoch
        data.set_epoch(epoch)
        # A loaded position continues its epoch, whose rest may be empty (a checkpoint taken
        # at its last batch, where only the end tells).
        continuing = loader.next_epoch == loader.epoch
        count = 0
        for batch in bar.wrap(loader):
            count += 1
            yield epoch, batch
        if count == 0 and not continuing:
            who = "the loader" if rank is None else f"rank {rank.rank}'s loader"
            shared = "" if rank is None else f", shared by {rank.world_size} ranks"
            raise DataechoValueError(
                f"{who} gave no batch of {cfg.batch_size}: the training set has "
                f"{dataset_size(data)} examples{shared}; use a smaller batch_size or more data"
            )


def profile_run(cfg: TrainConfig, seconds: float = 10.0) -> ProfileReport:
    """Is the run ``cfg`` describes input-bound? Times its real upstream and its real step."""
    device = training_device(cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        data = build_data(cfg)
        model, optimizer = build_model(cfg, data)
        model.to(device)

        def step(batch: Any) -> None:
            loss = step_loss(cfg, model, to_device(batch, device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        loader = make_loader(cfg, data, device=device)
        try:
            return profile(loader, step, seconds=seconds)
        finally:
            loader.close()
