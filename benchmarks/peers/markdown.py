"""The Markdown report of ``python -m benchmarks peers``: one part per section that ran."""

from __future__ import annotations

from pathlib import Path

from benchmarks import common
from benchmarks.peers import snapshots, target_report, verdict
from benchmarks.peers.report import (
    EXAMPLE_PAYLOAD,
    GROWTH_HEADERS,
    INPUT_HEADERS,
    MEMORY_HEADERS,
    OVERHEAD_HEADERS,
    QUALITY_HEADERS,
    RAW_HEADERS,
    TARGET_HEADERS,
    growth_rows,
    input_rows,
    memory_rows,
    overhead_rows,
    plot,
    quality_rows,
    raw_rows,
    target_rows,
)


def _head(result: dict, command: str) -> str:
    s, m = result["settings"], result["machine"]
    return f"""\
# dataecho vs peers

Command: `{command}`.
Machine: {m["cpu"]}; torch {m["torch"]}, Python {m["python"]}; {result["threads"]}.
Load average (1/5/15 min) before: {m["load_before"]}; after: {m["load_after"]}.
t_down = {result["t_down"] * 1e3:.2f} ms (SmallCNN + SGD step, batch {s.batch_size}, median of 30
steps alone). Upstream: Fashion-MNIST in memory behind `Throttled` (sleeping reads) at
R x t_down per batch, one loader worker, `Augment` per emitted example in the worker (MONAI and
dataecho batch echoing repeat augmented batches; "batch aug" augments each emitted batch in one
call). Cases interleaved, A B C ... A B C ...
Section times (s): {", ".join(f"{k} {v:.0f}" for k, v in result["seconds"].items())}.
{"".join(f"Section {k} FAILED: {v}{chr(10)}" for k, v in result.get("failed", {}).items())}"""


def _overhead(result: dict) -> str:
    s, table = result["settings"], common.markdown_table
    return f"""\
## 1. Overhead at e = 1 (unthrottled upstream; {s.overhead_rounds} round(s) of {s.duration:g} s)

{table(OVERHEAD_HEADERS, overhead_rows(result))}
"""


def _raw(result: dict) -> str:
    s, table, e = result["settings"], common.markdown_table, result["settings"].raw_factor
    return f"""\
Raw echo-stage throughput, in one process on items already in memory (e = {e};
example = uint8 1x28x28 + label, batch = {s.batch_size} of them):

{table([h.format(e=e) for h in RAW_HEADERS], raw_rows(result), align="lllrrr")}
"""


def _bound(result: dict) -> str:
    s, table = result["settings"], common.markdown_table
    return f"""\
## 2. Input-bound, e = R ({s.rounds} round(s) of {s.duration:g} s per case)

dataecho example-level shuffle buffer {s.example_shuffle} examples, batch-level {s.batch_shuffle}
batches; auto: `max_echo_factor={s.max_echo_factor:g}`. Rows "no snapshots" turn the workers'
state snapshots off (no checkpoints then): like for like with the peers, which cannot checkpoint.

{table(INPUT_HEADERS, input_rows(result), align="rl" + "r" * 8)}

Target (i), "never slower than the fastest peer at equal e", by paired rounds (see
`benchmarks/verdict.py`: like for like, then fastest against fastest; "yes" = mean
ratio >= {verdict.TOLERANCE}):

{table(verdict.HEADERS, verdict.rows(result), align="rlllrll")}

Every dataecho loader against the fastest peer at equal e (ratios of steps/s):

{table(TARGET_HEADERS, target_rows(result), align="rlllll")}

Columns: *fresh ex/s* = distinct examples first received by the step / wall time; *fresh /
upstream* = that over the throttle's rate (B / (R t_down)); *realized e* = examples stepped on
/ fresh; *stall %* = time in `next(loader)` / wall; *efficiency* = steps/s / (min(e, R) x
no-echo steps/s at the same R), e = max_echo_factor for auto; *step ms* = the step's wall time
in this case (slower than t_down when the loader competes for the cores); *spread %* = (max -
min) / mean of the per-round steps/s.
"""


