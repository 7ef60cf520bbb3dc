"""Host-side example echo's own cost: the loader worker's CPU per extra copy of a batch.

``where="before_augment"`` at a fixed factor echoes examples inside the loader worker. What one
extra copy costs the worker is dataecho's own work on the copy (mixing, batching, counting,
and, where a per-example ``transform=`` follows, a separate object per copy) plus the
transform's. Measured side by side in one run, cases interleaved in rounds: the same loader at
e = 1 (no echo) and e = 4, with three transforms:

- ``identity``: a per-example ``transform=`` that returns its example: each copy is its own
  object, handed to the transform, then collated; what is left is dataecho's cost.
- ``augment``: the application's per-example shift-flip-normalise
  (``dataecho.app.workloads.image_augment.Augment``); minus identity, the transform's own.
- ``batch``: no per-example transform, an identity ``batch_transform=`` (how the demo's
  before-augmentation run augments): the copies are collated as they are, no object per copy.

Per extra copy = (worker CPU per fresh batch at e = 4 - at e = 1) / 3. Of that, collating the
copy's batch and sending it is what any loader pays per batch (priced below); the rest is
echoing's own. Target: echoing's own CPU per extra copy (identity) at most 0.5 ms per batch of
128.

Every case reads ahead as much as echoing reads ahead by default (``read_ahead``: one batch,
on a thread): at e = 1 the loader would not, so the read-ahead thread's CPU is per fresh read,
not per copy, and is priced on a line of its own (identity at e = 1 with and without it).

By default the worker's pipeline runs in the training process (``num_workers=0``, the same
stages): its CPU is the pipeline's alone. With ``--workers 1`` the worker process's CPU also
holds the transport of every batch (pickled through the pipe, or shared memory for large ones:
:mod:`dataecho.loader.transport`) and the worker's state snapshots, which the loader sends by
default; two more identity cases without snapshots (``snapshot_every_n_steps`` past the run)
price the snapshots' share of each extra copy.

One more case prices what any loader pays per batch, echo or not: a ``StatefulDataLoader``
over ready examples of the same shape that only collates them as dataecho's worker does
(:class:`dataecho.loader.transport.WorkerCollate`) and, in a worker, sends each batch the same
way (:func:`~dataecho.loader.transport.to_wire`; a batch too large for the pipe goes through a
new shared-memory segment, as every emitted batch does). Each extra copy less that is what
echoing itself adds: the pool, the copies, the counting.

    python -m benchmarks host_echo               # ~1 min; bench-results/host_echo/host_echo.md
    python -m benchmarks host_echo --workers 1   # the same, CPU of one worker process
    python -m benchmarks host_echo --image 28 --channels 1   # the demo's Fashion-MNIST shape
    python -m benchmarks host_echo --quick       # ~8 s, one short round
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from benchmarks import common
from benchmarks.device.workload import PacedShapes
from dataecho import EchoingDataLoader
from dataecho.app.workloads.image_augment import Augment
from dataecho.loader.transport import WorkerCollate, to_wire

TARGET_MS = 0.5  # echoing's own worker CPU per extra copy of a batch of 128 (less a plain batch)
FACTOR = 4
STREAM = 10**6  # examples: more than any window reads


def identity(example: Any) -> Any:
    """The cheapest per-example transform: what is left is dataecho's own cost."""
    return example


# Each transform's loader keywords.
TRANSFORMS: dict[str, dict[str, Any]] = {
    "identity": {"transform": identity},
    "augment": {"transform": Augment(pad=2)},
    "batch": {"batch_transform": identity},
}
PLAIN = "a plain loader's batch"  # ready examples collated and (in a worker) sent


@dataclass(frozen=True)
class Plan:
    batch_size: int
    workers: int
    shuffle_buffer: int
    warmup: float
    duration: float
    read_ahead: int


# (transform, echo factor, whether it reads ahead, whether workers send state snapshots)
Case = tuple[str, int, bool, bool]


def window(plan: Plan, data: Any, case: Case) -> float:
    """Worker CPU ms per fresh batch of one case (the main process's with ``workers=0``)."""
    transform, e, reads_ahead, snapshots = case
    if transform == PLAIN:
        return plain_window(plan, data)
    loader = EchoingDataLoader(
        data, batch_size=plan.batch_size, echo_factor=e, where="before_augment",
        shuffle_buffer=plan.shuffle_buffer, num_workers=plan.workers, seed=0,
        read_ahead=plan.read_ahead if reads_ahead else 0,
        snapshot_every_n_steps=None if snapshots else common.NO_SNAPSHOTS,
        **TRANSFORMS[transform],
    )  # fmt: skip
    cpu = common.children_cpu_seconds if plan.workers else time.process_time
    try:
        seconds, fresh = timed(iter(loader), plan, cpu, lambda: loader.stats.fresh_items)
    finally:
        loader.close()
    return 1e3 * seconds / (fresh / plan.batch_size)


