"""``python -m benchmarks <name> [args]``: run one benchmark; without a name, list them.

A benchmark is a package ``benchmarks/NAME/`` whose ``main(argv: list[str]) -> int`` runs it,
with its results page ``RESULTS.md`` beside it; add it to ``BENCHMARKS`` with a one-line
description. Packages are imported only when run, so listing stays fast and one benchmark's
imports never slow another.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "adaptive": (
        "benchmarks.adaptive",
        "adaptive echoing: no echo vs fixed e vs auto at R = 1, 2, 4, 8",
    ),
    "distributed": (
        "benchmarks.distributed",
        "data-parallel echoing: ddp vs local-echo on 2 ranks, e = 1, 2, 4",
    ),
    "peers": (
        "benchmarks.peers",
        "dataecho vs DataLoader, MONAI ThreadDataLoader and adjacent repeats",
    ),
    "read_ahead": (
        "benchmarks.read_ahead",
        "the loader's read-ahead on vs off, fixed e, latency-bound and paced upstreams",
    ),
    "augmentation": (
        "benchmarks.augmentation",
        "the main job: fresh examples to 85% per augmentation shift, e=1 vs e=4",
    ),
    "memory": (
        "benchmarks.memory",
        "bounded memory: RSS of a 30-minute stream through nginx, e=4, 1 worker",
    ),
    "device": ("benchmarks.device", "echo on the training device vs host-side echo, e = 1-8"),
    "host_echo": (
        "benchmarks.host_echo",
        "before_augment's own worker CPU per extra copy: e=1 vs e=4, per-example or batch transforms",
    ),
    "transport": (
        "benchmarks.transport",
        "a worker's batch through the pipe vs shared memory: CPU per batch by size",
    ),
    "evaluation": (
        "benchmarks.evaluation",
        "one evaluation of the demo's CNN by chunk size, alone and beside a busy step",
    ),
    "pool": ("benchmarks.pool", "the device pool's time per batch at 10-100 batches vs the step"),
    "spread": (
        "benchmarks.spread",
        "how far the default shuffle buffer spreads copies, what it holds, the first batch's wait",
    ),
    "persistent_workers": (
        "benchmarks.persistent_workers",
        "epoch start (iter() to the first batch) with and without persistent workers",
    ),
    "streaming": ("benchmarks.streaming", "mosaic/litdata/webdataset/HF: own loader vs e=4, auto"),
}


def usage() -> str:
    width = max(len(name) for name in BENCHMARKS)
    lines = ["usage: python -m benchmarks <name> [args]   (<name> --help for its options)", ""]
    lines.append("benchmarks:")
    lines += [f"  {name.ljust(width)}  {about}" for name, (_, about) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "list"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(
            f"unknown benchmark {name!r}; choose one of: {', '.join(BENCHMARKS)}\n\n{usage()}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(BENCHMARKS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
