"""A lean in-memory training loop for the reproductions: real echoing loader, tiny models.

Why not :func:`dataecho.app.train.train`: the counts need no slow upstream, and the grids run
hundreds of trials on 2 cores, so the models here are a few times smaller than the demo's
(``TinyCNN``: ~40 k parameters; the char LM: 1 layer, d_model 32, context 32). The data still
flows through :class:`dataecho.EchoingDataLoader` (``num_workers=0``): the real echo, shuffle,
augment and batch stages run, and fresh examples are the loader's own count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dataecho.loader import EchoingDataLoader
from experiments.tuning import Trial


class TinyCNN(nn.Module):
    """conv5x5/2(8) -> conv3x3/2(16) -> fc(64) -> fc(10): SmallCNN's shape at half width."""

    def __init__(self, width: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 5, stride=2, padding=2)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(2 * width * 49, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


@dataclass
class Workload:
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
        return value >= self.target if self.higher_is_better else value <= self.target


@dataclass(frozen=True)
class Condition:
    """One cell of the grid: echo factor, insertion point, post-echo shuffle, batch size."""

    echo_factor: float
    where: str
    shuffle_buffer: int
    batch_size: int


def run_trial(
    wl: Workload,
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

    ``eval_every`` (fresh examples) overrides the workload's. ``info``: final metric, fresh
    examples read, steps, realized echo factor, and the median
    seconds of one training step (t_down, for the time model).
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