def timed(
    it: Any, plan: Plan, cpu: Callable[[], float], progress: Callable[[], int] | None = None
) -> tuple[float, int]:
    """Take from ``it`` for ``plan.warmup`` s, then for ``plan.duration`` s: the CPU seconds
    of the second window and how far ``progress`` (default: the batches taken) moved in it."""
    taken = 0
    count = progress or (lambda: taken)
    warm_until = time.perf_counter() + plan.warmup
    while time.perf_counter() < warm_until:
        next(it)
    start, cpu0 = count(), cpu()
    end = time.perf_counter() + plan.duration
    while time.perf_counter() < end:
        next(it)
        taken += 1
    return cpu() - cpu0, count() - start


class ReadyExamples(IterableDataset):
    """Batches of ready examples ``(image, label)`` of ``data``'s shape, collated and, in a
    worker, made ready to cross as dataecho's worker does it (``WorkerCollate``, then
    ``to_wire``): what any loader pays per batch, with no pipeline before it. Eight distinct
    batches of separate examples in turn, so that no batch repeats another's bytes or memory."""

    def __init__(self, data: PacedShapes, batch_size: int) -> None:
        self.shape, self.batch_size = data.shape, batch_size

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(0)
        size = (8, self.batch_size, *self.shape)
        images = torch.randint(0, 256, size, generator=g).to(torch.uint8)
        labels = torch.randint(0, 10, (8, self.batch_size), generator=g).tolist()
        batches = [list(zip([x.clone() for x in images[i]], labels[i], strict=True))
                   for i in range(8)]  # fmt: skip
        collate = WorkerCollate(replaced=False, piped=True)
        wire = to_wire if get_worker_info() is not None else lambda batch: batch
        i = 0
        while True:
            yield wire(collate(batches[i % 8]))
            i += 1


def plain_window(plan: Plan, data: PacedShapes) -> float:
    """A plain loader's CPU ms per batch (its worker's, with workers): collate and transport."""
    loader = common.ready_loader(ReadyExamples(data, plan.batch_size), plan.workers)
    cpu = common.children_cpu_seconds if plan.workers else time.process_time
    it = iter(loader)
    try:
        seconds, batches = timed(it, plan, cpu)
    finally:
        del it  # shuts the worker down
    return 1e3 * seconds / batches


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks host_echo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="one round of short windows")
    p.add_argument("--rounds", type=int, help="interleaved rounds (3; 1 with --quick)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round (3)")
    p.add_argument("--image", type=int, default=64, help="image side, C x N x N uint8 (64)")
    p.add_argument("--channels", type=int, default=3, help="image channels C (3)")
    p.add_argument("--batch-size", type=int, default=128, help="examples per batch (128)")
    p.add_argument("--workers", type=int, default=0, help="loader workers (0: in-process)")
    p.add_argument("--shuffle-buffer", type=int, default=1024, help="examples (1024)")
    p.add_argument("--read-ahead", type=int, help="examples read ahead in every case (the "
                   "echoing default: the batch size)")  # fmt: skip
    p.add_argument("--out", default=str(common.results_dir("host_echo")))
    a = p.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.duration = a.duration or (0.8 if a.quick else 3.0)
    a.read_ahead = a.batch_size if a.read_ahead is None else a.read_ahead
    return a


