"""The device pool's cost per batch against its size, beside the demo's training step.

``where="device"`` mixes the examples of echoed batches through a pool
(:class:`dataecho.stages.MixExamples`) on the training thread. Measured here, side by side in
one run on one device: the pool's time per emitted batch (``work_seconds`` over batches: its
draw, gather and scatter) at pools of 10 to 100 batches' worth, the demo's CNN step on a batch
of the same size, and what a draw that scans the pool would cost (uniform keys and ``topk``
over every slot, the usual way to draw on a device) at each size. Every figure is the median
of ``--rounds`` interleaved rounds; the ratios are the point, not the absolute times.

    python -m benchmarks pool                   # ~30 s
    python -m benchmarks pool --quick           # ~5 s, prints only
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks import common
from dataecho import echo, mix_examples
from dataecho.app import workloads

POOLS = (10, 40, 100)  # in batches' worth of examples
BATCH = 128
FACTOR = 4  # the demo's
TARGET = 0.02  # of the step: the pool's budget on the training thread


def make_batches(n: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches shaped like the demo's on the device: uint8 28x28 images and labels."""
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randint(0, 256, (BATCH, 1, 28, 28), dtype=torch.uint8, generator=g).to(device),
         torch.randint(0, 10, (BATCH,), generator=g).to(device))
        for _ in range(n)
    ]  # fmt: skip


def pool_seconds(pool: int, batches: list, device: torch.device) -> float:
    """Seconds the pool spends per emitted batch once full (e = 4, the first pool's worth
    of emissions not counted: they fill it)."""
    node = mix_examples(echo(batches, FACTOR, seed=0), pool * BATCH, seed=0, device=device)
    warm = pool + 2
    for _ in range(warm):
        next(node)
    start, emitted = node.work_seconds, 0
    for _ in node:
        emitted += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (node.work_seconds - start) / emitted


def scan_seconds(pool: int, device: torch.device, draws: int = 50) -> float:
    """Seconds per draw of a batch by keys over every slot: ``rand`` and ``topk``."""
    slots, g = pool * BATCH + BATCH, torch.Generator(device=device).manual_seed(0)
    times = []
    for _ in range(draws):
        t0 = time.perf_counter()
        torch.rand(slots, generator=g, device=device).topk(BATCH).indices.tolist()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[5:])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks pool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, short streams")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    threads = common.pin_threads(1)
    rounds, length = (2, 60) if args.quick else (args.rounds, 300)
    cnn = workloads.get("cnn")
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        results.setdefault("step", []).append(cnn.measure_step_seconds(BATCH, 20, seq_len=0))
        for pool in POOLS:
            batches = make_batches(max(length, 2 * pool + 10), device)
            results.setdefault(f"pool {pool}", []).append(pool_seconds(pool, batches, device))
            results.setdefault(f"scan {pool}", []).append(scan_seconds(pool, device))
    median = {k: statistics.median(v) for k, v in results.items()}
    step = median["step"]
    rows = []
    for pool in POOLS:
        mine, scan = median[f"pool {pool}"], median[f"scan {pool}"]
        rows.append([f"{pool} ({pool * BATCH:,} examples)", f"{mine * 1e6:.0f} us",
                     f"{mine / step:.2%}", f"{scan * 1e6:.0f} us", f"{scan / step:.2%}",
                     "met" if mine / step < TARGET else "MISSED"])  # fmt: skip
    table = common.markdown_table(
        ["pool, batches", "pool per batch", "of the step", "a scan's draw alone",
         "of the step", f"pool < {TARGET:.0%} of the step"], rows)  # fmt: skip
    machine = common.machine_summary()
    print(f"device {device}; CNN step on a batch of {BATCH}: {step * 1e3:.2f} ms (median of "
          f"{rounds} rounds); {threads}; {machine['cpu']}, torch {machine['torch']}, load "
          f"{machine['load']}")  # fmt: skip
    print(table)
    return 0 if all(median[f"pool {p}"] / step < TARGET for p in POOLS) else 1
