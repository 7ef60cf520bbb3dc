"""When the loop evaluates, what it records, and when a run is done (budget or target).

Evaluations run on a schedule of fresh examples (``eval_every``), in line or in a background
thread on a snapshot (:mod:`dataecho.app.evaluation`); a target counts when its evaluation has
finished, and only a full evaluation (not a screen) decides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dataecho.app.config import TrainConfig
from dataecho.app.evaluation import BackgroundEvaluator
from dataecho.app.training.recipe import better, evaluate_split, metric_key
from dataecho.app.training.record import RunCounters, history_row, log_line
from dataecho.app.upstream import Data
from dataecho.loader import EchoingDataLoader


def at_limit(cfg: TrainConfig, run: RunCounters, fresh: int) -> bool:
    return fresh >= cfg.budget or (cfg.max_steps is not None and run.steps >= cfg.max_steps)


def run_evaluations(
    cfg: TrainConfig, run: RunCounters, model: torch.nn.Module, loader: EchoingDataLoader, data: Data,
    history: list, start: float, say: Callable[[str], None],
    evaluator: BackgroundEvaluator | None,
) -> None:  # fmt: skip
    """After a step: evaluate when the schedule says so (in line, or handed to ``evaluator``),
    log what finished and decide whether the run is done."""
    fresh = loader.stats.fresh_examples
    limit = at_limit(cfg, run, fresh)
    due = fresh >= run.next_eval or limit
    if due:
        run.next_eval = (fresh // cfg.eval_every + 1) * cfg.eval_every
    t0 = time.perf_counter()
    if evaluator is None:
        if due:
            result = periodic_evaluation(cfg, model, data.eval_set)
            run.eval_seconds += time.perf_counter() - t0
            row = history_row(cfg, run, loader, *result, time.perf_counter() - start)
            record_evaluation(cfg, run, history, say, row, result, row["seconds"])
    else:
        # Results first (one snapshot at a time: a due evaluation waits for the last), so
        # that a run done at its target keeps that target's snapshot in the evaluator.
        for row, result in evaluator.wait() if due else evaluator.poll():
            record_evaluation(cfg, run, history, say, row, result, time.perf_counter() - start)
        if due and not run.done:  # the row: the snapshot's figures; its metric comes later
            row = history_row(cfg, run, loader, float("nan"), 0, time.perf_counter() - start)
            evaluator.submit(model, row)
            if limit:
                for row, result in evaluator.wait():
                    record_evaluation(
                        cfg, run, history, say, row, result, time.perf_counter() - start
                    )
        run.eval_seconds += (time.perf_counter() - t0) if due else 0.0
    run.done = run.done or limit


def record_evaluation(
    cfg: TrainConfig, run: RunCounters, history: list, say: Callable[[str], None],
    row: dict[str, float], result: tuple[float, int], known: float,
) -> None:  # fmt: skip
    """Record one finished evaluation; ``known``: when the run learned its result."""
    metric, screened = result
    row.update({metric_key(cfg): metric, "screened": screened})
    history.append(row)
    say(log_line(cfg, row))
    reached = cfg.target is not None and not screened and better(cfg, metric, cfg.target)
    if reached and run.to_target is None:
        run.to_target = [row["fresh"], row["steps"], known]
    run.done = run.done or (reached and cfg.stop_at_target)


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
        near = cfg.target - cfg.screen_margin if cfg.workload == "cnn" else (
            cfg.target + cfg.screen_margin)  # fmt: skip
        if not better(cfg, screen, near):
            return screen, 1
        # The screen was the full evaluation's first n examples: only the rest remain to do.
        rest = evaluate_split(cfg, model, (inputs[n:], targets[n:]))
        total = screen * n + rest * (len(inputs) - n)
        # cnn: whole counts of correct answers, so the same float as one pass over all
        return (round(total) if cfg.workload == "cnn" else total) / len(inputs), 0
    return evaluate_split(cfg, model, split), 0
