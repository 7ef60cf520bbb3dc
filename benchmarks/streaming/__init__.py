"""The streaming libraries, input-bound over a capped link: their own loader vs dataecho's.

    python -m benchmarks streaming                # ~4 minutes; writes bench-results/streaming/
    python -m benchmarks streaming --libraries webdataset,hf --seconds 0.5 --examples 512
    python -m benchmarks streaming --reuse-buffer 1    # or --read-ahead 0: dataecho's knobs
    python -m benchmarks streaming --step cpu          # the step on the loader's cores

For each library (mosaic streaming, litdata, webdataset, Hugging Face streams), the same real
Fashion-MNIST examples in its own format (:mod:`~benchmarks.streaming.data`) are served on
127.0.0.1 through a real nginx with a bandwidth cap (:mod:`~benchmarks.streaming.servers`):
nginx serves webdataset's tars and the JSON Lines files itself, and stands as a reverse proxy in
front of moto's S3 server for mosaic's shards and litdata's chunks. The cap is set so that the
library's own loader gets a batch every R x t_down, t_down being the time of
:class:`benchmarks.common.SyntheticStep` alone: first from the bytes per batch, then from what
the own loader lives in a window or three (:func:`calibrate`). The step trained on takes t_down
with the CPU free, as an accelerator's does (``--step device``,
:class:`~benchmarks.streaming.measure.DeviceStep`), or runs SyntheticStep itself on the cores
the loader, nginx and the S3 server share (``--step cpu``).

Three loaders per library, each over a fresh dataset (an empty cache), interleaved round by
round (:mod:`~benchmarks.streaming.libraries`, :mod:`~benchmarks.streaming.measure`): the
library's own loader without echo, and dataecho's ``EchoingDataLoader`` at ``echo_factor=4``
and at ``"auto"``. Reported: steps/s over the own loader's against min(e, R), R being the
own loader's measured time per batch over t_down; the fresh examples/s kept; and for dataecho
at e = 4, what one resume from ``state_dict()`` half-way through an epoch makes the server
send again, against what the rest of the epoch needs. Results:
``benchmarks/streaming/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from benchmarks import common
from benchmarks.streaming import data
from benchmarks.streaming.libraries import (
    NAMES,
    Library,
    s3_environment,
)
from benchmarks.streaming.measure import (
    CASES,
    Case,
    DeviceStep,
    Resume,
    Window,
    resume_bytes,
    train_window,
)
from benchmarks.streaming.servers import S3Server

HEADERS = [
    "library", "R", "own loader, steps/s", "e=4: steps/s x own", "e=4: of min(e, R)",
    "e=4: of its ceiling", "e=4: fresh kept", "auto: steps/s x own", "auto: fresh kept",
    "auto: realized e", "resume: sent / needed", "resume: excess (shards/worker)",
    "resume: shards read again/worker",
]  # fmt: skip
DETAIL_HEADERS = ["library", "loader", "steps/s (rounds)", "fresh ex/s (rounds)", "wait %",
                  "step ms", "realized e", "short windows"]  # fmt: skip
# litdata downloads up to 8 chunks at once by default, and nginx caps each request: one
# download at a time per worker, as the other libraries read, keeps the cap the link's.
LITDATA_ENV = {"LITDATA_ASYNC_CHUNK_PREFETCH": "0"}


@dataclass(frozen=True)
class Settings:
    libraries: tuple[str, ...] = NAMES
    examples: int = 20_000
    per_shard: int = 1000
    batch_size: int = 128
    workers: int = 1
    ratio: float = 5.0
    where: str = "batch"
    seconds: float = 4.0
    warmup: float = 1.0
    rounds: int = 3
    seed: int = 0
    read_ahead: int | None = None  # dataecho's default where None
    reuse_buffer: int | None = None
    step: str = "device"

    def options(self, factor: float | str) -> dict[str, int]:
        """The EchoingDataLoader keywords given for ``factor`` (its defaults otherwise)."""
        given = {"read_ahead": self.read_ahead}
        if factor == "auto":
            given["reuse_buffer"] = self.reuse_buffer
        return {k: v for k, v in given.items() if v is not None}


def parse(argv: list[str]) -> tuple[Settings, Path]:
    d = Settings()
    # fmt: off
    p = argparse.ArgumentParser(prog="python -m benchmarks streaming", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--libraries", default=",".join(d.libraries),
        help=f"comma-separated, of {', '.join(NAMES)} (all)")
    add("--examples", type=int, default=d.examples,
        help=f"Fashion-MNIST training images written for each library ({d.examples})")
    add("--per-shard", type=int, default=d.per_shard,
        help=f"examples per shard, chunk or file ({d.per_shard})")
    add("--batch-size", type=int, default=d.batch_size, help=f"({d.batch_size})")
    add("--workers", type=int, default=d.workers, help=f"loader workers ({d.workers})")
    add("--ratio", type=float, default=d.ratio,
        help=f"the R the cap is set for: one batch in R x t_down ({d.ratio:g})")
    add("--where", default=d.where, choices=("batch", "after_augment", "before_augment", "device"),
        help=f"dataecho's insertion point ({d.where})")
    add("--seconds", type=float, default=d.seconds,
        help=f"measured seconds per case and round ({d.seconds:g})")
    add("--warmup", type=float, default=None,
        help=f"seconds before each window ({d.warmup:g}, at most --seconds)")
    add("--rounds", type=int, default=d.rounds, help=f"interleaved rounds ({d.rounds})")
    add("--read-ahead", type=int, default=None,
        help="dataecho's read_ahead, examples per worker (default: dataecho's)")
    add("--reuse-buffer", type=int, default=None,
        help="dataecho's reuse_buffer for auto, in items (default: dataecho's)")
    add("--step", default=d.step, choices=("device", "cpu"),
        help="the training step: 'device' takes t_down with the CPU free, as a GPU step does; "
             "'cpu' runs SyntheticStep on the cores the loader and servers share "
             f"({d.step})")
    add("--out", type=Path, default=common.results_dir("streaming"))
    # fmt: on
    a = p.parse_args(argv)
    libraries = tuple(x for x in a.libraries.split(",") if x)
    if not libraries or any(x not in NAMES for x in libraries):
        p.error(f"--libraries: a comma-separated list of {', '.join(NAMES)}, got {a.libraries!r}")
    if min(a.examples, a.per_shard, a.batch_size, a.workers, a.rounds) < 1:
        p.error("--examples, --per-shard, --batch-size, --workers and --rounds must be >= 1")
    if not (a.ratio > 0 and a.seconds > 0):
        p.error("--ratio and --seconds must be > 0")
    warmup = min(d.warmup, a.seconds) if a.warmup is None else a.warmup
    s = Settings(libraries, a.examples, a.per_shard, a.batch_size, a.workers, a.ratio, a.where,
                 a.seconds, warmup, a.rounds, d.seed, a.read_ahead, a.reuse_buffer,
                 a.step)  # fmt: skip
    return s, a.out


def cap_for(shards: data.Shards, s: Settings, t_down: float) -> int:
    """Bytes/s for the whole link such that one batch's bytes take R x t_down."""
    return max(1, round(shards.bytes_per_example * s.batch_size / (s.ratio * t_down)))


