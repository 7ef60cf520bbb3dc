"""The fairness harness: tune every condition separately, pick by fresh examples to target.

As Choi et al. did (and the ICLR 2025 reviewers asked): for each condition run a small
quasi-random search over the learning rate (log-uniform) and, where used, the momentum; keep
the trial that reaches the target with the *fewest fresh examples*; repeat the whole search for
several seeds and report min / median / max of the selected counts.

    space = {"lr": LogUniform(1e-3, 1.0), "one_minus_momentum": LogUniform(0.01, 0.5)}
    results = repeated_search(objective, space, trials=4, seeds=[0, 1, 2])
    summarize([r.best_fresh for r in results])

``objective(params, seed, limit)`` trains once and returns a :class:`Trial`; ``limit`` is the
fewest fresh examples any earlier trial of the same search needed (None at first). A trial
that has used more than ``limit`` fresh examples cannot be selected any more, so the objective
may stop there: this pruning changes no selection, it only saves time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dataecho import _validate


@dataclass(frozen=True)
class LogUniform:
    """A hyperparameter drawn log-uniformly from ``[low, high]`` (both > 0)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (0 < self.low <= self.high and math.isfinite(self.high)):
            raise ValueError(
                f"LogUniform needs 0 < low <= high < inf, got low={self.low!r}, "
                f"high={self.high!r}; e.g. LogUniform(1e-3, 1.0) for a learning rate"
            )

    def at(self, u: float) -> float:
        """The value at quantile ``u`` in [0, 1]."""
        return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))


@dataclass
class Trial:
    """One training run: its hyperparameters and what it reached.

    ``fresh_to_target`` is None when the target was not reached (or the trial was pruned);
    ``info`` holds anything else the objective wants reported (final metric, steps, ...).
    """

    params: dict[str, float]
    fresh_to_target: int | None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResult:
    """All trials of one search and the one it selects (None: no trial reached the target)."""

    seed: int
    trials: list[Trial]
    best: Trial | None

    @property
    def best_fresh(self) -> float:
        """Fresh examples to target of the selected trial; ``inf`` if none reached it."""
        return math.inf if self.best is None else float(self.best.fresh_to_target)


Objective = Callable[[dict[str, float], int, "int | None"], Trial]


def quasi_random_points(
    space: Mapping[str, LogUniform], trials: int, seed: int
) -> list[dict[str, float]]:
    """``trials`` points of a scrambled Sobol sequence (seeded) mapped into ``space``."""
    trials = _validate.positive_int(trials, name="trials", hint="e.g. 4 trials per search")
    if not space:
        return [{} for _ in range(trials)]
    engine = torch.quasirandom.SobolEngine(len(space), scramble=True, seed=_validate.seed(seed))
    units = engine.draw(trials, dtype=torch.float64).tolist()
    return [
        {k: dist.at(u) for (k, dist), u in zip(space.items(), row, strict=True)} for row in units
    ]


def select_best(trials: Sequence[Trial]) -> Trial | None:
    """The trial with the fewest fresh examples to target (the first of equals); None if none."""
    reached = [t for t in trials if t.fresh_to_target is not None]
    return min(reached, key=lambda t: t.fresh_to_target) if reached else None


def search(
    objective: Objective, space: Mapping[str, LogUniform], *, trials: int, seed: int
) -> SearchResult:
    """One quasi-random search: run every point, pass each trial the best count so far."""
    done: list[Trial] = []
    for i, params in enumerate(quasi_random_points(space, trials, seed)):
        best = select_best(done)
        limit = None if best is None else best.fresh_to_target
        # Trial i of search `seed` gets its own training seed, so seeds repeat nothing.
        trial = objective(params, seed * 1000 + i, limit)
        done.append(trial)
    return SearchResult(seed=seed, trials=done, best=select_best(done))


def repeated_search(
    objective: Objective,
    space: Mapping[str, LogUniform],
    *,
    trials: int,
    seeds: Sequence[int],
) -> list[SearchResult]:
    """:func:`search` once per seed (different quasi-random points and training seeds)."""
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed, e.g. seeds=[0, 1, 2]")
    return [search(objective, space, trials=trials, seed=s) for s in seeds]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of ``values`` (``inf`` = target not reached) and how many reached.

    The median counts unreached searches as infinitely expensive, so it is finite only when
    more than half reached the target.
    """
    if not values:
        raise ValueError("summarize() got no values; pass one count per seed")
    vals = sorted(float(v) for v in values)
    return {
        "min": vals[0],
        "median": statistics.median(vals),
        "max": vals[-1],
        "n": len(vals),
        "reached": sum(v < math.inf for v in vals),
    }
