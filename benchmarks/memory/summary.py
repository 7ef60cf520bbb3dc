"""The memory benchmark's summary of its samples: table, slopes, CSV and plot."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.memory.stream import COLUMNS, Settings

# RSS counts a page shared by the two processes (torch's libraries, what the fork left shared)
# in both; PSS splits it between them: the sum of PSS is what the two cost the machine.
SERIES = {"main_mib": "training process", "workers_mib": "loader worker",
          "total_mib": "both (RSS summed)", "pss_mib": "both (PSS summed)"}  # fmt: skip


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
