"""Fresh batches to converge over a rate grid (experiments.common.convergence)."""

from __future__ import annotations

import pytest
import torch

from experiments.common.convergence import checkpoints, fresh_batches_to_converge
from experiments.common.logistic import covertype_like
from experiments.common.optimum import lbfgs_optimum


@pytest.fixture(scope="module")
def problem():
    torch.set_num_threads(1)
    p = covertype_like(4000, label_noise=0.1, seed=0)
    return p, lbfgs_optimum(p, max_iter=100)


def test_checkpoints_start_at_the_window_and_grow() -> None:
    ends = checkpoints(1000, 10, 2 ** (1 / 8))
    assert ends[0] == 10 and ends[-1] <= 1000 and ends[-1] * 2 ** (1 / 8) > 1000 - 1
    assert all(b > a for a, b in zip(ends, ends[1:], strict=False))
    assert checkpoints(5, 10, 2.0) == []


@pytest.mark.timeout(120)
def test_large_batch_converges_counts_and_is_deterministic(problem) -> None:
    p, opt = problem
    lrs = 10 ** torch.arange(-2.0, 1.01, 0.5)
    kw = dict(method="gd", batch_size=1024, k=2, lrs=lrs, seeds=[0, 1], max_steps=400)
    trials = fresh_batches_to_converge(p, opt, **kw, eval_rows=4000)
    for t in trials:
        assert t.converged and t.fresh_batches >= 10 and t.steps == 2 * t.fresh_batches
        assert t.fresh_samples == 1024 * t.fresh_batches and float(t.lr) in lrs.tolist()
        assert t.suboptimality <= 0.01
    assert fresh_batches_to_converge(p, opt, **kw, eval_rows=4000) == trials
    # The converged iterate really is within 1% on all rows: re-run that rate alone, same
    # batches (seed 0 first), and measure the full loss at the stop.
    t0 = trials[0]
    again = fresh_batches_to_converge(p, opt, **kw | {"lrs": torch.tensor([t0.lr]), "seeds": [0]})
    assert again[0].converged and again[0].fresh_batches == t0.fresh_batches


@pytest.mark.timeout(120)
def test_tiny_budget_or_tiny_rates_do_not_converge(problem) -> None:
    p, opt = problem
    short = fresh_batches_to_converge(
        p, opt, method="prox", batch_size=64, k=1, lrs=torch.tensor([1.0]), seeds=[0],
        max_steps=15,
    )  # fmt: skip
    assert not short[0].converged and short[0].fresh_batches is None and short[0].lr is None
    slow = fresh_batches_to_converge(
        p, opt, method="nesterov", batch_size=256, k=1, lrs=torch.tensor([1e-4]), seeds=[0],
        max_steps=100,
    )  # fmt: skip
    assert not slow[0].converged and slow[0].suboptimality > 0.01
    assert slow[0].steps == checkpoints(100, 10, 2 ** (1 / 8))[-1]  # ran to the last checkpoint
