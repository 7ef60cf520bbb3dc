"""The run report: a terminal table, and ``report.md``, ``metrics.csv`` and ``curves.png``.

    results = [train(cfg) for cfg in configs]       # dataecho.app.train.TrainResult
    print(format_table(results))
    print(format_ratios(results, ratio=lived_r))    # the figures of merit (dataecho.app.ratios)
    folder = write_report(results, "runs/demo", meta=ReportMeta(command="..."))

The first run with echo factor 1 is the baseline. Speedups are *to the target*: wall seconds
(evaluations included) and fresh examples up to the first evaluation at or above the target
accuracy; a run that missed the target gets none. Bad shard records a run skipped
(``on_bad_record="skip"``) are in ``report.md`` and, per evaluation, in ``metrics.csv``'s
``skipped_records`` column.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dataecho.app.quiet import RERUN
from dataecho.app.ratios import ratios
from dataecho.errors import DataechoValueError

COLUMNS = (
    "run", "echo factor", "where", "wall s to target", "fresh to target", "steps", "stall",
    "realized echo", "final test acc", "speedup wall", "speedup fresh", "worker ms/fresh batch",
)  # fmt: skip
LEADING_CSV = ("run", "echo_factor", "where")  # then every key of the history rows


@dataclass(frozen=True)
class ReportMeta:
    """What was run, for the head of ``report.md`` (all optional but ``command``)."""

    command: str
    machine: str = ""
    upstream: str = ""  # e.g. NginxServer.describe()
    emulated: bool = False  # the numbers come from the storage emulation, not a real server
    ratio: float | None = None  # R = t_up / t_down as measured
    ratio_how: str = "measured by `dataecho.profile`"
    bandwidth_bytes_per_s: float | None = None  # total cap over all connections
    load: str = ""  # load averages before and after: other jobs may share the cores
    notes: tuple[str, ...] = ()  # extra lines (calibration, profiler output, ...)
    # Signs that the machine was not quiet (dataecho.app.quiet): the figures may not hold.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """One run's figures, as the table shows them."""

    name: str
    echo: str
    where: str
    seconds_to_target: float | None
    fresh_to_target: int | None
    steps: int
    stall: float
    realized: float
    accuracy: float | None
    speedup_wall: float | None = None
    speedup_fresh: float | None = None
    worker_ms: float | None = None  # the loader workers' CPU per fresh batch


def summarize(results: Sequence[Any]) -> list[Row]:
    """One :class:`Row` per ``TrainResult``, with speedups against the first run without echo."""
    rows = [_row(r) for r in results]
    base = next((row for row in rows if row.echo == "1"), None)
    if base is None:
        return rows

    def ratio(mine: float | None, theirs: float | None) -> float | None:
        return theirs / mine if mine and theirs else None

    return [
        dataclasses.replace(row, speedup_wall=ratio(row.seconds_to_target, base.seconds_to_target),
                            speedup_fresh=ratio(row.fresh_to_target, base.fresh_to_target))
        for row in rows
    ]  # fmt: skip


