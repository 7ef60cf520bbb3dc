"""Schedules for the loading probability ``p_t`` of :func:`dataecho.stochastic_echo`.

Each is a small frozen dataclass called as ``schedule(step) -> probability`` (picklable, so a
stage that uses one can be sent to a worker process). Steps past ``total_steps`` keep the end
value.

- :func:`constant` ``(p)``: ``p`` at every step; mean reuse count about ``1/p``.
- :func:`cosine_increasing` ``(p_min, p_max, total_steps)``: ``p`` rises from ``p_min`` to
  ``p_max`` along a half cosine: reuse a lot early, load more fresh data later. A rationale:
  Agarwal et al. show echoing only shrinks the optimisation term of the error, not the
  statistical one; early in training the optimisation term dominates, so reused data is nearly
  as useful as fresh data, and late in training only fresh data still helps.
- :func:`cosine_decreasing` ``(p_max, p_min, total_steps)``: ``p`` falls from ``p_max`` to
  ``p_min``: load more early, reuse more later, in step with a cosine learning-rate decay (small
  late steps move the model little, so repeating data costs little).

Why both directions: the ICLR 2025 submission reports that a cosine schedule of the loading
probability improved test accuracy, but only its abstract and reviews could be read and they
do not say which way it goes. Both are offered so an experiment can decide.

Over ``total_steps`` either cosine averages ``(p_min + p_max) / 2`` (the half cosine is
symmetric about its midpoint), so ``constant((p_min + p_max) / 2)`` loads about as many fresh
items in the same number of steps: a fair baseline.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from dataecho.errors import DataechoTypeError, DataechoValueError

__all__ = [
    "Constant",
    "Cosine",
    "check_probability",
    "constant",
    "cosine_decreasing",
    "cosine_increasing",
]


def check_probability(value: object, *, name: str) -> float:
    """Return ``value`` as a loading probability in (0, 1], or raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(
            f"{name} must be a probability in (0, 1] (e.g. 0.25: each fresh item used about 4 "
            f"times), got {value!r} of type {type(value).__name__}; pass a float such as "
            f"{name}=0.25"
        )
    p = float(value)
    # NaN fails this test too, since every comparison with NaN is false.
    if not 0.0 < p <= 1.0:
        raise DataechoValueError(
            f"{name} must be in (0, 1], got {value!r}; 0 would never load fresh data and "
            f"values above 1 are not probabilities: use {name}=1 for no reuse or 1/e for a "
            f"mean reuse count of e"
        )
    return p


def _check_steps(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise DataechoValueError(
            f"total_steps must be an integer >= 1 (the step at which the schedule reaches its "
            f"end value), got {value!r}; pass the number of training steps, e.g. 10_000"
        )
    return int(value)


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise DataechoValueError(
            f"step must be an integer >= 0 (items emitted so far), got {step!r}"
        )
    return int(step)


@dataclass(frozen=True)
class Constant:
    """``p`` at every step."""

    p: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability(self.p, name="p"))

    def __call__(self, step: int) -> float:
        _check_step(step)
        return self.p


@dataclass(frozen=True)
class Cosine:
    """A half cosine from ``start`` (step 0) to ``end`` (step ``total_steps`` and after)."""

    start: float
    end: float
    total_steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", check_probability(self.start, name="start"))
        object.__setattr__(self, "end", check_probability(self.end, name="end"))
        object.__setattr__(self, "total_steps", _check_steps(self.total_steps))

    def __call__(self, step: int) -> float:
        frac = min(_check_step(step), self.total_steps) / self.total_steps
        p = self.end + (self.start - self.end) * (1.0 + math.cos(math.pi * frac)) / 2.0
        # Rounding may step an ulp outside [start, end]; never return more than 1 or below p_min.
        lo, hi = min(self.start, self.end), max(self.start, self.end)
        return min(max(p, lo), hi)


def constant(p: float) -> Constant:
    """The loading probability ``p`` at every step (0 < p <= 1)."""
    return Constant(p)


def cosine_increasing(p_min: float, p_max: float, total_steps: int) -> Cosine:
    """``p`` rises from ``p_min`` at step 0 to ``p_max`` at ``total_steps`` (then stays)."""
    p_min = check_probability(p_min, name="p_min")
    p_max = check_probability(p_max, name="p_max")
    if p_min > p_max:
        raise DataechoValueError(
            f"cosine_increasing needs p_min <= p_max, got p_min={p_min!r} > p_max={p_max!r}; "
            f"swap them, or use cosine_decreasing(p_max, p_min, total_steps) for a falling p"
        )
    return Cosine(p_min, p_max, total_steps)


def cosine_decreasing(p_max: float, p_min: float, total_steps: int) -> Cosine:
    """``p`` falls from ``p_max`` at step 0 to ``p_min`` at ``total_steps`` (then stays)."""
    p_max = check_probability(p_max, name="p_max")
    p_min = check_probability(p_min, name="p_min")
    if p_min > p_max:
        raise DataechoValueError(
            f"cosine_decreasing needs p_max >= p_min, got p_max={p_max!r} < p_min={p_min!r}; "
            f"swap them, or use cosine_increasing(p_min, p_max, total_steps) for a rising p"
        )
    return Cosine(p_max, p_min, total_steps)
