"""Tables and plot panel of the wall-time-to-target section (see benchmarks.peers.target)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.peers.loaders import Case
from benchmarks.peers.target import mean_seconds

AUTO_TOLERANCE = 0.10  # "within 10%": the round-to-round spread of one case is about this

HEADERS = ["R", "loader", "reached", "wall s to target", "per round (s)", "fresh to target",
           "steps", "evals (s)", "stall %", "realized e", "speedup vs no echo"]  # fmt: skip


def _mean(runs: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def _realized(runs: list[dict], batch: int) -> float:
    return statistics.fmean(r["steps"] * batch / r["fresh"] for r in runs if r["fresh"])


def rows(result: dict) -> list[list[str]]:
    s, runs_by = result["settings"], result["target"]
    out = []
    for (ratio, case), runs in runs_by.items():
        base = mean_seconds(runs_by[(ratio, Case("dataloader"))])
        secs = mean_seconds(runs)
        reached = sum(r["reached"] for r in runs)
        out.append([
            f"{ratio:g}", case.name, f"{reached}/{len(runs)}",
            f"{secs:.1f}" if math.isfinite(secs) else "not reached",
            " / ".join(f"{r['seconds']:.1f}" + ("" if r["reached"] else "*") for r in runs),
            f"{_mean(runs, 'fresh'):,.0f}", f"{_mean(runs, 'steps'):,.0f}",
            f"{_mean(runs, 'evals'):.1f} ({_mean(runs, 'eval_s'):.1f})",
            f"{100 * sum(r['wait_s'] for r in runs) / sum(r['seconds'] for r in runs):.1f}",
            f"{_realized(runs, s.batch_size):.2f}",
            f"{base / secs:.2f}" if math.isfinite(secs) and math.isfinite(base) else "-",
        ])  # fmt: skip
    return out


def _fixed(result: dict, ratio: float, where: str | None) -> list[tuple[Case, list[dict]]]:
    """Fixed-e cases at R = ``ratio``: dataecho at ``where`` (None: any loader that echoes)."""
    return [(c, runs) for (r, c), runs in result["target"].items()
            if r == ratio and c.echo != "auto" and c.kind != "dataloader"
            and (c.kind == "dataecho" and c.where == where if where else True)]  # fmt: skip


def verdict_rows(result: dict) -> list[list[str]]:
    """Per R and auto insertion point: auto's time over the best fixed e's."""
    s, out = result["settings"], []
    for ratio in s.target_ratios:
        anywhere = min(_fixed(result, ratio, None), key=lambda cr: mean_seconds(cr[1]))
        for (r, case), runs in result["target"].items():
            if r != ratio or case.echo != "auto":
                continue
            same = min(_fixed(result, ratio, case.where), key=lambda cr: mean_seconds(cr[1]))
            auto_s, same_s = mean_seconds(runs), mean_seconds(same[1])
            ratio_same = auto_s / same_s
            paired = [a["seconds"] / b["seconds"] for a, b in zip(runs, same[1], strict=True)]
            if ratio_same <= 1.0:
                verdict = "met"
            elif ratio_same <= 1 + AUTO_TOLERANCE:
                verdict = f"within {AUTO_TOLERANCE:.0%} (about met)"
            else:
                verdict = "NOT met"
            out.append([
                f"{ratio:g}", case.where, f"{auto_s:.1f} (e {_realized(runs, s.batch_size):.2f})",
                f"{same[0].name}: {same_s:.1f}", f"{ratio_same:.2f}",
                " / ".join(f"{p:.2f}" for p in paired),
                f"{anywhere[0].name}: {mean_seconds(anywhere[1]):.1f}",
                f"{auto_s / mean_seconds(anywhere[1]):.2f}", verdict,
            ])  # fmt: skip
    return out


VERDICT_HEADERS = ["R", "auto at", "auto s (realized e)", "best fixed e there: s",
                   "auto / it", "per round", "best fixed e of any loader: s", "auto / it",
                   "verdict"]  # fmt: skip


def peer_rows(result: dict) -> list[list[str]]:
    """Per R and e: MONAI against dataecho's fixed e, in wall time to target."""
    s, out = result["settings"], []
    for ratio in s.target_ratios:
        for e in s.target_factors:
            at = {(c.kind, c.where): mean_seconds(runs)
                  for (r, c), runs in result["target"].items() if r == ratio and c.echo == e}  # fmt: skip
            monai = at[("monai", "-")]
            ours = min(at[("dataecho", "batch")], at[("dataecho", "before_augment")])
            ok = "yes" if ours <= monai else "no"
            out.append([f"{ratio:g}", f"{e:g}", f"{monai:.1f}", f"{at[('dataecho', 'batch')]:.1f}",
                        f"{at[('dataecho', 'before_augment')]:.1f}", f"{ours / monai:.2f}", ok])  # fmt: skip
    return out


PEER_HEADERS = ["R", "e", "MONAI s", "dataecho batch s", "dataecho before_augment s",
                "best dataecho / MONAI", "dataecho not slower?"]  # fmt: skip


def plot_panel(ax: Any, result: dict) -> None:
    """Horizontal bars: mean wall seconds to target per loader, one colour per R."""
    keys = list(result["target"])
    names = list(dict.fromkeys(c.name for _, c in keys))
    ratios = result["settings"].target_ratios
    height = 0.8 / len(ratios)
    for j, ratio in enumerate(ratios):
        ys, xs = [], []
        for i, name in enumerate(names):
            runs = next(
                v for (r, c), v in result["target"].items() if r == ratio and c.name == name
            )
            secs = mean_seconds(runs)
            ys.append(i + j * height)
            xs.append(secs if math.isfinite(secs) else result["settings"].target_max_seconds)
        ax.barh(ys, xs, height=height, label=f"R = {ratio:g}")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="wall seconds to target (mean over rounds; evaluations included)",
           title=f"Time to {result['settings'].target_accuracy:.2f} test accuracy")  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8)