def rows(costs: dict[Case, list[float]], sent: bool) -> tuple[list[list[str]], dict[str, Any]]:
    """One row per transform, one for the read-ahead thread (with workers, the snapshots'
    share), a plain loader's batch (``sent``: by a worker) and each transform less it; and per
    transform the medians ms per extra copy, in all (``total``) and less a plain batch (``own``)."""
    per_copy: dict[str, list[float]] = {}
    out = []
    for name in TRANSFORMS:
        base, echoed = costs[(name, 1, True, True)], costs[(name, FACTOR, True, True)]
        per_copy[name] = extra_copy(base, echoed)
        extra = per_copy[name]
        spread = f" ({min(extra):.2f}-{max(extra):.2f})" if len(extra) > 1 else ""
        out.append([name, f"{statistics.median(base):.2f}", f"{statistics.median(echoed):.2f}",
                    f"{statistics.median(extra):.2f}{spread}"])  # fmt: skip
    user = statistics.median([a - b for a, b in zip(per_copy["augment"], per_copy["identity"],
                                                    strict=True)])  # fmt: skip
    out.append(["augment - identity: the transform's own", "-", "-", f"{user:.2f}"])
    if ("identity", 1, False, True) in costs:
        thread = [a - b for a, b in zip(costs[("identity", 1, True, True)],
                                        costs[("identity", 1, False, True)], strict=True)]  # fmt: skip
        out.append(["the read-ahead thread's own, per fresh batch (identity, e=1)",
                    f"{statistics.median(thread):.2f}", "-", "-"])  # fmt: skip
    if ("identity", 1, True, False) in costs:
        base, echoed = costs[("identity", 1, True, False)], costs[("identity", FACTOR, True, False)]
        without = extra_copy(base, echoed)
        share = [a - b for a, b in zip(per_copy["identity"], without, strict=True)]
        out.append(["identity without state snapshots", f"{statistics.median(base):.2f}",
                    f"{statistics.median(echoed):.2f}", f"{statistics.median(without):.2f}"])  # fmt: skip
        out.append(["the snapshots' share of an extra copy (identity)", "-", "-",
                    f"{statistics.median(share):.2f}"])  # fmt: skip
    # Every extra copy is one more batch collated (and, in a worker, sent).
    plain = costs[(PLAIN, 1, False, False)]
    out.append([f"{PLAIN}: ready examples collated{', sent' if sent else ''}, per batch",
                "-", "-", f"{statistics.median(plain):.2f}"])  # fmt: skip
    own = {}
    for name in ("identity", "batch"):
        less = [a - b for a, b in zip(per_copy[name], plain, strict=True)]
        own[name] = statistics.median(less)
        out.append([f"{name}, less {PLAIN}", "-", "-", f"{own[name]:.2f}"])
    total = {name: statistics.median(extra) for name, extra in per_copy.items()}
    return out, {"total": total, "own": own}


def extra_copy(base: list[float], echoed: list[float]) -> list[float]:
    """Each round's CPU per extra copy from its e = 1 and e = FACTOR cases."""
    return [(b - a) / (FACTOR - 1) for a, b in zip(base, echoed, strict=True)]


def describe(case: Case) -> str:
    transform, e, reads_ahead, snapshots = case
    if transform == PLAIN:
        return f"{PLAIN} (ready examples)"
    return (f"{transform} e={e}{'' if reads_ahead else ' read_ahead=0'}"
            f"{'' if snapshots else ' no snapshots'}")  # fmt: skip


HEADERS = ["transform", "ms / fresh batch, e=1", f"ms / fresh batch, e={FACTOR}",
           "ms per extra copy (rounds)"]  # fmt: skip


def main(argv: list[str]) -> int:
    a = parse(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = common.pin_threads(1)
    load = common.load_average()
    plan = Plan(a.batch_size, a.workers, a.shuffle_buffer, min(1.0, a.duration), a.duration,
                a.read_ahead)  # fmt: skip
    data = PacedShapes(STREAM, (a.channels, a.image, a.image), 0.0, 0.0)
    cases: list[Case] = [(name, e, True, True) for name in TRANSFORMS for e in (1, FACTOR)]
    if a.read_ahead:
        cases.append(("identity", 1, False, True))
    if a.workers:
        cases += [("identity", e, True, False) for e in (1, FACTOR)]
    cases.append((PLAIN, 1, False, False))
    costs = common.interleaved(cases, a.rounds, lambda c: window(plan, data, c), log, describe)
    table, medians = rows(costs, sent=a.workers > 0)
    total, own = medians["total"], medians["own"]
    verdict = "met" if own["identity"] <= TARGET_MS else "MISSED"
    m = common.machine_summary()
    where = f"{a.workers} loader worker(s)" if a.workers else "in-process (num_workers=0)"
    text = (
        f"# Host-side example echo: worker CPU per extra copy\n\nCommand: `python -m benchmarks "
        f"host_echo {' '.join(argv)}`.\nMachine: {m['cpu']}; torch {m['torch']}; {threads}. "
        f"Load before: {load}; after: {common.load_average()}.\nwhere=before_augment, images "
        f"{a.channels}x{a.image}x{a.image} uint8, batch {a.batch_size}, shuffle_buffer "
        f"{a.shuffle_buffer}, read_ahead {a.read_ahead} in every loader case but the "
        f"read-ahead thread's twin, {where}; {a.rounds} round(s) of {a.duration:g} s per case, "
        f"interleaved. CPU in ms per fresh batch of {a.batch_size} (medians over rounds).\n\n"
        + common.markdown_table(HEADERS, table, "lrrr")
        + f"\n\nCPU per extra copy of a batch of {a.batch_size} (identity): "
        f"{total['identity']:.2f} ms, of which echoing's own (less {PLAIN}) "
        f"{own['identity']:.2f} ms; target for echoing's own <= {TARGET_MS} ms: {verdict}. "
        f"Without a per-example transform (batch): {total['batch']:.2f} ms, echoing's own "
        f"{own['batch']:.2f} ms.\n"
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_echo.md").write_text(text)
    print(text)
    return 0 if verdict == "met" else 1
