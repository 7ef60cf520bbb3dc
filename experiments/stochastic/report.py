"""The stochastic experiment's outputs: speedup and bias tables, plots, README.

:func:`write` renders one run into ``out``; the computed claims end the README, the verdicts
are written by hand on the results page (docs/results/stochastic/README.md).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from experiments.common.plotting import pyplot
from experiments.common.tables import markdown_table, write_csv

LAG_BINS = ((0, 0), (1, 3), (4, 15), (16, 63), (64, 10**9))


def speedups(loads: list[dict]) -> list[dict]:
    """loads(p=1) / loads(p) per buffer, next to the linear claim 1/p."""
    base = next((r["loads_median"] for r in loads if r["p"] == 1.0), math.nan)
    return [{"p": r["p"], "buffer": r["buffer"], "reuses": r["reuses"],
             "speedup": base / r["loads_median"] if r["loads_median"] > 0 else math.nan,
             "efficiency": base / r["loads_median"] / r["reuses"]} for r in loads]  # fmt: skip


def bias_table(bias: list[dict]) -> list[dict]:
    """Mean gradient agreement per (p, M, lag bin): the reused batch vs an independent one."""
    out = []
    for p, m in sorted({(r["p"], r["buffer"]) for r in bias}, reverse=True):
        for lo, hi in LAG_BINS:
            rs = [r for r in bias if (r["p"], r["buffer"]) == (p, m) and lo <= r["lag"] <= hi]
            if not rs:
                continue

            def mean(key: str, rs: list[dict] = rs) -> float:
                return statistics.fmean(r[key] for r in rs)

            out.append({"p": p, "buffer": m, "lag": f"{lo}-{hi}" if hi < 10**9 else f">={lo}",
                        "samples": len(rs), "mean_use": mean("use"),
                        "cos_reused": mean("cos_batch"), "cos_fresh": mean("cos_fresh"),
                        "rel_err_reused": mean("rel_err_batch"),
                        "rel_err_fresh": mean("rel_err_fresh")})  # fmt: skip
    return out


def plot(loads: list[dict], sched: list[dict], btab: list[dict], path: Path) -> None:
    """``stochastic.png``: speedup against reuses, accuracy per schedule, bias against lag."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    base = next((r["loads_median"] for r in loads if r["p"] == 1.0), math.nan)
    for m in sorted({r["buffer"] for r in loads}):
        rs = sorted((r for r in loads if r["buffer"] == m or r["p"] == 1.0),
                    key=lambda r: r["reuses"])  # fmt: skip
        xs = [r["reuses"] for r in rs]
        ys = [base / r["loads_median"] for r in rs]
        ax.plot(xs, ys, marker="o", label=f"M={m}")
    xs = sorted({r["reuses"] for r in loads})
    ax.plot(xs, xs, "k--", lw=0.8, label="linear (claim)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("mean reuses 1/p")
    ax.set_ylabel("speedup in data loads to target")
    ax.legend(fontsize=7)
    ax = axes[1]
    labels = [f"p={r['p']:g}\nM={r['buffer']}" for r in sched if r["schedule"] == "constant"]
    for k, name in enumerate(("constant", "cos_inc", "cos_dec")):
        rs = [r for r in sched if r["schedule"] == name]
        ax.bar([i + 0.27 * (k - 1) for i in range(len(rs))], [r["acc_median"] for r in rs],
               width=0.27, label=name)  # fmt: skip
    ax.set_xticks(range(len(labels)), labels, fontsize=6)
    lo = min((r["acc_min"] for r in sched), default=0.0)
    ax.set_ylim(max(0.0, lo - 0.03), None)
    ax.set_ylabel("test accuracy at fixed loads (median)")
    ax.legend(fontsize=7)
    ax = axes[2]
    for p, m in sorted({(r["p"], r["buffer"]) for r in btab}, reverse=True):
        rs = [r for r in btab if (r["p"], r["buffer"]) == (p, m)]
        ax.plot([r["lag"] for r in rs], [r["cos_reused"] for r in rs], marker="o",
                label=f"reused, p={p:g} M={m}")  # fmt: skip
        ax.plot([r["lag"] for r in rs], [r["cos_fresh"] for r in rs], ls=":", marker="x",
                label=f"fresh batch, p={p:g} M={m}")  # fmt: skip
    ax.set_xlabel("reuse lag (steps since the batch was loaded)")
    ax.set_ylabel("cos(batch grad, large-sample grad)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def write(out: Path, plan: Any, loads: list[dict], sched: list[dict], bias: list[dict],
          wall: float, *, quick: bool, seed: int) -> Path:  # fmt: skip
    """Write the CSVs, ``stochastic.png`` and ``README.md`` into ``out``; return the README."""
    sp = speedups(loads)
    btab = bias_table(bias)
    write_csv(loads, out / "loads_to_target.csv")
    write_csv(sp, out / "speedup.csv")
    write_csv(sched, out / "schedules.csv")
    write_csv(btab, out / "gradient_bias.csv")
    plot(loads, sched, btab, out / "stochastic.png")
    cmd = f"python -m experiments stochastic{' --quick' if quick else ''} --out {out} --seed {seed}"
    md = [
        "# Stochastic data echoing, reproduced small (`python -m experiments stochastic`)",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, {os.cpu_count()} cores, torch 1 "
        f"thread. Wall time: {wall / 60:.1f} min.",
        "",
        f"Setup: MLP 784-64-10 on Fashion-MNIST ({plan.data[0]} training / {plan.data[1]} test "
        f"examples, no augmentation), plain SGD, batch {plan.batch_size}; batch-level "
        f"`StochasticEcho` (a batch is loaded with probability p_t, else one of the last M "
        f"loaded batches is reused). Target: test accuracy {plan.target}. Learning rate tuned "
        f"per cell: {plan.trials} quasi-random trials (log-uniform 0.02-1) per search, "
        f"{plan.seeds} searches; loads = fresh examples.",
        "",
        "![plots](stochastic.png)",
        "",
        "## Data loads to target",
        "",
        markdown_table(loads),
        "",
        "## Speedup in loads against the claimed linear speedup",
        "",
        "speedup = median loads at p=1 / median loads at p; efficiency = speedup / (1/p).",
        "",
        markdown_table(sp),
        "",
        f"## Schedules at a fixed budget of {plan.sched_loads} loads",
        "",
        "cos_inc: p rises from p/2 to 3p/2 (reuse early); cos_dec: falls (reuse late); both "
        "average p over the run, so every row loads about the same data. Learning rate per "
        "seed: best final accuracy of the quasi-random trials.",
        "",
        markdown_table(sched),
        "",
        "## Gradient bias against reuse lag",
        "",
        "Every few steps: cosine and relative error ||g - G|| / ||G|| of the step's batch "
        "gradient g against G, the gradient on 2,000 held-back training examples at the same "
        "weights; *fresh* columns: an independent batch of the same size at the same weights "
        "(no reuse, same noise level). Reuse bias shows as the reused columns departing from "
        "the fresh ones.",
        "",
        markdown_table(btab),
        "",
        "## Claims (computed; verdicts in docs/results/stochastic/README.md)",
        "",
    ]
    for r in sp:
        if r["p"] < 1:
            md.append(f"- p={r['p']:g} (reuses {r['reuses']:g}), M={r['buffer']}: speedup "
                      f"{r['speedup']:.2f}x vs linear {r['reuses']:g}x "
                      f"(efficiency {r['efficiency']:.2f})")  # fmt: skip
    path = out / "README.md"
    path.write_text("\n".join(md) + "\n")
    return path
