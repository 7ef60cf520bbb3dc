"""Stall profiler: is training input-bound, and which echo factor pays off? (Choi et al. 2019)

Three short measurements on the real loader and the real step:
1. upstream alone: seconds per batch pulled from a fresh iterator, no training (``t_up``);
2. step alone: seconds per ``step_fn(batch)`` on one cached batch (``t_down``);
3. the pipeline as it runs: pull and step per batch, timing how long ``next()`` blocks.

Time model (upstream and step overlapped, echoing free): one fresh batch and its ``e`` steps take
``max(t_up, e * t_down)``; without echoing a step takes ``max(t_up, t_down)``. So

    speedup(e) = e * max(t_up, t_down) / max(t_up, e * t_down) = max(1, min(e, R)),  R = t_up/t_down

Extra steps are free while ``e <= R``; past ``R`` the step is the bottleneck, so step throughput
stays at ``R`` while the fresh-data rate falls as ``R / e``.
"""

from __future__ import annotations

import itertools
import math
import numbers
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dataecho import _validate
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.stages.stats import item_counts

INPUT_BOUND_RATIO = 1.1
"""R above this: the upstream is measurably slower than the step (10% absorbs timing noise)."""
INPUT_BOUND_STALL = 0.05
"""Stall share at or above this: the running pipeline really waits (prefetch does not hide it)."""
FRESH_RATE_TOLERANCE = 0.10
"""Recommend the largest whole ``e`` that lowers the fresh-data rate by at most this share."""
USEFUL_ECHO_FACTORS = (4, 8)
"""The echo factors the papers found useful at common batch sizes (docs/papers.md): Choi et al.
saw the best factor at 4-8 on LM1B (batch 1024), with gains that shrink as ``e`` grows, and
Agarwal et al. saw the fresh examples saved saturate, small batches first. A recommendation
above the upper end comes with a note on what it risks (:func:`echo_factor_note`)."""
# Phase shares of ``seconds``: the two pulls are the slow, noisy ones, the cached step is steady.
_SHARES = (0.4, 0.2, 0.4)


@dataclass(frozen=True)
class TimeModel:
    """What the time model predicts for one (t_up, t_down, e)."""

    cycle_seconds: float
    """Seconds for one fresh batch and its ``e`` steps."""
    steps_per_second: float
    fresh_batches_per_second: float
    speedup: float
    """Step throughput relative to ``e = 1`` under the same model."""


def time_model(t_up: float, t_down: float, e: float, *, overlap: bool = True) -> TimeModel:
    """Predict throughput for echo factor ``e`` from seconds per upstream batch and per step.

    ``overlap=True`` is the paper's model (loading runs in the background while the step runs):
    a cycle takes ``max(t_up, e * t_down)``. ``overlap=False`` models a loader that runs in the
    training loop itself (``num_workers=0``, a plain iterable): a cycle takes
    ``t_up + e * t_down``, so every extra step costs ``t_down``.
    """
    t_up, t_down = _seconds(t_up, "t_up", zero_ok=True), _seconds(t_down, "t_down", zero_ok=True)
    e = _validate.echo_factor(e, name="e")
    if t_up == 0 and t_down == 0:
        raise DataechoValueError("t_up and t_down are both 0; at least one must be > 0 seconds")
    if overlap:
        cycle, base = max(t_up, e * t_down), max(t_up, t_down)
    else:
        cycle, base = t_up + e * t_down, t_up + t_down
    return TimeModel(cycle, e / cycle, 1.0 / cycle, e * base / cycle)


@dataclass(frozen=True)
class ProfileReport:
    """The measurements of :func:`profile` and what follows from them (times in seconds)."""

    t_up: float
    t_down: float
    t_overlapped: float
    """Seconds per step of the pipeline as it runs (pull + step)."""
    stall_fraction: float
    """Share of that wall time spent blocked in ``next()``."""
    overlap_fraction: float
    """How much of min(t_up, t_down) the running pipeline hid: 1 = fully overlapped, 0 = serial."""
    input_bound: bool
    recommended_echo_factor: int
    max_echo_factor: int
    batches_up: int
    steps_down: int
    steps_overlapped: int
    source_echo_factor: float | None = None
    """items_out / fresh_items of the source's ``.stats`` over the profile (None: no stats)."""

    @property
    def ratio(self) -> float:
        """R = t_up / t_down."""
        return self.t_up / self.t_down if self.t_down > 0 else math.inf

    @property
    def overlapped(self) -> bool:
        """Whether the running pipeline overlapped loading and step (closer to max than sum)."""
        return self.overlap_fraction >= 0.5

    def predicted_speedup(self, e: float, *, overlap: bool = True) -> float:
        """Step-throughput speedup of echo factor ``e`` over no echoing; see :func:`time_model`."""
        return time_model(self.t_up, self.t_down, e, overlap=overlap).speedup

    @property
    def echo_factor_note(self) -> str | None:
        """What the recommended factor risks when it is past the papers' useful range, with the
        range to try (:func:`echo_factor_note`); None within it."""
        return echo_factor_note(self.recommended_echo_factor, self.ratio)

    def as_dict(self) -> dict[str, Any]:
        """All fields plus R and the note on the factor, for JSON output."""
        return {**asdict(self), "ratio": self.ratio, "overlapped": self.overlapped,
                "echo_factor_note": self.echo_factor_note}  # fmt: skip


