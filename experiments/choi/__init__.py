"""Choi et al. 2019, "Faster neural network training with data echoing", at small scale.

    python -m experiments choi [--quick] [--out DIR] [--seed N]

- :mod:`~experiments.choi.experiment`: :func:`run`, the whole experiment;
- :mod:`~experiments.choi.plan`: the grid (workloads, echo factors, insertion points,
  shuffle, searches per cell);
- :mod:`~experiments.choi.scaling`: the batch-size scaling study at a higher target;
- :mod:`~experiments.choi.wall_time`: the time model and the timed check against it;
- :mod:`~experiments.choi.report` and :mod:`~experiments.choi.plots`: tables, claims, plots.

Results: docs/results/choi/README.md.
"""

from experiments.choi.experiment import run
from experiments.choi.plan import FACTORS, Plan, WorkloadPlan, cells, make_plan

__all__ = ["FACTORS", "Plan", "WorkloadPlan", "cells", "make_plan", "run"]
