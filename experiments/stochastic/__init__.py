"""Stochastic data echoing (ICLR 2025 submission) at small scale.

    python -m experiments stochastic [--quick] [--out DIR] [--seed N]

- :mod:`~experiments.stochastic.experiment`: :func:`run`, its plan and the three
  measurements (loads to target against p and M, the schedules, the gradient bias);
- :mod:`~experiments.stochastic.training`: the MLP's training through the library's
  :class:`dataecho.StochasticEcho` stage, and the gradient-bias probe;
- :mod:`~experiments.stochastic.report`: tables, plots and the README.

Results: docs/results/stochastic/README.md.
"""

from experiments.stochastic.experiment import Plan, make_plan, run

__all__ = ["Plan", "make_plan", "run"]
