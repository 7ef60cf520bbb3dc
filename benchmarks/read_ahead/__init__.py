"""What the loader's read-ahead buys: fixed-factor example echoing, read-ahead on vs off.

    python -m benchmarks read_ahead                 # ~3 minutes; writes bench-results/read_ahead/
    python -m benchmarks read_ahead --ratios 4 --rounds 1

What is measured: steps/s, stall and fresh examples/s of fixed-factor example echoing
(``before_augment``, per-example and batch augmentation) with the loader's read-ahead on (the
default) and off, and the paired per-round ratio on / off. Two upstreams at R x t_down per
batch, both in one loader worker (the peers benchmark's step, augmentation and measurement:
:func:`benchmarks.peers.train_window`):

- *latency*: every read sleeps its share (:class:`LatencyReads`), as a synchronous read from a
  remote store or a disk does: a reader busy elsewhere does not get the time back;
- *paced*: ``dataecho.app.sources.Throttled``, whose reads are due on a clock with 1 ms of slack,
  so a reader that was busy catches up (what the peers benchmark uses).

Cases run interleaved (on, off, on, off, ...), so each on / off pair ran side by side.
Results: ``benchmarks/read_ahead/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.peers.loaders import Case
from benchmarks.peers.report import paired
from benchmarks.peers.sections import Context, Window, train_window
from benchmarks.peers.settings import Settings
from dataecho.app.sources.fashion_mnist import FashionMNIST
from dataecho.app.sources.throttled import Throttled
from dataecho.app.workloads.image_augment import Augment

HEADERS = ["upstream", "R", "loader", "steps/s", "stall %", "fresh ex/s", "on / off (per round)"]


class LatencyReads:
    """``dataset`` with every read sleeping ``delay`` seconds first: a synchronous read."""

    def __init__(self, dataset: Any, delay: float) -> None:
        self.dataset, self.delay = dataset, delay

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay)
        return self.dataset[index]


def cases(e: int) -> list[Case]:
    """Read-ahead on (the default) and off, per-example and batch augmentation."""
    return [Case("dataecho", e, "before_augment"),
            Case("dataecho", e, "before_augment", read_ahead=0),
            Case("dataecho", e, "before_augment", 1024, batch_augment=True),
            Case("dataecho", e, "before_augment", 1024, batch_augment=True, read_ahead=0)]  # fmt: skip


def run(s: Settings, log=print) -> tuple[dict, float]:
    """Windows per (upstream, R, case), and t_down."""
    common.pin_threads(s.threads)
    train = FashionMNIST(split="train", limit=s.train_limit)
    step = common.SyntheticStep(seed=s.seed)
    t_down = step.measure(s.batch_size)
    ctx = Context(s, train, None, Augment(), step, t_down)
    upstreams = {"latency": LatencyReads, "paced": lambda d, delay: Throttled(d, delay=delay)}
    keys = [(up, r, c) for up in upstreams for r in s.ratios for c in cases(max(1, round(r)))]

    def one(key: tuple[str, float, Case]) -> Window:
        up, ratio, case = key
        return train_window(ctx, case, upstreams[up](train, ratio * t_down / s.batch_size))

    raw = common.interleaved(keys, s.rounds, one, log, lambda k: f"{k[0]} R={k[1]:g} {k[2].name}")
    return {k: sum(ws[1:], ws[0]) for k, ws in raw.items()}, t_down


def rows(windows: dict) -> list[list[str]]:
    out = []
    for (up, ratio, case), w in windows.items():
        on_off = "-"
        if case.read_ahead is None:  # "on": pair it with the same case read in step
            off = windows[(up, ratio, replace(case, read_ahead=0))]
            ratios = paired(w, off)
            on_off = f"{statistics.fmean(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        out.append([up, f"{ratio:g}", case.name, f"{w.steps / w.wall:.2f}",
                    f"{100 * w.wait / w.wall:.1f}", f"{w.fresh / w.wall:,.0f}", on_off])  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks read_ahead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--ratios", type=float, nargs="+", default=[2, 4], help="R values (2 4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per case (4)")
    p.add_argument("--train-limit", type=int, help="training examples held (all 60,000)")
    p.add_argument("--out", type=Path, default=common.results_dir("read_ahead"))
    a = p.parse_args(argv)
    s = replace(Settings(), ratios=tuple(a.ratios), rounds=a.rounds, duration=a.duration,
                warmup=min(Settings.warmup, a.duration), train_limit=a.train_limit)  # fmt: skip
    load = common.load_average()
    windows, t_down = run(s, log=lambda m: print(m, file=sys.stderr, flush=True))
    m = common.machine_summary()
    text = (
        f"# Read-ahead on vs off\n\nCommand: `python -m benchmarks read_ahead "
        f"{' '.join(argv)}`.\nMachine: {m['cpu']}; torch {m['torch']}. Load "
        f"before: {load}; after: {common.load_average()}. t_down = {t_down * 1e3:.2f} ms; "
        f"{s.rounds} round(s) of {s.duration:g} s per case, interleaved.\n\n"
        f"{common.markdown_table(HEADERS, rows(windows), align='lrlrrrl')}\n"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "read_ahead.md").write_text(text)
    print(text)
    return 0
