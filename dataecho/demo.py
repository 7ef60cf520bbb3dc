"""``dataecho demo``: an input-bound run over a real HTTP server, trained with and without echoing.

    dataecho demo             # ~3-5 minutes on 2 cores; writes runs/<timestamp>/
    dataecho demo --quick     # seconds: a tiny subset, a low target, one evaluation

Steps: write the Fashion-MNIST training set once as WebDataset shards (cached in --work-dir);
time one training step (t_down) and pick nginx's bandwidth cap so that one batch takes R steps'
time to arrive (t_up = R x t_down); start nginx on loopback with that cap and *measure* R with
``dataecho.profile`` on the real loader, t_down taken while the loader runs (on two shared
cores the worker slows the step), correcting the cap once; then train to the target three
times (no echo, a fixed factor, ``auto``) and write the table, ``report.md``, ``metrics.csv``
and ``curves.png``. The run's own R (time per step over compute per step) is reported too.
Without nginx (or with --emulate) the shards are read through the storage *emulation*
(:mod:`dataecho.sources.emulated`), and every number says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dataecho.loader import EchoingDataLoader
from dataecho.profiling import ProfileReport, format_report, profile
from dataecho.sources.emulated import EmulatedStorage
from dataecho.sources.fashion_mnist import DEFAULT_DATA_DIR
from dataecho.sources.nginx import NginxNotFoundError, NginxServer, find_nginx
from dataecho.train import TrainConfig, measure_step_seconds, train
from dataecho.upstream import build_data, prepare
from dataecho.workloads.cnn import SmallCNN

DEFAULT_WORK_DIR = Path.home() / ".cache" / "dataecho"
DEFAULT_TARGET, QUICK_TARGET = 0.85, 0.3
# A shard is one HTTP request; 1,000 examples (~2.3 MB) keeps request overhead negligible.
EXAMPLES_PER_SHARD = 1000
# 2 cores: the step on 1 torch thread here, reading/decoding/augmenting in 1 worker process.
THREADS, WORKERS = 1, 1
SHUFFLE_BATCHES = 10  # post-echo shuffle buffer, in batches
RATIO_TOLERANCE = 0.1  # a measured R within 10% of the aim is kept; else one correction


@dataclass(frozen=True)
class Plan:
    """The demo's sizes; ``--quick`` swaps in tiny ones (for tests and a first look)."""

    examples: int | None = None  # training examples written as shards (None: all 60,000)
    batch_size: int = 128
    budget: int = 120_000  # fresh examples per run at most
    eval_every: int = 3_000  # fresh examples between evaluations
    eval_examples: int = 5_000  # test examples per evaluation (~0.3 s on one core)
    profile_seconds: float = 8.0  # 40% upstream, 20% step, 40% both
    examples_per_shard: int = EXAMPLES_PER_SHARD


