"""The experiments' training loop: one in-memory trial, to a target or a fresh-example cap.

:func:`run_trial` trains a :class:`TrialWorkload`'s model under one :class:`Condition` (echo
factor, insertion point, post-echo shuffle, batch size) and returns a tuning
:class:`~experiments.common.tuning.Trial`: the fresh examples it needed to reach the target
(None if it did not, or diverged) and what it measured on the way. Every grid of the choi
experiment runs through it.

The data flows through the library's :class:`dataecho.loader.EchoingDataLoader` in this
process (``num_workers=0``), so the real echo, shuffle, augment and batch stages run and the
fresh-example count is the loader's own. It is deliberately not the application's loop
(:func:`dataecho.app.train.train`):

- no upstream and no application loader (``make_loader``): the dataset is already in memory,
  because a trial measures fresh examples to a target, not read time; wall time comes from
  the time model (:func:`dataecho.profiling.time_model`) with the step time measured here;
- no checkpoints, resume, progress or run records: a trial is short and is re-run, not
  resumed, so the loader's state snapshots are switched off;
- compute-bound and small: a grid is hundreds of tuned trials on a few CPU cores, one torch
  thread each, so the loop adds nothing per step beyond the step, its timer and the
  evaluation cadence.

A trial may be pruned: with ``limit`` (the fewest fresh examples an earlier trial of the same
search needed) it stops there, since it could no longer be selected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dataecho.loader import EchoingDataLoader
from experiments.common.tuning import Trial


@dataclass
class TrialWorkload:
    """What a trial needs: data, model and optimizer factories, the metric and its target."""

    name: str
    train: Any  # map-style dataset of examples
    transform: Callable[[Any], Any] | None
    make_model: Callable[[], nn.Module]
    make_optimizer: Callable[[nn.Module, dict[str, float]], torch.optim.Optimizer]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    metric: Callable[[nn.Module], float]  # on held-out data
    target: float
    higher_is_better: bool
    eval_every: int  # fresh examples between evaluations
    budget: int  # most fresh examples a trial may read

    def reached(self, value: float) -> bool:
        """Whether the metric ``value`` meets the target."""
        return value >= self.target if self.higher_is_better else value <= self.target


@dataclass(frozen=True)
class Condition:
    """One cell of the grid: echo factor, insertion point, post-echo shuffle, batch size."""

    echo_factor: float
    where: str
    shuffle_buffer: int
    batch_size: int


def run_trial(
    wl: TrialWorkload,
    cond: Condition,
    params: dict[str, float],
    seed: int,
    limit: int | None = None,
    *,
    stop_at_target: bool = True,
    budget: int | None = None,
    eval_every: int | None = None,
) -> Trial:
    """Train until the target (or ``budget`` / ``limit`` fresh examples); return the trial.

    The metric is evaluated every ``eval_every`` fresh examples (the workload's by default)
    and at the cap; ``stop_at_target=False`` trains on to the cap (fixed-budget runs). A
    non-finite loss ends the trial as diverged (never reaching the target). ``info``: final
    metric, fresh examples read, steps, realized echo factor, the median seconds of one
    training step (``t_down``, for the time model), ``diverged`` and the evaluation
    ``history`` as (fresh examples, metric) pairs.
    """
    budget = wl.budget if budget is None else budget
    every = wl.eval_every if eval_every is None else eval_every
    cap = budget if limit is None else min(budget, limit)
    torch.manual_seed(seed)
    model = wl.make_model()
    opt = wl.make_optimizer(model, params)
    loader = EchoingDataLoader(
        wl.train,
        batch_size=cond.batch_size,
        echo_factor=cond.echo_factor,
        where=cond.where,
        shuffle_buffer=cond.shuffle_buffer,
        transform=wl.transform,
        num_workers=0,
        seed=seed,
        shuffle=True,
        drop_last=True,
        snapshot_every_n_steps=1 << 30,  # no checkpoints here: skip the state snapshots
    )
    steps, next_eval, to_target, metric, diverged = 0, every, None, math.nan, False
    step_times: list[float] = []
    history: list[tuple[int, float]] = []  # (fresh examples, metric) at each evaluation
    done = False
    try:
        while not done:
            for batch in loader:
                t0 = time.perf_counter()
                loss = wl.loss(model, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step_times.append(time.perf_counter() - t0)
                steps += 1
                if not math.isfinite(loss.item()):
                    diverged = done = True
                    break
                fresh = loader.stats.fresh_examples
                if fresh >= next_eval or fresh >= cap:
                    metric = wl.metric(model)
                    history.append((fresh, metric))
                    next_eval = (fresh // every + 1) * every
                    if to_target is None and wl.reached(metric):
                        to_target = fresh
                        done = stop_at_target
                    done = done or fresh >= cap
                if done:
                    break
    finally:
        loader.close()
    if diverged:
        to_target, metric = None, math.nan
    step_times.sort()
    return Trial(
        params=dict(params),
        fresh_to_target=to_target,
        info={
            "metric": metric,
            "fresh": loader.stats.fresh_examples,
            "steps": steps,
            "realized_factor": loader.stats.realized_factor,
            "t_down": step_times[len(step_times) // 2] if step_times else math.nan,
            "diverged": diverged,
            "history": history,
        },
    )
