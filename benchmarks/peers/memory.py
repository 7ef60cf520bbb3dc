"""Peak memory of each loader (section 4 of ``python -m benchmarks peers``).

Every case runs in its own ``fork()`` of the benchmark process, which has already imported
torch, dataecho and MONAI and loaded the data, so no case pays the imports and all start
alike. Linux starts a forked child's high-water mark (``VmHWM``) at what the fork left resident
(the parent's private pages, not its shared libraries), so each child reports that start and
its peak. It iterates its loader for a number of batches (no training: the model's memory is
the same for every loader), closes it, and also reports its loader worker's peak
(``getrusage(RUSAGE_CHILDREN)``, read after the worker exited). A dataecho case with worker
state snapshots runs until at least one snapshot was taken, unless the epoch ends first
(the report says so).
"""

from __future__ import annotations

import ctypes
import gc
import json
import multiprocessing
import os
import resource
from typing import Any

from benchmarks.peers.loaders import Case, build


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` figure in kB (e.g. "VmHWM", "VmRSS")."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def release_free_memory() -> None:
    """Collect garbage and return free heap pages to the OS, so that a child's new
    allocations show in its resident set instead of reusing the parent's free (resident)
    heap."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def measure(case: Case, batches: int, dataset: Any, augment: Any, s: Any) -> dict:
    """Run one case in a forked child; its figures in kB (start, main peak, worker peak)."""
    release_free_memory()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report through the pipe, leave without cleanup
        os.close(read)
        try:
            result = _child(case, batches, dataset, augment, s)
        except BaseException as err:  # noqa: BLE001  (reported to the parent)
            result = {"error": f"{type(err).__name__}: {err}"}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        result = json.loads(f.read() or '{"error": "the child died without a word"}')
    os.waitpid(pid, 0)
    if "error" in result:
        raise RuntimeError(f"memory case {case.name}: {result['error']}")
    return result | {"case": case}


def measure_all(cases: list[Case], dataset: Any, augment: Any, s: Any, log=print) -> list[dict]:
    """:func:`measure` for every case, with enough batches to fill its shuffle buffer."""
    rows = []
    for case in cases:
        batches = max(s.memory_batches, int(1.5 * case.shuffle_buffer / s.batch_size) + 20)
        row = measure(case, batches, dataset, augment, s)
        log(
            f"    {case.name}: main {row['main_kb'] / 1024:.0f} MiB, "
            f"worker {row['worker_kb'] / 1024:.0f} MiB"
        )
        rows.append(row)
    return rows


def _child(case: Case, batches: int, dataset: Any, augment: Any, s: Any) -> dict:
    start = status_kb("VmRSS")
    run = build(case, dataset, augment, batch_size=s.batch_size, seed=s.seed, shuffle=True,
                max_echo_factor=s.max_echo_factor)  # fmt: skip
    interval = 0  # batches between worker state snapshots; 0: none (not dataecho, or off)
    if case.kind == "dataecho" and case.snapshots is not False:
        # Run past the first worker snapshot (a packed shuffle buffer), or it would not count.
        interval = run.loader._inner.snapshot_every_n_steps
        batches = max(batches, interval + 2)
    got = 0
    try:
        for _ in range(batches):
            try:
                next(run)
            except StopIteration:  # the epoch ended first (a default interval can exceed it)
                break
            got += 1
    finally:
        run.close()
    gc.collect()
    multiprocessing.active_children()  # reaps exited workers, so RUSAGE_CHILDREN counts them
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB on Linux
    return {
        "start_kb": start,
        "main_kb": status_kb("VmHWM"),
        "worker_kb": worker,
        "batches": got,
        "interval": interval,
    }
