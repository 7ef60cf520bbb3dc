"""What one case measures: a timed window of training steps, and one resume's bytes.

:func:`train_window` trains :class:`benchmarks.common.SyntheticStep` on a loader's batches
(every case starts a fresh loader over a fresh dataset, so nothing is cached) and, after a
warm-up, counts the steps, the examples delivered and the *fresh* ones (read from the server:
every example for the library's own loader, ``loader.stats.fresh_examples`` for dataecho's),
and the time spent waiting on ``next()``. The window ends after ``seconds``, or earlier where
the epoch does (``short``): the data is sized so that it does not.

:func:`resume_bytes` takes ``state_dict()`` from dataecho's loader half-way through an epoch,
resumes a fresh loader (a fresh dataset, an empty cache) from it, reads the rest of the epoch,
and sets what the server sent the resumed loader, file by file (nginx's access log), against
the files the rest of the epoch needs.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import SyntheticStep
from benchmarks.streaming.libraries import Library, split
from dataecho import EchoingDataLoader
from dataecho.app.sources.nginx import NginxServer, Request


@dataclass(frozen=True)
class Case:
    """The library's own loader (``factor`` None) or dataecho's at ``factor``."""

    name: str
    factor: float | str | None

    @property
    def own(self) -> bool:
        return self.factor is None


CASES = (Case("own loader", None), Case("dataecho e=4", 4), Case("dataecho auto", "auto"))


@dataclass
class Window:
    """Counts of one timed window (summed over rounds with ``+``; ``rounds``: per round
    steps/s and fresh examples/s, for the spread)."""

    steps: int = 0
    examples: int = 0  # delivered, echoed copies included
    fresh: int = 0
    wall: float = 0.0
    wait: float = 0.0
    step: float = 0.0  # seconds in the step itself
    short: int = 0  # windows the epoch's end cut short
    rounds: list[tuple[float, float]] = field(default_factory=list)

    def __add__(self, other: Window) -> Window:
        return Window(self.steps + other.steps, self.examples + other.examples,
                      self.fresh + other.fresh, self.wall + other.wall, self.wait + other.wait,
                      self.step + other.step, self.short + other.short,
                      self.rounds + other.rounds)  # fmt: skip

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall if self.wall else float("nan")

    @property
    def fresh_per_s(self) -> float:
        return self.fresh / self.wall if self.wall else float("nan")

    @property
    def step_seconds(self) -> float:
        """The mean time of one step in the window."""
        return self.step / self.steps if self.steps else float("nan")

    @property
    def realized_factor(self) -> float:
        return self.examples / self.fresh if self.fresh else float("nan")


def _fresh(loader: Any, delivered: int) -> int:
    """Fresh examples so far: dataecho's loader counts them; without echo, all delivered."""
    if isinstance(loader, EchoingDataLoader):
        return int(loader.stats.fresh_examples)
    return delivered


def close(loader: Any, it: Any) -> None:
    """Stop a loader's workers: dataecho's ``close()``; a DataLoader's with its iterator (a
    generator, litdata's, closed first, which lets go of the DataLoader's iterator)."""
    if inspect.isgenerator(it):
        it.close()
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    if isinstance(loader, EchoingDataLoader):
        loader.close()


