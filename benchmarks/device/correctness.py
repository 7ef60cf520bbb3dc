"""Section 1: the device path's batches and counts, checked against references.

Each check is one row (name, passed, detail):

- *order and content*: ``where="device"`` at a fixed integer factor e with a deterministic
  device transform (:class:`~benchmarks.device.workload.Scale`) yields each batch of the
  no-echo loader (same seed) e times in a row, transformed, and counts fresh = the dataset,
  out = e x fresh.
- *device vs CPU* (only when the device is not the CPU): the same loader on the device and on
  ``echo_device="cpu"``: equal batches (float tolerance) and equal counts. With the deterministic
  transform: a random op draws from a generator on each device, and CUDA's (Philox) and the
  CPU's (Mersenne Twister) give different numbers for one seed.
- *fresh copies*: with the shift-and-flip op, the e copies of one fresh batch are all on the
  device, pairwise different, and share no memory.
- *reproducible*: two runs with the same seed give identical augmented batches.
- *exact resume*: ``state_dict()`` taken mid-group (between copies of one fresh batch), loaded
  into a new loader, gives the rest of the run bit for bit.
- *ranks' draws*: the same loader as rank 0 and as rank 1 of two (``RANK``/``WORLD_SIZE``):
  the device transform's draws differ, so the ranks' augmentations are not the same.
- *no host sync* (CUDA): iterating the device path, mixing pool included, with torch's sync
  debug mode set to error: no operation per batch makes the host wait for the GPU.
- *checkpoint memory* (CUDA): ``state_dict()`` of a loader whose pool is full adds less than
  half the pool's size to the device's peak memory (the pool goes to host memory without a
  device clone, which would add all of it).
- *pinned copies* (CUDA): host-side batch echo (``where="batch"``, ``pin_memory=True``) hands
  on every copy in pinned memory, so the loop's ``non_blocking`` copy to the GPU is
  asynchronous.
- *state per step* (measured, any device): the time of ``state_dict()`` with the device's pool
  full, against the time of one batch of that loader: what ``--checkpoint-on-exit``, which
  takes the state before each wait for a batch, adds per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from benchmarks.common import environment
from benchmarks.device.workload import LoaderSpec, PacedShapes, Scale, build_loader
from dataecho import EchoingDataLoader
from dataecho._structure import tensors

Check = tuple[str, bool, str]


@dataclass(frozen=True)
class Setup:
    """The small workload of the checks: ``fresh_batches`` batches of ``shape`` images."""

    spec: LoaderSpec
    shape: tuple[int, ...]
    e: int = 3
    fresh_batches: int = 5

    def data(self) -> PacedShapes:
        return PacedShapes(self.fresh_batches * self.spec.batch_size, self.shape, 0.0, 0.0)


def _host(batch: Any) -> list[torch.Tensor]:
    return [t.detach().to("cpu", copy=True) for t in batch]


def _collect(loader: EchoingDataLoader, keep: Callable[[list[Any]], None] | None = None):
    """Every batch of one epoch, copied to the host; ``keep`` sees each group of live copies."""
    out = []
    for batch in loader:
        out.append(_host(batch))
        if keep is not None:
            keep(batch)
    return out


def _counts(loader: EchoingDataLoader) -> tuple[int, int, int]:
    s = loader.stats
    return s.fresh_items, s.items_out, s.batches


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]], exact: bool) -> str:
    """'' when the two runs agree, else where they first differ."""
    if len(a) != len(b):
        return f"{len(a)} batches against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for part, (u, v) in enumerate(zip(x, y, strict=True)):
            ok = (
                torch.equal(u, v)
                if exact or not u.is_floating_point()
                else torch.allclose(u, v, rtol=1e-6, atol=1e-6)
            )
            if not ok:
                return f"batch {i}, part {part} differs"
    return ""


def order_and_content(st: Setup) -> list[Check]:
    """The order and content, counts and (off the CPU) device vs CPU rows."""
    data, scale = st.data(), Scale()
    plain = _collect(
        build_loader(replace(st.spec, device=torch.device("cpu")), data, "host", 1, None)
    )
    expected = [_host(scale([b[0].clone(), b[1]])) for b in plain for _ in range(st.e)]
    loader = build_loader(st.spec, data, "device", st.e, scale)
    got = _collect(loader)
    n = len(data)
    counts = _counts(loader)
    want = (n, st.e * n, st.e * len(plain))
    diff = _same(got, expected, exact=False)
    rows = [
        ("order and content", not diff, diff or f"{len(got)} batches = {st.e} x {len(plain)}"),
        (
            "counts",
            counts == want,
            f"fresh, out, batches = {counts}; expected {want}; "
            f"realized factor {loader.stats.realized_factor:g}",
        ),
    ]
    if st.spec.device.type != "cpu":
        on_cpu = build_loader(
            replace(st.spec, device=torch.device("cpu")), data, "device", st.e, scale
        )
        ref = _collect(on_cpu)
        diff = _same(got, ref, exact=False)
        rows.append(
            (
                f"{st.spec.device.type} vs cpu",
                not diff and counts == _counts(on_cpu),
                diff or f"{len(got)} batches equal (tolerance 1e-6); counts {counts}",
            )
        )
    return rows


def fresh_copies(st: Setup, aug: Any) -> list[Check]:
    """The fresh copies row: checked on each group of e live copies, as they come."""
    group: list[Any] = []
    problems: list[str] = []

    def keep(batch: list[Any]) -> None:
        group.append(batch)
        if len(group) < st.e:
            return
        images = [b[0] for b in group]
        if any(x.device.type != st.spec.device.type for x in images):
            problems.append(f"a copy on {images[0].device}")
        if len({x.untyped_storage().data_ptr() for x in images}) < len(images):
            problems.append("copies share memory")
        if any(torch.equal(images[i], images[j]) for i in range(st.e) for j in range(i)):
            problems.append("two copies of one fresh batch are identical")
        group.clear()

    loader = build_loader(st.spec, st.data(), "device", st.e, aug)
    got = _collect(loader, keep)
    detail = "; ".join(sorted(set(problems))) or f"{len(got) // st.e} groups of {st.e} copies"
    return [("fresh copies", not problems, detail)]


def reproducible_and_resumed(st: Setup, aug: Any) -> list[Check]:
    """The reproducible and exact resume rows, with the augmentation ``aug`` on the device."""
    data = st.data()
    first = _collect(build_loader(st.spec, data, "device", st.e, aug))
    second = _collect(build_loader(st.spec, data, "device", st.e, aug))
    rows = [
        (
            "reproducible",
            not _same(first, second, exact=True),
            _same(first, second, exact=True) or f"{len(first)} batches identical",
        )
    ]
    stop = st.e + 1  # inside the second fresh batch's group of copies
    loader = build_loader(st.spec, data, "device", st.e, aug)
    it: Iterator[Any] = iter(loader)
    head = [_host(next(it)) for _ in range(stop)]
    state = loader.state_dict()
    loader.close()
    resumed = build_loader(st.spec, data, "device", st.e, aug)
    resumed.load_state_dict(state)
    tail = _collect(resumed)
    diff = _same(head + tail, first, exact=True)
    rows.append(("exact resume", not diff, diff or f"resumed after batch {stop}: identical"))
    return rows


def draws(batch: Any, generator: torch.Generator | None = None) -> list[Any]:
    """A device transform that shows its draws: each image's first value replaced by one."""
    images = batch[0].float().clone()
    flat = images.view(len(images), -1)
    flat[:, 0] = torch.rand(len(images), generator=generator, device=images.device)
    return [images, *batch[1:]]