def format_table(results: Sequence[Any]) -> str:
    """A plain-text table, one line per run, columns aligned."""
    cells = [COLUMNS, *(_cells(row) for row in summarize(results))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_ratios(results: Sequence[Any], ratio: float | None) -> str:
    """The figures of merit, one line each with its target and definition (see
    :mod:`dataecho.app.ratios`); ``ratio`` is R as the no-echo run lived it."""
    return "\n".join(r.line() for r in ratios(results, summarize(results), ratio))


def write_report(results: Sequence[Any], out_dir: str | Path, *, meta: ReportMeta) -> Path:
    """Write ``report.md``, ``metrics.csv`` and ``curves.png`` into ``out_dir``; return it."""
    if not results:
        raise DataechoValueError("write_report got no results; pass at least one TrainResult")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(results)
    _write_csv(results, rows, out / "metrics.csv")
    _plot(results, rows, meta, out / "curves.png")
    (out / "report.md").write_text(_markdown(results, rows, meta))
    return out


# --- pieces -----------------------------------------------------------------------------------


def _row(r: Any) -> Row:
    cfg = r.config
    echo = f"auto<={cfg.max_echo_factor:g}" if cfg.echo_factor == "auto" else f"{cfg.echo_factor:g}"
    return Row(
        name=cfg.name, echo=echo, where=cfg.where if echo != "1" else "-",
        seconds_to_target=r.seconds_to_target, fresh_to_target=r.fresh_to_target,
        steps=r.steps, stall=r.wait_seconds / r.wall_seconds if r.wall_seconds > 0 else 0.0,
        realized=r.realized_factor, accuracy=r.test_accuracy,
        worker_ms=getattr(r, "worker_ms_per_fresh_batch", None),
    )  # fmt: skip


def _target(results: Sequence[Any]) -> float | None:
    return results[0].config.target_accuracy


def _cells(row: Row) -> tuple[str, ...]:
    def num(value: float | None, spec: str, none: str = "-") -> str:
        return none if value is None else format(value, spec)

    return (
        row.name, row.echo, row.where, num(row.seconds_to_target, ".1f", "missed"),
        num(row.fresh_to_target, ",", "missed"), f"{row.steps:,}", f"{row.stall:.0%}",
        f"{row.realized:.2f}", num(row.accuracy, ".4f"),
        num(row.speedup_wall, ".2f") + ("x" if row.speedup_wall else ""),
        num(row.speedup_fresh, ".2f") + ("x" if row.speedup_fresh else ""),
        num(row.worker_ms, ".1f"),
    )  # fmt: skip


def _write_csv(results: Sequence[Any], rows: list[Row], path: Path) -> None:
    keys: list[str] = []  # every history key, in first-seen order: new fields need no change
    for r in results:
        for h in r.history:
            keys += [k for k in h if k not in keys]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*LEADING_CSV, *keys])
        for r, row in zip(results, rows, strict=True):
            for h in r.history:
                writer.writerow([row.name, row.echo, row.where, *(h.get(k, "") for k in keys)])


