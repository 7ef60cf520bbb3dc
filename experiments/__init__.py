"""The three papers' claims, re-run at small scale (from a checkout; not installed).

    python -m experiments choi --quick              # < 2 minutes; writes reproduce-choi/
    python -m experiments laggard --out docs/results/laggard
    python -m experiments stochastic

Each experiment is one module here with a ``run(out, *, quick, seed) -> Path`` function that
writes Markdown tables (``README.md`` in ``out``), CSV and PNG files and returns the Markdown
file's path. The experiments read in-memory data (compute-bound, so fresh-example counts come
fast); ``dataecho.profiling.time_model`` turns them into wall time for a given R.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from dataecho import _validate

EXPERIMENTS = {
    "choi": "Choi et al. 2019: fresh examples to target vs echo factor, insertion point, shuffle",
    "laggard": "Agarwal et al. 2020: echoed GD / proximal GD / Nesterov on logistic regression",
    "stochastic": "ICLR 2025 submission: stochastic echoing, load probability and schedules",
}


def run(name: str, out: str | Path, *, quick: bool = False, seed: int = 0) -> Path:
    """Run experiment ``name`` (one of :data:`EXPERIMENTS`); return its Markdown summary."""
    _validate.one_of(name, tuple(EXPERIMENTS), name="experiment")
    module = importlib.import_module(f"experiments.{name}")
    return module.run(Path(out), quick=quick, seed=_validate.seed(seed))
