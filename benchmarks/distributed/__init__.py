"""Data-parallel echoing: ddp vs local-echo on 2 ranks, Fashion-MNIST CNN, e = 1, 2, 4.

    python -m benchmarks distributed            # 2 ranks, 12,000 fresh examples per run
    python -m benchmarks distributed --quick    # 2,560 fresh examples, e = 1, 4
    sh benchmarks/distributed/slowlink.sh 50mbit local-echo 4   # one run over a slow link (root)

What is measured, per (sync, e): steps and model all-reduce rounds per rank, rounds per fresh
batch, bytes and seconds of communication per rank, the training loop's wall time and the test
accuracy, at the same fresh-example budget for every row (both ranks together).

How: every run is a real ``dataecho train --nproc 2`` (PyTorch's launcher, gloo over loopback),
the in-memory upstream slowed by ``--read-delay`` per example, batch echoing (``where=batch``:
each fresh batch, then its ``e - 1`` copies). Figures per rank are rank 0's (rank 1's are
equal by construction, except seconds). ``rounds/fresh batch`` = all-reduce calls / fresh
batches of this rank: by design 1 for local-echo at every e and e for ddp (slightly less: a
run stops at the step that reaches the budget, so the last batch is not echoed). ``comm s``
for ddp counts each bucket's all-reduce from launch to completion, overlapped with the
backward pass. Test accuracy is on the whole test split, one seed, one learning rate for both
modes (not tuned per method). ``slowlink.sh`` runs the same training with the two ranks in two
network namespaces joined by a rate-limited link. Results: ``benchmarks/distributed/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import common
from dataecho.app.config import TrainConfig


@dataclass(frozen=True)
class Settings:
    factors: tuple[int, ...] = (1, 2, 4)
    budget: int = 12_000
    read_delay: float = 0.0005  # seconds per example: 64 ms per fresh batch of 128
    nproc: int = 2
    seed: int = 0


def run(settings: Settings, log: Any = print) -> list[dict[str, Any]]:
    """One launched run per (sync, e); a row of figures each."""
    from dataecho.app.train import train  # nproc > 1: launches the ranks, returns rank 0's result

    rows = []
    for e in settings.factors:
        for sync in ("ddp", "local-echo"):
            cfg = TrainConfig(
                nproc=settings.nproc, sync=sync, echo_factor=float(e), where="batch",
                budget=settings.budget, read_delay=settings.read_delay, seed=settings.seed,
                eval_every=settings.budget, name=f"{sync} e={e}", threads=1, num_workers=1,
            )  # fmt: skip
            log(f"[distributed] {cfg.name}: launching {settings.nproc} ranks")
            t0 = time.perf_counter()
            r = train(cfg)
            launched = time.perf_counter() - t0
            rank0 = r.ranks[0]
            fresh_batches = rank0["fresh_examples"] / cfg.batch_size
            rows.append({
                "sync": sync, "e": e, "fresh": r.fresh_examples, "steps": int(rank0["steps"]),
                "rounds": int(rank0["allreduce_calls"]),
                "per_batch": rank0["allreduce_calls"] / fresh_batches,
                "mb": rank0["allreduce_bytes"] / 1e6, "comm": rank0["comm_seconds"],
                "wall": r.wall_seconds, "launch": launched, "accuracy": r.test_accuracy,
            })  # fmt: skip
            log(f"[distributed] {cfg.name}: {rows[-1]}")
    return rows


HEADERS = ("sync", "echo e", "fresh (both ranks)", "steps/rank", "all-reduces/rank",
           "rounds/fresh batch", "MB/rank", "comm s/rank", "wall s", "test acc")  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    body = [
        (r["sync"], r["e"], f"{r['fresh']:,}", r["steps"], r["rounds"], f"{r['per_batch']:.2f}",
         f"{r['mb']:.1f}", f"{r['comm']:.2f}", f"{r['wall']:.1f}", f"{r['accuracy']:.4f}")
        for r in rows
    ]  # fmt: skip
    return common.markdown_table(HEADERS, body, align="lrrrrrrrrr")


def parse(argv: list[str]) -> Settings:
    p = argparse.ArgumentParser(prog="python -m benchmarks distributed", description=__doc__)
    p.add_argument("--quick", action="store_true", help="2,560 fresh examples, e = 1 and 4")
    p.add_argument("--budget", type=int, default=None, help="fresh examples per run")
    p.add_argument("--read-delay", type=float, default=None, help="seconds per example read")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    s = Settings(factors=(1, 4), budget=2_560) if a.quick else Settings()
    return Settings(
        factors=s.factors,
        budget=a.budget or s.budget,
        read_delay=s.read_delay if a.read_delay is None else a.read_delay,
        seed=a.seed,
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = parse(args)
    machine = common.machine_summary()
    rows = run(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"command: python -m benchmarks distributed {' '.join(args)}".rstrip())
    print(f"machine: {machine['cpu']}; torch {machine['torch']}; load before "
          f"{machine['load']}, after {common.load_average()}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '1 (set by the launcher)')}")  # fmt: skip
    print(f"settings: {settings}\n")
    print(table(rows))
    return 0
