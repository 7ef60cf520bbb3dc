"""Adaptive echoing: no echo, fixed e and ``echo_factor="auto"`` side by side, R = 1, 2, 4, 8.

What is measured: for each ratio R of upstream time to step time, the steps/s, fresh
examples/s, stall (time in ``next(loader)``), realized echo factor and the loader worker's CPU
of every configuration: the upstream read alone, no echo, fixed e = 2, 4, 8 at
``where="batch"``, and ``auto`` at ``batch`` and ``before_augment``.

How: :class:`benchmarks.common.SyntheticStep` runs on 1 torch thread in this process; its time
``t_down`` is measured first. Then the upstream delivers one batch of 128 per ``R * t_down``
through *sleeping* reads (:class:`benchmarks.common.PacedImages`) in one loader worker, which
also runs ``Augment`` per example. Every (R, configuration) case trains for a fixed wall time
after a warm-up, and the cases run interleaved, round after round, so the machine's drift hits
them alike (:mod:`~benchmarks.adaptive.measure`). Efficiency is steps/s over min(e, R) times
the no-echo case's, at the same R; :data:`TARGETS` are checked per row
(:mod:`~benchmarks.adaptive.report`). Command line: :mod:`~benchmarks.adaptive.cli`; results:
``benchmarks/adaptive/RESULTS.md``.
"""

from benchmarks.adaptive.cli import main, parse, write
from benchmarks.adaptive.measure import Config, Settings, Window, run, run_case
from benchmarks.adaptive.report import COLUMNS, TARGETS, report, rows, table, verdict

__all__ = ["COLUMNS", "TARGETS", "Config", "Settings", "Window", "main", "parse", "report",
           "rows", "run", "run_case", "table", "verdict", "write"]  # fmt: skip
