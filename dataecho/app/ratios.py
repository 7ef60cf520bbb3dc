"""The report's figures of merit: how much of what echoing promises each run kept.

    for r in ratios(results, summarize(results), ratio=lived_r):  # dataecho.app.report
        print(r.line())                 # or dataecho.app.report.format_ratios(results, lived_r)

Three ratios, against the first run without echo (the baseline), each with its target:

- ``auto``'s **fresh-example rate kept**: the examples it read from upstream per wall second of
  the whole run (evaluations included) over the baseline's. Adaptive echoing promises never to
  slow the upstream, so 1 is the ideal. Read, not only trained on: at the stop a pool or a
  worker's shuffle buffer still holds examples read whose first copy it has not emitted
  (``TrainResult.read_examples``).
- every echoed run's **wall gain / fresh gain**: the speedup in wall time to the target over
  the speedup in fresh examples to it. Echoing saves fresh examples; the wall time follows
  only as far as the pipeline keeps up, so this is the pipeline's efficiency (1: all of it).
- a fixed-factor run's **wall gain / time model**: the time model of echo factor e at
  R = t_up / t_down is fresh gain x min(1, R / e) (at e <= R the upstream still sets the pace,
  beyond it the step does), with R as the baseline lived it.

A ratio that needs a speedup is left out for a run that missed the target (it has none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FRESH_RATE_TARGET = 0.97
WALL_OVER_FRESH_TARGET = 0.95
TIME_MODEL_TARGET = 0.95

FRESH_RATE_DEFINITION = (
    "examples read from upstream per wall second of the whole run (evaluations included), over "
    "the no-echo run's"
)
WALL_OVER_FRESH_DEFINITION = (
    "speedup in wall seconds to the target over the speedup in fresh examples to it"
)
TIME_MODEL_DEFINITION = (
    "wall gain over fresh gain x min(1, R/e), R = {r:.2f} as the no-echo run lived it"
)


@dataclass(frozen=True)
class Ratio:
    """One figure of merit of one run."""

    run: str
    name: str
    value: float
    target: float
    definition: str

    @property
    def met(self) -> bool:
        return self.value >= self.target

    def line(self) -> str:
        verdict = "met" if self.met else "MISSED"
        return (f"{self.run}: {self.name} = {self.value:.3f} (target >= {self.target:g}, "
                f"{verdict}): {self.definition}")  # fmt: skip


def ratios(results: Sequence[Any], rows: Sequence[Any], ratio: float | None) -> list[Ratio]:
    """The figures of merit of ``results`` (``TrainResult``) with their report ``rows``
    (:func:`dataecho.app.report.summarize`); ``ratio`` is R as the baseline lived it (None:
    no time model)."""
    base = next((i for i, row in enumerate(rows) if row.echo == "1"), None)
    if base is None:
        return []
    base_rate = _fresh_rate(results[base])
    out: list[Ratio] = []
    for result, row in zip(results, rows, strict=True):
        if row.echo == "1":
            continue
        auto = result.config.echo_factor == "auto"
        rate = _fresh_rate(result)
        if auto and rate is not None and base_rate:
            out.append(Ratio(row.name, "fresh-example rate / no echo's", rate / base_rate,
                             FRESH_RATE_TARGET, FRESH_RATE_DEFINITION))  # fmt: skip
        if row.speedup_wall is None or row.speedup_fresh is None:
            continue
        gain = row.speedup_wall / row.speedup_fresh
        out.append(Ratio(row.name, "wall gain / fresh gain", gain, WALL_OVER_FRESH_TARGET,
                         WALL_OVER_FRESH_DEFINITION))  # fmt: skip
        if not auto and ratio is not None:
            model = row.speedup_fresh * min(1.0, ratio / float(result.config.echo_factor))
            out.append(Ratio(row.name, "wall gain / time model", row.speedup_wall / model,
                             TIME_MODEL_TARGET, TIME_MODEL_DEFINITION.format(r=ratio)))  # fmt: skip
    return out


def _fresh_rate(result: Any) -> float | None:
    return result.read_examples / result.wall_seconds if result.wall_seconds > 0 else None
