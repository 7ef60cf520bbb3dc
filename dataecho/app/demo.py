"""``dataecho demo``: an input-bound run over a real HTTP server, trained with and without echoing.

    dataecho demo             # a few minutes; writes runs/<timestamp>/ (results: docs/demo.md)
    dataecho demo --quick     # seconds: a tiny subset, a low target, one evaluation

Steps: write the Fashion-MNIST training set once as WebDataset shards (cached in --work-dir);
pick nginx's bandwidth cap so that one batch takes R steps' time to arrive, *measuring* R on
the real parts (:mod:`dataecho.app.calibration`: a first guess from the step's time, then
``dataecho.profile`` on the real loader, then a short probe through the training loop); then
train to the target three times (no echo, a fixed factor, ``auto``) and write the table,
``report.md``, ``metrics.csv`` and ``curves.png``. The run's own R (time per step over compute
per step) is reported too.
Without nginx (or with --emulate) the shards are read through the storage *emulation*
(:mod:`dataecho.app.sources.emulated`), and every number says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dataecho._validate import MAX_BUFFER, Int, Real
from dataecho.app.calibration import THREADS, WORKERS, calibrate, serve
from dataecho.app.config import COUNT_WHY, MAX_AUGMENT_PAD, MAX_COUNT, MAX_SEED
from dataecho.app.loader_settings import DEVICE_POOL_BATCHES, MAX_ECHO_FACTOR
from dataecho.app.quiet import CpuWatch, QuietCheck, load_per_core
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR
from dataecho.app.sources.nginx import NginxNotFoundError, find_nginx
from dataecho.app.train import TrainConfig, train
from dataecho.app.upstream import prepare
from dataecho.loader import WHERE_CHOICES
from dataecho.loader.points import point_named

DEFAULT_WORK_DIR = Path.home() / ".cache" / "dataecho"
DEFAULT_TARGET, QUICK_TARGET = 0.85, 0.3
# A shard is one HTTP request; 1,000 examples (~2.3 MB) keeps request overhead negligible.
EXAMPLES_PER_SHARD = 1000
# Post-echo shuffle buffer in batches' worth, by insertion point (docs/demo.md measures both):
# the device's mixing pool at a run's 40 saved more fresh examples and wall time than at 10;
# in the loader worker 40 saved no more than 10 and cost more of the fresh-data rate.
HOST_SHUFFLE_BATCHES = 10


def shuffle_batches(where: str) -> int:
    """The demo's post-echo shuffle buffer for ``where``, in batches' worth."""
    return DEVICE_POOL_BATCHES if point_named(where).on_device else HOST_SHUFFLE_BATCHES


def shuffle_buffer(where: str, batches: int | None, batch_size: int) -> int:
    """``batches`` (None: the demo's for ``where``) of ``batch_size`` examples, as the
    loader's ``shuffle_buffer`` counts them."""
    batches = shuffle_batches(where) if batches is None else batches
    return batches * batch_size


# The echoed runs' insertion point: after the host-to-device copy (the CPU device here), so the
# loader worker does no per-copy work and the copies' examples mix on the device.
DEFAULT_WHERE = "device"


@dataclass(frozen=True)
class Plan:
    """The demo's sizes; ``--quick`` swaps in tiny ones (for tests and a first look)."""

    examples: int | None = None  # training examples written as shards (None: all 60,000)
    batch_size: int = 128
    budget: int = 120_000  # fresh examples per run at most
    eval_every: int = 3_000  # fresh examples between evaluations
    eval_examples: int = 5_000  # test examples per evaluation
    # A first look at 1,000 of them; the full 5,000 only within 2 points of the target. The
    # echoed runs cannot hide evaluations behind the upstream as the no-echo run does, so
    # their cost matters.
    screen_examples: int = 1_000
    # ... and in a background thread on a copy of the weights (dataecho.app.evaluation), so that a run with
    # no slack (echoing at e = R) need not stop for them either; a target counts when its
    # evaluation has finished.
    eval_in_background: bool = True
    profile_seconds: float = 8.0  # 40% upstream, 20% step, 40% both
    probe_examples: int = 12_000  # the calibration's run through the training loop
    examples_per_shard: int = EXAMPLES_PER_SHARD


QUICK = Plan(examples=2_048, batch_size=64, budget=2_048, eval_every=2_048, eval_examples=500,
             profile_seconds=1.5, probe_examples=0, screen_examples=0,
             examples_per_shard=256)  # fmt: skip


# The demo's own flags, checked by the same rules (and messages) as ``dataecho train``'s.
_TARGET = Real(0.0, 1.0, low_open=True).argparse_type("--target")
_SEED = Int(0, high=MAX_SEED).argparse_type("--seed")
# R = t_up / t_down to calibrate for: below 1/10 the step is ten times slower than the data and
# there is nothing for echoing to hide (and the cap grows without bound); past 100 every batch
# waits 100 steps' time, and a run takes hours.
MIN_RATIO, MAX_RATIO = 0.1, 100.0
_RATIO = Real(MIN_RATIO, MAX_RATIO, why="R = t_up / t_down: the papers' runs are at R of 1.5 to "
              "10, e.g. --upstream-ratio 4").argparse_type("--upstream-ratio")  # fmt: skip
# A bandwidth cap in bytes/s: below 10 kB/s one 2.3 MB shard takes four minutes to arrive;
# above 1 TB/s it caps nothing (loopback is slower) and nginx's limit_rate cannot hold much more.
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e4, 1e12
_BANDWIDTH = Real(MIN_BANDWIDTH, MAX_BANDWIDTH,
                  why="1 TB/s is no cap at all on loopback; leave --bandwidth out to calibrate "
                  "for --upstream-ratio, or pass e.g. --bandwidth 2e6").argparse_type("--bandwidth")  # fmt: skip
# The echoed runs' shuffle buffer holds this many batches of up to Plan.batch_size examples.
MAX_SHUFFLE_BATCHES = MAX_BUFFER // Plan.batch_size


def _factor(name: str):  # noqa: ANN202
    return Real(
        1.0, MAX_ECHO_FACTOR, why="a larger factor only repeats the same data"
    ).argparse_type(name)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``dataecho demo``."""
    add = p.add_argument
    # fmt: off
    add("--data-dir", type=Path, default=DEFAULT_DATA_DIR, metavar="DIR",
        help="Fashion-MNIST IDX files (default: %(default)s)")
    add("--work-dir", type=Path, default=DEFAULT_WORK_DIR, metavar="DIR",
        help="cache of the prepared shards (default: %(default)s)")
    add("--runs-dir", type=Path, default=Path("runs"), metavar="DIR",
        help="reports go to DIR/<timestamp>/ (default: %(default)s)")
    add("--target", type=_TARGET, default=None, metavar="ACC",
        help=f"evaluation accuracy each run trains to (default: {DEFAULT_TARGET}; "
        f"{QUICK_TARGET} with --quick)")
    add("--echo-factor", type=_factor("--echo-factor"), default=4.0, metavar="E",
        help="echo factor of the fixed-factor run (default: %(default)s)")
    add("--max-echo-factor", type=_factor("--max-echo-factor"), default=8.0, metavar="E",
        help="the most copies the 'auto' run may make of one example (default: %(default)s)")
    add("--where", choices=WHERE_CHOICES, default=DEFAULT_WHERE,
        help="insertion point of the echoed runs' echo stage (default: %(default)s)")
    add("--upstream-ratio", type=_RATIO, default=4.0, metavar="R",
        help="choose the bandwidth cap for R = t_up / t_down (default: %(default)s)")
    add("--bandwidth", type=_BANDWIDTH, default=None, metavar="BYTES_PER_S",
        help="a total bandwidth cap of your own instead (R is still measured)")
    add("--emulate", action="store_true",
        help="read the shards through the storage emulation, not nginx (automatic without it)")
    add("--budget", type=Int(1, high=MAX_COUNT, why=COUNT_WHY).argparse_type("--budget"),
        default=None, metavar="N",
        help=f"fresh examples per run at most (default: {Plan.budget:,})")
    add("--shuffle-batches",
        type=Int(0, high=MAX_SHUFFLE_BATCHES, why="the buffer holds that many batches of 128 "
                 "examples in memory; a few dozen mix the copies well, e.g. "
                 f"--shuffle-batches {HOST_SHUFFLE_BATCHES}").argparse_type("--shuffle-batches"),
        default=None, metavar="N",
        help="the echoed runs' shuffle buffer (with --where device, its mixing pool), in "
        f"batches' worth (default: {DEVICE_POOL_BATCHES} with --where device, else "
        f"{HOST_SHUFFLE_BATCHES}; docs/demo.md compares them)")
    add("--seed", type=_SEED, default=0, metavar="N")
    add("--augment-pad", type=Int(0, high=MAX_AUGMENT_PAD, why="Fashion-MNIST images are 28 "
        "pixels wide: a larger shift moves the whole image out of the crop; e.g. "
        "--augment-pad 2").argparse_type("--augment-pad"), default=2, metavar="N",
        help="random shift of up to N pixels in the augmentation (default: %(default)s); "
        "less augmentation reaches the target sooner with and without echoing, and echoing "
        "then saves less (benchmarks/augmentation)")
    add("--quick", action="store_true",
        help="tiny settings for a smoke test: 2,048 examples, a low target, one evaluation")
    # fmt: on


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say; print the table and the report folder. Returns 0."""
    from dataecho.app.report import (  # matplotlib: only here
        ReportMeta,
        format_ratios,
        format_table,
        write_report,
    )

    plan = QUICK if args.quick else Plan()
    if args.budget is not None:
        plan = dataclasses.replace(plan, budget=args.budget)
    target = args.target or (QUICK_TARGET if args.quick else DEFAULT_TARGET)
    # Every run's settings are checked now, before the shards are written and the bandwidth
    # calibrated (minutes): the upstream's URL is the one thing only the server gives.
    _configs("http://127.0.0.1:1", plan, args, target)
    load_before, load_per_core_before = _load(), load_per_core()
    shard_dir, manifest = _prepare(args, plan)
    watch = CpuWatch.start()  # after the one-time shard writing: the runs' own time only
    emulate = args.emulate or _nginx_missing()
    cal = calibrate(shard_dir, manifest, aim=args.upstream_ratio, data_dir=args.data_dir,
                    batch_size=plan.batch_size, seed=args.seed,
                    profile_seconds=plan.profile_seconds, probe_examples=plan.probe_examples,
                    # the runs' typical evaluation: the screen, where there is one
                    eval_every=plan.eval_every,
                    eval_examples=plan.screen_examples or plan.eval_examples,
                    eval_in_background=plan.eval_in_background, bandwidth=args.bandwidth,
                    emulate=emulate, where=args.where)  # fmt: skip
    with serve(shard_dir, cal.rate, emulate) as up:
        print(f"upstream: {up.description}")
        results = [train(cfg, log=tqdm.write) for cfg in _configs(up.url, plan, args, target)]
    base = results[0]  # R as the no-echo run lived it: time per step over compute per step
    lived_ratio = (base.wall_seconds - base.eval_seconds) / max(base.step_seconds, 1e-9)
    print()
    print(format_table(results))
    print(f"R during the no-echo run: {lived_ratio:.2f} (time per step over compute per step)")
    if merits := format_ratios(results, ratio=lived_ratio):
        print(f"figures of merit:\n{merits}")
    if emulate:
        print(f"EMULATION: these numbers come from {up.description}")
    check = QuietCheck(aim=args.upstream_ratio, lived_ratio=lived_ratio,
                       others_cores=watch.others_cores(), load_per_core=load_per_core_before,
                       calibration_settled=cal.settled)  # fmt: skip
    if busy := check.summary():
        print("\n" + "\n".join(busy))
    meta = ReportMeta(
        command=_command(args),
        machine=_machine(),
        upstream=up.description,
        emulated=emulate,
        ratio=lived_ratio,
        ratio_how="in the no-echo run: time per step, evaluations excluded, over the step's "
        f"compute time; before the runs: dataecho.profile {cal.profiled_ratio:.2f} with the "
        f"step's time while the loader runs ({cal.report.ratio:.2f} with the step alone)"
        + ("" if cal.probed_ratio is None else f", a probe of the loop {cal.probed_ratio:.2f}"),
        bandwidth_bytes_per_s=cal.rate,
        load=f"before: {load_before}; after: {_load()}",
        warnings=tuple(check.problems()),
        notes=(
            *cal.notes,
            f"echo stage of the echoed runs: where={args.where}; augmentation: a random "
            f"shift of up to {args.augment_pad} pixels and a flip; echoing's saving grows with "
            "it, and so does the no-echo run's time to this early target "
            "(benchmarks/augmentation)",
        ),
    )
    out = write_report(results, _new_run_dir(args.runs_dir), meta=meta)
    print(f"\nreport: {out / 'report.md'} (and metrics.csv, curves.png in {out})")
    return 0


def _prepare(args: argparse.Namespace, plan: Plan) -> tuple[Path, dict[str, Any]]:
    """The training shards in the cache; written on the first call only."""
    n = "all" if plan.examples is None else str(plan.examples)
    out = args.work_dir / "shards" / f"fashion-mnist-{n}-{plan.examples_per_shard}"
    print(f"shards: {out} (written once, then reused)")
    manifest, _ = prepare(out, data_dir=args.data_dir, examples=plan.examples,
                          examples_per_shard=plan.examples_per_shard)  # fmt: skip
    return out, manifest


def _configs(url: str, plan: Plan, args: argparse.Namespace, target: float) -> list[TrainConfig]:
    """No echo, the fixed factor and auto, alike in all else; copies get a shuffle buffer."""
    # Spreads copies apart (Choi et al.).
    shuffle = shuffle_buffer(args.where, args.shuffle_batches, plan.batch_size)
    common = dict(upstream=url, data_dir=args.data_dir, batch_size=plan.batch_size,
                  budget=plan.budget, target_accuracy=target, eval_every=plan.eval_every,
                  eval_examples=plan.eval_examples, screen_examples=plan.screen_examples,
                  eval_in_background=plan.eval_in_background,
                  num_workers=WORKERS, threads=THREADS,
                  seed=args.seed, augment_pad=args.augment_pad, progress=True,
                  where=args.where)  # fmt: skip
    runs = [("no echo", 1.0, 0), (f"e={args.echo_factor:g}", args.echo_factor, shuffle),
            ("auto", "auto", shuffle)]  # fmt: skip
    return [TrainConfig(name=name, echo_factor=e, shuffle_buffer=buf,
                        max_echo_factor=args.max_echo_factor, **common)
            for name, e, buf in runs]  # fmt: skip


# --- small helpers ----------------------------------------------------------------------------


def _nginx_missing() -> bool:
    try:
        find_nginx()
    except NginxNotFoundError as err:
        print(f"{err}\nFalling back to the EMULATION of the server.")
        return True
    return False


def _command(args: argparse.Namespace) -> str:
    """The demo's command with every option spelled out, so the report can be rerun."""
    parts = ["dataecho demo"]
    for key, value in sorted(vars(args).items()):
        if key.startswith("_") or key == "command" or value is None or value is False:
            continue
        parts.append(f"--{key.replace('_', '-')}" + ("" if value is True else f" {value}"))
    return " ".join(parts)


def _machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.machine())  # fmt: skip
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{cpu}, {cores} cores usable; torch {torch.__version__} on {THREADS} thread(s), "
            f"{WORKERS} loader worker(s); Python {platform.python_version()}")  # fmt: skip


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _load() -> str:
    """Load averages (1, 5, 15 min), as `uptime` prints them: other jobs share the cores."""
    if not hasattr(os, "getloadavg"):
        return "n/a"
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _new_run_dir(runs_dir: Path) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = runs_dir / stamp, 1
    while out.exists():  # two demos in the same second
        out, n = runs_dir / f"{stamp}-{n}", n + 1
    return out
