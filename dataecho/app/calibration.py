"""The demo's upstream: a served shard folder, and the bandwidth cap that makes R what you ask.

    with serve(shard_dir, rate) as up:          # nginx on loopback (or the emulation)
        ...
    cal = calibrate(shard_dir, manifest, aim=4.0, data_dir=..., batch_size=128)

R = t_up / t_down. The cap is found in three steps, each measuring the real parts:

1. a first guess from the step's time alone: one batch's bytes arrive in R steps' time;
2. :func:`dataecho.profile` on the real loader (no echo) and step, with t_down taken *while
   the loader runs* (:func:`lived_t_down`): on two shared cores the worker slows the step;
   the cap is scaled once if that R is more than 10% off;
3. a short no-echo probe through the real training loop, R measured there as the report
   measures it (time per step over the step's compute, evaluations and warm-up excluded):
   the profiler's fixed batch and tight loop time the step faster than the loop does, so a
   cap from the profiler alone leaves the runs below the R aimed at. The probe evaluates on
   the runs' schedule (a step after a large evaluation is slower too). The cap is scaled
   again if the probe is more than 5% off, and the probe repeated: a second probe within 15%
   is kept; further off (a busy machine moved R), up to four probes in all, and a calibration
   still off after them says so (``Calibration.settled``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataecho.app.sources.emulated import EmulatedStorage
from dataecho.app.sources.nginx import NginxServer
from dataecho.app.train import TrainConfig, measure_step_seconds, train
from dataecho.app.upstream import build_data
from dataecho.app.workloads.cnn import CNN, SmallCNN
from dataecho.loader import EchoingDataLoader
from dataecho.profiling import ProfileReport, format_report, profile

# 2 cores: the step on 1 torch thread here, reading/decoding/augmenting in 1 worker process.
THREADS, WORKERS = 1, 1
PROFILE_TOLERANCE = 0.10  # a profiled R within 10% of the aim is kept; else one correction
PROBE_TOLERANCE = 0.05  # the same for the probe through the training loop
# A later probe within 15% is kept; beyond it the cap is corrected again, up to MAX_PROBES
# probes in all, and a calibration that ends further off says it did not settle.
SETTLE_TOLERANCE = 0.15
MAX_PROBES = 4


@dataclass(frozen=True)
class Upstream:
    url: str
    description: str


@dataclass
class Calibration:
    """The cap (bytes/s over all connections) and how it was measured."""

    rate: int
    report: ProfileReport  # the profiler's last measurement
    probed_ratio: float | None = None  # R in the last probe through the training loop
    settled: bool = True  # False: the last probe was still more than SETTLE_TOLERANCE off
    notes: list[str] = field(default_factory=list)

    @property
    def profiled_ratio(self) -> float:
        """R by the profiler, with the step's time while the loader runs."""
        return self.report.t_up / lived_t_down(self.report)


@contextlib.contextmanager
def serve(shard_dir: Path, rate: int, emulate: bool = False) -> Iterator[Upstream]:
    """nginx on loopback (stopped on exit, error and Ctrl-C), or the emulation of it."""
    if emulate:
        storage = EmulatedStorage(shard_dir, bandwidth_bytes_per_s=rate / WORKERS)
        yield Upstream(storage.url, storage.describe())
        return
    # nginx caps each connection; every worker streams one shard at a time: split the total.
    with NginxServer(shard_dir, total_rate_bytes_per_s=rate, connections=WORKERS) as server:
        yield Upstream(server.url, server.describe())


