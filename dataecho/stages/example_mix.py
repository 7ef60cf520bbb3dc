"""Mixing batches' examples: a shuffle buffer over examples whose items are whole batches.

Why: echoing whole batches (on the training device, after one host-to-device copy) repeats
each batch's examples together, and Choi et al. found that batch echoing saves fewer fresh
examples than example echoing, whose copies spread over many batches. This stage keeps a pool
of examples, stored as one batch of the batches' own structure on their own device, and forms
each batch from random pool examples: the copies of a fresh batch spread over the batches that
follow, while each batch in or out costs a few tensor operations (a concatenation, a gather).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch

from dataecho import _validate
from dataecho._structure import map_leaves, map_tensors
from dataecho.stages.base import Stage
from dataecho.stages.seeds import STAGE_MIX, derive_seed


class MixExamples(Stage[Any]):
    """Pool at least ``buffer_size`` examples of ``source``'s batches; emit batches of random
    pool examples, drawn without replacement, of the sizes the batches arrived in (so a loader
    yields as many batches as without mixing). At the source's end the pool drains.

    Every leaf of a batch must be a tensor whose first dimension is the batch's size. The pool
    lives on ``device`` (None: the first batch's), in slots that each batch in or out touches
    only its own rows of; the draws come from a generator there, so nothing waits on the host.
    Emitted tensors are new (gathered). State: the pool, its free slots, the sizes still due
    and the generator's state, all copies.
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
        self.buffer_size = _validate.non_negative_int(
            buffer_size, name="buffer_size", hint="use 0 (or 1) for no mixing"
        )
        super().__init__(source, seed=_validate.seed(seed))
        self.device = None if device is None else torch.device(device)
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._slots: Any = None  # the pool: per leaf, ``capacity`` rows as words (see _Rows)
        self._rows: list[_Rows] = []  # per leaf, how its rows are stored
        self._used: torch.Tensor | None = None  # bool per slot: holds a pooled example
        self._free: list[torch.Tensor] = []  # indices of free slots, in pieces
        self._free_count = 0
        self._capacity = 0
        self._sizes: deque[int] = deque()  # sizes of the batches still to emit, in order
        self._exhausted = False
        self._generator: torch.Generator | None = None
        self._saved_generator: torch.Tensor | None = None  # a resumed state, until it is used

    def next(self) -> Any:
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
        keys = torch.rand(self._capacity, generator=self._generator, device=self._used.device)
        picked = keys.masked_fill_(~self._used, -1.0).topk(size).indices
        rows = iter(self._rows)
        out = map_tensors(self._slots, lambda t: next(rows).restore(t.index_select(0, picked)))
        self._used.index_fill_(0, picked, False)
        self._free.append(picked)
        self._free_count += size
        self.stats.items_out += 1
        return out

    @property
    def _pooled(self) -> int:
        return self._capacity - self._free_count

    def _add(self, batch: Any) -> None:
        leaves = _leaves(batch)
        size = leaves[0].shape[0] if leaves[0].dim() else 0
        if any(t.dim() == 0 or t.shape[0] != size for t in leaves):
            shapes = [tuple(t.shape) for t in leaves]
            raise ValueError(
                f"mixing examples across batches needs every tensor of a batch to hold one row "
                f"per example; got shapes {shapes}; collate each field to shape (batch, ...), "
                "or pass shuffle_buffer=0 to keep batches whole"
            )
        if self._slots is None:
            self.device = self.device or leaves[0].device
            self._start_pool(map_tensors(batch, lambda t: t.new_empty((0, *t.shape[1:]))))
        self._follow_device()
        if self._free_count < size:
            self._grow(max(self._capacity + size - self._free_count, self.buffer_size + size))
        where = self._take(size)
        new = iter(zip(self._rows, leaves, strict=True))

        def put(slots: torch.Tensor) -> torch.Tensor:
            how, leaf = next(new)
            return slots.index_copy_(0, where, how.words(leaf.to(slots.device)))

        map_tensors(self._slots, put)
        self._used.index_fill_(0, where, True)
        self._sizes.append(size)

    def _start_pool(self, pool: Any) -> None:
        """Slots holding the rows of ``pool`` (a batch: a resumed pool, or an empty one)."""
        self._rows = [_Rows.of(t) for t in _leaves(pool)]
        how = iter(self._rows)
        self._slots = map_tensors(pool, lambda t: next(how).words(t))
        self._used = torch.zeros(len(_leaves(pool)[0]), dtype=torch.bool, device=self.device)

    def _pool_as_batch(self, fn: Any) -> Any:
        how = iter(self._rows)
        return map_tensors(self._slots, lambda t: fn(next(how).restore(t)))

    def _follow_device(self) -> None:
        """The pool (and the generator) on ``device``: a resumed pool comes from the host."""
        self.device = self.device or self._used.device
        if self._used.device != self.device:
            move = lambda t: t.to(self.device)  # noqa: E731
            self._slots, self._used = map_tensors(self._slots, move), move(self._used)
            self._free = [move(t) for t in self._free]
        if self._generator is None:
            self._generator = torch.Generator(device=self.device)
            self._generator.manual_seed(derive_seed(self.seed, self.STAGE_ID, self._epoch))
            if self._saved_generator is not None:
                self._generator.set_state(self._saved_generator)
                self._saved_generator = None

    def _grow(self, capacity: int) -> None:
        more = capacity - self._capacity
        self._slots = map_tensors(
            self._slots, lambda t: torch.cat([t, t.new_empty((more, *t.shape[1:]))])
        )
        self._used = torch.cat([self._used, self._used.new_zeros(more)])
        self._free.append(torch.arange(self._capacity, capacity, device=self.device))
        self._free_count += more
        self._capacity = capacity

    def _take(self, n: int) -> torch.Tensor:
        """``n`` free slots, oldest freed first."""
        pieces, have = [], 0
        while have < n:
            piece = self._free.pop(0)
            pieces.append(piece)
            have += piece.numel()
        taken = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        if have > n:
            self._free.insert(0, taken[n:])
        self._free_count -= n
        return taken[:n]

    def _get_stage_state(self) -> dict[str, Any]:
        clone = lambda t: t.clone()  # noqa: E731
        return {
            "slots": None if self._slots is None else self._pool_as_batch(clone),
            "used": None if self._used is None else self._used.clone(),
            "free": torch.cat(self._free) if self._free else None,  # a new tensor
            "sizes": list(self._sizes),
            "exhausted": self._exhausted,
            "generator": None if self._generator is None else self._generator.get_state(),
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._start_epoch()
        if state["slots"] is not None:
            self._start_pool(state["slots"])
            self._used = state["used"]
            self._capacity = int(self._used.numel())
            self._free = [] if state["free"] is None else [state["free"]]
            self._free_count = 0 if state["free"] is None else int(state["free"].numel())
        self._sizes = deque(int(s) for s in state["sizes"])
        self._exhausted = bool(state["exhausted"])
        self._saved_generator = state["generator"]


class _Rows:
    """How one leaf's rows are stored: flat, as words of the widest integer type that divides
    a row's bytes. Copying rows in and out then moves a few wide words per row, not one
    element each (on the CPU a uint8 image's rows move about 6x faster)."""

    __slots__ = ("dtype", "tail", "word")

    def __init__(self, dtype: torch.dtype, tail: tuple[int, ...], word: torch.dtype) -> None:
        self.dtype, self.tail, self.word = dtype, tail, word

    @classmethod
    def of(cls, leaf: torch.Tensor) -> _Rows:
        row_bytes = math.prod(leaf.shape[1:]) * leaf.element_size()
        word = next(w for w in _WORDS if row_bytes % w.itemsize == 0)
        return cls(leaf.dtype, tuple(leaf.shape[1:]), word)

    def words(self, leaf: torch.Tensor) -> torch.Tensor:
        flat = leaf.reshape(len(leaf), math.prod(self.tail)).contiguous().view(torch.uint8)
        try:
            return flat.view(self.word)
        except RuntimeError:  # a view into memory not aligned for the word: a fresh copy is
            return flat.clone().view(self.word)

    def restore(self, words: torch.Tensor) -> torch.Tensor:
        return words.view(torch.uint8).view(self.dtype).view(len(words), *self.tail)


_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


def _leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of ``batch`` in order; a clear error for any other kind of leaf."""
    found: list[torch.Tensor] = []

    def take(leaf: Any) -> None:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"mixing examples across batches needs batches made of tensors (in tuples, "
                f"lists or dicts); got a {type(leaf).__name__} leaf ({leaf!r:.60}); collate it "
                "into a tensor, or pass shuffle_buffer=0 to keep batches whole"
            )
        found.append(leaf)

    map_leaves(batch, take)
    if not found:
        raise TypeError("mixing examples across batches needs at least one tensor per batch")
    return found


def mix_examples(
    source: Iterable[Any], buffer_size: int, *, seed: int | None = None
) -> MixExamples:
    """Mix the examples of ``source``'s batches through a pool of ``buffer_size`` examples
    (0 or 1: batches pass whole, each shuffled within itself); see :class:`MixExamples`."""
    return MixExamples(source, buffer_size, seed=seed)