def echo_factor_note(e: float, ratio: float) -> str | None:
    """A note for an echo factor ``e`` above :data:`USEFUL_ECHO_FACTORS` (None up to it): the
    time model counts echoed steps as free, but echoed data is worth less than fresh data."""
    low, high = USEFUL_ECHO_FACTORS
    if e <= high:
        return None
    return (
        f"note: e = {e:g} is past the papers' useful range of about {low}-{high} at common "
        f"batch sizes (docs/papers.md). The speedup above counts steps, but an echoed example "
        f"is worth less than a fresh one: past about {high} copies the fresh examples saved "
        "per extra step shrink toward none (small batches saturate first), so the extra steps "
        "can buy no time to the target, and the run trains on each example "
        f"{e:g} times between fresh ones. Try e = {low} to {high} and compare the fresh "
        f"examples to your target; with R = {ratio:.3g} the step will still wait for data, so "
        "speed up the upstream too (more loader workers, faster or cached storage), or use a "
        "larger batch, which tolerates a larger factor"
    )


def profile(
    loader_or_iterable: Iterable[Any],
    step_fn: Callable[[Any], Any],
    *,
    seconds: float = 10.0,
    warmup_batches: int = 2,
    max_echo_factor: int = 16,
    max_batches: int = 200,
) -> ProfileReport:
    """Measure t_up, t_down and the running pipeline; recommend an echo factor.

    Each phase runs ``warmup_batches`` untimed batches, then until its share of ``seconds``
    (40% upstream, 20% step, 40% pipeline) is spent or ``max_batches`` are timed. ``step_fn``
    really runs (a training step updates the model). A re-iterable source (list, DataLoader) is
    iterated afresh per phase; a one-shot iterator continues where the last phase stopped.

    Input-bound means ``R > 1.1`` and the running pipeline stalls >= 5% of its wall time. The
    recommended ``e`` is 1 when not input-bound, else the largest whole ``e`` with
    ``R / e >= 0.9`` (at most 10% of the fresh-data rate traded for steps), in [1, max].
    """
    if not isinstance(loader_or_iterable, Iterable):
        raise DataechoTypeError(
            f"loader_or_iterable must be iterable (a DataLoader, a list of batches, a dataecho "
            f"loader), got {type(loader_or_iterable).__name__}"
        )
    if not callable(step_fn):
        raise DataechoTypeError(
            f"step_fn must be a callable taking one batch (e.g. lambda batch: train_step(batch)), "
            f"got {step_fn!r} of type {type(step_fn).__name__}"
        )
    seconds = _seconds(seconds, "seconds")
    warmup = _validate.non_negative_int(warmup_batches, name="warmup_batches", hint="e.g. 2")
    max_e = _validate.positive_int(max_echo_factor, name="max_echo_factor", hint="e.g. 16")
    max_n = _validate.positive_int(max_batches, name="max_batches", hint="e.g. 200")
    up_budget, down_budget, pipe_budget = (share * seconds for share in _SHARES)
    counts_before = _stats_counts(loader_or_iterable)

    it = iter(loader_or_iterable)
    n_up, wall_up, _, batch = _run(it, None, warmup, up_budget, max_n)
    if n_up == 0:
        raise DataechoValueError(
            "loader_or_iterable is empty (it yielded no batch); pass a loader with at least "
            f"{warmup + 1} batches"
        )
    if it is not loader_or_iterable:
        del it  # drop the first iterator so its workers stop competing for the CPU
    n_down, wall_down, _, _ = _run(itertools.repeat(batch), step_fn, warmup, down_budget, max_n)
    it = iter(loader_or_iterable)
    n_pipe, wall_pipe, wait_pipe, _ = _run(it, step_fn, warmup, pipe_budget, max_n)
    if n_pipe == 0:
        raise DataechoValueError(
            f"loader_or_iterable ran out after the upstream phase ({n_up + warmup} batches); pass "
            "a re-iterable source (a list, a DataLoader) or one with more batches"
        )

    t_up, t_down, t_pipe = wall_up / n_up, wall_down / n_down, wall_pipe / n_pipe
    stall = min(wait_pipe / wall_pipe, 1.0) if wall_pipe > 0 else 0.0
    hidden = min(t_up, t_down)
    overlap = min(max((t_up + t_down - t_pipe) / hidden, 0.0), 1.0) if hidden > 0 else 1.0
    ratio = t_up / t_down if t_down > 0 else math.inf
    input_bound = ratio > INPUT_BOUND_RATIO and stall >= INPUT_BOUND_STALL
    e = 1
    if input_bound:
        e = min(max(math.floor(ratio / (1.0 - FRESH_RATE_TOLERANCE)), 1), max_e)
    counts_after, source_factor = _stats_counts(loader_or_iterable), None
    if counts_before is not None and counts_after is not None:
        fresh, out = counts_after[0] - counts_before[0], counts_after[1] - counts_before[1]
        source_factor = out / fresh if fresh > 0 else None
    return ProfileReport(
        t_up, t_down, t_pipe, stall, overlap, input_bound, e, max_e, n_up, n_down, n_pipe,
        source_factor,
    )  # fmt: skip