QUICK = Plan(examples=2_048, batch_size=64, budget=2_048, eval_every=2_048, eval_examples=500,
             profile_seconds=1.5, examples_per_shard=256)  # fmt: skip


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
    add("--target", type=_fraction, default=None, metavar="ACC",
        help=f"evaluation accuracy each run trains to (default: {DEFAULT_TARGET}; "
        f"{QUICK_TARGET} with --quick)")
    add("--echo-factor", type=_at_least_one, default=4.0, metavar="E",
        help="echo factor of the fixed-factor run (default: %(default)s)")
    add("--max-echo-factor", type=_at_least_one, default=8.0, metavar="E",
        help="the most copies the 'auto' run may make of one example (default: %(default)s)")
    add("--upstream-ratio", type=_positive, default=4.0, metavar="R",
        help="choose the bandwidth cap for R = t_up / t_down (default: %(default)s)")
    add("--bandwidth", type=_positive, default=None, metavar="BYTES_PER_S",
        help="a total bandwidth cap of your own instead (R is still measured)")
    add("--emulate", action="store_true",
        help="read the shards through the storage emulation, not nginx (automatic without it)")
    add("--budget", type=_positive_int, default=None, metavar="N",
        help=f"fresh examples per run at most (default: {Plan.budget:,})")
    add("--seed", type=_non_negative_int, default=0, metavar="N")
    add("--quick", action="store_true",
        help="tiny settings for a smoke test: 2,048 examples, a low target, one evaluation")
    # fmt: on


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say; print the table and the report folder. Returns 0."""
    from dataecho.report import ReportMeta, format_table, write_report  # matplotlib: only here

    plan = QUICK if args.quick else Plan()
    if args.budget is not None:
        plan = dataclasses.replace(plan, budget=args.budget)
    target = args.target or (QUICK_TARGET if args.quick else DEFAULT_TARGET)
    load_before = _load()
    shard_dir, manifest = _prepare(args, plan)
    emulate = args.emulate or _nginx_missing()
    rate, report, notes = _calibrate(shard_dir, manifest, plan, args, emulate)
    with _serve(shard_dir, rate, emulate) as up:
        print(f"upstream: {up.description}")
        results = [train(cfg, log=tqdm.write) for cfg in _configs(up.url, plan, args, target)]
    base = results[0]  # R as the no-echo run lived it: time per step over compute per step
    lived_ratio = (base.wall_seconds - base.eval_seconds) / max(base.step_seconds, 1e-9)
    print()
    print(format_table(results))
    print(f"R during the no-echo run: {lived_ratio:.2f} (time per step over compute per step)")
    if emulate:
        print(f"EMULATION: these numbers come from {up.description}")
    meta = ReportMeta(
        command=_command(args),
        machine=_machine(),
        upstream=up.description,
        emulated=emulate,
        ratio=lived_ratio,
        ratio_how="in the no-echo run: time per step, evaluations excluded, over the step's "
        f"compute time; dataecho.profile before the runs: {report.t_up / lived_t_down(report):.2f}"
        f" with the step's time while the loader runs, {report.ratio:.2f} with the step alone",
        bandwidth_bytes_per_s=rate,
        load=f"before: {load_before}; after: {_load()}",
        notes=tuple(notes),
    )
    out = write_report(results, _new_run_dir(args.runs_dir), meta=meta)
    print(f"\nreport: {out / 'report.md'} (and metrics.csv, curves.png in {out})")
    return 0


def _prepare(args: argparse.Namespace, plan: Plan) -> tuple[Path, dict[str, Any]]:
    """The training shards in the cache; written on the first call only (~20 s for 60,000)."""
    n = "all" if plan.examples is None else str(plan.examples)
    out = args.work_dir / "shards" / f"fashion-mnist-{n}-{plan.examples_per_shard}"
    print(f"shards: {out} (written once, then reused)")
    manifest, _ = prepare(out, data_dir=args.data_dir, examples=plan.examples,
                          examples_per_shard=plan.examples_per_shard)  # fmt: skip
    return out, manifest


def _calibrate(shard_dir: Path, manifest: dict[str, Any], plan: Plan, args: argparse.Namespace,
               emulate: bool) -> tuple[int, ProfileReport, list[str]]:  # fmt: skip
    """The total cap that makes R about ``--upstream-ratio``, measured with the profiler.

    First guess: one batch's bytes arrive in R steps' time. Then R is measured on the real
    loader and step, with t_down taken *while the loader runs* (:func:`lived_t_down`): on two
    shared cores the worker's decoding slows the step (measured: ~2x), and the step-alone
    figure would make the run far less input-bound than R says. The cap is scaled once if
    that R is more than 10% off.
    """
    t_down = measure_step_seconds(plan.batch_size, THREADS, steps=30)
    batch_bytes = _bytes_per_example(manifest) * plan.batch_size
    rate = int(args.bandwidth or max(1, round(batch_bytes / (args.upstream_ratio * t_down))))
    notes = [
        f"{manifest['total']:,} training examples in {len(manifest['shards'])} shards, "
        f"{_bytes_per_example(manifest):,.0f} bytes each on the wire (PNG in tar)",
        f"t_down of the step alone before calibrating: {t_down * 1e3:.1f} ms (batch "
        f"{plan.batch_size}, {THREADS} torch thread)",
    ]
    lived: list[float] = []  # t_down while the loader runs, per attempt: noisy, so averaged
    for attempt in range(2):
        with _serve(shard_dir, rate, emulate) as up:
            print(f"calibrating: {up.description}")
            report = _measure(up.url, plan, args.seed)
        print(format_report(report))
        lived.append(lived_t_down(report))
        note = (f"a cap of {rate / 1e6:.3g} MB/s gave t_up = {report.t_up * 1e3:.1f} ms, "
                f"R = {report.t_up / lived[-1]:.2f} with the step's time while the loader runs "
                f"({lived[-1] * 1e3:.1f} ms), {report.ratio:.2f} with the step alone "
                f"({report.t_down * 1e3:.1f} ms)")  # fmt: skip
        print(note)
        notes.append(note)
        off = report.t_up / (args.upstream_ratio * sum(lived) / len(lived))
        if attempt == 1 or args.bandwidth or abs(off - 1) <= RATIO_TOLERANCE:
            return rate, report, notes
        rate = max(1, round(rate * off))
    raise AssertionError("unreachable")


def lived_t_down(report: ProfileReport) -> float:
    """Seconds per step while the loader runs: the pipeline's time per step minus its wait."""
    return report.t_overlapped * (1.0 - report.stall_fraction)


