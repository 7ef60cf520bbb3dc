"""Adaptive echoing: no echo, fixed e and ``echo_factor="auto"`` side by side.

    python -m benchmarks adaptive            # ~7.5 minutes; writes docs/benchmarks.md
    python -m benchmarks adaptive --quick    # ~1 minute; prints only

Setup: the training step (:class:`benchmarks.common.TrainStep`, SmallCNN + SGD on batches of
128 Fashion-MNIST-shaped images) runs on 1 torch thread in this process. Its time ``t_down`` is
measured first; then, for each ratio R, the upstream delivers one batch per ``R * t_down``
through *sleeping* reads (:class:`benchmarks.common.PacedImages`) in one DataLoader worker
(the other core), which also runs the per-example augmentation. Every (R, configuration) case
trains for a fixed wall time after a warm-up, and the cases run interleaved, round after
round, so machine drift cancels.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field, fields

from benchmarks import common
from dataecho import EchoingDataLoader
from dataecho.app.workloads.augment import Augment

HEADING = "Adaptive echoing"
TARGETS = {"efficiency": 0.95, "stall": 0.02, "fresh": 0.98, "factor": 0.10}


@dataclass(frozen=True)
class Config:
    """One loader configuration; ``echo_factor=None`` reads the upstream alone (no step)."""

    echo_factor: float | str | None
    where: str = "batch"

    @property
    def name(self) -> str:
        if self.echo_factor is None:
            return "upstream alone"
        if self.echo_factor == 1:
            return "no echo"
        e = self.echo_factor if self.echo_factor == "auto" else f"e={self.echo_factor:g}"
        return f"{e} ({self.where})"


@dataclass(frozen=True)
class Settings:
    ratios: tuple[float, ...] = (1, 2, 4, 8)
    factors: tuple[float, ...] = (2, 4, 8)
    where: str = "batch"  # insertion point of the fixed factors
    auto_wheres: tuple[str, ...] = ("batch", "before_augment")
    max_echo_factor: float = 16
    batch_size: int = 128
    duration: float = 4.0  # measured seconds per case and round
    warmup: float = 1.0  # seconds (and >= 2 fresh batches) before measuring
    rounds: int = 3
    threads: int = 1
    seed: int = 0

    def configs(self) -> list[Config]:
        fixed = [Config(float(e), self.where) for e in self.factors]
        auto = [Config("auto", w) for w in self.auto_wheres]
        return [Config(None), Config(1.0), *fixed, *auto]


@dataclass
class Window:
    """Counts over one measured window (or the sum of several)."""

    wall: float = 0.0
    steps: int = 0
    fresh: int = 0  # examples read from upstream
    out: int = 0  # examples handed to the step, echoes included
    wait: float = 0.0  # seconds the step loop spent in next(loader)
    compute: float = 0.0  # seconds in the training step
    compute_cpu: float = 0.0  # CPU seconds of the step's thread in the step (< compute: preempted)
    worker_cpu: float = 0.0  # CPU seconds of the loader worker process
    # Fresh examples between the first and the last fresh arrival seen in the window, and the
    # seconds between them: a rate free of the +-1 batch a fixed window cuts off (at R=8 a 4 s
    # window holds ~20 fresh batches, so counting alone would be off by up to 5%).
    arrivals: int = 0
    arrival_seconds: float = 0.0
    per_round: list[float] = field(default_factory=list)  # steps/s of each round

    def __add__(self, other: Window) -> Window:
        sums = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return Window(**sums)


def run_case(
    ratio: float, config: Config, t_down: float, s: Settings, step: common.TrainStep
) -> Window:
    """Run one case: build the loader, warm up, then measure ``s.duration`` seconds."""
    batch_seconds = ratio * t_down
    # Long enough that no case reaches the end of the epoch (which would restart the worker).
    length = int(s.batch_size * (s.warmup + s.duration + 30) / batch_seconds) + 8 * s.batch_size
    loader = EchoingDataLoader(
        common.paced_upstream(batch_seconds, s.batch_size, length),
        batch_size=s.batch_size,
        echo_factor=1.0 if config.echo_factor is None else config.echo_factor,
        max_echo_factor=s.max_echo_factor,
        where=config.where,
        transform=Augment(),
        num_workers=1,
        seed=s.seed,
        drop_last=True,
    )
    train = config.echo_factor is not None
    try:
        it = iter(loader)
        warm_until = time.perf_counter() + s.warmup
        # Warm-up: the worker starts, and auto's reuse buffer holds a fresh item.
        while time.perf_counter() < warm_until or loader.stats.fresh_examples < 2 * s.batch_size:
            images, labels = next(it)
            if train:
                step(images, labels)
        fresh0, out0 = loader.stats.fresh_examples, loader.stats.examples_out
        w = Window()
        worker0 = common.children_cpu_seconds()
        start = time.perf_counter()
        seen, first, last = fresh0, None, None  # (time, fresh count) at the first/last arrival
        while (now := time.perf_counter()) < start + s.duration:
            images, labels = next(it)
            got = time.perf_counter()
            w.wait += got - now
            if (fresh := loader.stats.fresh_examples) != seen:
                seen, last = fresh, (got, fresh)
                first = first or last
            if train:
                cpu = time.thread_time()
                w.compute += step(images, labels)
                w.compute_cpu += time.thread_time() - cpu
            w.steps += 1
        w.wall = time.perf_counter() - start
        w.worker_cpu = common.children_cpu_seconds() - worker0
        w.fresh = loader.stats.fresh_examples - fresh0
        w.out = loader.stats.examples_out - out0
        w.per_round = [w.steps / w.wall]
        if first is not None and last[0] > first[0]:
            w.arrivals, w.arrival_seconds = last[1] - first[1], last[0] - first[0]
    finally:
        loader.close()
    return w


def run(s: Settings, log=print) -> dict:
    """Calibrate t_down, run every case interleaved; the raw results and the context."""
    threads = common.pin_threads(s.threads)
    load_before = common.load_average()
    step = common.TrainStep(seed=s.seed)
    t_down = step.measure(s.batch_size)
    log(f"t_down = {t_down * 1e3:.2f} ms per step ({threads}); load {load_before}")
    cases = [(r, c) for r in s.ratios for c in s.configs()]

    def one(case: tuple[float, Config]) -> Window:
        w = run_case(case[0], case[1], t_down, s, step)
        log(f"    {w.steps / w.wall:7.2f} steps/s, {w.fresh / w.wall:8.0f} fresh/s")
        return w

    raw = common.interleaved(
        cases, s.rounds, one, log, describe=lambda c: f"R={c[0]:g} {c[1].name}"
    )
    windows = {case: sum(ws[1:], ws[0]) for case, ws in raw.items()}
    return {
        "settings": s,
        "t_down": t_down,
        "threads": threads,
        "machine": common.machine_summary() | {"load_before": load_before},
        "windows": windows,
    }


def rows(result: dict) -> list[dict]:
    """One dict of figures per (R, config), with the issue's targets checked."""
    s, windows = result["settings"], result["windows"]

    def fresh_rate(w: Window) -> float:
        return w.arrivals / w.arrival_seconds if w.arrival_seconds else w.fresh / w.wall

    out = []
    for (ratio, config), w in windows.items():
        base = windows[(ratio, Config(1.0))]
        upstream = windows[(ratio, Config(None))]
        t_up = s.batch_size / fresh_rate(upstream)  # seconds per fresh batch, measured
        step_s = w.compute / w.steps if w.compute else math.nan  # this case's step, wall
        row = {
            "R": ratio,
            "config": config.name,
            "steps/s": w.steps / w.wall,
            "fresh ex/s": fresh_rate(w),
            "fresh / upstream": fresh_rate(w) / fresh_rate(upstream),
            "realized e": w.out / w.fresh if w.fresh else math.nan,
            "R seen": t_up / step_s,
            "stall %": 100 * w.wait / w.wall,
            "step ms": 1e3 * step_s,
            "step cpu ms": 1e3 * w.compute_cpu / w.steps if w.compute else math.nan,
            "efficiency": math.nan,
            "eff. seen": math.nan,
            "worker cpu %": 100 * w.worker_cpu / w.wall,
            "spread %": 100 * (max(w.per_round) - min(w.per_round)) / (w.steps / w.wall),
            "targets": "-",
        }
        if config.echo_factor not in (None, 1.0):
            factor = s.max_echo_factor if config.echo_factor == "auto" else config.echo_factor
            ideal = min(factor, ratio) * base.steps / base.wall
            row["efficiency"] = row["steps/s"] / ideal
            # The same against what this case's own step time allows: echoing's overhead alone.
            row["eff. seen"] = row["steps/s"] / min(factor / t_up, 1 / step_s)
            row["targets"] = verdict(row, config, ratio, s)
        out.append(row)
    return out


