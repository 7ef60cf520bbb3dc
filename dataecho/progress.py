"""Live training view: steps/s, fresh examples/s, realized echo factor and stall %, via tqdm.

    with TrainingProgress(loader, total_steps=1000, desc="train") as bar:
        for batch in bar.wrap(loader):
            train_step(batch)

``wrap`` times each ``next()`` itself, so the stall share (wall time the loop waited for data)
is known for any loader. The bar shows a total and the time left (tqdm's ``n/total`` and ETA):
the run's ``total_steps`` when given, else each epoch's length where ``len()`` of the wrapped
loader is known (the bar then counts that epoch's steps, labelled ``epoch N``). The echo factor comes from ``update(fresh=...)`` if given, else from
the ratio of the loader's ``.stats`` counters (dataecho loaders and stages); a loader with
neither is taken as echo-free (every example fresh).
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from tqdm import tqdm

from dataecho import _validate
from dataecho.errors import DataechoValueError
from dataecho.stages.stats import batch_length, item_counts

T = TypeVar("T")

# A log file or a pipe keeps every redraw of the bar (tqdm rewrites the line with "\r"): there
# the bar is redrawn every this many seconds instead of several times a second.
NON_TTY_REDRAW_SECONDS = 30.0


@dataclass(frozen=True)
class ProgressReading:
    """Counts since the view started (or over a window, see :meth:`minus`)."""

    steps: int
    examples: int
    """Examples the steps consumed, echoed copies included."""
    fresh_examples: float
    wait_seconds: float | None
    """Seconds blocked waiting for data (None: not measured)."""
    wall_seconds: float

    def _rate(self, count: float) -> float:
        return count / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def steps_per_second(self) -> float:
        return self._rate(self.steps)

    @property
    def fresh_per_second(self) -> float:
        return self._rate(self.fresh_examples)

    @property
    def realized_factor(self) -> float:
        """examples / fresh examples (0.0 before any fresh example)."""
        return self.examples / self.fresh_examples if self.fresh_examples > 0 else 0.0

    @property
    def stall_fraction(self) -> float | None:
        """Share of wall time spent waiting for data (None when waits were not measured)."""
        if self.wait_seconds is None or self.wall_seconds <= 0:
            return None
        return min(self.wait_seconds / self.wall_seconds, 1.0)

    def minus(self, earlier: ProgressReading) -> ProgressReading:
        """The window between ``earlier`` and this reading."""
        wait = None
        if self.wait_seconds is not None and earlier.wait_seconds is not None:
            wait = self.wait_seconds - earlier.wait_seconds
        return ProgressReading(
            self.steps - earlier.steps,
            self.examples - earlier.examples,
            self.fresh_examples - earlier.fresh_examples,
            wait,
            self.wall_seconds - earlier.wall_seconds,
        )


class TrainingProgress:
    """A tqdm bar over training steps whose postfix shows what echoing is doing.

    Count steps with :meth:`wrap` (times ``next()``, infers batch sizes) or call :meth:`update`
    once per step. The postfix (rates over the last ``refresh_seconds`` window) is recomputed at
    most every ``refresh_seconds``, so a step costs a few counter updates. :meth:`summary` gives
    the whole-run figures; :meth:`close` prints it (unless ``print_summary`` is false; by default
    it is printed unless ``disable``).
    """

    def __init__(
        self,
        loader: object = None,
        *,
        total_steps: int | None = None,
        desc: str = "train",
        batch_size: int | None = None,
        file: IO[str] | None = None,
        disable: bool = False,
        refresh_seconds: float = 0.5,
        print_summary: bool | None = None,
        **tqdm_kwargs: Any,
    ) -> None:
        if total_steps is not None:
            total_steps = _validate.positive_int(total_steps, name="total_steps", hint="or None")
        if batch_size is not None:
            batch_size = _validate.positive_int(batch_size, name="batch_size", hint="or None")
        # float first: type checkers take numbers.Real as unrelated to float.
        if not isinstance(refresh_seconds, (float, numbers.Real)) or not refresh_seconds > 0:
            raise DataechoValueError(
                f"refresh_seconds must be a number > 0, got {refresh_seconds!r}; e.g. 0.5"
            )
        self.desc, self.batch_size, self.refresh_seconds = desc, batch_size, float(refresh_seconds)
        self._file, self._disable = file, bool(disable)
        self._print_summary = not disable if print_summary is None else bool(print_summary)
        stream = sys.stderr if file is None else file
        if not (hasattr(stream, "isatty") and stream.isatty()):
            tqdm_kwargs.setdefault("mininterval", NON_TTY_REDRAW_SECONDS)
        self._bar = tqdm(
            total=total_steps, desc=desc, file=file, disable=disable, unit="step", **tqdm_kwargs
        )
        self._run_total = total_steps  # None: each epoch's length is the total, where known
        self._epochs = 0
        self._steps, self._examples, self._fresh, self._wait = 0, 0, 0.0, 0.0
        self._fresh_given = self._wait_measured = False
        self._final: ProgressReading | None = None  # frozen by close()
        self._stats_src: object = None
        self._stats_base: tuple[float, float, float | None] | None = None
        if loader is not None:
            self._watch(loader)
        self._restart_clock()

    def _restart_clock(self) -> None:
        self._start = time.perf_counter()
        self._last = self.reading()
        self._next_refresh = self._start + self.refresh_seconds

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield the batches of ``iterable``, one step each, timing how long each took to come."""
        self._watch(iterable)
        if self._steps == 0:  # the clock starts with the loop, not with the bar's construction
            self._restart_clock()
        self._start_epoch(iterable)
        self._wait_measured = True
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self._wait += time.perf_counter() - t0  # end-of-epoch teardown is waiting too
                return
            waited = time.perf_counter() - t0
            self._record(self.batch_size or _batch_len(batch), None, waited)
            yield batch

    def _start_epoch(self, iterable: object) -> None:
        """Without a run total: make ``len(iterable)`` (this epoch's steps) the bar's total, so
        it shows the epoch's position and time left; an iterable without a length shows the
        count and rate only."""
        if self._run_total is not None:
            return
        try:
            length = len(iterable)  # type: ignore[arg-type]
        except (TypeError, NotImplementedError):  # no length: a stream, an IterableDataset
            return
        if not isinstance(length, int) or length <= 0:
            return
        self._epochs += 1
        # reset: tqdm's count and clock restart, so its ETA is this epoch's time left.
        self._bar.set_description(f"{self.desc} epoch {self._epochs}", refresh=False)
        self._bar.reset(total=length)

    def update(
        self,
        *,
        batch_size: int | None = None,
        fresh: int | None = None,
        wait_seconds: float | None = None,
    ) -> None:
        """Count one step of ``batch_size`` examples (default: the constructor's).

        ``fresh``: how many of them were fresh (default: from ``.stats``, else all);
        ``wait_seconds``: how long the step waited for its batch (default: from ``.stats``).
        """
        self._record(
            batch_size if batch_size is not None else self.batch_size or 0, fresh, wait_seconds
        )

    def _record(self, examples: int, fresh: int | None, wait: float | None) -> None:
        if self._final is not None:
            raise RuntimeError(
                f"TrainingProgress {self.desc!r} is closed (its summary is final); "
                "start a new TrainingProgress for more steps"
            )
        self._steps += 1
        self._examples += examples
        if fresh is not None:
            self._fresh_given = True
        self._fresh += examples if fresh is None else fresh
        if wait is not None:
            self._wait += wait
            self._wait_measured = True
        self._bar.update(1)
        if not self._disable and time.perf_counter() >= self._next_refresh:
            self._refresh()

    def _refresh(self) -> None:
        now = self.reading()
        window, self._last = now.minus(self._last), now
        self._next_refresh = self._start + now.wall_seconds + self.refresh_seconds
        # Rates over the window; the echo factor since the start, because over a short window
        # it jumps by one fresh item (an echo stage fetches a new item only when one is due).
        stall, echo = window.stall_fraction, now.realized_factor or 1.0
        examples_per_s = window.examples / window.wall_seconds if window.wall_seconds > 0 else 0.0
        self._bar.set_postfix(
            {
                "steps/s": _num(window.steps_per_second),
                "fresh/s": _num(examples_per_s / echo),
                "echo": f"{echo:.2f}x",
                "stall": "n/a" if stall is None else f"{stall:.0%}",
            },
            refresh=False,  # drawn at tqdm's next redraw: mininterval paces the output
        )

    def reading(self) -> ProgressReading:
        """The counts since the start (up to :meth:`close`, after which they stay fixed)."""
        if self._final is not None:
            return self._final
        fresh, wait = self._fresh, self._wait if self._wait_measured else None
        now = _read_stats(self._stats_src)
        if now is not None and self._stats_base is not None:
            base = self._stats_base
            d_fresh, d_out = now[0] - base[0], now[1] - base[1]
            if not self._fresh_given and d_fresh > 0 and d_out > 0:
                # The ratio, not the raw counts: a stage may count batches, the bar examples.
                fresh = self._examples * d_fresh / d_out
            if wait is None and now[2] is not None and base[2] is not None:
                wait = now[2] - base[2]
        return ProgressReading(
            self._steps, self._examples, fresh, wait, time.perf_counter() - self._start
        )

    def summary(self) -> str:
        """One line: steps, examples, fresh examples, echo factor, rates, stall share, time."""
        s = self.reading()
        stall = "n/a" if s.stall_fraction is None else f"{s.stall_fraction:.1%}"
        return (
            f"{self.desc}: {s.steps} steps, {s.examples} examples ({round(s.fresh_examples)} "
            f"fresh, echo {s.realized_factor:.2f}x), {_num(s.steps_per_second)} steps/s, "
            f"{_num(s.fresh_per_second)} fresh examples/s, stall {stall}, {s.wall_seconds:.2f} s"
        )

    def close(self) -> None:
        """Show the final postfix, close the bar and print the summary (once)."""
        if self._final is not None:
            return
        if not self._disable and self._steps:
            self._refresh()
        self._final = self.reading()
        self._bar.close()
        if self._print_summary:
            print(self.summary(), file=self._file if self._file is not None else sys.stderr)

    def __enter__(self) -> TrainingProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch(self, source: object) -> None:
        # The first source with counters is the one read; later wraps (epochs) keep its base.
        if self._stats_base is None and (base := _read_stats(source)) is not None:
            self._stats_src, self._stats_base = source, base


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _read_stats(source: object) -> tuple[float, float, float | None] | None:
    """(fresh items, items out, wait_seconds or None) of ``source.stats``, if present."""
    stats = getattr(source, "stats", None)
    counts = item_counts(stats)
    if counts is None:
        return None
    wait = getattr(stats, "wait_seconds", None)
    wait = float(wait) if isinstance(wait, numbers.Real) and math.isfinite(wait) else None
    return counts[0], counts[1], wait


_batch_len = batch_length  # the loader counts examples the same way
