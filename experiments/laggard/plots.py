"""The laggard experiment's plots, one set per problem and one across problems."""

from __future__ import annotations

from pathlib import Path

from experiments.common.plotting import pyplot
from experiments.laggard.claims import RATIOS


def plot_grid(rows, out: Path, methods, prefix: str) -> list[str]:
    """``{prefix}convergence.png`` (Figure 2 of the paper: steps and fresh samples against K
    per B) and ``{prefix}rate_and_bound.png`` (echoed GD's best rate; bound vs measured)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(methods), 2, figsize=(9, 2.6 * len(methods)), squeeze=False)
    for i, method in enumerate(methods):
        for j, (key, label) in enumerate((("steps", "steps K*T"), ("fresh", "fresh samples B*T"))):
            ax = axes[i][j]
            for b in sorted({r["B"] for r in rows}):
                rs = [r for r in rows if r["method"] == method and r["B"] == b and r["T_med"]]
                if not rs:
                    continue
                scale = [r["K"] if key == "steps" else b for r in rs]
                med = [s * r["T_med"] for s, r in zip(scale, rs, strict=True)]
                lo = [m - s * r["T_min"] for m, s, r in zip(med, scale, rs, strict=True)]
                hi = [s * r["T_max"] - m for m, s, r in zip(med, scale, rs, strict=True)]
                ax.errorbar([r["K"] for r in rs], med, yerr=[lo, hi], marker="o", capsize=2,
                            label=f"B={b}")  # fmt: skip
            ax.set(xscale="log", yscale="log", xlabel="K", ylabel=label, title=method)
            ax.set_xticks(sorted({r["K"] for r in rows}), labels=sorted({r["K"] for r in rows}))
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{prefix}convergence.png", dpi=70)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    gd = [r for r in rows if r["method"] == "gd" and r["T_med"]]
    for b in sorted({r["B"] for r in gd}):
        rs = [r for r in gd if r["B"] == b]
        a1.plot([r["K"] for r in rs], [r["lr_med"] for r in rs], "o-", label=f"B={b}")
        a2.scatter([r["measured"] for r in rs], [r["bound"] for r in rs], label=f"B={b}")
    ks = sorted({r["K"] for r in gd})
    if gd:
        lr1 = next(r["lr_med"] for r in gd if r["K"] == 1)
        a1.plot(ks, [lr1 / k for k in ks], "k--", label="1/K from smallest B")
    a1.set(xscale="log", yscale="log", xlabel="K", ylabel="best rate", title="echoed GD: best rate")
    a2.set(xscale="log", yscale="log", xlabel="measured excess loss", ylabel="theorem bound",
           title="bound at measured T vs measured")  # fmt: skip
    lim = [min(r["measured"] for r in gd), max(r["bound"] for r in gd)] if gd else [1e-3, 1]
    a2.plot(lim, lim, "k:", label="bound = measured")
    for ax in (a1, a2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{prefix}rate_and_bound.png", dpi=70)
    plt.close(fig)
    return [f"{prefix}convergence.png", f"{prefix}rate_and_bound.png"]


def plot_wall(speedups, out: Path) -> str:
    """``wall_time.png``: echoed GD's best modelled wall-time speedup against R, per B."""
    plt = pyplot()
    problems = list(dict.fromkeys(r["problem"] for r in speedups))
    fig, axes = plt.subplots(1, len(problems), figsize=(4.5 * len(problems), 3.2), squeeze=False)
    for ax, problem in zip(axes[0], problems, strict=True):
        gd = [r for r in speedups if r["problem"] == problem and r["method"] == "gd"]
        for b in sorted({r["B"] for r in gd}):
            rs = [r for r in gd if r["B"] == b]
            ax.plot([r["R"] for r in rs], [r["speedup"] for r in rs], "o-", label=f"B={b}")
        ax.plot(RATIOS, RATIOS, "k:", label="speedup = R")
        ax.set(xscale="log", yscale="log", xlabel="R = t_up / t_down", ylabel="speedup",
               title=problem[:40])  # fmt: skip
        ax.set_xticks(RATIOS, labels=RATIOS)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "wall_time.png", dpi=70)
    plt.close(fig)
    return "wall_time.png"