def serve(stack: ExitStack, s: Settings, root: Path, t_down: float) -> dict[str, Library]:
    """Every library's data written, uploaded where it goes to S3, and served capped."""
    s3 = None
    if {"mosaic", "litdata"} & set(s.libraries):
        s3 = stack.enter_context(S3Server(root))
    libs = {}
    for name in s.libraries:
        shards = data.write(name, root / "data" / name, s.examples, s.per_shard)
        remote = s3.upload(shards.folder, name) if s3 and name in ("mosaic", "litdata") else None
        lib = Library(name, shards, s3=s3.url if remote else None, remote=remote,
                      caches=root / name / "caches", batch_size=s.batch_size,
                      workers=s.workers)  # fmt: skip
        stack.callback(lib.stop)
        lib.serve(cap_for(shards, s, t_down))
        libs[name] = lib
    return libs


def calibrate(lib: Library, s: Settings, step: common.SyntheticStep | DeviceStep, t_down: float, log,
              tries: int = 3, within: float = 0.05) -> None:  # fmt: skip
    """Set ``lib``'s cap so that its own loader lives R = ``s.ratio`` (within ``within``):
    each library reaches its own share of the link (its requests, its pauses between shards,
    its worker's own CPU per example), so the cap from the bytes alone is only a start. Its
    own loader runs a window at the cap; the next cap scales it by the R lived over the R asked,
    or, from the third window on, assumes a time per batch of a + b / cap (a: what the cap
    does not pace) fitted to the last two windows where they lie apart; at most ``tries``
    windows, and a cap at most twice or half the last."""
    target = s.ratio * t_down
    seen: list[tuple[int, float]] = []  # (cap, seconds per batch)
    for _ in range(tries):
        w = train_window(lib.own_loader(), step, warmup=s.warmup, seconds=s.seconds)
        lib.clear_caches()
        t_up = _over(1, w.steps_per_s)
        log(f"{lib.name}: own loader at {lib.cap / 1e6:.3g} MB/s lived R = {t_up / t_down:.2f}")
        if not math.isfinite(t_up) or abs(t_up / target - 1) <= within:
            break
        seen.append((lib.cap, t_up))
        cap = lib.cap * t_up / target
        if len(seen) >= 2:
            (c1, t1), (c2, t2) = seen[-2:]
            # Two windows far enough apart to fit a line through (noise is a few %).
            if abs(c1 / c2 - 1) >= 0.1 and abs(t1 / t2 - 1) >= 0.05:
                b = (t1 - t2) / (1 / c1 - 1 / c2)
                a = t1 - b / c1
                if b > 0 and target > a:
                    cap = b / (target - a)
        lib.serve(round(min(max(cap, lib.cap / 2), lib.cap * 2)))
    log(f"{lib.name}: {len(lib.shards.names)} files, {lib.shards.bytes_per_example:,.0f} "
        f"bytes/example, {lib.server.describe()}")  # fmt: skip


