"""Mixing batches' examples: a shuffle buffer over examples whose items are whole batches.

Why: echoing whole batches (on the training device, after one host-to-device copy) repeats
each batch's examples together, and Choi et al. found that batch echoing saves fewer fresh
examples than example echoing, whose copies spread over many batches. This stage keeps a pool
of examples in slots on the batches' own device and forms each batch from random pool
examples: the copies of a fresh batch spread over the batches that follow, while each batch in
or out costs a few tensor operations on its own rows (a scatter, a gather).

Its cost does not grow with the pool, so the pool can hold as many batches as memory allows:
which slots hold an example, which are free and which are drawn is kept on the host in numpy
(:func:`draw_distinct`, O(batch) per batch: no scan, sort or ``topk`` over the pool), and only
the drawn and the filled slot numbers go to the device, where they never make the host wait.

With ``numbered=True`` the source's items are ``(n, batch)``: ``n`` numbers the fresh batch a
copy came from (:class:`dataecho.loader.reading.Tagged` before the echo stage), and
:attr:`MixExamples.first_deliveries` counts the examples whose first copy has left the pool,
so a loader counts an example fresh when it is first trained on (host bookkeeping as well).
:meth:`MixExamples.drain` then ends a run at a budget of fresh examples with every copy of
the examples delivered so far trained on, and none of those not yet delivered. A loader with
``drop_last`` also passes ``fill_to`` (its batch size): a shorter numbered batch, the epoch's
last, is filled with its own rows again as it enters, each counted as the example it repeats.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from dataecho import _validate
from dataecho._structure import leaves, map_tensors
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.stages.base import Stage
from dataecho.stages.seeds import STAGE_MIX, derive_seed


def draw_distinct(rng: np.random.Generator, n: int, k: int, owner: np.ndarray) -> np.ndarray:
    """``k`` distinct numbers of ``range(n)``: a uniform random subset, in random order.

    O(k): ``k`` draws with replacement, each repeat drawn again (about ``k**2 / 2n`` of them).
    ``owner`` is scratch space of at least ``n`` entries, all -1, and left so: it tells the
    first of equal draws apart without a sort (``np.unique``) or a scan of ``range(n)``.
    """
    if 2 * k > n:  # few to draw from: a permutation costs no more
        return rng.permutation(n)[:k]
    drawn = np.empty(0, dtype=np.int64)
    while len(drawn) < k:
        both = np.concatenate([drawn, rng.integers(0, n, size=k - len(drawn))])
        order = np.arange(len(both))
        owner[both[::-1]] = order[::-1]  # one occurrence of each number owns it
        firsts = owner[both] == order
        owner[both] = -1
        drawn = both[firsts]  # the earlier draws are kept, as they are distinct
    return drawn


# Rows per batch number in an example's key (n * ROWS + row): more than a batch can hold.
ROWS = 1 << 24


class MixExamples(Stage[Any]):
    """Pool at least ``buffer_size`` examples of ``source``'s batches; emit batches of random
    pool examples, drawn without replacement, of the sizes the batches arrived in (so a loader
    yields as many batches as without mixing). At the source's end the pool drains.

    Every leaf of a batch must be a tensor with one row per example, in one dtype and row
    shape (:class:`RowLayout`). The pool lives on ``device`` (None: the first
    batch's); the draws are made on the host (module docstring). Emitted tensors are new
    (gathered). ``work_seconds``: time spent mixing (the source's waits excluded). State: a copy
    of the pool in host memory, its held and free slots, the sizes still due and the generator's
    state.
    """

    STAGE_ID = STAGE_MIX
    STATE_KEYS = ("pool", "held", "free", "sizes", "exhausted", "examples", "undelivered",
                  "newest", "first_deliveries", "draws")  # fmt: skip
    STATE_HOLDS = "example pool"

    def __init__(
        self,
        source: Iterable[Any],
        buffer_size: int,
        *,
        seed: int | None = None,
        device: str | torch.device | None = None,
        numbered: bool = False,
        fill_to: int = 0,
    ) -> None:
        self.numbered = bool(numbered)
        if fill_to and not self.numbered:
            raise DataechoValueError(
                f"fill_to={fill_to} without numbered=True: a filled batch's repeated rows count "
                "as their originals only in a numbered pool; pass numbered=True"
            )
        self.fill_to = _validate.non_negative_int(
            fill_to, name="fill_to", hint="pass the batch size, or 0 to take batches as they come"
        )
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
        # The slots holding an example, any order: the first _count entries of _held, which
        # has one entry per slot (as _owner, draw_distinct's scratch).
        self._held = np.zeros(0, dtype=np.int64)
        self._count = 0
        self._owner = np.zeros(0, dtype=np.int64)
        self._free = np.zeros(0, dtype=np.int64)  # free slots, the oldest freed first
        self._sizes: deque[int] = deque()  # sizes of the batches still to emit, in order
        self._exhausted = False
        self._draws: np.random.Generator | None = None
        self._saved_draws: dict[str, Any] | None = None  # a resumed state, until it is used
        # With numbered: per slot, the example it holds as n * ROWS + row; those not delivered yet.
        self._example = np.zeros(0, dtype=np.int64)
        self._undelivered: set[int] = set()
        self._newest = -1  # the highest batch number seen (they start at 0): a lower one is a copy
        self.first_deliveries = 0  # this epoch's examples whose first copy left the pool
        self._draining = False  # drain(): only the held copies of delivered examples are drawn
        self._aside = np.zeros(0, dtype=np.int64)  # draining: slots of undelivered examples

    @property
    def _pooled(self) -> int:
        return self._count

    def next(self) -> Any:
        start, waited = time.perf_counter(), self.stats.wait_seconds
        try:
            return self._next()
        finally:
            self.work_seconds += time.perf_counter() - start - (self.stats.wait_seconds - waited)

    def _next(self) -> Any:
        sizes = self._sizes
        while (
            not self._draining
            and not self._exhausted
            and (not sizes or self._pooled < self.buffer_size + sizes[0])
        ):
            if not self._take():
                break
        if not sizes or self.drained:
            raise StopIteration
        size = min(sizes[0], self._count)  # draining: the last batch may be short
        if size == sizes[0]:
            sizes.popleft()
        else:  # the rest of that size is due once the examples set aside come back
            sizes[0] -= size
        self._follow_device()
        positions = draw_distinct(self._generator(), self._count, size, self._owner)
        picked = self._held[positions]
        self._release(positions)
        if self.numbered:
            delivered = self._undelivered.intersection(self._example[picked].tolist())
            self._undelivered -= delivered
            self.first_deliveries += len(delivered)
        self._free = np.concatenate([self._free, picked])
        where = self._to_device(picked)
        out = map_tensors(self._slots, lambda t: t.index_select(0, where))
        self.stats.items_out += 1
        assert self._layout is not None  # a size was queued, so _add has run and set it
        return self._layout.from_words(out)

    def _take(self) -> bool:
        """Pool the source's next item; False at its end."""
        try:
            item = self._pull()
        except StopIteration:
            self._exhausted = True
            return False
        self.stats.fresh_items += 1
        number, batch = item if self.numbered else (0, item)
        self._add(number, batch)
        return True

    def drain(self) -> None:
        """Read nothing fresh any more: pool the copies the source still owes of what it has
        read (its ``copies_due``: an echo stage's), then emit only the pooled copies of examples
        already delivered, until :attr:`drained`. The examples not yet delivered are set aside,
        undrawn but kept in the state, so a run resumed from it delivers them as usual.
        Only with ``numbered`` (which examples were delivered is known only then)."""
        if not self.numbered:
            raise DataechoValueError(
                "drain() needs numbered=True: only then does the pool know which examples it "
                "has delivered; build the stage with numbered=True"
            )
        if self._draining:
            return
        while getattr(self.source, "copies_due", 0) > 0 and self._take():
            pass
        self._draining = True
        if self._layout is None:  # nothing pooled yet
            return
        held = self._held[: self._count]
        aside = np.isin(self._example[held], np.fromiter(self._undelivered, np.int64))
        self._aside = held[aside]
        kept = held[~aside]
        self._held[: len(kept)] = kept
        self._count = len(kept)

    @property
    def waiting(self) -> int:
        """Fresh examples pooled whose first copy has not left yet (``numbered``; else 0)."""
        return len(self._undelivered)

    @property
    def drained(self) -> bool:
        """Draining, and no delivered example's copy is left to emit."""
        return self._draining and self._count == 0

    def _add(self, number: int, batch: Any) -> None:
        if self._layout is None:
            self.device = self.device or tensor_leaves(batch)[0].device
            self._layout = RowLayout(batch)
            empty = map_tensors(batch, lambda t: t.new_empty((0, *t.shape[1:])))
            self._slots = self._layout.to_words(empty)
        size = self._layout.size(batch)
        of_row = np.arange(size)  # the batch's row each new slot holds
        if 0 < size < self.fill_to:  # repeat its rows, as copies of the examples they hold
            of_row = np.arange(self.fill_to) % size
            repeat = torch.as_tensor(of_row, device=tensor_leaves(batch)[0].device)
            batch = map_tensors(batch, lambda t: t.index_select(0, repeat))
            size = self.fill_to
        self._follow_device()
        if len(self._free) < size:  # room for this batch, and for the pool to reach its size
            capacity = len(self._held)
            more = max(size - len(self._free), self.buffer_size + size - capacity)
            self._grow(capacity, more)
        filled, self._free = self._free[:size], self._free[size:]
        self._held[self._count : self._count + size] = filled
        self._count += size
        if self.numbered:
            examples = number * ROWS + of_row
            self._example[filled] = examples
            if number > self._newest:  # a fresh batch, not a copy of one
                self._newest = number
                self._undelivered.update(examples.tolist())
        where = self._to_device(filled)
        rows = iter(tensor_leaves(self._layout.to_words(batch)))
        map_tensors(self._slots, lambda t: t.index_copy_(0, where, next(rows).to(t.device)))
        self._sizes.append(size)

    def _grow(self, capacity: int, more: int) -> None:
        self._slots = map_tensors(
            self._slots, lambda t: torch.cat([t, t.new_empty((more, *t.shape[1:]))])
        )
        self._free = np.concatenate([self._free, np.arange(capacity, capacity + more)])
        self._held = np.concatenate([self._held, np.zeros(more, dtype=np.int64)])
        self._example = np.concatenate([self._example, np.zeros(more, dtype=np.int64)])
        self._owner = np.full(capacity + more, -1, dtype=np.int64)

    def _release(self, positions: np.ndarray) -> None:
        """Drop the entries at ``positions`` from the held slots in O(len(positions)): the
        last entries not dropped move into the gaps."""
        tail = self._count - len(positions)
        in_tail = positions >= tail
        kept = np.ones(len(positions), dtype=bool)
        kept[positions[in_tail] - tail] = False
        self._held[positions[~in_tail]] = self._held[tail : self._count][kept]
        self._count = tail

    def _to_device(self, slots: np.ndarray) -> torch.Tensor:
        """Slot numbers as an index on the pool's device; to a GPU from pinned memory, so the
        copy queues behind the device's work instead of waiting for it."""
        index = torch.from_numpy(slots)
        if self.device is not None and self.device.type == "cuda":
            return index.pin_memory().to(self.device, non_blocking=True)
        return index

    def _follow_device(self) -> None:
        """The pool on ``device``: a resumed pool comes from the host."""
        assert self._slots is not None  # _add has run
        first = tensor_leaves(self._slots)[0]
        self.device = self.device or first.device
        if first.device != self.device:
            self._slots = map_tensors(self._slots, lambda t: t.to(self.device))

    def _generator(self) -> np.random.Generator:
        if self._draws is None:
            self._draws = np.random.default_rng(derive_seed(self.seed, self.STAGE_ID, self._epoch))
            if self._saved_draws is not None:
                self._draws.bit_generator.state = self._saved_draws
                self._saved_draws = None
        return self._draws

    def _get_stage_state(self) -> dict[str, Any]:
        pool = None if self._layout is None else self._layout.from_words(self._slots)
        held = np.concatenate([self._held[: self._count], self._aside])  # a drain's too
        return {
            # Copied to host memory at once: a clone on the device first would need the pool's
            # memory twice there, and a pool sized to the device's memory would not fit.
            "pool": None if pool is None else map_tensors(pool, _host_copy),
            # Plain lists: the state's bookkeeping survives a JSON round trip (the pool's rows
            # are the user's data, kept as they are).
            "held": held.tolist(),
            "free": self._free.tolist(),
            "sizes": list(self._sizes),
            "exhausted": self._exhausted,
            "examples": self._example[held].tolist(),
            "undelivered": sorted(self._undelivered),
            "newest": self._newest,
            "first_deliveries": self.first_deliveries,
            "draws": self._saved_draws if self._draws is None else self._draws.bit_generator.state,
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._start_epoch()
        if state["pool"] is not None:
            self._layout = RowLayout(state["pool"])
            self._slots = self._layout.to_words(state["pool"])
        held = np.asarray(state["held"], dtype=np.int64)
        self._free = np.array(state["free"], dtype=np.int64)
        self._count = len(held)
        capacity = self._count + len(self._free)
        self._held = np.concatenate([held, np.zeros(len(self._free), dtype=np.int64)])
        self._owner = np.full(capacity, -1, dtype=np.int64)
        self._example = np.zeros(capacity, dtype=np.int64)
        self._example[held] = np.asarray(state["examples"], dtype=np.int64)
        self._undelivered = {int(i) for i in state["undelivered"]}
        self._newest, self.first_deliveries = int(state["newest"]), int(state["first_deliveries"])
        self._sizes = deque(int(s) for s in state["sizes"])
        self._exhausted = bool(state["exhausted"])
        self._saved_draws = state["draws"]


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in new host memory (one copy, wherever ``t`` is)."""
    return t.clone() if t.device.type == "cpu" else t.cpu()


def mix_examples(
    source: Iterable[Any],
    buffer_size: int,
    *,
    seed: int | None = None,
    device: str | torch.device | None = None,
    numbered: bool = False,
) -> MixExamples:
    """Mix the examples of ``source``'s batches through a pool of ``buffer_size`` examples on
    ``device`` (None: the first batch's); 0 or 1: each batch only shuffled within itself. See
    :class:`MixExamples`."""
    return MixExamples(source, buffer_size, seed=seed, device=device, numbered=numbered)


# A batch's examples as rows of wide words: how the pool stores and moves them. On the CPU,
# scattering a batch of uint8 images into a pool moves one byte at a time; viewed as int64 words,
# the same rows move about 6x faster (a GPU moves either quickly). Every leaf of a batch must be
# a tensor with one row per example, in one dtype and row shape.
_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
_KEEP_WHOLE = "or pass shuffle_buffer=0 to keep batches whole"


class RowLayout:
    """Each leaf's dtype, row shape and word type, as the first batch (``template``) has them."""

    def __init__(self, template: Any) -> None:
        self.fields = [(t.dtype, tuple(t.shape[1:])) for t in tensor_leaves(template)]
        self.words = []
        for dtype, row in self.fields:
            row_bytes = math.prod(row) * dtype.itemsize
            self.words.append(next(w for w in _WORDS if row_bytes % w.itemsize == 0))

    def size(self, batch: Any) -> int:
        """Examples in ``batch``; a clear error unless its leaves match the layout."""
        leaves = tensor_leaves(batch)
        size = leaves[0].shape[0] if leaves[0].dim() else 0
        if any(t.dim() == 0 or t.shape[0] != size for t in leaves):
            raise DataechoValueError(
                f"mixing examples across batches needs every tensor of a batch to hold one row "
                f"per example; got shapes {[tuple(t.shape) for t in leaves]}; collate each "
                f"field to shape (batch, ...), {_KEEP_WHOLE}"
            )
        seen = [(t.dtype, tuple(t.shape[1:])) for t in leaves]
        if seen != self.fields:
            raise DataechoValueError(
                f"mixing examples across batches needs every batch's fields in one dtype and "
                f"shape; got {_named(seen)} after {_named(self.fields)}; pad or crop to one "
                f"shape, {_KEEP_WHOLE}"
            )
        return size

    def to_words(self, batch: Any) -> Any:
        """``batch`` with each leaf as a 2-D tensor of words, one row per example."""
        layout = iter(zip(self.fields, self.words, strict=True))

        def flat(t: torch.Tensor) -> torch.Tensor:
            (_, row), word = next(layout)
            raw = t.reshape(len(t), math.prod(row)).contiguous().view(torch.uint8)
            try:
                return raw.view(word)
            except RuntimeError:  # a view into memory not aligned for the word: copied
                return raw.clone().view(word)

        return map_tensors(batch, flat)

    def from_words(self, batch: Any) -> Any:
        """Undo :meth:`to_words` (views, no copy)."""
        fields = iter(self.fields)

        def shaped(t: torch.Tensor) -> torch.Tensor:
            dtype, row = next(fields)
            return t.view(torch.uint8).view(dtype).view(len(t), *row)

        return map_tensors(batch, shaped)


def tensor_leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of ``batch`` in order; a clear error for any other kind of leaf."""
    found = leaves(batch)
    for leaf in found:
        if not isinstance(leaf, torch.Tensor):
            raise DataechoTypeError(
                f"mixing examples across batches needs batches made of tensors (in tuples, "
                f"lists or dicts); got a {type(leaf).__name__} leaf ({leaf!r:.60}); collate it "
                f"into a tensor, {_KEEP_WHOLE}"
            )
    if not found:
        raise DataechoTypeError(
            "mixing examples across batches needs at least one tensor per batch"
        )
    return found


def _named(fields: list[tuple[torch.dtype, tuple[int, ...]]]) -> list[tuple[str, tuple]]:
    return [(str(dtype), row) for dtype, row in fields]
