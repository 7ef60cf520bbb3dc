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

Threads: on the 2-core target machine the step runs on 1 torch thread here and the upstream
in 1 loader worker on the other core (the defaults). Wall seconds of 18,000 fresh examples,
e=1 / e=4, from ``dataecho train --read-delay 0.0006 --target-accuracy off --budget 18000
--threads T --num-workers W --echo-factor E`` (e=4 with a 1,024-example shuffle buffer; measured
with this loop's predecessor, same loader and step, on 2 cores shared with other jobs: rough):

    1 thread,  1 worker    12.7 / 19.9   <- the defaults
    2 threads, 1 worker    12.5 / 54.0   (step and worker fight for the cores)
    1 thread,  0 workers   14.1 / 28.7   (reads and augmentation stall the step)
    2 threads, 0 workers   18.3 / 26.0

Checkpoints (``checkpoint_dir``): every ``checkpoint_every`` steps and at the end, the model,
optimizer, loader state, counters, history and the loop's RNG, written atomically
(:mod:`dataecho.app.checkpoint`). ``resume`` continues from the latest one. With
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
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from dataecho.app.config import TrainConfig
from dataecho.app.distributed.group import in_torchrun
from dataecho.app.evaluation import BackgroundEvaluator
from dataecho.app.shutdown import ExitCheckpoint
from dataecho.app.training.checkpoints import RESUME_MUST_MATCH, resume_or_start, save, save_on_exit
from dataecho.app.training.loader import make_loader
from dataecho.app.training.recipe import (
    build_model,
    evaluate_split,
    measure_step_seconds,
    step_loss,
    torch_threads,
)
from dataecho.app.training.record import (
    RunCounters,
    TrainResult,
    dataset_size,
    line_logger,
    train_result,
)
from dataecho.app.training.schedule import periodic_evaluation, run_evaluations
from dataecho.app.upstream import build_data
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
    """Train as ``config`` says; log one line per evaluation. See the module docstring."""
    cfg = config
    if cfg.nproc > 1 or in_torchrun():  # data parallel: dataecho.app.distributed
        from dataecho.app.distributed import run_distributed

        return run_distributed(cfg, log)
    with torch_threads(cfg.threads):  # why 1: the module docstring's table
        torch.manual_seed(cfg.seed)  # the model's initial weights
        data = build_data(cfg)
        model, optimizer = build_model(cfg, data)
        loader = make_loader(cfg, data)
        run, history, losses = RunCounters(next_eval=cfg.eval_every), [], []
        if cfg.checkpoint_dir is not None:
            run, history, losses = resume_or_start(cfg, data, model, optimizer, loader, run, log)
        say = line_logger(cfg, log)
        say(f"[{cfg.name}] upstream: {data.description}")

        bar = TrainingProgress(loader, desc=cfg.name, batch_size=cfg.batch_size,
                               disable=not cfg.progress, total_steps=cfg.max_steps)  # fmt: skip
        start = time.perf_counter() - run.seconds  # after a resume: the checkpoint's wall time
        final_save = functools.partial(save_on_exit, cfg, run, model, optimizer, loader, data,
                                       history, losses, start)  # fmt: skip
        on_exit = ExitCheckpoint(loader, final_save if cfg.checkpoint_on_exit else None,
                                 log=say, label=cfg.name)  # signals: dataecho.app.shutdown  # fmt: skip
        evaluate_snapshot = functools.partial(periodic_evaluation, cfg, split=data.eval_set)
        evaluator = (
            BackgroundEvaluator(model, evaluate_snapshot) if cfg.eval_in_background else None
        )
        with bar, loader, on_exit, evaluator or contextlib.nullcontext():
            # on the way out: handlers restored, workers and evaluation thread stopped, bar
            while not run.done:  # one pass of the loader: one epoch of fresh data
                data.set_epoch(run.epoch)
                for batch in on_exit.batches(bar.wrap(loader)):
                    t0 = time.perf_counter()
                    loss = step_loss(cfg, model, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    run.step_seconds += time.perf_counter() - t0
                    run.steps += 1
                    losses.append(loss.item())
                    run.loss_sum, run.loss_count = run.loss_sum + losses[-1], run.loss_count + 1

                    run_evaluations(cfg, run, model, loader, data, history, start, say, evaluator)
                    if cfg.checkpoint_dir and (run.done or run.steps % cfg.checkpoint_every == 0):
                        run.seconds = time.perf_counter() - start
                        save(cfg, run, model, optimizer, loader, data, history, losses)
                    on_exit.after_step()  # a signal during the step: checkpoint, then stop
                    if run.done:
                        break
                else:
                    run.epoch += 1
                    if loader.stats.fresh_examples == 0:
                        raise ValueError(
                            f"the loader gave no batch of {cfg.batch_size}: the training set "
                            f"has {dataset_size(data)} examples; use a smaller batch_size or more"
                        )
            run.seconds = time.perf_counter() - start
        # Stopped at a target found in the background: the final figures are those of the
        # weights that reached it (the evaluator's snapshot), as they are in line.
        at_target = evaluator is not None and run.to_target is not None and cfg.stop_at_target
        weights = evaluator.snapshot if at_target else model
        final = evaluate_split(cfg, weights, data.final_set, full=True)
    return train_result(cfg, run, loader, final, history, losses)


def profile_run(cfg: TrainConfig, seconds: float = 10.0) -> ProfileReport:
    """Is the run ``cfg`` describes input-bound? Times its real upstream and its real step."""
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        data = build_data(cfg)
        model, optimizer = build_model(cfg, data)

        def step(batch: Any) -> None:
            loss = step_loss(cfg, model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        loader = make_loader(cfg, data)
        try:
            return profile(loader, step, seconds=seconds)
        finally:
            loader.close()