def _quality(result: dict) -> str:
    s, table = result["settings"], common.markdown_table
    return f"""\
## 3. Quality per fresh example, e = {s.quality_factor}

{s.quality_budget:,} fresh training examples (a random subset per seed, one pass through each
loader), SGD lr 0.01 momentum 0.9 for every loader (not tuned per loader), test accuracy on
the 10,000 test images; seeds {", ".join(map(str, s.quality_seeds))}.

{table(QUALITY_HEADERS, quality_rows(result), align="lrrrl")}
"""


def _memory(result: dict) -> str:
    table, e = common.markdown_table, result["settings"].memory_factor
    return f"""\
## 4. Memory

Peak resident set per case, each in a process forked from the benchmark (torch, dataecho and
MONAI imported, Fashion-MNIST loaded); *main start* = what the fork left resident,
*main growth* = its peak over that; *worker peak* = the loader worker's peak (it shares pages
with the process it was forked from, which count too). The loader is iterated without training,
dataecho cases with snapshots past the first one.

{table([h.format(e=e) for h in MEMORY_HEADERS], memory_rows(result))}

dataecho `before_augment`, e = {e}, by post-echo shuffle buffer (it lives in the worker), with
the worker's state snapshots for checkpoints at the default interval and off; payload =
{EXAMPLE_PAYLOAD} bytes per example (uint8 image, label, index):

{table(GROWTH_HEADERS, growth_rows(result))}
"""


def _snapshots(result: dict) -> str:
    s, table = result["settings"], common.markdown_table
    return f"""\
## 5. What the worker state snapshots cost

e = {s.snapshot_factor}, unthrottled upstream, the loader iterated without training; per
emitted batch over {s.snapshot_batches} batches after {s.snapshot_warmup}, median of
{s.snapshot_rounds} interleaved round(s). CPU: the worker's from /proc, the training thread's
from `time.thread_time()`. "snapshots every {max(1, s.example_shuffle // s.batch_size)}" is the
interval dataecho used before `snapshot_interval` (`dataecho/loader/inner.py`) (shuffle_buffer // batch_size).
"auto" snapshots every batch by default: its reuse decisions depend on timing, so a replay
from an older snapshot would not repeat them.

{table(snapshots.HEADERS, snapshots.rows(result))}
"""


def _target(result: dict) -> str:
    s, table, tr = result["settings"], common.markdown_table, target_report
    return f"""\
## 6. Wall time to {s.target_accuracy:.2f} test accuracy ({s.target_rounds} round(s))

Same upstream and step as section 2, SGD lr {s.target_lr:g} momentum 0.9 from a fresh model
(round r: seed {s.seed} + r for the model, the read order and the augmentation);
evaluated every {s.target_eval_every:,} fresh examples on a fixed subset of
{s.target_eval_examples:,} test images, in the training loop (evaluation time counted); stopped
unreached after {s.target_max_seconds:g} s. dataecho fixed e and auto use the same pipelines:
`batch` with a {s.batch_shuffle}-batch shuffle, `before_augment` with a {s.example_shuffle}-example
shuffle and batch augmentation; auto with `max_echo_factor={s.max_echo_factor:g}` (R not given).
"*" = that round did not reach the target.

{table(tr.HEADERS, tr.rows(result), align="rllrlrrrrrr")}

auto against the best fixed e (lowest mean wall time to target):

{table(tr.VERDICT_HEADERS, tr.verdict_rows(result), align="rllllllll")}

dataecho against MONAI at equal e, in wall time to target:

{table(tr.PEER_HEADERS, tr.peer_rows(result), align="rrrrrrl")}
"""


SECTIONS = {"overhead": _overhead, "raw": _raw, "input_bound": _bound, "quality": _quality,
            "memory": _memory, "snapshots": _snapshots, "target": _target}  # fmt: skip


def markdown(result: dict, command: str) -> str:
    parts = [_head(result, command)]
    parts += [render(result) for name, render in SECTIONS.items() if name in result]
    if "input_bound" in result or "target" in result:
        parts.append("![throughput against R; wall time to target](peers.png)\n")
    return "\n".join(parts)


def write(result: dict, command: str, out: Path) -> Path:
    """Write ``peers.md`` and ``peers.png`` (when section 2 or 6 ran) into ``out``; the
    report's path."""
    out.mkdir(parents=True, exist_ok=True)
    if "input_bound" in result or "target" in result:
        plot(result, out / "peers.png")
    path = out / "peers.md"
    path.write_text(markdown(result, command))
    return path
