"""Tables and plot of ``python -m benchmarks peers`` (see benchmarks.peers); the Markdown
report that holds them is :mod:`benchmarks.peers.markdown`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.peers import target_report
from benchmarks.peers.loaders import Case

OVERHEAD_TARGET = 0.98
MIB = 1024.0  # kB per MiB
EXAMPLE_PAYLOAD = 28 * 28 + 2 * 8  # bytes: uint8 image, label and index


def fmt(value, spec: str = "{:.2f}") -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return spec.format(value)


def rate(w) -> float:
    """Steps per second of a window (or a sum of rounds)."""
    return w.steps / w.wall if w.wall else math.nan


def paired(ours, theirs) -> list[float]:
    """Round r of ``ours`` over round r of ``theirs`` (steps/s): neighbours in time, so the
    machine's drift mostly cancels within a pair."""
    return [a / b for a, b in zip(ours.per_round, theirs.per_round, strict=True) if b > 0]


def _spread(w) -> float:
    steps_per_s = rate(w)
    return 100 * (max(w.per_round) - min(w.per_round)) / steps_per_s if steps_per_s else math.nan


def overhead_rows(result: dict) -> list[list[str]]:
    windows = result["overhead"]
    base = windows[Case("dataloader")]
    rows = []
    for case, w in windows.items():
        ratio = rate(w) / rate(base)
        rounds = paired(w, base)  # round r of this case against round r of DataLoader
        target = "-"
        if case.kind == "dataecho":
            target = "ok" if ratio >= OVERHEAD_TARGET else f"MISS (< {OVERHEAD_TARGET})"
        rows.append([case.name, fmt(rate(w)), fmt(ratio, "{:.3f}"),
                     f"{min(rounds):.3f}-{max(rounds):.3f}", fmt(100 * w.wait / w.wall, "{:.1f}"),
                     fmt(1e3 * w.compute / w.steps, "{:.1f}"), fmt(_spread(w), "{:.1f}"), target])  # fmt: skip
    return rows


OVERHEAD_HEADERS = ["loader (e = 1)", "steps/s", "vs DataLoader", "per round", "stall %",
                    "step ms", "spread %", "target"]  # fmt: skip
RAW_HEADERS = ["level", "stage (e = {e})", "copy", "items/s", "examples/s", "us/item"]


def raw_rows(result: dict) -> list[list[str]]:
    return [[r["level"], r["stage"], "yes" if r["copy"] else "no", fmt(r["items/s"], "{:,.0f}"),
             fmt(r["examples/s"], "{:,.0f}"), fmt(r["us/item"], "{:.2f}")]
            for r in result["raw"]]  # fmt: skip


INPUT_HEADERS = ["R", "loader", "steps/s", "stall %", "fresh ex/s", "fresh / upstream",
                 "realized e", "efficiency", "step ms", "spread %"]  # fmt: skip


def input_figures(result: dict) -> list[dict]:
    """Section 2's figures per (R, loader)."""
    s, t_down, windows = result["settings"], result["t_down"], result["input_bound"]
    out = []
    for (ratio, case), w in windows.items():
        base = rate(windows[(ratio, Case("dataloader"))])
        factor = s.max_echo_factor if case.echo == "auto" else float(case.echo)
        upstream = s.batch_size / (ratio * t_down)  # examples/s the throttle allows
        out.append({
            "R": ratio, "case": case, "steps/s": rate(w), "stall %": 100 * w.wait / w.wall,
            "fresh ex/s": w.fresh / w.wall, "fresh / upstream": w.fresh / w.wall / upstream,
            "realized e": w.steps * s.batch_size / w.fresh if w.fresh else math.nan,
            "efficiency": rate(w) / (min(factor, ratio) * base),
            "step ms": 1e3 * w.compute / w.steps if w.steps else math.nan,
            "spread %": _spread(w),
        })  # fmt: skip
    return out


def input_rows(result: dict) -> list[list[str]]:
    specs = ["{:g}", "{}", "{:.2f}", "{:.1f}", "{:,.0f}", "{:.3f}", "{:.2f}", "{:.3f}",
             "{:.1f}", "{:.1f}"]  # fmt: skip
    return [[fmt(f[h] if h != "loader" else f["case"].name, spec)
             for h, spec in zip(INPUT_HEADERS, specs, strict=True)]
            for f in input_figures(result)]  # fmt: skip


