"""Bounded memory over a long run: does RSS stay flat once the stream is warm?

    nice -n 19 python -m benchmarks memory --minutes 30    # writes bench-results/memory/
    python -m benchmarks memory --minutes 0.2 --warmup-minutes 0.05 --examples 1024   # smoke

The stream is the one ``dataecho train --checkpoint-dir`` builds (``make_loader``): Fashion-MNIST
shards served by a real nginx on loopback, one loader worker (download, PNG decode, echo e=4
before augmentation, a shuffle buffer, batching, augmentation), epoch after epoch, with a
checkpoint (model, optimizer, loader state with the shuffle buffer) every ``checkpoint_every``
steps. The consumer is the real SmallCNN step on 1 torch thread. The upstream is rate limited
(nginx ``limit_rate``), so the loop mostly waits and the run uses a small share of one core:
it can run for half an hour beside other work.

Every ``sample_seconds`` a thread reads, from ``/proc``, the RSS of this process and of every
child: the loader worker (a new one each epoch) and nginx (reported apart: not ours). The
report: RSS after the warm-up, at the end, the peak, and the slope (least squares over the
samples after the warm-up, MiB per 10 minutes); a CSV of every sample and a PNG plot.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import resource
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common

COLUMNS = ("seconds", "main_mib", "workers_mib", "workers", "pss_mib", "nginx_mib", "steps",
           "fresh", "epoch", "cpu_seconds", "total_mib")  # fmt: skip
# RSS counts a page shared by the two processes (torch's libraries, what the fork left shared)
# in both; PSS splits it between them: the sum of PSS is what the two cost the machine.
SERIES = {"main_mib": "training process", "workers_mib": "loader worker",
          "total_mib": "both (RSS summed)", "pss_mib": "both (PSS summed)"}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    minutes: float = 30.0
    warmup_minutes: float = 3.0
    sample_seconds: float = 5.0
    rate: int = 300_000  # bytes/s per nginx connection: ~130 fresh examples/s
    examples: int = 60_000
    examples_per_shard: int = 1000
    echo_factor: float = 4.0
    shuffle_buffer: int = 10_000
    batch_size: int = 128
    checkpoint_every: int = 500
    out: Path = Path("bench-results/memory")


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


# --- /proc ------------------------------------------------------------------------------------


def rss_mib(pid: int | str, field: str = "VmRSS", file: str = "status") -> float:
    """Resident set (or another kB figure of ``/proc/PID/FILE``) in MiB; 0 once it exited."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pss_mib(pid: int | str) -> float:
    return rss_mib(pid, "Pss", "smaps_rollup")


def children(pid: int | str) -> list[int]:
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in path.read_text().split()]
        except OSError:
            pass
    return found