def calibrate(
    shard_dir: Path,
    manifest: dict[str, Any],
    *,
    aim: float,
    data_dir: Path,
    batch_size: int,
    seed: int = 0,
    profile_seconds: float = 8.0,
    probe_examples: int = 10_240,
    eval_every: int | None = None,
    eval_examples: int = 200,
    eval_in_background: bool = False,
    bandwidth: float | None = None,
    emulate: bool = False,
    where: str = "before_augment",
    say: Callable[[str], None] = print,
) -> Calibration:
    """The total cap that makes R about ``aim`` (or R measured at ``bandwidth``, if given);
    ``where``: the runs' insertion point, which decides where the augmentation runs (in the
    worker, or on the training thread with "device"), so the probe runs it there too."""
    per_example = bytes_per_example(manifest)
    t_down = measure_step_seconds(batch_size, THREADS, steps=30)
    rate = int(bandwidth or max(1, round(per_example * batch_size / (aim * t_down))))
    notes = [
        f"{manifest['total']:,} training examples in {len(manifest['shards'])} shards, "
        f"{per_example:,.0f} bytes each on the wire (PNG in tar)",
        f"t_down of the step alone before calibrating: {t_down * 1e3:.1f} ms (batch "
        f"{batch_size}, {THREADS} torch thread)",
    ]

    def note(line: str) -> None:
        say(line)
        notes.append(line)

    lived: list[float] = []  # t_down while the loader runs, per attempt: noisy, so averaged
    for attempt in range(2):
        with serve(shard_dir, rate, emulate) as up:
            say(f"calibrating: {up.description}")
            report = _profile(up.url, batch_size, seed, profile_seconds)
        say(format_report(report))
        lived.append(lived_t_down(report))
        note(f"profiler: a cap of {rate / 1e6:.3g} MB/s gave t_up = {report.t_up * 1e3:.1f} ms, "
             f"R = {report.t_up / lived[-1]:.2f} with the step's time while the loader runs "
             f"({lived[-1] * 1e3:.1f} ms), {report.ratio:.2f} with the step alone "
             f"({report.t_down * 1e3:.1f} ms)")  # fmt: skip
        off = report.t_up / (aim * sum(lived) / len(lived))
        if attempt == 1 or bandwidth or abs(off - 1) <= PROFILE_TOLERANCE:
            break
        rate = max(1, round(rate * off))
    cal = Calibration(rate, report, notes=notes)
    for attempt in range(MAX_PROBES if probe_examples else 0):
        with serve(shard_dir, rate, emulate) as up:
            cal.probed_ratio = probe(up.url, data_dir, batch_size, seed, probe_examples,
                                     eval_every, eval_examples, eval_in_background,
                                     where)  # fmt: skip
        note(f"probe through the training loop ({probe_examples:,} fresh examples, no echo): a "
             f"cap of {rate / 1e6:.3g} MB/s gave R = {cal.probed_ratio:.2f}")  # fmt: skip
        off = cal.probed_ratio / aim
        if bandwidth or abs(off - 1) <= PROBE_TOLERANCE:
            break
        # A second probe after one correction is kept if near; further ones only when a busy
        # machine moved R (the first correction over- or undershot by more than noise).
        if attempt >= 1 and abs(off - 1) <= SETTLE_TOLERANCE:
            break
        if attempt == MAX_PROBES - 1:
            cal.settled = False
            note(f"calibration did not settle: {MAX_PROBES} probes, the last at R = "
                 f"{cal.probed_ratio:.2f} for an aim of {aim:g} (more than "
                 f"{SETTLE_TOLERANCE:.0%} off); the machine is likely busy")  # fmt: skip
            break
        cal.rate = rate = max(1, round(rate * off))
    return cal


def probe(url: str, data_dir: Path, batch_size: int, seed: int, examples: int,
          eval_every: int | None = None, eval_examples: int = 200,
          eval_in_background: bool = False, where: str = "before_augment") -> float:  # fmt: skip
    """R of a short no-echo run: time per step over compute per step, after a warm-up quarter.

    Give it the runs' own evaluation schedule: a step right after a large evaluation runs
    slower, so a probe with tiny evaluations sees a higher R than the runs; the probe must see
    the same interruptions as the runs it calibrates.
    """
    cfg = TrainConfig(upstream=url, data_dir=data_dir, batch_size=batch_size, budget=examples,
                      eval_every=eval_every or max(batch_size, examples // 4),
                      eval_examples=eval_examples, eval_in_background=eval_in_background,
                      num_workers=WORKERS, threads=THREADS, seed=seed, progress=False,
                      where=where, name="calibration probe")  # fmt: skip
    rows = train(cfg, log=lambda line: None).history
    first, last = rows[0], rows[-1]  # the first quarter holds worker start-up and first request
    wall = (last["seconds"] - first["seconds"]) - (last["eval_seconds"] - first["eval_seconds"])
    return wall / max(last["step_seconds"] - first["step_seconds"], 1e-9)


def lived_t_down(report: ProfileReport) -> float:
    """Seconds per step while the loader runs: the pipeline's time per step minus its wait."""
    return report.t_overlapped * (1.0 - report.stall_fraction)


def bytes_per_example(manifest: dict[str, Any]) -> float:
    """Mean bytes per example on the wire (tar overhead included)."""
    return sum(s["bytes"] for s in manifest["shards"]) / max(1, manifest["total"])


def _profile(url: str, batch_size: int, seed: int, seconds: float) -> ProfileReport:
    """R measured on the real loader (no echo) and the real training step."""
    cfg = TrainConfig(upstream=url, batch_size=batch_size, seed=seed)
    data = build_data(cfg)
    loader = EchoingDataLoader(data.train, batch_size=batch_size, transform=data.transform,
                               batch_transform=data.batch_transform, num_workers=WORKERS,
                               seed=seed, drop_last=True)  # fmt: skip
    torch.set_num_threads(THREADS)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    def step(batch: Any) -> None:
        loss = CNN.loss(model, batch)  # the runs' own: it normalises the workers' uint8
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    try:
        return profile(loader, step, seconds=seconds)
    finally:
        loader.close()