def verdict(row: dict, config: Config, ratio: float, s: Settings) -> str:
    """Either "ok" or "MISS: " and the targets missed (see ``TARGETS``)."""
    if config.echo_factor != "auto":
        missed = ["efficiency"] if row["efficiency"] < TARGETS["efficiency"] else []
    else:
        expected = min(ratio, math.floor(s.max_echo_factor))
        missed = [
            name
            for name, bad in (
                ("stall", row["stall %"] > 100 * TARGETS["stall"]),
                ("fresh", row["fresh / upstream"] < TARGETS["fresh"]),
                ("factor", abs(row["realized e"] / expected - 1) > TARGETS["factor"]),
            )
            if bad
        ]
    return "MISS: " + ", ".join(missed) if missed else "ok"


COLUMNS = {  # name -> format of its figures
    "R": "{:g}",
    "config": "{}",
    "steps/s": "{:.2f}",
    "fresh ex/s": "{:.0f}",
    "fresh / upstream": "{:.3f}",
    "realized e": "{:.2f}",
    "R seen": "{:.2f}",
    "stall %": "{:.1f}",
    "step ms": "{:.1f}",
    "step cpu ms": "{:.1f}",
    "efficiency": "{:.3f}",
    "eff. seen": "{:.3f}",
    "worker cpu %": "{:.0f}",
    "spread %": "{:.1f}",
    "targets": "{}",
}