@dataclass(frozen=True)
class _Upstream:
    url: str
    description: str


@contextlib.contextmanager
def _serve(shard_dir: Path, rate: int, emulate: bool) -> Iterator[_Upstream]:
    """nginx on loopback (stopped on exit, error and Ctrl-C), or the emulation of it."""
    if emulate:
        storage = EmulatedStorage(shard_dir, bandwidth_bytes_per_s=rate / WORKERS)
        yield _Upstream(storage.url, storage.describe())
        return
    # nginx caps each connection; every worker streams one shard at a time: split the total.
    with NginxServer(shard_dir, total_rate_bytes_per_s=rate, connections=WORKERS) as server:
        yield _Upstream(server.url, server.describe())


def _measure(url: str, plan: Plan, seed: int) -> ProfileReport:
    """R measured on the real loader (no echo) and the real training step."""
    cfg = TrainConfig(upstream=url, batch_size=plan.batch_size, seed=seed)
    data = build_data(cfg)
    loader = EchoingDataLoader(data.train, batch_size=plan.batch_size, transform=data.transform,
                               batch_transform=data.batch_transform, num_workers=WORKERS,
                               seed=seed, drop_last=True)  # fmt: skip
    torch.set_num_threads(THREADS)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(batch: Any) -> None:
        loss = F.cross_entropy(model(batch[0]), batch[1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    try:
        return profile(loader, step, seconds=plan.profile_seconds)
    finally:
        loader.close()


def _configs(url: str, plan: Plan, args: argparse.Namespace, target: float) -> list[TrainConfig]:
    """No echo, the fixed factor and auto, alike in all else; copies get a shuffle buffer."""
    shuffle = SHUFFLE_BATCHES * plan.batch_size  # spreads copies apart (Choi et al.)
    common = dict(upstream=url, data_dir=args.data_dir, batch_size=plan.batch_size,
                  budget=plan.budget, target_accuracy=target, eval_every=plan.eval_every,
                  eval_examples=plan.eval_examples, num_workers=WORKERS, threads=THREADS,
                  seed=args.seed, progress=True, where="before_augment")  # fmt: skip
    runs = [("no echo", 1.0, 0), (f"e={args.echo_factor:g}", args.echo_factor, shuffle),
            ("auto", "auto", shuffle)]  # fmt: skip
    return [TrainConfig(name=name, echo_factor=e, shuffle_buffer=buf,
                        max_echo_factor=args.max_echo_factor, **common)
            for name, e, buf in runs]  # fmt: skip


# --- small helpers ----------------------------------------------------------------------------


def _bytes_per_example(manifest: dict[str, Any]) -> float:
    return sum(s["bytes"] for s in manifest["shards"]) / max(1, manifest["total"])


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


def _type(convert, ok, want: str):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    return parse


_fraction = _type(float, lambda v: 0 < v <= 1, "an accuracy in (0, 1]")
_at_least_one = _type(float, lambda v: 1 <= v < float("inf"), "a finite number >= 1")
_positive = _type(float, lambda v: 0 < v < float("inf"), "a finite number > 0")
_positive_int = _type(int, lambda v: v >= 1, "an integer >= 1")
_non_negative_int = _type(int, lambda v: v >= 0, "an integer >= 0")
