"""What the three experiments share: tuning, problems, the trial loop, workloads, tables.

- :mod:`~experiments.common.tuning`: the fairness harness, a quasi-random (Sobol) search per
  condition, the trial with the fewest fresh examples to target selected, repeated over seeds.
- :mod:`~experiments.common.logistic`: logistic-regression problems (a CoverType-like
  synthetic set, Fashion-MNIST) and their batched loss;
  :mod:`~experiments.common.optimum`: their optimum by L-BFGS in float64;
  :mod:`~experiments.common.convergence`: fresh batches an echoed optimizer needs to come
  within 1% of it, over a whole learning-rate grid at once.
- :mod:`~experiments.common.trial_loop`: the one training loop for in-memory trials;
  :mod:`~experiments.common.workloads`: the models and data it trains (TinyCNN, char LM).
- :mod:`~experiments.common.tables`: rows of dicts as CSV files and Markdown tables.

The echoed optimizers themselves are library code, :mod:`dataecho.optim`. This package
imports nothing on its own: each module loads what it needs.
"""
