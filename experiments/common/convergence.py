"""Fresh batches to converge: one (method, B, K, seed) trial over a whole learning-rate grid.

Every learning rate of the grid runs at once, as one ``(L, *weight_shape)`` weight tensor (the
rows are independent problems: the closure sums their losses). Batches are drawn with
replacement from a seeded generator, the weights start at zero, and the run stops at the first
checkpoint where some row has converged, which is then that trial's best learning rate: the
criterion is "fewest fresh batches to target", and all rows advance in lock-step.

Converged (Agarwal et al.): the mean of the last ``window`` training losses is within ``tol``
(relative) of the optimum. The losses are those of the iterates after each fresh batch's K steps
(the sequence the theory bounds), measured at checkpoints spaced by ``checkpoint_ratio`` (each
checkpoint evaluates the ``window`` consecutive iterates ending there, so the criterion is exact
at the checkpoints and T is known to within that spacing). The loss is measured on a fixed random
subset of ``eval_rows`` examples with the optimum's loss on the same subset as control variate:
``(F_S(w) - F_S(w*)) / F(w*)`` is unbiased for the relative suboptimality and, near the optimum,
far less noisy than ``F_S(w)`` alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from dataecho import _validate
from dataecho.optim import EchoedGD, EchoedNesterov, EchoedOptimizer, EchoedProxGD
from experiments.common.logistic import LogisticProblem, logistic_loss
from experiments.common.optimum import Optimum

METHODS = ("gd", "prox", "nesterov")


@dataclasses.dataclass(frozen=True)
class ConvergenceTrial:
    """One (method, B, K, seed) run over the rate grid; ``fresh_batches`` / ``lr`` are None
    when no rate converged (``suboptimality`` is then the best row's at the stop)."""

    method: str
    batch_size: int
    k: int
    seed: int
    converged: bool
    fresh_batches: int | None
    steps: int  # optimizer steps taken (k * fresh batches at the stop)
    lr: float | None
    suboptimality: float  # the chosen (or best) row's window mean at the stop

    @property
    def fresh_samples(self) -> int | None:
        return None if self.fresh_batches is None else self.batch_size * self.fresh_batches


def make_optimizer(
    method: str, params: list[torch.Tensor], lr, k: int, momentum=0.9
) -> EchoedOptimizer:
    """``method`` in :data:`METHODS`; prox uses gamma = lr; Nesterov a constant momentum."""
    _validate.one_of(method, METHODS, name="method")
    if method == "gd":
        return EchoedGD(params, lr, k)
    if method == "prox":
        return EchoedProxGD(params, lr, k)
    return EchoedNesterov(params, lr, k, momentum=momentum)


def checkpoints(max_batches: int, window: int, ratio: float) -> list[int]:
    """Checkpoint ends: ``window``, then growing by ``ratio`` (at least 1), up to the budget."""
    ends, c = [], float(window)
    while round(c) <= max_batches:
        if not ends or round(c) > ends[-1]:
            ends.append(round(c))
        c *= ratio
    return ends


def fresh_batches_to_converge(
    problem: LogisticProblem,
    optimum: Optimum,
    *,
    method: str,
    batch_size: int,
    k: int,
    lrs: torch.Tensor,
    seeds: Sequence[int],
    max_steps: int,
    tol: float = 0.01,
    window: int = 10,
    eval_rows: int = 16_384,
    checkpoint_ratio: float = 2 ** (1 / 8),
    momentum: float = 0.9,
) -> list[ConvergenceTrial]:
    """Run the grid ``lrs`` for every seed (one trial each, in one tensor computation) until
    each seed has a converged row or ``max_steps`` optimizer steps are spent."""
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    n = len(problem.y)
    eval_idx = torch.randperm(n, generator=torch.Generator().manual_seed(seeds[0]))[:eval_rows]
    x_eval, y_eval = problem.x[eval_idx], problem.y[eval_idx]
    c, l2 = problem.num_classes, problem.l2
    f_star_eval = float(logistic_loss(optimum.w, x_eval.double(), y_eval, c, l2))

    w = torch.zeros((len(seeds), len(lrs), *problem.weight_shape), requires_grad=True)
    lr = lrs.float().view(1, -1, *[1] * len(problem.weight_shape))
    opt = make_optimizer(method, [w], lr, k, momentum)
    ends = checkpoints(max(1, max_steps // k), window, checkpoint_ratio)
    ticks = {t for end in ends for t in range(end - window + 1, end + 1)}
    recent: list[torch.Tensor] = []
    trials: dict[int, ConvergenceTrial] = {}
    mean = torch.full((len(seeds), len(lrs)), math.inf)
    for t in range(1, (ends[-1] if ends else 0) + 1):
        idx = torch.stack([torch.randint(n, (batch_size,), generator=g) for g in gens])
        xb, yb = problem.x[idx], problem.y[idx]  # (seeds, B, d), (seeds, B)
        opt.fresh_batch(lambda xb=xb, yb=yb: logistic_loss(w, xb, yb, c, l2).sum())
        if t not in ticks:
            continue
        with torch.no_grad():
            f_eval = logistic_loss(w, x_eval, y_eval, c, l2).double()
        recent = [*recent[-(window - 1) :], (f_eval - f_star_eval) / optimum.loss]
        if t not in ends:
            continue
        mean = torch.stack(recent).mean(0).nan_to_num(math.inf)  # (seeds, lrs)
        for i, seed in enumerate(seeds):
            best = float(mean[i].min())
            if i not in trials and best <= tol:
                row = int(mean[i].argmin())
                trials[i] = ConvergenceTrial(method, batch_size, k, seed, True, t, opt.steps,
                                  float(lrs[row]), best)  # fmt: skip
        if len(trials) == len(seeds):
            break
    return [
        trials.get(i)
        or ConvergenceTrial(
            method, batch_size, k, seed, False, None, opt.steps, None, float(mean[i].min())
        )
        for i, seed in enumerate(seeds)
    ]
