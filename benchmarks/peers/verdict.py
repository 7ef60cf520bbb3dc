"""Target (i) of the peers benchmark, "dataecho is never slower than the fastest peer at equal e", judged
from section 2 of ``python -m benchmarks peers`` by paired rounds.

Three comparisons per R (e = R), each dataecho loader against a peer in the same run:

- *same work as MONAI*: dataecho ``where="batch"`` (no shuffle) against ``ThreadDataLoader
  (repeats=e)``: both repeat augmented batches in the training process;
- *same work as adjacent repeats*: dataecho ``before_augment`` (no shuffle) against the tf.data
  idiom: both read each example once and augment every copy on its own in the worker;
- *fastest against fastest*: dataecho's fastest fixed-e loader against the fastest peer.

Figures are the mean of per-round ratios (round r of one case over round r of the other: the
cases ran interleaved, so a pair is close in time and the machine's drift mostly cancels), and
their range. Verdict: "yes" when the mean is at least :data:`TOLERANCE` (the overhead target's
2%); "no" otherwise, with "(rounds disagree)" when some rounds went the other way.
"""

from __future__ import annotations

import statistics

from benchmarks.peers.loaders import Case
from benchmarks.peers.report import paired, rate

TOLERANCE = 0.98

HEADERS = ["R", "comparison", "dataecho", "peer", "mean ratio", "per round", "not slower?"]


def verdict(ratios: list[float]) -> str:
    """ "yes" or "no" for paired ratios (see the module docstring)."""
    if not ratios:
        return "-"
    mean = statistics.fmean(ratios)
    if mean >= TOLERANCE:
        return "yes"
    return "no (rounds disagree)" if max(ratios) >= 1 else "no"


def rows(result: dict) -> list[list[str]]:
    """One row per R and comparison; pairs whose cases did not run are left out."""
    windows = result["input_bound"]
    out = []
    for ratio in result["settings"].ratios:
        e = max(1, round(ratio))
        here = {case: w for (r, case), w in windows.items() if r == ratio}
        peers = {c: w for c, w in here.items() if c.kind in ("monai", "adjacent")}
        fixed = {c: w for c, w in here.items() if c.kind == "dataecho" and c.echo != "auto"}
        pairs = [
            ("same work as MONAI", Case("dataecho", e, "batch"), Case("monai", e)),
            ("same work as adjacent", Case("dataecho", e, "before_augment"), Case("adjacent", e)),
        ]
        if peers and fixed:
            pairs.append(("fastest vs fastest", max(fixed, key=lambda c: rate(fixed[c])),
                          max(peers, key=lambda c: rate(peers[c]))))  # fmt: skip
        for what, ours, theirs in pairs:
            if ours not in here or theirs not in here:
                continue
            ratios = paired(here[ours], here[theirs])
            span = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
            mean = f"{statistics.fmean(ratios):.3f}" if ratios else "-"
            out.append([f"{ratio:g}", what, ours.name, theirs.name, mean, span, verdict(ratios)])
    return out
