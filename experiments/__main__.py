"""``python -m experiments NAME``: run one paper's experiments; write tables and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments import EXPERIMENTS, run


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Re-run a paper's experiments at small scale; write tables and plots.",
    )
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS),
                        help="; ".join(f"{k}: {v}" for k, v in EXPERIMENTS.items()))  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="a small version that finishes in under 2 minutes")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the tables and plots go (default: reproduce-EXPERIMENT)")  # fmt: skip
    parser.add_argument("--seed", type=_non_negative_int, default=0, metavar="N",
                        help="base seed of every trial (default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out or Path(f"reproduce-{args.experiment}")
    summary = run(args.experiment, out, quick=args.quick, seed=args.seed)
    print(f"results: {summary} (CSV and PNG files next to it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