TARGET_HEADERS = ["R", "dataecho snapshots", "fastest peer, steps/s",
                  "dataecho fixed e: steps/s / peer's", "auto: steps/s / best fixed e's",
                  "slower than the fastest peer"]  # fmt: skip


def label(case: Case) -> str:
    """A dataecho case in a few words: where, its shuffle buffer, "+batch aug"."""
    shuffle = f" +shuffle {case.shuffle_buffer}" if case.shuffle_buffer > 1 else ""
    return case.where + shuffle + (" +batch aug" if case.batch_augment else "")


def target_rows(result: dict) -> list[list[str]]:
    """Per R and snapshot setting: the fastest peer at e = R against each dataecho loader.

    "no snapshots" rows are like for like (the peers cannot checkpoint); auto has only the
    default, and is compared with the best fixed e of the same snapshot setting.
    """
    figures = input_figures(result)
    rows = []
    for ratio in result["settings"].ratios:
        here = [f for f in figures if f["R"] == ratio]
        peers = [f for f in here if f["case"].kind in ("monai", "adjacent")]
        best_peer = max(peers, key=lambda f: f["steps/s"])
        for snapshots in (True, False):
            ours = [f for f in here if f["case"].kind == "dataecho"
                    and f["case"].snapshots is snapshots]  # fmt: skip
            fixed = [f for f in ours if f["case"].echo != "auto"]
            if not fixed:
                continue
            best_fixed = max(fixed, key=lambda f: f["steps/s"])
            ratios = "; ".join(
                f"{label(f['case'])} {f['steps/s'] / best_peer['steps/s']:.3f}" for f in fixed
            )
            autos = "; ".join(f"{label(f['case'])} {f['steps/s'] / best_fixed['steps/s']:.3f}"
                              for f in ours if f["case"].echo == "auto")  # fmt: skip
            slower = [label(f["case"]) for f in fixed if f["steps/s"] < best_peer["steps/s"]]
            verdict = ", ".join(slower) if slower else "none"
            rows.append([fmt(ratio, "{:g}"), "default" if snapshots else "off",
                         f"{best_peer['case'].name} {best_peer['steps/s']:.2f}", ratios,
                         autos or "-", verdict])  # fmt: skip
    return rows


QUALITY_HEADERS = ["loader", "fresh examples", "steps", "test accuracy (mean)", "per seed"]


def quality_rows(result: dict) -> list[list[str]]:
    return [[r["case"].name, f"{r['fresh']:,}", f"{r['steps']:,}",
             fmt(statistics.fmean(r["accs"]), "{:.4f}"), " / ".join(f"{a:.4f}" for a in r["accs"])]
            for r in result["quality"]]  # fmt: skip


MEMORY_HEADERS = ["loader (e = {e})", "main start MiB", "main peak MiB", "main growth MiB",
                  "worker peak MiB", "worker vs DataLoader MiB", "batches"]  # fmt: skip


def memory_rows(result: dict) -> list[list[str]]:
    runs = result["memory"]
    base = next((r["worker_kb"] for r in runs if r["case"].kind == "dataloader"), math.nan)
    return [[r["case"].name, fmt(r["start_kb"] / MIB, "{:.0f}"), fmt(r["main_kb"] / MIB, "{:.0f}"),
             fmt((r["main_kb"] - r["start_kb"]) / MIB, "{:.1f}"), fmt(r["worker_kb"] / MIB, "{:.0f}"),
             fmt((r["worker_kb"] - base) / MIB, "{:+.1f}"), str(r["batches"])]
            for r in runs]  # fmt: skip


GROWTH_HEADERS = ["shuffle buffer (examples)", "worker state snapshots", "worker peak MiB",
                  "growth MiB", "bytes / buffered example", "marginal bytes / example"]  # fmt: skip


