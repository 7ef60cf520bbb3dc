"""When the loop evaluates and checkpoints, what it records, and when a run is done (budget
or target).

The loop decides after an *exchange* (after every step in a single process; where the ranks
sum their counts in a data-parallel run: :mod:`dataecho.app.distributed.strategy`), from the
run's counts as of that exchange, so every rank decides the same. Evaluations run on a
schedule of fresh examples (``eval_every``), in line or in a background thread on a copy
(:mod:`dataecho.app.evaluation`); a target counts when its evaluation has finished, and only a
full evaluation (not a screen) decides it. Checkpoints: every ``checkpoint_every`` steps (mean
per rank) and at the end.

The loop's counters go in and changed ones come back (:class:`~.record.RunCounters`): nothing
here changes what it was given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from dataecho.app import workloads
from dataecho.app.config import TrainConfig
from dataecho.app.distributed.control import Control
from dataecho.app.evaluation import BackgroundEvaluator
from dataecho.app.training.recipe import better, evaluate_split, metric_key, on_cpu
from dataecho.app.training.record import RunCounters, TargetHit, history_row, log_line
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader


def at_limit(
    cfg: TrainConfig, run: RunCounters, world: int = 1, loader: EchoingDataLoader | None = None
) -> bool:
    """``max_steps`` taken (mean steps per rank), or the budget of fresh examples spent: with
    ``loader`` (one process, no process group), once the copies it still owes of the examples
    counted are trained on too (where it can drain: :meth:`EchoingDataLoader.drain`), so a
    budget stop trains every counted example as often as the factor says. Ranks pass no
    loader and stop at the budget itself: they would drain unequal numbers of batches, and
    local-echo exchanges only at fresh batches."""
    if cfg.max_steps is not None and run.global_steps // world >= cfg.max_steps:
        return True
    if run.fresh < cfg.budget:
        return False
    return loader is None or not loader.drain() or loader.drained


def count_exchange(cfg: TrainConfig, run: RunCounters, summed: Control) -> RunCounters:
    """The run's counts with an exchange's control numbers added (fresh examples and steps of
    every rank since the last one, the target's vote: :mod:`dataecho.app.distributed.control`)."""
    # A target rank 0 reached at the exchange before ends the run here, on every rank.
    done = run.done or (summed.target and cfg.stop_at_target)
    return replace(run, fresh=run.fresh + summed.fresh,
                   global_steps=run.global_steps + summed.steps, done=done)  # fmt: skip


def checkpoint_due(run: RunCounters, world: int = 1) -> bool:
    """Whether this exchange writes a checkpoint: the end, or ``run.next_checkpoint`` reached
    (steps per rank; :func:`next_checkpoint` moves it on)."""
    return run.done or run.global_steps // world >= run.next_checkpoint


def next_checkpoint(cfg: TrainConfig, run: RunCounters, world: int = 1) -> int:
    """Steps per rank at the periodic checkpoint after one written now: the next multiple of
    ``checkpoint_every``."""
    return (run.global_steps // world // cfg.checkpoint_every + 1) * cfg.checkpoint_every


def run_evaluations(
    cfg: TrainConfig, run: RunCounters, model: torch.nn.Module, loader: EchoingDataLoader, data: Data,
    start: float, say: Callable[[str], None], evaluator: BackgroundEvaluator | None, *,
    rank: int | None = None, world: int = 1, extra: Callable[[], dict[str, float]] | None = None,
) -> tuple[RunCounters, list[dict[str, float]]]:  # fmt: skip
    """After an exchange: evaluate when the schedule says so (in line, or handed to
    ``evaluator``), log what finished and decide whether the run is done. Returns the counters
    after it and the history rows of the evaluations that finished (``start``: the wall clock's
    zero, from which the rows' seconds count).

    Data parallel (``rank`` set: this process's among ``world``): only rank 0 evaluates, in
    line; its rows get ``extra()``'s keys, and a target it reaches is voted at the next
    exchange (:func:`count_exchange`) so that every rank stops at the same one.
    """
    # Ranks stop at the budget itself (at_limit): they would drain unequal numbers of batches.
    limit = at_limit(cfg, run, world, loader if rank is None else None)
    due = run.fresh >= run.next_eval or limit
    if due:
        run = replace(run, next_eval=(run.fresh // cfg.eval_every + 1) * cfg.eval_every)
    rows: list[dict[str, float]] = []
    t0 = time.perf_counter()
    if evaluator is None:
        if due and rank in (None, 0):
            result = periodic_evaluation(cfg, on_cpu(model), data.eval_set)
            run = replace(run, eval_seconds=run.eval_seconds + time.perf_counter() - t0)
            row, run = history_row(cfg, run, loader, *result, time.perf_counter() - start,
                                   extra() if extra else None)  # fmt: skip
            row, run = record_evaluation(cfg, run, say, row, result, row["seconds"],
                                         vote=rank is not None)  # fmt: skip
            rows.append(row)
    else:
        # Results first (one copy at a time: a due evaluation waits for the last), so
        # that a run done at its target keeps that target's copy in the evaluator.
        for row, result in evaluator.wait() if due else evaluator.poll():
            row, run = record_evaluation(cfg, run, say, row, result, time.perf_counter() - start)
            rows.append(row)
        if due and not run.done:  # the row: the copy's figures; its metric comes later
            row, run = history_row(cfg, run, loader, float("nan"), 0, time.perf_counter() - start)
            evaluator.submit(model, row)
            if limit:
                for row, result in evaluator.wait():
                    row, run = record_evaluation(
                        cfg, run, say, row, result, time.perf_counter() - start
                    )
                    rows.append(row)
        if due:
            run = replace(run, eval_seconds=run.eval_seconds + time.perf_counter() - t0)
    return replace(run, done=run.done or limit), rows


def record_evaluation(
    cfg: TrainConfig, run: RunCounters, say: Callable[[str], None], row: dict[str, float],
    result: tuple[float, int], known: float, *, vote: bool = False,
) -> tuple[dict[str, float], RunCounters]:  # fmt: skip
    """One finished evaluation: ``row`` with its ``result`` in (the history's row; logged) and
    the counters with a target it reached. ``known``: when the run learned the result.
    ``vote``: a target reached stops the run at the next exchange, not here (data parallel)."""
    metric, screened = result
    row = {**row, metric_key(cfg): metric, "screened": screened}
    say(log_line(cfg, row))
    reached = cfg.target is not None and not screened and better(cfg, metric, cfg.target)
    if reached and run.to_target is None:
        hit = TargetHit(int(row["fresh"]), int(row["steps"]), known)
        run = replace(run, to_target=hit, stop_vote=vote)
    return row, replace(run, done=run.done or (reached and cfg.stop_at_target and not vote))


def periodic_evaluation(cfg: TrainConfig, model: torch.nn.Module, split: tuple) -> tuple:
    """``(metric, screened)``: with ``screen_examples``, a cheap look first.

    Evaluations cost wall time, and a run echoing e times evaluates as often per fresh example
    as one without: the screen (e.g. 1,000 of 5,000 examples, a fifth of the time) answers
    "far from the target" cheaply; only a screen within ``screen_margin`` of the target pays
    for the full evaluation, which alone decides whether the target is reached.
    """
    n, (inputs, targets) = cfg.screen_examples, split
    if n and cfg.target is not None and n < len(inputs):
        screen = evaluate_split(cfg, model, (inputs[:n], targets[:n]))
        workload = workloads.get(cfg.workload)
        near = workload.near(cfg.target, cfg.screen_margin)
        if not better(cfg, screen, near):
            return screen, 1
        # The screen was the full evaluation's first n examples: only the rest remain to do.
        rest = evaluate_split(cfg, model, (inputs[n:], targets[n:]))
        total = screen * n + rest * (len(inputs) - n)
        return workload.combine(total, len(inputs)), 0
    return evaluate_split(cfg, model, split), 0