def format_report(report: ProfileReport) -> str:
    """Human-readable lines: the measurements, R, the verdict and a predicted speedup table."""
    rep, e_rec, serial = report, report.recommended_echo_factor, not report.overlapped
    lines = [
        f"upstream alone: t_up   = {_ms(rep.t_up)} per batch ({rep.batches_up} batches)",
        f"step alone:     t_down = {_ms(rep.t_down)} per step ({rep.steps_down} steps)",
        f"pipeline:       {_ms(rep.t_overlapped)} per step, waiting for data "
        f"{rep.stall_fraction:.1%} of the time ({rep.steps_overlapped} steps)",
        f"R = t_up / t_down = {rep.ratio:.2f}",
        ("INPUT-BOUND: the step waits for data; echoing can help" if rep.input_bound else
         "not input-bound: the step, not the data, limits training; echoing will not speed it up")
        + f" (rule: R > {INPUT_BOUND_RATIO} and stall >= {INPUT_BOUND_STALL:.0%})",
        f"recommended echo factor: e = {e_rec} " + (
            f"(extra steps are free while e <= R; largest e costing <= {FRESH_RATE_TOLERANCE:.0%}"
            f" of the fresh-data rate, at most {rep.max_echo_factor})" if rep.input_bound
            else "(no echoing)"),
        "predicted step-throughput speedup = e * max(t_up, t_down) / max(t_up, e * t_down):",
        "      e  overlapped" + ("  as measured (no overlap)" if serial else ""),
    ]  # fmt: skip
    for e in sorted({1, 2, 4, 8, e_rec}):
        row = f"  {e:5d}  {rep.predicted_speedup(e):9.2f}x"
        row += f"  {rep.predicted_speedup(e, overlap=False):9.2f}x" if serial else ""
        lines.append(row + ("  <- recommended" if e == e_rec else ""))
    if rep.echo_factor_note is not None:
        lines.append(rep.echo_factor_note)
    if serial:
        lines.append(
            "note: loading did not overlap the step (pipeline near t_up + t_down), so each extra "
            "step costs t_down; load in the background (DataLoader num_workers > 0) for the "
            "overlapped column"
        )
    if rep.source_echo_factor is not None and rep.source_echo_factor > 1.0 + 1e-9:
        lines.append(
            f"note: the source already echoes {rep.source_echo_factor:.2f}x, so t_up is per "
            "emitted batch; the recommended e multiplies that factor"
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.4g} us"


def _run(
    it: Iterator[Any], step_fn: Callable[[Any], Any] | None, warmup: int, budget: float, max_n: int
) -> tuple[int, float, float, Any]:
    """Pull (and step) until ``budget`` seconds or ``max_n`` batches after ``warmup``.

    Returns (timed batches, wall seconds, seconds blocked in next(), last batch). Wall time is
    taken per phase, not per batch, and after a device sync, so an asynchronous step (CUDA
    queues kernels and returns) is charged its real time. If the source runs out during warmup,
    the warmup batches are timed instead, so a short list still gives a figure.
    """
    n, waits, last = 0, [], None
    start = first = time.perf_counter()
    while n - warmup < max_n:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t0)
        if step_fn is not None:
            step_fn(batch)
        n, last = n + 1, batch
        if n == warmup:
            _sync()
            start = time.perf_counter()
        elif n > warmup and time.perf_counter() - start >= budget:
            break
    _sync()
    if n > warmup:
        return n - warmup, time.perf_counter() - start, sum(waits[warmup:]), last
    return n, time.perf_counter() - first, sum(waits), last


def _sync() -> None:
    # Only when CUDA is already in use: initialising it here would cost seconds.
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _stats_counts(source: object) -> tuple[float, float] | None:
    """(fresh items, items out) of ``source.stats`` if it has such counters."""
    return item_counts(getattr(source, "stats", None))


def _seconds(value: object, name: str, *, zero_ok: bool = False) -> float:
    """``value`` as finite seconds > 0 (>= 0 with ``zero_ok``), or a clear error."""
    bound = ">= 0" if zero_ok else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(
            f"{name} must be a number of seconds {bound}, got {value!r} of type "
            f"{type(value).__name__}; pass a float such as {name}=10.0"
        )
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise DataechoValueError(
            f"{name} must be a finite number of seconds {bound}, got {value!r}; "
            f"pass e.g. {name}=10.0"
        )
    return value
