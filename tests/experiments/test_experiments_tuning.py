"""The fairness harness: quasi-random points, selection by fewest fresh examples, summaries."""

from __future__ import annotations

import math

import pytest

from experiments.common.tuning import (
    LogUniform,
    Trial,
    quasi_random_points,
    repeated_search,
    search,
    select_best,
    summarize,
)

SPACE = {"lr": LogUniform(1e-3, 1.0), "one_minus_momentum": LogUniform(0.01, 0.5)}


def cost(params: dict[str, float]) -> int:
    """A known objective: fewest fresh examples at lr = 0.1 (any momentum)."""
    return 100 + round(1000 * abs(math.log10(params["lr"]) + 1.0))


def objective(params, seed, limit):  # noqa: ANN001, ANN201
    return Trial(params, cost(params), {"seed": seed, "limit": limit})


def test_points_lie_in_the_space_and_depend_on_the_seed() -> None:
    a = quasi_random_points(SPACE, 8, seed=0)
    assert len(a) == 8
    for p in a:
        assert 1e-3 <= p["lr"] <= 1.0 and 0.01 <= p["one_minus_momentum"] <= 0.5
    assert quasi_random_points(SPACE, 8, seed=0) == a  # seeded: reproducible
    assert quasi_random_points(SPACE, 8, seed=1) != a
    assert len({round(p["lr"], 12) for p in a}) == 8  # no repeated points


def test_points_cover_the_log_range() -> None:
    lrs = [p["lr"] for p in quasi_random_points({"lr": LogUniform(1e-4, 1.0)}, 16, seed=3)]
    # Sobol: every quarter of the log range holds some of 16 points.
    quarters = {min(int((math.log10(x) + 4) // 1), 3) for x in lrs}
    assert quarters == {0, 1, 2, 3}


def test_search_selects_the_trial_with_fewest_fresh_examples() -> None:
    result = search(objective, SPACE, trials=6, seed=0)
    assert len(result.trials) == 6
    assert result.best is not None
    assert result.best.fresh_to_target == min(cost(t.params) for t in result.trials)
    assert result.best_fresh == result.best.fresh_to_target
    # Each trial was told the best count before it (None for the first): the pruning bound.
    seen = []
    for t in result.trials:
        assert t.info["limit"] == (min(seen) if seen else None)
        seen.append(t.fresh_to_target)


def test_repeated_searches_use_different_points_and_training_seeds() -> None:
    results = repeated_search(objective, SPACE, trials=4, seeds=[0, 1, 2])
    assert [r.seed for r in results] == [0, 1, 2]
    points = [tuple(t.params["lr"] for t in r.trials) for r in results]
    assert len(set(points)) == 3
    train_seeds = [t.info["seed"] for r in results for t in r.trials]
    assert len(set(train_seeds)) == len(train_seeds)


def test_unreached_trials_are_never_selected() -> None:
    trials = [Trial({"lr": 1.0}, None), Trial({"lr": 0.1}, 500), Trial({"lr": 0.2}, 300)]
    assert select_best(trials) is trials[2]
    assert select_best([Trial({"lr": 1.0}, None)]) is None
    result = search(lambda p, s, lim: Trial(p, None), SPACE, trials=3, seed=0)
    assert result.best is None and result.best_fresh == math.inf


def test_ties_go_to_the_earlier_trial() -> None:
    trials = [Trial({"lr": 0.1}, 400), Trial({"lr": 0.2}, 400)]
    assert select_best(trials) is trials[0]


def test_summarize() -> None:
    assert summarize([300, 100, 200]) == {
        "min": 100.0, "median": 200.0, "max": 300.0, "n": 3, "reached": 3,
    }  # fmt: skip
    s = summarize([100, math.inf, 200])
    assert (s["min"], s["median"], s["max"], s["reached"]) == (100.0, 200.0, math.inf, 2)
    # Most searches failed: the median is not a finite count.
    assert summarize([100, math.inf, math.inf])["median"] == math.inf
    assert summarize([100, 300])["median"] == 200.0


def test_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="low=0"):
        LogUniform(0, 1.0)
    with pytest.raises(ValueError, match="trials"):
        quasi_random_points(SPACE, 0, seed=0)
    with pytest.raises(ValueError, match="seeds is empty"):
        repeated_search(objective, SPACE, trials=2, seeds=[])
    with pytest.raises(ValueError, match="no values"):
        summarize([])
