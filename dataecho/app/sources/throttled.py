"""An *emulation* of slow storage: a dataset wrapper whose reads take a set time each.

Data echoing pays off when the upstream (reading, decoding) is slower than the training step.
A dataset held in memory is never slow, so demos and tests make it slow on purpose: every read
waits ``delay`` seconds (or ``1 / rate``) before returning the example. The wait is a sleep,
which is how a network or disk read looks to the host: time passes, but the CPU is free. It does
not emulate CPU-bound decoding, bandwidth shared between readers, or latency jitter.

The pace is kept on a clock, not per read: a sleep that overshoots (as every sleep does) is
paid back on the next read, so the long-run rate is the one asked for even at sub-millisecond
delays. Each process has its own clock, so ``num_workers`` DataLoader workers read ``num_workers``
times as fast, as that many independent storage clients would.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from torch.utils.data import Dataset

from dataecho.errors import DataechoTypeError, DataechoValueError

# How far behind the clock a reader may fall and still catch up (a burst after an idle spell).
_SLACK_SECONDS = 0.001


class Throttled(Dataset):
    """``dataset`` with every ``__getitem__`` slowed to ``delay`` seconds (or ``rate`` per second).

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``).
        delay: seconds per example read, >= 0.
        rate: examples per second, > 0; give exactly one of ``delay`` and ``rate``.
    """

    def __init__(
        self, dataset: Any, *, delay: float | None = None, rate: float | None = None
    ) -> None:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise DataechoTypeError(
                f"Throttled wraps a map-style dataset (with __getitem__ and __len__), got "
                f"{type(dataset).__name__}; wrap the dataset before any iterable stage"
            )
        if (delay is None) == (rate is None):
            raise DataechoValueError(
                f"give exactly one of delay (seconds per example) and rate (examples per "
                f"second), got delay={delay!r}, rate={rate!r}"
            )
        if rate is not None:
            rate = _positive_real(rate, name="rate")
            delay = 1.0 / rate
        else:
            delay = _positive_real(delay, name="delay", allow_zero=True)
        self.dataset = dataset
        self.delay = delay
        self._due = -math.inf  # when the previous read was due to finish (perf_counter clock)

    @property
    def rate(self) -> float:
        """Examples per second one reader gets (inf when ``delay`` is 0)."""
        return 1.0 / self.delay if self.delay else math.inf

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if self.delay:
            now = time.perf_counter()
            due = max(self._due, now - _SLACK_SECONDS) + self.delay
            if due > now:
                time.sleep(due - now)
            self._due = due
        return self.dataset[index]

    def __repr__(self) -> str:
        return f"Throttled({self.dataset!r}, delay={self.delay:.6g})"


def _positive_real(value: object, *, name: str, allow_zero: bool = False) -> float:
    low = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(f"{name} must be a real number {low}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise DataechoValueError(
            f"{name} must be a finite number {low}, got {value!r}"
            + ("; use delay=0 for no throttling" if name == "rate" else "")
        )
    return value
