"""``python -m benchmarks device``: options, the three sections in order, the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.device import correctness, throughput, worker_cpu
from benchmarks.device.throughput import Plan
from benchmarks.device.workload import (
    DeviceStep,
    LoaderSpec,
    PacedShapes,
    augmentation,
    device_echo_available,
)

# Examples in a stream: more than any window reads, and an epoch order cheap to build (8 MB).
STREAM = 10**6
# Per device and mode: image side, batch size, loader workers, step ms (None: one pass of the
# net), warmup s, measured s, rounds.
SIZES = {
    ("cuda", False): (224, 128, 8, 10.0, 2.0, 5.0, 3),
    ("cuda", True): (224, 128, 8, 10.0, 1.0, 2.0, 1),
    ("cpu", False): (64, 64, 1, None, 1.0, 4.0, 3),
    ("cpu", True): (32, 32, 1, None, 0.3, 0.8, 1),
}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks device",
        description=sys.modules[__package__].__doc__,  # the package's docstring, no import back
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="the training device (cuda where there is one, else cpu)",
    )
    p.add_argument("--quick", action="store_true", help="short windows, one round, small images")
    p.add_argument("--ratio", type=float, default=4.0, help="R = t_up / t_down (4)")
    p.add_argument("--factors", type=int, nargs="+", default=[1, 2, 4, 8], help="e (1 2 4 8)")
    p.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3], choices=(1, 2, 3))
    p.add_argument("--image", type=int, help="image side, 3 x N x N uint8 (224 cuda, 64 cpu)")
    p.add_argument("--batch-size", type=int, help="examples per batch (128 cuda, 64 cpu)")
    p.add_argument("--workers", type=int, help="loader workers (8 cuda, 1 cpu)")
    p.add_argument(
        "--step-ms",
        type=float,
        help="t_down to aim for, in passes of the net (10 cuda; cpu: one pass)",
    )
    p.add_argument("--rounds", type=int, help="interleaved rounds (3; 1 with --quick)")
    p.add_argument("--duration", type=float, help="measured seconds per case and round")
    p.add_argument("--out", type=Path, default=common.results_dir("device"))
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    if a.ratio < 1:
        p.error(f"--ratio {a.ratio:g}: R = t_up / t_down must be at least 1 (input-bound), e.g. 4")
    image, batch, workers, step_ms, warmup, duration, rounds = SIZES[(a.device, a.quick)]
    a.step_ms = a.step_ms or step_ms
    a.image, a.batch_size = a.image or image, a.batch_size or batch
    a.workers = workers if a.workers is None else a.workers
    a.rounds, a.duration = a.rounds or rounds, a.duration or duration
    a.warmup = min(warmup, a.duration)
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = common.pin_threads(1) if a.device == "cpu" else "torch defaults"
    load = common.load_average()
    device = torch.device(a.device)
    shape = (3, a.image, a.image)
    aug, aug_name = augmentation()
    have_device = device_echo_available()
    parts: list[str] = []
    failed = False
    if 1 in a.sections:
        sized = correctness.Setup(
            LoaderSpec(a.batch_size, a.workers, device), shape, fresh_batches=20
        )
        text, failed = correctness_section(device, aug, have_device, sized)
        parts.append(text)
    plan = Plan(LoaderSpec(a.batch_size, a.workers, device), a.warmup, a.duration, a.rounds)
    if 2 in a.sections:
        parts.append(throughput_section(a, plan, shape, aug, have_device, log))
    if 3 in a.sections:
        data = PacedShapes(STREAM, shape, 0.0, 0.0)
        cases = [("host", 1), ("host_example", 4)] + ([("device", 4)] if have_device else [])
        costs = worker_cpu.run(plan, data, cases, aug, log)
        parts.append(
            f"## 3. Loader worker CPU per fresh batch ({a.device}, unpaced upstream)\n\n"
            f"Ceiling for device echo: {worker_cpu.CEILING} x no echo's worker CPU.\n\n"
            + common.markdown_table(worker_cpu.HEADERS, worker_cpu.rows(costs), "lrrrrr")
        )
    text = header(argv, a, shape, aug_name, threads, load) + "\n\n".join(parts) + "\n"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "device.md").write_text(text)
    print(text)
    return 1 if failed else 0


def correctness_section(
    device: torch.device, aug: Any, have_device: bool, sized: correctness.Setup
) -> tuple[str, bool]:
    """Section 1's text, and whether a check failed; ``sized``: the run's images and batch,
    for the state per step."""
    if not have_device:
        return "## 1. Correctness\n\nSkipped: this dataecho has no where='device'.", False
    setup = correctness.Setup(LoaderSpec(16, 1, device, shuffle=True), (3, 16, 16))
    checks = correctness.run(setup, aug, sized)
    table = [[name, "pass" if ok else "FAIL", detail] for name, ok, detail in checks]
    text = f"## 1. Correctness ({device.type}, e = {setup.e})\n\n" + common.markdown_table(
        ["check", "result", "detail"], table, "lll"
    )
    return text, not all(ok for _, ok, _ in checks)


def throughput_section(
    a: Any, plan: Plan, shape: tuple[int, ...], aug: Any, have_device: bool, log: Any
) -> str:
    """Section 2's text: the step calibrated, the upstream paced at R x t_down, every case."""
    step = DeviceStep(shape, plan.spec.device)
    t_down = step.calibrate(a.batch_size, a.step_ms / 1e3 if a.step_ms else None)
    period = a.ratio * t_down  # seconds per fresh batch, all workers together
    per_worker = period * max(1, a.workers)
    data = PacedShapes(STREAM, shape, per_worker / a.batch_size, per_worker)
    modes = ["host", "device", "device_mixed"] if have_device else ["host"]
    # At e = 1 mixing only shuffles: the mixed case runs where there are copies to mix.
    cases = [(m, e) for e in a.factors for m in modes if m != "device_mixed" or e > 1]
    windows = throughput.run(plan, data, cases, aug, step, log)
    return (
        f"## 2. Steps/s, host-side vs device-side echo (R = {a.ratio:g})\n\n"
        f"t_down = {t_down * 1e3:.2f} ms ({step.passes} pass(es) of the net); upstream: one "
        f"fresh batch per {period * 1e3:.1f} ms. {throughput.LEGEND}\n\n"
        + common.markdown_table(throughput.HEADERS, throughput.rows(windows, a.ratio))
    )


def header(
    argv: list[str], a: Any, shape: tuple[int, ...], aug: str, threads: str, load: str
) -> str:
    m = common.machine_summary()
    gpu = f"; GPU {torch.cuda.get_device_name()}" if a.device == "cuda" else ""
    return (
        f"# Echo on the training device\n\nCommand: `python -m benchmarks device "
        f"{' '.join(argv)}`.\nMachine: {m['cpu']}{gpu}; torch {m['torch']}; {threads}. Load "
        f"before: {load}; after: {common.load_average()}.\nDevice {a.device}; images "
        f"{'x'.join(map(str, shape))} uint8, batch {a.batch_size}, {a.workers} loader "
        f"worker(s); augmentation {aug}; {a.rounds} round(s) of {a.duration:g} s per case, "
        f"interleaved.\n\n"
    )