def ranks_draws(st: Setup) -> list[Check]:
    """The ranks' draws row: rank 0's and rank 1's first batches draw different numbers."""
    firsts = []
    for rank in (0, 1):
        with environment({"RANK": str(rank), "WORLD_SIZE": "2"}):
            loader = build_loader(st.spec, st.data(), "device", st.e, draws)
            images = next(iter(loader))[0]
            firsts.append(images.reshape(len(images), -1)[:, 0].to("cpu"))
            loader.close()
    same = torch.equal(firsts[0], firsts[1])
    return [
        (
            "ranks' draws",
            not same,
            "rank 0 and rank 1 drew " + ("the same" if same else "different numbers"),
        )
    ]


def no_host_sync(st: Setup, aug: Any) -> list[Check]:
    """The no host sync row (CUDA): the device path's batches, after the first, under torch's
    sync debug mode "error"."""
    if st.spec.device.type != "cuda":
        return []
    loader = build_loader(st.spec, st.data(), "device_mixed", st.e, aug)
    it = iter(loader)
    next(it)  # the first batch sets up the pool and its layout
    torch.cuda.set_sync_debug_mode("error")
    try:
        rest = sum(1 for _ in it)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [("no host sync", True, f"{rest} batches without a host sync")]


def checkpoint_memory(st: Setup, aug: Any) -> list[Check]:
    """The checkpoint memory row (CUDA): the device's peak memory while ``state_dict()`` runs,
    over what it held before, against the pool's size."""
    if st.spec.device.type != "cuda":
        return []
    loader = build_loader(st.spec, st.data(), "device_mixed", st.e, aug)
    it = iter(loader)
    for _ in range(st.e * 2):
        next(it)
    torch.cuda.synchronize(st.spec.device)
    before = torch.cuda.memory_allocated(st.spec.device)
    torch.cuda.reset_peak_memory_stats(st.spec.device)
    state = loader.state_dict()
    extra = torch.cuda.max_memory_allocated(st.spec.device) - before
    pool = sum(t.numel() * t.element_size() for t in tensors(state) if t.dim() > 1)
    loader.close()
    # A clone of the pool on the device would add all of it; its gathers, a batch or two.
    return [("checkpoint memory", extra < pool / 2,
             f"state_dict() added {extra / 2**20:.1f} MiB to the device's peak; the pool is "
             f"{pool / 2**20:.1f} MiB")]  # fmt: skip


