"""The three papers' claims, re-run at small scale (from a checkout; not installed).

    python -m experiments choi --quick              # < 2 minutes; writes reproduce-choi/
    python -m experiments laggard --out docs/results/laggard
    python -m experiments stochastic

One package per paper, :mod:`experiments.choi`, :mod:`experiments.laggard` and
:mod:`experiments.stochastic`, each with a ``run(out, *, quick, seed) -> Path`` that writes
Markdown tables (``README.md`` in ``out``), CSV and PNG files and returns the Markdown file's
path; what they share (tuning, problems, the trial loop, workloads, tables) is
:mod:`experiments.common`. The experiments read in-memory data (compute-bound, so
fresh-example counts come fast); :func:`dataecho.profiling.time_model` turns them into wall
time for a given R. The results, with the verdicts, are in docs/results/.
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
    """Run experiment ``name`` (one of :data:`EXPERIMENTS`) into ``out``; return its README.

    ``seed`` is the base seed of every trial (an int >= 0: the trials derive theirs from it).
    """
    _validate.one_of(name, tuple(EXPERIMENTS), name="experiment")
    seed = _validate.non_negative_int(seed, name="seed", hint="the trials' base seed, e.g. 0")
    module = importlib.import_module(f"experiments.{name}")
    return module.run(Path(out), quick=quick, seed=seed)