def growth_rows(result: dict) -> list[list[str]]:
    """dataecho before_augment at the memory factor, by shuffle buffer size (0 = none).

    Growth is over the no-buffer run; *marginal* is between this size and the previous one,
    which cancels whatever constant the buffer adds (the slope is the cost per example).
    """
    e = result["settings"].memory_factor
    runs = [r for r in result["memory"]
            if r["case"].kind == "dataecho" and r["case"].where == "before_augment"
            and r["case"].echo == e and not r["case"].batch_augment]  # fmt: skip
    zero = next((r for r in runs if r["case"].shuffle_buffer <= 1), None)
    if zero is None:
        return []

    def row(r: dict, prev: tuple[int, float] | None) -> tuple[list[str], tuple[int, float]]:
        n = r["case"].shuffle_buffer
        growth = (r["worker_kb"] - zero["worker_kb"]) * 1024
        marginal = (growth - prev[1]) / (n - prev[0]) if prev and n > prev[0] else math.nan
        if r is zero:
            snapshots = "-"
        elif not r["case"].snapshots:
            snapshots = "off"
        else:  # the run stops at the epoch's end, which may come before the first snapshot
            snapshots = f"every {r['interval']:,}"
            if r["batches"] < r["interval"]:
                snapshots += f" (epoch ended at {r['batches']:,})"
        return [f"{n:,}", snapshots, fmt(r["worker_kb"] / MIB, "{:.0f}"),
                fmt(growth / 2**20, "{:.1f}"), fmt(growth / n if n > 1 else math.nan, "{:,.0f}"),
                fmt(marginal, "{:,.0f}")], (n, growth)  # fmt: skip

    rows = [row(zero, None)[0]]
    for snapshots in (True, False):
        series = sorted((r for r in runs if r["case"].shuffle_buffer > 1
                         and r["case"].snapshots is snapshots),
                        key=lambda r: r["case"].shuffle_buffer)  # fmt: skip
        prev = (0, 0.0)
        for r in series:
            cells, prev = row(r, prev)
            rows.append(cells)
    return rows


def _bound_panels(axes, result: dict) -> None:
    """Section 2: steps/s and efficiency against R, one line per loader."""
    import matplotlib
    import matplotlib.ticker

    def series(case: Case) -> str:  # the loader's name with its factor (= R) as "R"
        return case.name if case.echo == "auto" else case.name.replace(f"={case.echo:g}", "=R")

    figures = input_figures(result)
    for ax in axes:  # more loaders than the default cycle's 10 colours
        ax.set_prop_cycle(color=matplotlib.colormaps["tab20"].colors)
    for name in dict.fromkeys(series(f["case"]) for f in figures):
        pts = [f for f in figures if series(f["case"]) == name]
        xs = [f["R"] for f in pts]
        case = pts[0]["case"]
        style = ("--" if case.kind in ("monai", "adjacent", "dataloader")
                 else ":" if case.snapshots is False else "-")  # fmt: skip
        axes[0].plot(xs, [f["steps/s"] for f in pts], style, marker="o", label=name)
        axes[1].plot(xs, [f["efficiency"] for f in pts], style, marker="o", label=name)
    axes[0].set(xlabel="R = t_up / t_down", ylabel="training steps / s", xscale="log",
                title="Throughput, e = R")  # fmt: skip
    axes[1].set(xlabel="R = t_up / t_down", ylabel="efficiency", xscale="log",
                title="steps/s / (min(e, R) x no-echo steps/s)")  # fmt: skip
    for ax in axes:
        ax.set_xticks(result["settings"].ratios, [f"{r:g}" for r in result["settings"].ratios])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)


def plot(result: dict, path: Path) -> None:
    """Section 2's throughput and efficiency against R (peers dashed, dataecho without worker
    snapshots dotted) above section 6's wall time to target, for the sections that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bound, target = "input_bound" in result, "target" in result
    loaders = len({case.name for _, case in result.get("target", ())})
    heights = [6.2] * bound + [1.2 + 0.42 * loaders] * target
    fig = plt.figure(figsize=(12, sum(heights)), layout="constrained")
    subs = fig.subfigures(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    if bound:
        axes = subs[0].subplots(1, 2)
        _bound_panels(axes, result)
        handles, labels = axes[0].get_legend_handles_labels()
        subs[0].legend(handles, labels, loc="outside lower center", ncol=3, fontsize=7,
                       frameon=False)  # fmt: skip
    if target:
        target_report.plot_panel(subs[-1].subplots(1, 1), result)
    fig.suptitle(f"dataecho vs peers; t_down = {result['t_down'] * 1e3:.1f} ms, "
                 f"{result['machine']['cpu']}", fontsize=9)  # fmt: skip
    fig.savefig(path, dpi=100)
    plt.close(fig)
