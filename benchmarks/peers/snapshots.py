"""What dataecho's worker state snapshots cost (section 5 of ``python -m benchmarks peers``).

The peers cannot checkpoint; dataecho's workers send their pipeline state (the packed shuffle
buffer included) with some batches so that a checkpoint can resume exactly. Here each case
iterates its loader on the unthrottled upstream without training and reports the CPU its
worker and the training thread spend per emitted batch, with snapshots at the loader's
default interval, at the interval dataecho used before ``snapshot_interval`` (``dataecho/loader/inner.py``)
(one per ``shuffle_buffer // batch_size`` batches) and off. A resume replays at most one
interval of batches in the worker: *max replay* says how many fresh examples that re-reads.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.peers.loaders import Case, build


def cases(s: Any) -> list[Case]:
    """Example-level echo at e = ``s.snapshot_factor``: with the shuffle buffer (per-example
    and batch augmentation), each at the default, the old and no interval; without one; and
    "auto" with the buffer and batch augmentation, at its default interval and none."""
    e, buffer = s.snapshot_factor, s.example_shuffle
    old = max(1, buffer // s.batch_size)  # dataecho's default interval before this section
    out = [
        Case("dataecho", e, "before_augment", buffer, batch_augment=aug, snapshots=snap)
        for aug in (False, True)
        for snap in (True, old, False)
    ]
    out += [Case("dataecho", e, "before_augment", snapshots=snap) for snap in (True, False)]
    # "auto" decides by timing, so its workers snapshot every batch by default (an exact
    # resume cannot replay its decisions): what that costs against no snapshots.
    return out + [
        Case("dataecho", "auto", "before_augment", buffer, batch_augment=True, snapshots=snap)
        for snap in (True, False)
    ]


def measure(case: Case, dataset: Any, augment: Any, s: Any) -> dict:
    """CPU and wall milliseconds per emitted batch of ``case``, after a warm-up."""
    run = build(case, dataset, augment, batch_size=s.batch_size, seed=s.seed, shuffle=True,
                max_echo_factor=s.max_echo_factor)  # fmt: skip
    try:
        for _ in range(s.snapshot_warmup):
            next(run)
        worker0, main0, wall0 = (
            common.children_cpu_seconds(),
            time.thread_time(),
            time.perf_counter(),
        )
        for _ in range(s.snapshot_batches):
            next(run)
        worker, main = common.children_cpu_seconds() - worker0, time.thread_time() - main0
        wall = time.perf_counter() - wall0
        interval = run.loader._inner.snapshot_every_n_steps  # the StatefulDataLoader's setting
    finally:
        run.close()
    n = s.snapshot_batches
    return {"case": case, "worker_ms": 1e3 * worker / n, "main_ms": 1e3 * main / n,
            "wall_ms": 1e3 * wall / n, "interval": interval}  # fmt: skip


def measure_all(dataset: Any, augment: Any, s: Any, log=print) -> list[dict]:
    """Every case of :func:`cases`, interleaved over ``s.snapshot_rounds`` rounds; medians."""
    raw = common.interleaved(cases(s), s.snapshot_rounds, lambda c: measure(c, dataset, augment, s),
                             log, lambda c: c.name)  # fmt: skip
    return [{"case": case, "interval": runs[0]["interval"], "rounds": len(runs),
             **{k: statistics.median(r[k] for r in runs) for k in ("worker_ms", "main_ms", "wall_ms")}}
            for case, runs in raw.items()]  # fmt: skip


HEADERS = ["loader (unthrottled, not training)", "snapshot interval (batches)",
           "worker CPU ms / batch", "training thread CPU ms / batch", "wall ms / batch",
           "max replay on resume (fresh examples)"]  # fmt: skip


def rows(result: dict) -> list[list[str]]:
    s = result["settings"]
    out = []
    for r in result["snapshots"]:
        case = r["case"]
        off = case.snapshots is False
        per_fresh = 1 if case.echo == "auto" else int(case.echo)  # auto: at most every example
        replay = "-" if off else f"{r['interval'] * s.batch_size // per_fresh:,}"
        out.append([case.name, "-" if off else f"{r['interval']:,}", f"{r['worker_ms']:.2f}",
                    f"{r['main_ms']:.2f}", f"{r['wall_ms']:.2f}", replay])  # fmt: skip
    return out
