"""Agarwal et al. 2020, "Stochastic optimization with laggard data pipelines", at small scale.

    python -m experiments laggard [--quick] [--out DIR] [--seed N]

- :mod:`~experiments.laggard.experiment`: :func:`run`, the problems and their grids
  (:data:`QUICK`, :data:`FULL`);
- :mod:`~experiments.laggard.sweep`: the (method, B, K) sweep, each cell over a whole rate
  grid, Nesterov's momentum tuned on top;
- :mod:`~experiments.laggard.claims`: each claim's verdict and the modelled wall time;
- :mod:`~experiments.laggard.report` and :mod:`~experiments.laggard.plots`: the README.

The problems, their optimum and the convergence measurement are shared
(:mod:`experiments.common`); the echoed optimizers are :mod:`dataecho.optim`.
Results: docs/results/laggard/README.md.
"""

from experiments.laggard.experiment import FULL, QUICK, load_results, run, run_problem

__all__ = ["FULL", "QUICK", "load_results", "run", "run_problem"]