def table(result: dict) -> str:
    def cell(value, fmt: str) -> str:
        return "-" if isinstance(value, float) and math.isnan(value) else fmt.format(value)

    body = [[cell(r[c], f) for c, f in COLUMNS.items()] for r in rows(result)]
    return common.markdown_table(list(COLUMNS), body, align="rl" + "r" * (len(COLUMNS) - 3) + "l")


def report(result: dict, command: str) -> str:
    """The generated part of the docs section: command, context, table, legend."""
    s, m = result["settings"], result["machine"]
    return f"""\
Command: `{command}` ({m["date"]}).
Machine: {m["cpu"]}; torch {m["torch"]}, Python {m["python"]}; {result["threads"]}.
Load average (1/5/15 min) before: {m["load_before"]}; after: {common.load_average()}.

Step: SmallCNN + SGD (momentum 0.9), batch {s.batch_size}, 1x28x28 inputs;
t_down = {result["t_down"] * 1e3:.2f} ms (median of 30 steps before the cases). Upstream: one
DataLoader worker reads examples at R x t_down per batch (`benchmarks.common.PacedImages`:
sleeping reads, emulating storage/network latency, no CPU while waiting; a reader descheduled
for up to one batch period catches up), then runs `Augment` per example.
Fixed factors echo at `where="{s.where}"`; auto uses `max_echo_factor={s.max_echo_factor:g}`.
Each case: {s.warmup:g} s warm-up (and >= 2 fresh batches), then {s.duration:g} s measured;
{s.rounds} round(s), cases interleaved (A B C ... A B C ...); figures are totals over rounds.

{table(result)}

Columns: *fresh ex/s* = fresh examples between the first and last fresh arrival in each
window over the time between them (a window's count alone would be off by up to one batch);
*fresh / upstream* = that over the "upstream alone" case at the same R (reading only, no
step); *realized e* = examples out / fresh examples in the windows (`loader.stats` counts);
*R seen* = the measured upstream time per batch over this case's own step time (R as the run
saw it; the step is slower than t_down when it shares the cores); *stall %* = time in
`next(loader)` / wall time; *step ms* = one step, wall clock; *step cpu ms* = CPU time of the
step's thread in it (lower than step ms: the thread was preempted or waited for the GIL);
*efficiency* = steps/s / (min(e, R) x steps/s of "no echo"), e = max_echo_factor for auto;
*eff. seen* = steps/s / min(e / t_up, 1 / step time of this case): echoing's own overhead,
without the step's slowdown; *worker cpu %* = CPU of the loader worker process / wall time
(100 = one core); *spread %* = (max - min) / mean of the per-round steps/s. Targets:
fixed e efficiency >= {TARGETS["efficiency"]}; auto stall <= {100 * TARGETS["stall"]:g}%,
fresh / upstream >= {TARGETS["fresh"]}, realized e within {100 * TARGETS["factor"]:g}% of
min(R, max_echo_factor).
"""


def parse(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m benchmarks adaptive", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="1 round of 1.5 s per case; no docs")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round (4)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per case (1)")
    p.add_argument("--ratios", type=float, nargs="+", help="R values (1 2 4 8)")
    p.add_argument("--factors", type=float, nargs="+", help="fixed echo factors (2 4 8)")
    p.add_argument("--where", choices=("before_augment", "after_augment", "batch"))
    p.add_argument("--auto-wheres", nargs="+", choices=("before_augment", "after_augment", "batch"))
    p.add_argument("--max-echo-factor", type=float, help="auto's cap (16)")
    p.add_argument("--write", action=argparse.BooleanOptionalAction, default=None,
                   help=f"update {common.DOCS.relative_to(common.REPO)} (default: unless --quick)")  # fmt: skip
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
        common.replace_block(common.DOCS, HEADING, "adaptive", text, PREAMBLE)
        print(f"written to {common.DOCS}", file=sys.stderr)
    return 0


PREAMBLE = """\
# Benchmarks

Side-by-side measurements of dataecho. Run them from the repository root:

    python -m benchmarks                 # list the benchmarks
    python -m benchmarks adaptive        # one benchmark; it rewrites its own section below
    python -m benchmarks adaptive --quick

Each benchmark runs all of its configurations in *one* process, interleaved (A B C ... A B C
...), so drift of a shared machine (other jobs, frequency changes) hits every configuration
alike. Each section records the exact command, date, machine, torch version, thread settings
and the load average around the run. Slow storage is *emulated* with sleeping reads
(`benchmarks.common.PacedImages`); real I/O also costs CPU, which these numbers leave out.
The generated part of each section sits between `<!-- name:begin -->` / `<!-- name:end -->`
markers and is replaced on a rerun; notes outside the markers are written by hand.
"""