def cpu_seconds(pid: int | str) -> float:
    try:  # after the command name: utime and stime are fields 11 and 12
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def sample(progress: dict[str, int], start: float) -> dict[str, float]:
    """One row: RSS of this process, its loader workers and nginx; counters; CPU so far."""
    workers, nginx, cpu, pss = [], 0.0, cpu_seconds("self"), pss_mib("self")
    for child in children("self"):
        try:
            name = Path(f"/proc/{child}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("nginx"):  # the master and its worker: the server, not ours
            nginx += rss_mib(child) + sum(rss_mib(c) for c in children(child))
        else:
            workers.append(rss_mib(child))
            cpu, pss = cpu + cpu_seconds(child), pss + pss_mib(child)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers of finished epochs
    main = rss_mib("self")
    return {"seconds": time.monotonic() - start, "main_mib": main, "workers_mib": sum(workers),
            "workers": len(workers), "pss_mib": pss, "nginx_mib": nginx, **progress,
            "cpu_seconds": cpu + reaped.ru_utime + reaped.ru_stime,
            "total_mib": main + sum(workers)}  # fmt: skip


# --- the run ----------------------------------------------------------------------------------


def run(s: Settings, log: Any = print) -> list[dict[str, float]]:
    """Stream for ``s.minutes``; return the samples (see the module docstring)."""
    from dataecho.app.checkpoint import save_checkpoint
    from dataecho.app.config import TrainConfig
    from dataecho.app.sources.nginx import NginxServer
    from dataecho.app.training.loader import make_loader
    from dataecho.app.upstream import build_data, prepare

    common.pin_threads(1)
    prepare(s.out / "shards", examples=s.examples, examples_per_shard=s.examples_per_shard)
    progress = {"steps": 0, "fresh": 0, "epoch": 0}
    rows: list[dict[str, float]] = []
    stop = threading.Event()
    with NginxServer(s.out / "shards", rate_limit_bytes_per_s=s.rate) as server:
        cfg = TrainConfig(upstream=server.url, echo_factor=s.echo_factor, where="before_augment",
                          shuffle_buffer=s.shuffle_buffer, batch_size=s.batch_size,
                          num_workers=1, threads=1, checkpoint_dir=s.out / "checkpoints")  # fmt: skip
        data = build_data(cfg)
        loader, step = make_loader(cfg, data), common.TrainStep()
        start = time.monotonic()
        end = start + s.minutes * 60

        def sampler() -> None:
            while not stop.wait(max(0.0, start + len(rows) * s.sample_seconds - time.monotonic())):
                rows.append(sample(progress, start))

        thread = threading.Thread(target=sampler, name="rss-sampler", daemon=True)
        thread.start()
        log(f"streaming for {s.minutes:g} min from {data.description}")
        try:
            while time.monotonic() < end:
                data.set_epoch(progress["epoch"])
                for images, labels in loader:
                    step(images, labels)
                    progress["steps"] += 1
                    progress["fresh"] = loader.stats.fresh_examples
                    if progress["steps"] % s.checkpoint_every == 0:
                        state = {"model": step.model.state_dict(), "loader": loader.state_dict(),
                                 "optimizer": step.optimizer.state_dict()}  # fmt: skip
                        save_checkpoint(cfg.checkpoint_dir, state, step=progress["steps"], keep=1)
                    if time.monotonic() >= end:
                        break
                else:
                    progress["epoch"] += 1
        finally:
            stop.set()
            thread.join()
            rows.append(sample(progress, start))  # the end, with the worker still there
            loader.close()
    return rows


def summarize(rows: list[dict[str, float]], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per series: RSS after the warm-up, at the end, the peak, and the slope (MiB per 10 min)
    over the samples after the warm-up and over the run's second half (growth that settles
    late in the warm-up shows in the first, a leak in both); under "cpu": cores used on
    average after the warm-up (both processes)."""
    warm = [r for r in rows if r["seconds"] >= warmup_s] or rows[-1:]
    late = [r for r in rows if r["seconds"] >= rows[-1]["seconds"] / 2]
    out = {}
    for key in (*SERIES, "nginx_mib"):
        y = [r[key] for r in warm]
        out[key] = {"after_warmup": y[0], "end": y[-1], "peak": max(r[key] for r in rows),
                    "slope_per_10min": _slope(warm, key), "slope_late": _slope(late, key)}  # fmt: skip
    seconds = warm[-1]["seconds"] - warm[0]["seconds"]
    used = warm[-1]["cpu_seconds"] - warm[0]["cpu_seconds"]
    out["cpu"] = {"cores": used / seconds if seconds > 0 else math.nan}
    # A new worker each epoch: its RSS saws; the peak per epoch shows growth across epochs.
    out["worker_peaks"] = {}
    for r in rows:
        epoch = int(r["epoch"])
        out["worker_peaks"][epoch] = max(out["worker_peaks"].get(epoch, 0.0), r["workers_mib"])
    return out


def _slope(rows: list[dict[str, float]], key: str) -> float:
    """Least-squares slope of ``key`` over time, MiB per 10 minutes (NaN under 2 samples)."""
    t = np.array([r["seconds"] for r in rows])
    if len(rows) < 2 or np.ptp(t) == 0:
        return math.nan
    return float(np.polyfit(t, np.array([r[key] for r in rows]), 1)[0]) * 600


def read_csv(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_csv(rows: list[dict[str, float]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict[str, float]], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["seconds"] / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.0), dpi=90)
    ax.axvspan(0, warmup_s / 60, color="0.92", label="warm-up")
    for key, label in SERIES.items():
        ax.plot(minutes, [r[key] for r in rows], label=label, linewidth=1.2)
    ax.set(xlabel="minutes", ylabel="RSS (MiB)", ylim=(0, None),
           title="RSS over a long run (e=4 before augment, 1 worker, nginx)")  # fmt: skip
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(s: Settings, rows: list[dict[str, float]], summary: dict[str, Any]) -> str:
    last = rows[-1]
    table = common.markdown_table(
        ["RSS, MiB", "after warm-up", "end", "peak", "slope, MiB per 10 min",
         "slope, 2nd half"],
        [[SERIES.get(k, "nginx (the server, not ours)"), f"{v['after_warmup']:.1f}",
          f"{v['end']:.1f}", f"{v['peak']:.1f}", f"{v['slope_per_10min']:+.2f}",
          f"{v['slope_late']:+.2f}"]
         for k, v in summary.items() if k in (*SERIES, "nginx_mib")],
    )  # fmt: skip
    peaks = ", ".join(f"{v:.0f}" for v in summary["worker_peaks"].values())
    return (f"{table}\n\nLoader worker's peak RSS per epoch (MiB, the last one partial): "
            f"{peaks}.\n{int(last['steps']):,} steps, {int(last['fresh']):,} fresh examples "
            f"({int(last['epoch'])} epochs done), {len(rows)} samples every "
            f"{s.sample_seconds:g} s, warm-up {s.warmup_minutes:g} min; CPU after the warm-up: "
            f"{summary['cpu']['cores']:.2f} cores on average (training process and loader "
            "worker)")  # fmt: skip


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
    print(f"machine: {machine['cpu']}; torch {machine['torch']}; {machine['date']}; load "
          f"before {machine['load']}, after {common.load_average()}")  # fmt: skip
    print(f"settings: {s}\n\n{report(s, rows, summary)}")
    written = [s.out / "memory.png"] if from_csv else [s.out / "memory.csv", s.out / "memory.png"]
    print(f"\nwrote {' and '.join(map(str, written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