def run(
    s: Settings, log=print
) -> tuple[dict[tuple[str, Case], Window], dict[str, Resume], float, dict[str, int]]:
    """Windows per (library, case), one resume per library, t_down, and the caps (bytes/s)."""
    threads = common.pin_threads(1)
    cpu_step = common.SyntheticStep(seed=s.seed)
    # The least of three medians: a busy moment of the machine inflates one, not all three.
    t_down = min(cpu_step.measure(s.batch_size) for _ in range(3))
    step = cpu_step if s.step == "cpu" else DeviceStep(t_down)
    log(f"{threads}; t_down = {t_down * 1e3:.2f} ms per batch of {s.batch_size} "
        f"({s.step} step)")  # fmt: skip
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dataecho-stream-")))
        libs = serve(stack, s, root, t_down)
        mosaic = libs["mosaic"].server.url if "mosaic" in libs else None  # its port stays
        stack.enter_context(common.environment({**s3_environment(mosaic), **LITDATA_ENV}))
        stack.enter_context(warnings.catch_warnings())
        # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on.
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        # mosaic hands its ndarray fields over read-only: torch's collate says so per worker.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for lib in libs.values():
            calibrate(lib, s, step, t_down, log)

        def one(key: tuple[str, Case]) -> Window:
            lib, case = libs[key[0]], key[1]
            if case.own:
                loader = lib.own_loader()
            else:
                factor = cast(float | str, case.factor)
                loader = lib.echoing_loader(factor, s.where, **s.options(factor))
            try:
                return train_window(loader, step, warmup=s.warmup, seconds=s.seconds)
            finally:
                lib.clear_caches()

        keys = [(name, case) for name in s.libraries for case in CASES]
        raw = common.interleaved(keys, s.rounds, one, log, lambda k: f"{k[0]}: {k[1].name}")
        windows = {k: sum(ws[1:], ws[0]) for k, ws in raw.items()}
        resumes = {}
        for name, lib in libs.items():
            log(f"{name}: one resume of dataecho e=4 half-way through an epoch")
            resumes[name] = resume_bytes(lib, 4, s.where, s.options(4))
            lib.clear_caches()
        caps = {name: lib.cap for name, lib in libs.items()}
    return windows, resumes, t_down, caps