class DeviceStep:
    """A step that stands in for an accelerator's: it takes ``seconds`` of wall time and leaves
    the host's CPU free meanwhile, as a GPU step does (the host waits on the device), so the
    loader's reads and decoding do not share cores with the step. Called like
    :class:`SyntheticStep`; returns the seconds it took."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, images: Any, labels: Any) -> float:
        start = time.perf_counter()
        time.sleep(self.seconds)
        return time.perf_counter() - start


def train_window(
    loader: Any, step: SyntheticStep | DeviceStep, *, warmup: float, seconds: float
) -> Window:
    """Steps on ``loader``'s batches: the window starts at the first step that ends
    ``warmup`` s after the first one did and ends ``seconds`` s later, or with the epoch
    (``short``); where even the warm-up outlasts the epoch, it is all but the first step."""
    it = iter(loader)
    steps = delivered = 0
    waited = busy = 0.0
    # Marks: (time, steps, delivered, fresh, waited, busy) after a step.
    first: tuple[float, int, int, int, float, float] | None = None
    start = last = first
    short = 0
    try:
        while True:
            before = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                short = 1
                break
            waited += time.perf_counter() - before
            images, labels, ids = split(batch)
            busy += step(images, labels)
            steps, delivered = steps + 1, delivered + len(ids)
            now = time.perf_counter()
            last = (now, steps, delivered, _fresh(loader, delivered), waited, busy)
            if first is None:
                first = last
            elif start is None and now - first[0] >= warmup:
                start = last
            elif start is not None and now - start[0] >= seconds:
                break
    finally:
        close(loader, it)
    base = start if start is not None and last is not None and last[1] > start[1] else first
    if base is None or last is None:  # the epoch was empty
        return Window(short=1, rounds=[(math.nan, math.nan)])
    (t0, s0, d0, f0, w0, b0), (t1, s1, d1, f1, w1, b1) = base, last
    w = Window(s1 - s0, d1 - d0, f1 - f0, t1 - t0, w1 - w0, b1 - b0, short)
    w.rounds = [(w.steps_per_s, w.fresh_per_s)]
    return w


# --- one resume ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Resume:
    """One resume of dataecho's loader half-way through an epoch, in bytes the server sent."""

    workers: int
    shard_bytes: float  # a shard's mean size
    sent: int  # shard bytes sent to the resumed loader, all requests
    needed: int  # the bytes of the shards holding examples the rest delivers first
    excess: int  # bytes sent for shards the rest does not need
    read_again: int  # shards sent to the resumed loader that hold examples delivered before
    complete: bool  # the rest and the part before together delivered every example

    @property
    def excess_shards_per_worker(self) -> float:
        return self.excess / self.shard_bytes / self.workers

    @property
    def read_again_per_worker(self) -> float:
        return self.read_again / self.workers


def quiet(server: NginxServer, settle: float = 0.3, timeout: float = 10.0) -> int:
    """Wait until nginx has logged nothing new for ``settle`` s (a request is logged once it
    ends, a stopped worker's last ones included); the number of requests logged."""
    seen, since = len(server.requests()), time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = len(server.requests())
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            break
    return seen


def _sent(requests: list[Request], names: set[str]) -> dict[str, int]:
    """Body bytes sent per shard file (200 and 206 answers; HEADs send none)."""
    out: dict[str, int] = {}
    for r in requests:
        name = r.uri.split("?", 1)[0].rsplit("/", 1)[-1]
        if name in names and r.status in (200, 206) and r.bytes > 0:
            out[name] = out.get(name, 0) + r.bytes
    return out


def resume_bytes(
    lib: Library,
    factor: float | str,
    where: str,
    options: dict[str, Any] | None = None,
    fraction: float = 0.5,
) -> Resume:
    """Bytes a resume of dataecho's loader at ``factor`` (``options``: its other keywords)
    makes the server send again."""
    shards = lib.shards
    names = set(shards.names)
    loader = lib.echoing_loader(factor, where, **(options or {}))
    it = iter(loader)
    head: set[int] = set()
    try:
        for batch in it:
            head.update(split(batch)[2])
            if loader.stats.fresh_examples >= fraction * shards.count:
                break
        state = loader.state_dict()
    finally:
        close(loader, it)
    resumed = lib.echoing_loader(
        factor, where, **(options or {})
    )  # building a dataset may read: not counted
    resumed.load_state_dict(state)
    mark = quiet(lib.server)
    rest: set[int] = set()
    it = iter(resumed)
    try:
        for batch in it:
            rest.update(split(batch)[2])
    finally:
        close(resumed, it)
    quiet(lib.server)
    sent = _sent(lib.server.requests()[mark:], names)
    needed = {shards.shard_of(i) for i in rest - head}
    of_head = {shards.shard_of(i) for i in head}
    return Resume(
        workers=lib.workers,
        shard_bytes=shards.shard_bytes / len(shards.names),
        sent=sum(sent.values()),
        needed=sum(shards.sizes[n] for n in needed),
        excess=sum(b for n, b in sent.items() if n not in needed),
        read_again=len(set(sent) & of_head),
        complete=(head | rest) == set(range(shards.count)),
    )
