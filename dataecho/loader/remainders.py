"""The workers' last short batches, batched together in the main process.

Each worker batches its own share of the epoch, so each would end on a short batch, and
``drop_last`` would drop one per worker, where DataLoader's epoch ends on one short batch at
most. A worker sends its last short batch uncollated, as a :class:`Remainder`; once every
worker has ended, :class:`Remainders` batches their examples together in the order they came,
then collates each batch and runs ``batch_transform`` on it here, seeded per batch as a
worker's are (:mod:`dataecho.loader.rng_scope`).

The last short batch of them is kept without ``drop_last``. With it:

- without echoing it is dropped, as DataLoader drops it;
- at the batch level (``where="batch"``/``"device"``) it is filled with copies of its own
  examples: dropped, its examples would have no copy at all, and batch echoing repeats it with
  the rest. On the device with an example pool, the pool fills it as it takes it in (there
  the copies count as their originals: :class:`~dataecho.stages.MixExamples`'s ``fill_to``),
  so it is handed on short;
- at the example level the loader rounds a map-style dataset's copies to whole batches
  (:mod:`dataecho.loader.epoch_counts`), so none is short; where it cannot (``"auto"``, a
  stream), the examples with no copy delivered yet are moved into the full batches first, and
  the short batch, of copies delivered elsewhere where there are enough, is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataecho.loader.options import LoaderOptions
from dataecho.loader.rng_scope import RngScope
from dataecho.stages.copying import copy_item
from dataecho.stages.packing import pack, unpack


@dataclass
class Remainder:
    """A worker's last short batch: its examples, uncollated, and which of them are their
    example's first delivered copy."""

    items: list[Any]
    firsts: list[bool]


def last_batch(opts: LoaderOptions, *, pool_fills: bool) -> str:
    """What becomes of the last short batch (see the module docstring): "keep", "drop" or
    "fill". ``pool_fills``: the device's example pool fills it."""
    if not opts.drop_last:
        return "keep"
    if not (opts.echoes and opts.batch_level):
        return "drop"
    return "keep" if pool_fills else "fill"


class Remainders:
    """The remainders received so far, and the batches made of them once every worker ended;
    ``last``: what becomes of the last short batch (:func:`last_batch`)."""

    def __init__(
        self,
        opts: LoaderOptions,
        collate_fn: Callable[[list[Any]], Any],
        *,
        seed: int,
        last: str,
    ) -> None:
        self.opts = opts
        self.collate_fn = collate_fn
        self.last = last
        self._items: list[Any] = []
        self._firsts: list[bool] = []
        self._rng = RngScope(seed)  # the training process's own RNGs are restored after

    def hold(self, remainder: Remainder) -> None:
        self._items += remainder.items
        self._firsts += remainder.firsts

    @property
    def waiting(self) -> int:
        """Fresh examples read and held here, not delivered yet."""
        return sum(self._firsts)

    def next_batch(self) -> tuple[Any, int] | None:
        """The next batch of the held examples, and how many fresh examples it delivers; None
        once none is left to deliver. Called after every worker has ended."""
        opts, size = self.opts, self.opts.batch_size
        items, firsts = self._items, self._firsts
        if not items:
            return None
        if self.last == "drop" and opts.echoes and len(items) % size:
            # A short batch will be dropped: the examples delivered nowhere yet go first.
            order = sorted(range(len(items)), key=lambda i: not firsts[i])
            items[:] = [items[i] for i in order]
            firsts[:] = [firsts[i] for i in order]
        if len(items) < size and self.last == "drop":
            items.clear()
            firsts.clear()
        elif len(items) < size and self.last == "fill":
            # Cyclically, with copies: each a new object, as every echoed copy is.
            fill = [copy_item(items[i % len(items)]) for i in range(size - len(items))]
            items += fill
            firsts += [False] * len(fill)
        if not items:
            return None
        taken, fresh = items[:size], sum(firsts[:size])
        del items[:size], firsts[:size]
        with self._rng:
            batch = self.collate_fn(taken)
            if opts.batch_transform is not None:
                batch = opts.batch_transform(batch)
        return batch, fresh

    def state_dict(self) -> dict[str, Any]:
        return {"items": pack(self._items), "firsts": list(self._firsts),
                "rng": self._rng.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._items = unpack(state["items"])
        self._firsts = [bool(f) for f in state["firsts"]]
        self._rng.load_state_dict(state["rng"])