def _over(a: float, b: float) -> float:
    """a / b, NaN where b is 0 or NaN (a window without steps)."""
    return a / b if b and math.isfinite(b) else math.nan


def _f(x: float, spec: str = ".2f") -> str:
    return "nan" if not math.isfinite(x) else format(x, spec)


def _spread(values: list[float], spec: str = ".2f") -> str:
    if len(values) < 2:
        return _f(values[0], spec) if values else "nan"
    return f"{_f(min(values), spec)}-{_f(max(values), spec)}"


def rows(s: Settings, windows: dict, resumes: dict[str, Resume], t_down: float) -> list[list[str]]:
    """The headline: one row per library. R: the own loader's time per batch (t_up) over
    t_down, the step's time alone; the ceiling of e = 4: min(e, t_up over the step's own time
    in the e = 4 run), which the other processes on the machine (the loader worker, nginx)
    slow down."""
    out = []
    for name in s.libraries:
        own, e4, auto = (windows[(name, c)] for c in CASES)
        t_up = _over(1, own.steps_per_s)
        bound, ceiling = min(4.0, _over(t_up, t_down)), min(4.0, _over(t_up, e4.step_seconds))
        x4, xa = _over(e4.steps_per_s, own.steps_per_s), _over(auto.steps_per_s, own.steps_per_s)
        res = resumes[name]
        out.append([
            name, _f(_over(t_up, t_down)), _f(own.steps_per_s, ".1f"), _f(x4),
            _f(_over(x4, bound)), _f(_over(x4, ceiling)),
            _f(_over(e4.fresh_per_s, own.fresh_per_s)), _f(xa),
            _f(_over(auto.fresh_per_s, own.fresh_per_s)),
            _f(auto.realized_factor), f"{res.sent / 1e6:.2f} / {res.needed / 1e6:.2f} MB",
            f"{res.excess / 1e3:,.0f} KB ({_f(res.excess_shards_per_worker)})",
            _f(res.read_again_per_worker, ".1f") + ("" if res.complete else " (incomplete!)"),
        ])  # fmt: skip
    return out


def detail_rows(s: Settings, windows: dict) -> list[list[str]]:
    out = []
    for (name, case), w in windows.items():
        out.append([name, case.name, f"{_f(w.steps_per_s)} ({_spread([r[0] for r in w.rounds])})",
                    f"{_f(w.fresh_per_s, ',.0f')} ({_spread([r[1] for r in w.rounds], ',.0f')})",
                    _f(100 * w.wait / w.wall if w.wall else math.nan, ".1f"),
                    _f(1e3 * w.step_seconds), _f(w.realized_factor), str(w.short)])  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    s, out = parse(argv)
    load = common.load_average()
    windows, resumes, t_down, caps_used = run(
        s, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    m = common.machine_summary()
    command = " ".join(["python -m benchmarks streaming", *argv])
    given = "".join(f", {k}={v}" for k, v in {**s.options(4), **s.options("auto")}.items())
    caps = ", ".join(f"{name} {cap / 1e6:.3g} MB/s" for name, cap in caps_used.items())
    text = (
        f"# Streaming libraries, own loader vs dataecho\n\n"
        f"Command: `{command}`.\n"
        f"Machine: {m['cpu']}; torch {m['torch']}. Load before: {load}; after: "
        f"{common.load_average()}. t_down = {t_down * 1e3:.2f} ms per batch of "
        f"{s.batch_size}, a {s.step} step; caps for R = {s.ratio:g}: {caps}; {s.workers} loader worker(s); "
        f"dataecho where={s.where}{given}; {s.examples} examples, {s.per_shard} per shard; "
        f"{s.rounds} round(s) of {s.seconds:g} s per case after {s.warmup:g} s, "
        f"interleaved.\n\n"
        f"{common.markdown_table(HEADERS, rows(s, windows, resumes, t_down))}\n\n"
        f"Per case:\n\n"
        f"{common.markdown_table(DETAIL_HEADERS, detail_rows(s, windows), align='llrrrrrr')}\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "streaming.md").write_text(text)
    print(text)
    return 0
