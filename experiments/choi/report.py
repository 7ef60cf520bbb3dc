"""The choi experiment's outputs: CSV tables, plots, ``results.json`` and the README.

:func:`write` renders one run; :func:`claims` computes each of the paper's claims from the
tables, as evidence (the verdicts are written by hand on the results page,
docs/results/choi/README.md).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from dataecho.app import workloads
from experiments.choi.plan import variant
from experiments.choi.plots import plot, plot_speedup
from experiments.choi.wall_time import baselines, time_rows
from experiments.common.tables import markdown_table, write_csv


def claims(rows: list[dict], fixed: list[dict]) -> list[tuple[str, str]]:
    """Each claim with the evidence, computed from the tables (verdict words are added here)."""
    base = baselines(rows)
    med = {(r["workload"], r["batch_size"], r["echo_factor"], r["where"], r["shuffle_buffer"] > 0):
           r["fresh_median"] for r in rows}  # fmt: skip
    lines = []
    # 1. echoing reduces fresh examples (at e = 2, some variant beats the baseline)
    parts = []
    for (wl, bs), b in sorted(base.items()):
        e2 = [r for r in rows if r["workload"] == wl and r["batch_size"] == bs
              and r["echo_factor"] == 2]  # fmt: skip
        best = min(e2, key=lambda r: r["fresh_median"], default=None)
        if best and not math.isfinite(b["fresh_median"]):
            parts.append(f"{wl} bs {bs}: baseline did not reach the target")
        elif best:
            parts.append(f"{wl} bs {bs}: best e=2 variant {variant(best)} needs "
                         f"{best['fresh_median'] / b['fresh_median']:.2f}x the baseline's fresh "
                         f"examples (median)")  # fmt: skip
    lines.append(("Echoing (e=2) reduces fresh examples to target", "; ".join(parts)))
    # 2. before-augment >= after-augment; 3. shuffling helps
    lines.append(("Before-augment echoing beats after-augment",
                  _pairs(med, lambda k: (k[3] == "before_augment",
                                         (k[0], k[1], k[2], "after_augment", k[4])))))  # fmt: skip
    lines.append(
        (
            "Post-echo shuffling helps",
            _pairs(med, lambda k: (k[4] and k[2] > 1, (k[0], k[1], k[2], k[3], False))),
        )
    )
    # 4. useful e grows with batch size
    parts = []
    for (wl, bs), b in sorted(base.items()):
        useful = [r["echo_factor"] for r in rows if r["workload"] == wl and r["batch_size"] == bs
                  and r["fresh_median"] < b["fresh_median"] and r["echo_factor"] > 1]  # fmt: skip
        best = min((r for r in rows if r["workload"] == wl and r["batch_size"] == bs),
                   key=lambda r: r["fresh_median"])  # fmt: skip
        parts.append(f"{wl} bs {bs}: largest e beating the baseline {max(useful, default=1):g}, "
                     f"best e {best['echo_factor']:g}")  # fmt: skip
    lines.append(("Useful e grows with batch size", "; ".join(parts)))
    # 5. final quality at a fixed fresh budget
    parts = []
    for wl in sorted({f["workload"] for f in fixed}):
        fs = [f for f in fixed if f["workload"] == wl]
        b = [f["final_metric"] for f in fs if f["echo_factor"] == 1]
        if not b:
            continue
        # The experiment's workloads share the application's names and metrics' direction.
        better = workloads.get(wl).better
        wins = sum(better(f["final_metric"], b[0]) for f in fs if f["echo_factor"] > 1)
        parts.append(f"{wl}: {wins}/{len(fs) - 1} echoed runs at least as good as the baseline "
                     f"({b[0]:.3f})")  # fmt: skip
    lines.append(("Final quality at a fixed fresh budget is not hurt", "; ".join(parts)))
    return lines


def _pairs(med: dict, pick: Any) -> str:
    """How often the key ``pick`` selects beats its partner (fewer fresh examples, medians)."""
    wins = ties = total = 0
    for key, value in med.items():
        chosen, other = pick(key)
        if chosen and other in med and key[2] > 1:
            total += 1
            wins += value < med[other]
            ties += value == med[other]
    return f"{wins} of {total} matched cells fewer fresh examples ({ties} ties)"


def write(out: Path, plan: Any, rows: list[dict], fixed: list[dict], timed: dict | None,
          wall: float, skipped: list[dict], *, quick: bool, seed: int,
          extra: list[str] | None = None) -> Path:  # fmt: skip
    """Write the CSVs, PNGs, ``results.json`` and ``README.md`` into ``out``; return the README.

    ``extra``: Markdown lines of further sections, placed before the claims."""
    table = [{k: v for k, v in r.items() if k not in ("curves", "best_params")}
             | {"best_params": json.dumps(r["best_params"], default=float)} for r in rows]  # fmt: skip
    table.sort(key=lambda r: (r["workload"], r["batch_size"], r["echo_factor"], r["where"],
                              r["shuffle_buffer"]))  # fmt: skip
    write_csv(table, out / "fresh_to_target.csv")
    trows = time_rows(rows)
    write_csv(trows, out / "time_model.csv")
    write_csv(fixed, out / "fixed_budget.csv")
    plot(rows, out / "fresh_to_target.png")
    if trows:
        plot_speedup(trows, out / "speedup.png")
    (out / "results.json").write_text(json.dumps({"timed_check": timed, "seed": seed}, indent=1))
    cmd = f"python -m experiments choi{' --quick' if quick else ''} --out {out} --seed {seed}"
    cols = ["workload", "batch_size", "echo_factor", "where", "shuffle_buffer", "searches",
            "reached", "fresh_min", "fresh_median", "fresh_max", "best_params"]  # fmt: skip
    md = [
        "# Choi et al. 2019, reproduced small (`python -m experiments choi`)",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, "
        f"{platform.processor() or 'CPU'}, {os.cpu_count()} cores, torch 1 thread per process. "
        f"Wall time: {wall / 60:.1f} min.",
        "",
        _plan_text(plan),
        "",
        f"Cells skipped at the deadline ({plan.deadline_s / 60:.0f} min): "
        + (
            ", ".join(
                f"{c['workload']} bs {c['batch_size']} e={c['echo_factor']:g} "
                f"{c['where']} shuffle {c['shuffle_buffer']}"
                for c in skipped
            )
            or "none"
        ),
        "",
        "## Fresh examples to target",
        "",
        "![fresh to target](fresh_to_target.png)",
        "",
        markdown_table(table, cols),
        "",
        "## Wall time from the time model (`dataecho.profiling.time_model`)",
        "",
        "Best variant per e; wall = fresh batches x max(R t_down, e t_down), t_down measured. "
        "speedup = baseline wall / wall.",
        "",
        "![speedup](speedup.png)" if trows else "",
        "",
        markdown_table(trows) if trows else "(no cell reached the target)",
        "",
        "## Final quality at a fixed fresh budget (selected params of search 0, small batch)",
        "",
        markdown_table(fixed) if fixed else "(none)",
        "",
        _timed_text(timed),
        "",
        *([*extra, ""] if extra else []),
        "## Claims (computed; see docs/results/choi/README.md for the verdicts)",
        "",
    ]
    md += [f"- **{name}**: {evidence}" for name, evidence in claims(rows, fixed)]
    path = out / "README.md"
    path.write_text("\n".join(md) + "\n")
    return path


def _plan_text(plan: Any) -> str:
    lines = [f"Plan: {plan.trials} quasi-random trials per search; {plan.main_seeds} searches "
             f"for e=1 and for the first insertion point with a large shuffle at e in "
             f"{list(plan.main_factors)}, {plan.other_seeds} for every other cell; e in "
             f"{list(plan.minor_factors)} only at the first insertion point; no-shuffle "
             f"cells only at e in {list(plan.unshuffled_factors)}; large shuffle = "
             f"{plan.shuffle_batches} batches' worth of examples."]  # fmt: skip
    for wp in plan.workloads:
        lines.append(f"- {wp.name}: target {wp.target:g}, batch sizes {list(wp.batch_sizes)}, "
                     f"insertion points {list(wp.wheres)}, evaluation every min({wp.eval_every}, "
                     f"8 batches) fresh examples, trial budget {wp.budget} fresh, fixed budget "
                     f"{wp.fixed_budget}, data settings {wp.args}")  # fmt: skip
    return "\n".join(lines)


def _timed_text(timed: dict | None) -> str:
    if not timed:
        return "## Timed check\n\n(not run in --quick)"
    rows = timed["runs"]
    ratio = rows[0]["measured_s"] / rows[1]["measured_s"] if len(rows) == 2 else math.nan
    return "\n".join([
        "## Timed check: one real run against the time model",
        "",
        f"`dataecho.app.train.train`, SmallCNN batch 128, reads slowed to {timed['read_delay'] * 1e6:.0f}"
        f" us/example so R = {timed['R']:g} against t_down = {timed['t_down'] * 1e3:.1f} ms "
        "(measured just before); batch echoing; evaluation time excluded.",
        "",
        markdown_table(rows),
        "",
        f"Wall ratio e=1 / e=4 for the same fresh examples: measured {ratio:.2f}, model 1.00. "
        f"Median step time in the runs vs before: {statistics.median(r['step_ms_in_run'] for r in rows):.1f} ms"
        f" vs {timed['t_down'] * 1e3:.1f} ms.",
    ])  # fmt: skip
