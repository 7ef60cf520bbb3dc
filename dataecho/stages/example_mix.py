"""Mixing batches' examples: a shuffle buffer over examples whose items are whole batches.

Why: echoing whole batches (on the training device, after one host-to-device copy) repeats
each batch's examples together, and Choi et al. found that batch echoing saves fewer fresh
examples than example echoing, whose copies spread over many batches. This stage keeps a pool
of examples in slots on the batches' own device and forms each batch from random pool
examples: the copies of a fresh batch spread over the batches that follow, while each batch in
or out costs a few tensor operations on its own rows (a scatter, a draw, a gather).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch

from dataecho import _validate
from dataecho._structure import map_tensors
from dataecho.errors import DataechoValueError
from dataecho.stages.base import Stage
from dataecho.stages.batch_rows import RowLayout, tensor_leaves
from dataecho.stages.seeds import STAGE_MIX, derive_seed


class MixExamples(Stage[Any]):
    """Pool at least ``buffer_size`` examples of ``source``'s batches; emit batches of random
    pool examples, drawn without replacement, of the sizes the batches arrived in (so a loader
    yields as many batches as without mixing). At the source's end the pool drains.

    Every leaf of a batch must be a tensor with one row per example, in one dtype and row
    shape (:mod:`~dataecho.stages.batch_rows`). The pool lives on ``device`` (None: the first
    batch's); the draws come from a generator there, so nothing waits on the host. Emitted
    tensors are new (gathered). ``work_seconds``: time spent mixing (the source's waits
    excluded). State: copies of the pool, its free slots, the sizes still due and the
    generator's state.
    """

    STAGE_ID = STAGE_MIX

    def __init__(
        self,
        source: Iterable[Any],
        buffer_size: int,
        *,
        seed: int | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.buffer_size = _validate.buffer_size(
            buffer_size, low=0, hint="use 0 (or 1) for no mixing"
        )
        super().__init__(source, seed=_validate.seed(seed))
        self.device = None if device is None else torch.device(device)
        self.work_seconds = 0.0  # time spent mixing, waits for the source excluded
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._layout: RowLayout | None = None
        self._slots: Any = None  # the pool: the batch structure, each leaf's rows as words
        self._used = torch.zeros(0, dtype=torch.bool)  # per slot: holds a pooled example
        self._free = torch.zeros(0, dtype=torch.long)  # free slots, the oldest freed first
        self._sizes: deque[int] = deque()  # sizes of the batches still to emit, in order
        self._exhausted = False
        self._generator: torch.Generator | None = None
        self._saved_generator: torch.Tensor | None = None  # a resumed state, until it is used

    @property
    def _pooled(self) -> int:
        return len(self._used) - len(self._free)

    def next(self) -> Any:
        start, waited = time.perf_counter(), self.stats.wait_seconds
        try:
            return self._next()
        finally:
            self.work_seconds += time.perf_counter() - start - (self.stats.wait_seconds - waited)

    def _next(self) -> Any:
        sizes = self._sizes
        while not self._exhausted and (not sizes or self._pooled < self.buffer_size + sizes[0]):
            try:
                batch = self._pull()
            except StopIteration:
                self._exhausted = True
                break
            self.stats.fresh_items += 1
            self._add(batch)
        if not sizes:
            raise StopIteration
        size = sizes.popleft()
        self._follow_device()
        # A uniform random subset of the pooled examples: the largest of iid uniform keys.
        keys = torch.rand(len(self._used), generator=self._generator, device=self.device)
        picked = keys.masked_fill_(~self._used, -1.0).topk(size).indices
        out = map_tensors(self._slots, lambda t: t.index_select(0, picked))
        self._used.index_fill_(0, picked, False)
        self._free = torch.cat([self._free, picked])
        self.stats.items_out += 1
        assert self._layout is not None  # a size was queued, so _add has run and set it
        return self._layout.from_words(out)

    def _add(self, batch: Any) -> None:
        if self._layout is None:
            self.device = self.device or tensor_leaves(batch)[0].device
            self._layout = RowLayout(batch)
            empty = map_tensors(batch, lambda t: t.new_empty((0, *t.shape[1:])))
            self._slots = self._layout.to_words(empty)
        size = self._layout.size(batch)
        self._follow_device()
        if len(self._free) < size:  # room for this batch, and for the pool to reach its size
            more = max(size - len(self._free), self.buffer_size + size - len(self._used))
            self._grow(more)
        where, self._free = self._free[:size], self._free[size:]
        rows = iter(tensor_leaves(self._layout.to_words(batch)))
        map_tensors(self._slots, lambda t: t.index_copy_(0, where, next(rows).to(t.device)))
        self._used.index_fill_(0, where, True)
        self._sizes.append(size)

    def _grow(self, more: int) -> None:
        n = len(self._used)
        self._slots = map_tensors(
            self._slots, lambda t: torch.cat([t, t.new_empty((more, *t.shape[1:]))])
        )
        self._used = torch.cat([self._used, self._used.new_zeros(more)])
        self._free = torch.cat([self._free, torch.arange(n, n + more, device=self.device)])

    def _follow_device(self) -> None:
        """The pool (and the generator) on ``device``: a resumed pool comes from the host."""
        self.device = self.device or self._used.device
        if self._used.device != self.device:
            move = lambda t: t.to(self.device)  # noqa: E731
            self._slots = map_tensors(self._slots, move)
            self._used, self._free = move(self._used), move(self._free)
        if self._generator is None:
            self._generator = torch.Generator(device=self.device)
            self._generator.manual_seed(derive_seed(self.seed, self.STAGE_ID, self._epoch))
            if self._saved_generator is not None:
                self._generator.set_state(self._saved_generator)
                self._saved_generator = None

    def _get_stage_state(self) -> dict[str, Any]:
        pool = None if self._layout is None else self._layout.from_words(self._slots)
        return {
            "pool": None if pool is None else map_tensors(pool, lambda t: t.clone()),
            "used": self._used.clone(),
            "free": self._free.clone(),
            "sizes": list(self._sizes),
            "exhausted": self._exhausted,
            "generator": None if self._generator is None else self._generator.get_state(),
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        if "pool" not in state:
            raise DataechoValueError(
                "this state holds no example pool (keys: "
                f"{', '.join(sorted(state))}): it comes from another stage, such as the whole-"
                "batch shuffle that where='device' used before it mixed examples; resume it "
                "with the dataecho that wrote it, or start the run anew"
            )
        self._start_epoch()
        if state["pool"] is not None:
            self._layout = RowLayout(state["pool"])
            self._slots = self._layout.to_words(state["pool"])
        self._used, self._free = state["used"], state["free"]
        self._sizes = deque(int(s) for s in state["sizes"])
        self._exhausted = bool(state["exhausted"])
        self._saved_generator = state["generator"]


def mix_examples(
    source: Iterable[Any],
    buffer_size: int,
    *,
    seed: int | None = None,
    device: str | torch.device | None = None,
) -> MixExamples:
    """Mix the examples of ``source``'s batches through a pool of ``buffer_size`` examples on
    ``device`` (None: the first batch's); 0 or 1: each batch only shuffled within itself. See
    :class:`MixExamples`."""
    return MixExamples(source, buffer_size, seed=seed, device=device)
