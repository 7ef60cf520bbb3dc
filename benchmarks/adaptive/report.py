"""The adaptive benchmark's table: figures per case, the targets checked, the report text."""

from __future__ import annotations

import math

from benchmarks import common
from benchmarks.adaptive.measure import Config, Settings, Window

# Fixed e: efficiency >= 0.95; auto: stall <= 2%, fresh / upstream >= 0.98, realized e within
# 10% of min(R, max_echo_factor).
TARGETS = {"efficiency": 0.95, "stall": 0.02, "fresh": 0.98, "factor": 0.10}


def rows(result: dict) -> list[dict]:
    """One dict of figures per (R, config), with the :data:`TARGETS` checked."""
    s, windows = result["settings"], result["windows"]

    def fresh_rate(w: Window) -> float:
        return w.arrivals / w.arrival_seconds if w.arrival_seconds else w.fresh / w.wall

    out = []
    for (ratio, config), w in windows.items():
        base = windows[(ratio, Config(1.0))]
        upstream = windows[(ratio, Config(None))]
        t_up = s.batch_size / fresh_rate(upstream)  # seconds per fresh batch, measured
        step_s = w.compute / w.steps if w.compute else math.nan  # this case's step, wall
        row = {
            "R": ratio,
            "config": config.name,
            "steps/s": w.steps / w.wall,
            "fresh ex/s": fresh_rate(w),
            "fresh / upstream": fresh_rate(w) / fresh_rate(upstream),
            "realized e": w.out / w.fresh if w.fresh else math.nan,
            "R seen": t_up / step_s,
            "stall %": 100 * w.wait / w.wall,
            "step ms": 1e3 * step_s,
            "step cpu ms": 1e3 * w.compute_cpu / w.steps if w.compute else math.nan,
            "efficiency": math.nan,
            "eff. seen": math.nan,
            "worker cpu %": 100 * w.worker_cpu / w.wall,
            "spread %": 100 * (max(w.per_round) - min(w.per_round)) / (w.steps / w.wall),
            "targets": "-",
        }
        if config.echo_factor not in (None, 1.0):
            factor = s.max_echo_factor if config.echo_factor == "auto" else config.echo_factor
            ideal = min(factor, ratio) * base.steps / base.wall
            row["efficiency"] = row["steps/s"] / ideal
            # The same against what this case's own step time allows: echoing's overhead alone.
            row["eff. seen"] = row["steps/s"] / min(factor / t_up, 1 / step_s)
            row["targets"] = verdict(row, config, ratio, s)
        out.append(row)
    return out


def verdict(row: dict, config: Config, ratio: float, s: Settings) -> str:
    """Either "ok" or "MISS: " and the targets missed (see ``TARGETS``)."""
    if config.echo_factor != "auto":
        missed = ["efficiency"] if row["efficiency"] < TARGETS["efficiency"] else []
    else:
        expected = min(ratio, math.floor(s.max_echo_factor))
        missed = [
            name
            for name, bad in (
                ("stall", row["stall %"] > 100 * TARGETS["stall"]),
                ("fresh", row["fresh / upstream"] < TARGETS["fresh"]),
                ("factor", abs(row["realized e"] / expected - 1) > TARGETS["factor"]),
            )
            if bad
        ]
    return "MISS: " + ", ".join(missed) if missed else "ok"


COLUMNS = {  # name -> format of its figures
    "R": "{:g}",
    "config": "{}",
    "steps/s": "{:.2f}",
    "fresh ex/s": "{:.0f}",
    "fresh / upstream": "{:.3f}",
    "realized e": "{:.2f}",
    "R seen": "{:.2f}",
    "stall %": "{:.1f}",
    "step ms": "{:.1f}",
    "step cpu ms": "{:.1f}",
    "efficiency": "{:.3f}",
    "eff. seen": "{:.3f}",
    "worker cpu %": "{:.0f}",
    "spread %": "{:.1f}",
    "targets": "{}",
}


def table(result: dict) -> str:
    def cell(value, fmt: str) -> str:
        return "-" if isinstance(value, float) and math.isnan(value) else fmt.format(value)

    body = [[cell(r[c], f) for c, f in COLUMNS.items()] for r in rows(result)]
    return common.markdown_table(list(COLUMNS), body, align="rl" + "r" * (len(COLUMNS) - 3) + "l")


def report(result: dict, command: str) -> str:
    """The generated part of the docs section: command, context, table, legend."""
    s, m = result["settings"], result["machine"]
    return f"""\
Command: `{command}`.
Machine: {m["cpu"]}; torch {m["torch"]}, Python {m["python"]}; {result["threads"]}.
Load average (1/5/15 min) before: {m["load_before"]}; after: {common.load_average()}.

Step: SmallCNN + SGD (momentum 0.9), batch {s.batch_size}, 1x28x28 inputs;
t_down = {result["t_down"] * 1e3:.2f} ms (median of 30 steps before the cases). Upstream: one
DataLoader worker reads examples at R x t_down per batch (`benchmarks.common.PacedImages`:
sleeping reads, emulating storage/network latency, no CPU while waiting; a reader descheduled
for up to one batch period catches up), then runs `Augment` per example.
Fixed factors echo at `where="{s.where}"`; auto uses `max_echo_factor={s.max_echo_factor:g}`.
Each case: {s.warmup:g} s warm-up (and >= 2 fresh batches), then {s.duration:g} s measured;
{s.rounds} round(s), cases interleaved (A B C ... A B C ...); figures are totals over rounds.

{table(result)}

Columns: *fresh ex/s* = fresh examples between the first and last fresh arrival in each
window over the time between them (a window's count alone would be off by up to one batch);
*fresh / upstream* = that over the "upstream alone" case at the same R (reading only, no
step); *realized e* = examples out / fresh examples in the windows (`loader.stats` counts);
*R seen* = the measured upstream time per batch over this case's own step time (R as the run
saw it; the step is slower than t_down when it shares the cores); *stall %* = time in
`next(loader)` / wall time; *step ms* = one step, wall clock; *step cpu ms* = CPU time of the
step's thread in it (lower than step ms: the thread was preempted or waited for the GIL);
*efficiency* = steps/s / (min(e, R) x steps/s of "no echo"), e = max_echo_factor for auto;
*eff. seen* = steps/s / min(e / t_up, 1 / step time of this case): echoing's own overhead,
without the step's slowdown; *worker cpu %* = CPU of the loader worker process / wall time
(100 = one core); *spread %* = (max - min) / mean of the per-round steps/s. Targets:
fixed e efficiency >= {TARGETS["efficiency"]}; auto stall <= {100 * TARGETS["stall"]:g}%,
fresh / upstream >= {TARGETS["fresh"]}, realized e within {100 * TARGETS["factor"]:g}% of
min(R, max_echo_factor).
"""