def pinned_copies(st: Setup, aug: Any) -> list[Check]:
    """The pinned copies row (CUDA): every tensor of every batch of host-side batch echo."""
    if st.spec.device.type != "cuda":
        return []
    batches = _collect(build_loader(st.spec, st.data(), "host", st.e, aug))
    unpinned = sum(not t.is_pinned() for batch in batches for t in tensors(batch))
    return [("pinned copies", unpinned == 0,
             f"{unpinned} of {sum(len(b) for b in batches)} tensors not pinned")]  # fmt: skip


def state_per_step(st: Setup, aug: Any, rounds: int = 10) -> list[Check]:
    """The state per step row: ms of ``state_dict()`` with the pool full, and of a batch
    (the fastest of ``rounds`` each: the upstream is not paced)."""
    loader = build_loader(st.spec, st.data(), "device_mixed", st.e, aug)
    it = iter(loader)
    batch_s, state_s = [], []
    sync = torch.cuda.synchronize if st.spec.device.type == "cuda" else lambda: None
    try:
        for _ in range(2 * st.e):  # the pool fills
            next(it)
        for _ in range(rounds):
            sync()
            start = time.perf_counter()
            loader.state_dict()
            state_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            sync()
            batch_s.append(time.perf_counter() - start)
    finally:
        loader.close()
    state_ms, batch_ms = 1e3 * min(state_s), 1e3 * min(batch_s)
    return [("state per step", True,
             f"measured: state_dict() {state_ms:.2f} ms, a batch {batch_ms:.2f} ms "
             f"({state_ms / batch_ms:.1f}x a batch)")]  # fmt: skip


def run(st: Setup, aug: Any, sized: Setup | None = None) -> list[Check]:
    """Every check, in order; a check that raises is a failed row naming the error.
    ``sized``: the throughput section's images and batch, for the state per step (default:
    ``st``)."""
    checks: list[tuple[str, Callable[[], list[Check]]]] = [
        ("order and content", lambda: order_and_content(st)),
        ("fresh copies", lambda: fresh_copies(st, aug)),
        ("reproducible", lambda: reproducible_and_resumed(st, aug)),
        ("ranks' draws", lambda: ranks_draws(st)),
        ("no host sync", lambda: no_host_sync(st, aug)),
        ("checkpoint memory", lambda: checkpoint_memory(st, aug)),
        ("pinned copies", lambda: pinned_copies(st, aug)),
        ("state per step", lambda: state_per_step(sized or st, aug)),
    ]
    rows: list[Check] = []
    for name, check in checks:
        try:
            rows += check()
        except Exception as exc:  # a broken path is a finding of this section, not a crash
            rows.append((name, False, f"{type(exc).__name__}: {exc}"))
    return rows
