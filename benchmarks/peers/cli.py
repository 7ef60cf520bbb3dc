"""``python -m benchmarks peers``: dataecho against its peers (see :mod:`benchmarks.peers`).

    python -m benchmarks peers                  # every section, ~30 minutes
    python -m benchmarks peers --quick          # a few seconds per case, 1 round: ~4 minutes
    python -m benchmarks peers --only target    # one section (or several)

Writes ``peers.md`` (the report), ``peers.png`` (when section 2 or 6 ran) and ``peers.pickle``
(the raw result) into ``--out`` (default ``bench-results/peers/``); prints the report.
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks import common
from benchmarks.peers import markdown
from benchmarks.peers.sections import run
from benchmarks.peers.settings import QUICK, Settings


def parse(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m benchmarks peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a few seconds per case, 1 round")
    p.add_argument("--rounds", type=int, help="interleaved rounds of section 2 (default 2)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round (4)")
    p.add_argument("--ratios", type=float, nargs="+", help="R values (2 4 8)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=Settings.sections,
        metavar="SECTION",
        help=f"run only these sections: {' '.join(Settings.sections)}",
    )
    p.add_argument("--match", nargs="+", metavar="TEXT",
                   help='section 2: only loaders whose name contains one of these, e.g. "MONAI" '
                        '"(batch)" (DataLoader always runs)')  # fmt: skip
    p.add_argument("--target-ratios", type=float, nargs="+", help="R values of section 6 (2 4 8)")
    p.add_argument("--target-rounds", type=int, help="rounds (seeds) of section 6 (2)")
    p.add_argument("--target-accuracy", type=float, help="test accuracy section 6 races to (0.8)")
    p.add_argument("--out", type=Path, default=common.results_dir("peers"),
                   help="where peers.md and peers.png go")  # fmt: skip
    a = p.parse_args(argv)
    s = Settings(**QUICK) if a.quick else Settings()
    given = {"rounds": a.rounds, "duration": a.duration,
             "ratios": tuple(a.ratios) if a.ratios else None,
             "sections": tuple(a.only) if a.only else None, "target_rounds": a.target_rounds,
             "input_bound_match": tuple(a.match) if a.match else None,
             "target_accuracy": a.target_accuracy,
             "target_ratios": tuple(a.target_ratios) if a.target_ratios else None}  # fmt: skip
    return replace(s, **{k: v for k, v in given.items() if v is not None}), a


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings, a = parse(args)
    result = run(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = " ".join(["python -m benchmarks peers", *args])
    path = markdown.write(result, command, a.out)
    print(path.read_text())
    print(f"written: {path} and {path.with_name('peers.png')}", file=sys.stderr)
    with open(a.out / "peers.pickle", "wb") as f:  # the raw result, to re-render the report
        pickle.dump(result, f)
    windows = result.get("input_bound", {}).values()
    ok = not result["failed"] and all(math.isfinite(w.steps) for w in windows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
