"""The choi experiment's plots: fresh examples to target, and the modelled wall-time speedup."""

from __future__ import annotations

import math
from pathlib import Path

from experiments.choi.plan import variant
from experiments.choi.wall_time import RATIOS
from experiments.common.plotting import pyplot


def plot(rows: list[dict], path: Path) -> None:
    workloads = sorted({r["workload"] for r in rows})
    sizes = {w: sorted({r["batch_size"] for r in rows if r["workload"] == w}) for w in workloads}
    plt = pyplot()
    fig, axes = plt.subplots(len(workloads), 2, figsize=(10, 4 * len(workloads)), squeeze=False)
    for i, wl in enumerate(workloads):
        for j, bs in enumerate(sizes[wl]):
            ax = axes[i][j]
            sub = [r for r in rows if r["workload"] == wl and r["batch_size"] == bs]
            base = [r for r in sub if r["echo_factor"] == 1]
            for name in sorted({variant(r) for r in sub} - {"baseline"}):
                pts = sorted((r for r in sub if variant(r) == name), key=lambda r: r["echo_factor"])
                pts = base + pts
                xs = [r["echo_factor"] for r in pts]
                ys = [r["fresh_median"] for r in pts]
                lo = [r["fresh_median"] - r["fresh_min"] for r in pts]
                hi = [r["fresh_max"] - r["fresh_median"] if math.isfinite(r["fresh_max"]) else 0
                      for r in pts]  # fmt: skip
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("echo factor e")
            ax.set_ylabel("fresh examples to target (median, min-max)")
            ax.set_title(f"{wl}, batch {bs}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def plot_speedup(trows: list[dict], path: Path) -> None:
    keys = sorted({(r["workload"], r["batch_size"]) for r in trows})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.5), squeeze=False)
    for ax, (wl, bs) in zip(axes[0], keys, strict=True):
        sub = sorted((r for r in trows if (r["workload"], r["batch_size"]) == (wl, bs)),
                     key=lambda r: r["e"])  # fmt: skip
        for ratio in RATIOS:
            ax.plot([r["e"] for r in sub], [r[f"speedup_R{ratio:g}"] for r in sub], marker="o",
                    label=f"R={ratio:g}")  # fmt: skip
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{wl}, batch {bs}", fontsize=9)
        ax.set_xlabel("e")
        ax.set_ylabel("wall-time speedup to target (model)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