def _plot(results: Sequence[Any], rows: list[Row], meta: ReportMeta, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for r, row in zip(results, rows, strict=True):
        acc, label = [h["accuracy"] for h in r.history], f"{row.name} (echo {row.echo})"
        axes[0].plot([h["seconds"] for h in r.history], acc, marker=".", label=label)
        axes[1].plot([h["fresh"] for h in r.history], acc, marker=".", label=label)
    target = _target(results)
    for ax, xlabel in zip(axes, ("wall seconds (evaluations included)", "fresh examples"),
                          strict=True):  # fmt: skip
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("evaluation accuracy")
    axes[1].legend(loc="lower right")
    emulated = " (EMULATED storage)" if meta.emulated else ""
    fig.suptitle(f"Accuracy against wall time and against fresh examples{emulated}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _markdown(results: Sequence[Any], rows: list[Row], meta: ReportMeta) -> str:
    emulated = " **(EMULATION: local files read at a set rate, no network)**"
    lines = [f"# dataecho run report{emulated if meta.emulated else ''}", "",
             f"- command: `{meta.command}`"]  # fmt: skip
    for label, value in (("machine", meta.machine), ("upstream", meta.upstream),
                         ("load (uptime)", meta.load)):  # fmt: skip
        lines += [f"- {label}: {value}"] if value else []
    if meta.bandwidth_bytes_per_s:
        lines.append(f"- bandwidth cap: {meta.bandwidth_bytes_per_s / 1e6:.3g} MB/s in total")
    if meta.ratio is not None:
        lines.append(f"- R = t_up / t_down = {meta.ratio:.2f} ({meta.ratio_how})")
    if (target := _target(results)) is not None:
        lines.append(f"- target: evaluation accuracy {target:g}")
    if skipped := _skipped(results):
        lines.append(f"- bad records skipped (on_bad_record=skip; never trained on): {skipped}")
    if meta.warnings:
        lines += ["", "## The machine was not quiet", "",
                  "The figures of merit below may not hold:", "",
                  *(f"- {w}" for w in meta.warnings), "", f"What to do: {RERUN}."]  # fmt: skip
    lines += ["", "## Results", "", "| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    lines += ["", "worker ms/fresh batch: CPU time of the loader's worker processes over the "
              "whole run, per fresh batch read (reading, decoding, and whatever echo work the "
              "insertion point puts there)."]  # fmt: skip
    if merits := ratios(results, rows, meta.ratio):
        lines += ["", "## Figures of merit", "", *(f"- {r.line()}" for r in merits)]
    lines += ["", "## Reading", "", *_reading(results, rows, meta)]
    lines += ["", "## Notes", "", *(f"- {n}" for n in meta.notes)] if meta.notes else []
    return "\n".join(lines) + "\n"


def _reading(results: Sequence[Any], rows: list[Row], meta: ReportMeta) -> list[str]:
    """Sentences computed from the numbers: what was gained, and what limited it."""
    i = next((i for i, row in enumerate(rows) if row.echo == "1"), None)
    if i is None:
        return ["- No run without echoing: nothing to compare against."]
    base = rows[i]
    verdict = "input-bound" if base.stall >= 0.5 else "NOT strongly input-bound (little to gain)"
    lines = [f"- Without echoing the step waited for data {base.stall:.0%} of the wall time: "
             f"{verdict}."]  # fmt: skip
    if meta.ratio is not None:
        lines.append(f"- At R = {meta.ratio:.2f} the time model allows at most {meta.ratio:.2f}x "
                     "the steps per second; the wall gain cannot exceed the fresh-example gain, "
                     "and at echo factor e the time model gives fresh gain x min(1, R/e) (see the "
                     "figures of merit).")  # fmt: skip
    for r, row in zip(results, rows, strict=True):
        if row is base:
            continue
        if row.speedup_wall is None or row.speedup_fresh is None:
            lines.append(f"- {row.name}: no speedup (a run missed the target).")
            continue
        lines.append(
            f"- {row.name}: {row.speedup_wall:.2f}x less wall time, {row.speedup_fresh:.2f}x "
            f"fewer fresh examples. Wall-time gain = fresh-example gain x the fresh-data rate "
            f"kept ({row.speedup_wall / row.speedup_fresh:.0%} of the baseline's; stall "
            f"{row.stall:.0%}, realized echo factor {row.realized:.2f}). Final test accuracy "
            f"{_num(row.accuracy)} vs {_num(base.accuracy)}{_equal_fresh(r, results[i])}."
        )
    if meta.emulated:
        lines.append("- These numbers come from the storage EMULATION, not a real server.")
    return lines


def _skipped(results: Sequence[Any]) -> str:
    """``name N, ...`` for the runs that skip bad records or skipped some; "" when none did."""
    runs = [r for r in results if getattr(r, "skipped_records", 0)
            or getattr(r.config, "on_bad_record", "raise") == "skip"]  # fmt: skip
    return ", ".join(f"{r.config.name} {getattr(r, 'skipped_records', 0):,}" for r in runs)


def _num(acc: float | None) -> str:
    return "-" if acc is None else f"{acc:.4f}"


def _equal_fresh(run: Any, base: Any) -> str:
    """``run``'s last evaluation against ``base``'s at as many fresh examples (interpolated)."""
    if not run.history or not base.history:
        return ""
    last, fresh = run.history[-1], [h["fresh"] for h in base.history]
    if not fresh[0] <= last["fresh"] <= fresh[-1]:
        return ""  # outside the baseline's curve: no honest interpolation
    acc = float(np.interp(last["fresh"], fresh, [h["accuracy"] for h in base.history]))
    return (f"; at the same {int(last['fresh']):,} fresh examples its evaluation accuracy was "
            f"{last['accuracy']:.4f} against {acc:.4f} without echoing "
            f"({100 * (last['accuracy'] - acc):+.2f} points)")  # fmt: skip
