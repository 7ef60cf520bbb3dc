"""``python -m benchmarks memory``: stream for a while, then report RSS (see :mod:`benchmarks.memory`).

    nice -n 19 python -m benchmarks memory --minutes 30    # writes bench-results/memory/
    python -m benchmarks memory --minutes 0.2 --warmup-minutes 0.05 --examples 1024   # smoke
    python -m benchmarks memory --from-csv bench-results/memory/memory.csv   # re-report

Writes ``memory.csv`` (every sample) and ``memory.png`` into ``--out``; prints the report.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks import common
from benchmarks.memory.stream import Settings, run
from benchmarks.memory.summary import plot, read_csv, report, summarize, write_csv


def parse(argv: list[str]) -> tuple[Settings, Path | None]:
    """The settings, and ``--from-csv``: summarize and plot an earlier run's samples instead."""
    d = Settings()
    p = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    for name, value in asdict(d).items():
        kind = type(value) if not isinstance(value, Path) else Path
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=value,
                       help=f"(default: {value})")  # fmt: skip
    p.add_argument("--from-csv", type=Path, default=None, metavar="CSV",
                   help="no run: report the samples of an earlier run's memory.csv (with the "
                   "--warmup-minutes given)")  # fmt: skip
    given = vars(p.parse_args(argv))
    from_csv = given.pop("from_csv")
    s = Settings(**given)
    if not (s.minutes > 0 and 0 <= s.warmup_minutes < s.minutes and s.sample_seconds > 0):
        p.error(f"need minutes > warmup-minutes >= 0 and sample-seconds > 0, got {s}")
    return s, from_csv


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    s, from_csv = parse(args)
    s.out.mkdir(parents=True, exist_ok=True)
    machine = common.machine_summary()
    if from_csv is None:
        rows = run(s, log=lambda m: print(m, file=sys.stderr, flush=True))
        write_csv(rows, s.out / "memory.csv")
    else:
        rows = read_csv(from_csv)
    summary = summarize(rows, s.warmup_minutes * 60)
    plot(rows, s.warmup_minutes * 60, s.out / "memory.png")
    print(f"command: python -m benchmarks memory {' '.join(args)}".rstrip())
    print(f"machine: {machine['cpu']}; torch {machine['torch']}; load "
          f"before {machine['load']}, after {common.load_average()}")  # fmt: skip
    print(f"settings: {s}\n\n{report(s, rows, summary)}")
    written = [s.out / "memory.png"] if from_csv else [s.out / "memory.csv", s.out / "memory.png"]
    print(f"\nwrote {' and '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
