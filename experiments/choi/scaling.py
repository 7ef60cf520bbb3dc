"""Choi et al.'s "useful e grows with batch size", checked at targets up to a higher one.

The main grid's targets are low, where training is step-limited and the largest e tends to
win at every batch size, so it cannot show the claim. Here the TinyCNN (echoing before
augmentation, large post-echo shuffle) trains for every e of :class:`ScalingPlan` at each of
its batch sizes until its highest target, each cell tuned with repeated quasi-random
searches. Every trial records its evaluation history, so one run gives
fresh-examples-to-target for every lower target too: per search, the trial needing the
fewest fresh examples to *that* target is selected. (A trial pruned at the best count to the
top target cannot be the one that reaches a lower target first: the best trial itself reached
it before that count.) :func:`useful` then shows how the useful e moves with the target and
with the batch size.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.common.plotting import pyplot
from experiments.common.tables import markdown_table, write_csv
from experiments.common.trial_loop import Condition, run_trial
from experiments.common.tuning import repeated_search
from experiments.common.workloads import CNN_SPACE, cnn_workload


@dataclass(frozen=True)
class ScalingPlan:
    """The scaling study's cells (batch sizes x echo factors), targets and search sizes."""

    batch_sizes: tuple[int, ...] = (32, 128)
    factors: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)
    targets: tuple[float, ...] = (0.65, 0.7, 0.75, 0.8)  # ascending; the last one stops a trial
    trials: int = 3  # quasi-random trials per search
    seeds: int = 3  # searches per cell
    budget: int = 24_576  # most fresh examples one trial reads
    data: tuple[int, int] = (20_000, 1000)  # training images, test images
    shuffle_batches: int = 8  # post-echo shuffle buffer, in batches' worth of examples


def fresh_to(history: list, target: float) -> float:
    """Fresh examples at the first evaluation reaching ``target`` (inf if none did)."""
    return next((float(f) for f, metric in history if metric >= target), math.inf)


def search_cell(plan: ScalingPlan, bs: int, e: float, seed: int) -> dict:
    """One (batch size, e) cell: ``plan.seeds`` searches; per target, each search's best."""
    torch.set_num_threads(1)
    every = min(512, 8 * bs)
    wl = cnn_workload(*plan.data, plan.targets[-1], every, plan.budget)
    cond = Condition(e, "before_augment", plan.shuffle_batches * bs, bs)
    results = repeated_search(
        lambda p, s, lim: run_trial(wl, cond, p, s, lim, eval_every=every),
        CNN_SPACE,
        trials=plan.trials,
        seeds=[seed + i for i in range(plan.seeds)],
    )
    row: dict = {"batch_size": bs, "echo_factor": e, "searches": plan.seeds}
    for target in plan.targets:
        best = [min(fresh_to(t.info["history"], target) for t in r.trials) for r in results]
        row[f"fresh_{target:g}"] = statistics.median(best)
        row[f"range_{target:g}"] = f"{min(best):g}-{max(best):g}"
    return row


def useful(rows: list[dict], bs: int, target: float) -> tuple[float, float]:
    """(best e, largest e still cutting fresh examples >= 20% from the e before it) at
    ``target`` for batch size ``bs``, from the medians."""
    col = f"fresh_{target:g}"
    cells = sorted((r["echo_factor"], r[col]) for r in rows if r["batch_size"] == bs)
    best = min(cells, key=lambda c: (c[1], c[0]))[0]
    grow = cells[0][0]
    for (_, before), (e, now) in zip(cells, cells[1:], strict=False):
        if not (math.isfinite(now) and now <= 0.8 * before):
            break
        grow = e
    return best, grow


def report(rows: list[dict], plan: ScalingPlan, out: Path) -> list[str]:
    """Write ``scaling.csv`` and ``scaling.png``; return the Markdown section."""
    write_csv(rows, out / "scaling.csv")
    _plot(rows, plan, out / "scaling.png")
    per = []
    for target in plan.targets:
        parts = [f"bs {bs}: best e {useful(rows, bs, target)[0]:g}, useful up to "
                 f"{useful(rows, bs, target)[1]:g}" for bs in plan.batch_sizes]  # fmt: skip
        per.append(f"- target {target:g}: " + "; ".join(parts))
    cols = ["batch_size", "echo_factor", "searches"] + [
        c for t in plan.targets for c in (f"fresh_{t:g}", f"range_{t:g}")
    ]
    return [
        "## Useful e against batch size, up to a higher target",
        "",
        f"TinyCNN, echoing before augmentation, shuffle {plan.shuffle_batches} batches' worth; "
        f"e in {list(plan.factors)}, batch sizes {list(plan.batch_sizes)}; {plan.seeds} "
        f"searches x {plan.trials} trials per cell; trials stop at accuracy "
        f"{plan.targets[-1]:g} or {plan.budget} fresh examples; the lower targets are read "
        "from the same trials' histories (medians over searches; `range` = min-max).",
        "'Useful up to' = the largest e whose every doubling still cut the median fresh "
        "examples by >= 20%.",
        "",
        *per,
        "",
        "![scaling](scaling.png)",
        "",
        markdown_table(rows, cols),
    ]


def _plot(rows: list[dict], plan: ScalingPlan, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(plan.batch_sizes), figsize=(4.5 * len(plan.batch_sizes), 3.4),
                             squeeze=False)  # fmt: skip
    for ax, bs in zip(axes[0], plan.batch_sizes, strict=True):
        sub = sorted((r for r in rows if r["batch_size"] == bs), key=lambda r: r["echo_factor"])
        for target in plan.targets:
            # Counts, not ratios to e=1: the baseline may miss the top target altogether.
            pts = [(r["echo_factor"], r[f"fresh_{target:g}"]) for r in sub
                   if math.isfinite(r[f"fresh_{target:g}"])]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", label=f"target {target:g}")
        ax.set(xscale="log", yscale="log", xlabel="echo factor e", title=f"batch {bs}",
               ylabel="fresh examples to target (median)")  # fmt: skip
        ax.set_xticks(plan.factors, labels=[f"{e:g}" for e in plan.factors])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
