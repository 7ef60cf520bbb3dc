"""``python -m benchmarks adaptive``: no echo, fixed e and ``auto`` at R = 1, 2, 4, 8.

    python -m benchmarks adaptive            # ~7.5 minutes; writes bench-results/adaptive/
    python -m benchmarks adaptive --quick    # ~1 minute; prints only

The report (command, machine, table, legend) is printed and, with ``--write`` (the default
unless ``--quick``), written to ``--out``/adaptive.md. See :mod:`benchmarks.adaptive`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import common
from benchmarks.adaptive.measure import Settings, run
from benchmarks.adaptive.report import report


def parse(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m benchmarks adaptive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="1 round of 1.5 s per case; prints only")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round (4)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per case (1)")
    p.add_argument("--ratios", type=float, nargs="+", help="R values (1 2 4 8)")
    p.add_argument("--factors", type=float, nargs="+", help="fixed echo factors (2 4 8)")
    p.add_argument("--where", choices=("before_augment", "after_augment", "batch"))
    p.add_argument("--auto-wheres", nargs="+", choices=("before_augment", "after_augment", "batch"))
    p.add_argument("--max-echo-factor", type=float, help="auto's cap (16)")
    p.add_argument("--write", action=argparse.BooleanOptionalAction, default=None,
                   help="write the report to --out/adaptive.md (default: unless --quick)")  # fmt: skip
    p.add_argument("--out", type=Path, default=common.results_dir("adaptive"),
                   help="where adaptive.md goes (default: bench-results/adaptive)")  # fmt: skip
    a = p.parse_args(argv)
    s = Settings(rounds=1, duration=1.5, warmup=0.5) if a.quick else Settings()
    given = {
        "rounds": a.rounds,
        "duration": a.duration,
        "warmup": a.warmup,
        "ratios": tuple(a.ratios) if a.ratios else None,
        "factors": tuple(a.factors) if a.factors else None,
        "where": a.where,
        "auto_wheres": tuple(a.auto_wheres) if a.auto_wheres else None,
        "max_echo_factor": a.max_echo_factor,
    }
    s = Settings(**{**s.__dict__, **{k: v for k, v in given.items() if v is not None}})
    if a.write is None:
        a.write = not a.quick
    return s, a


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings, a = parse(args)
    result = run(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = " ".join(["python -m benchmarks adaptive", *args])
    text = report(result, command)
    print(text)
    if a.write:
        print(f"written: {write(text, a.out)}", file=sys.stderr)
    return 0


def write(text: str, out: Path) -> Path:
    """Write the report to ``out/adaptive.md``, replacing an earlier run's; its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "adaptive.md"
    path.write_text(f"# Adaptive echoing\n\n{text}")
    return path
