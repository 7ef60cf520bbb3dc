"""The counters every stage and the loader share: honest accounting of fresh vs echoed data."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchdata.nodes import BaseNode

from dataecho.errors import DataechoAttributeError, DataechoValueError

UNITS = ("examples", "batches")


@dataclass(init=False)
class EchoStats:
    """Counts of one stage (or one loader) since it was built; kept across epochs and resumes.

    The item counters (``fresh_items``, ``items_out``, ``echoed_items``) count ``unit``:
    "examples", or "batches" on a stage whose items are whole batches (its source is a
    batching loader, see :func:`item_unit`; for batch echoing). The loader always counts
    examples. ``fresh_examples``, ``examples_out`` and ``echoed_examples`` are the same
    counters under the name of their unit, so they always count examples: on a stage that
    counts batches they raise ``DataechoAttributeError`` naming the neutral counter to read.
    """

    fresh_items: int
    """Items (of ``unit``) read from upstream, echoed copies not counted."""
    items_out: int
    """Items (of ``unit``) emitted downstream, echoed copies included."""
    batches: int
    """Batches emitted (loader only)."""
    wait_seconds: float
    """Time the consumer spent blocked on upstream."""
    stall_seconds: float
    """Time the consumer waited with nothing it was allowed to reuse (adaptive echoing)."""
    work_seconds: float
    """Time the consumer's thread spent on the loader's own work on each batch (loader only:
    ``device_transform`` on every copy with where="device"); not a wait, not in
    ``wait_seconds``."""
    waiting_items: int
    """Fresh items read and held back, not yet emitted once (loader only: the examples waiting
    in the device's pool with where="device", or in the workers' echo stages and shuffle
    buffers, as each worker last said; 0 elsewhere and at an epoch's end). With
    ``fresh_items``, the items read: an item counts fresh at its first emission."""
    unit: str
    """What the item counters count: "examples" or "batches". Not part of the state: it
    follows from the source, and a checkpoint holds numbers only."""

    def __init__(
        self,
        fresh_items: int = 0,
        items_out: int = 0,
        batches: int = 0,
        wait_seconds: float = 0.0,
        stall_seconds: float = 0.0,
        work_seconds: float = 0.0,
        waiting_items: int = 0,
        *,
        unit: str = "examples",
        fresh_examples: int | None = None,
        examples_out: int | None = None,
    ) -> None:
        if unit not in UNITS:
            raise DataechoValueError(
                f"unit must be one of {', '.join(map(repr, UNITS))}, got {unit!r}; "
                f'use "batches" when each item is a whole batch'
            )
        self.unit = unit
        self.fresh_items, self.items_out, self.batches = fresh_items, items_out, batches
        self.wait_seconds, self.stall_seconds = wait_seconds, stall_seconds
        self.work_seconds, self.waiting_items = work_seconds, waiting_items
        if fresh_examples is not None:
            self.fresh_examples = fresh_examples  # the unit's name: warns for batches
        if examples_out is not None:
            self.examples_out = examples_out

    def __repr__(self) -> str:
        # The unit first: it says how to read the counters after it.
        counters = ", ".join(f"{name}={getattr(self, name)!r}" for name in _COUNTERS)
        return f"{type(self).__name__}(unit={self.unit!r}, {counters})"

    @property
    def realized_factor(self) -> float:
        """items_out / fresh_items (0.0 before the first fresh item)."""
        return self.items_out / self.fresh_items if self.fresh_items else 0.0

    @property
    def echoed_items(self) -> int:
        """Emitted items (of ``unit``) that were echoed copies rather than first deliveries."""
        return max(self.items_out - self.fresh_items, 0)

    @property
    def fresh_examples(self) -> int:
        """``fresh_items`` where they are examples (see the class docstring)."""
        return self._examples("fresh_examples", "fresh_items")

    @fresh_examples.setter
    def fresh_examples(self, value: int) -> None:
        self._examples("fresh_examples", "fresh_items")
        self.fresh_items = value

    @property
    def examples_out(self) -> int:
        """``items_out`` where they are examples (see the class docstring)."""
        return self._examples("examples_out", "items_out")

    @examples_out.setter
    def examples_out(self, value: int) -> None:
        self._examples("examples_out", "items_out")
        self.items_out = value

    @property
    def echoed_examples(self) -> int:
        """``echoed_items`` where they are examples (see the class docstring)."""
        return self._examples("echoed_examples", "echoed_items")

    def _examples(self, name: str, neutral: str) -> Any:
        if self.unit != "examples":
            raise DataechoAttributeError(
                f"EchoStats.{name} counts examples, and this stage counts {self.unit}: read "
                f"stats.{neutral} (a count of {self.unit}, as stats.unit says)"
            )
        return getattr(self, neutral)

    def state_dict(self) -> dict[str, float]:
        """The counters (numbers only; ``unit`` is not saved), the item counters under the
        unit's name (``fresh_examples``, ``examples_out`` or ``fresh_batches``, ``batches_out``)."""
        return {_state_key(name, self.unit): getattr(self, name) for name in _COUNTERS}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Set the counters ``state`` has (the others keep their values); ``unit`` stays.

        Each item counter is read under its unit's name or its neutral name.
        """
        for name in _COUNTERS:
            for key in dict.fromkeys((_state_key(name, self.unit), name)):
                if key in state:
                    setattr(self, name, type(getattr(self, name))(state[key]))
                    break

    def as_dict(self) -> dict[str, float | str]:
        """``unit``, all counters and the derived figures, for logs and reports."""
        return {
            "unit": self.unit,
            **self.state_dict(),
            "realized_factor": self.realized_factor,
            _state_key("echoed_items", self.unit): self.echoed_items,
        }


_COUNTERS = (
    "fresh_items",
    "items_out",
    "batches",
    "wait_seconds",
    "stall_seconds",
    "work_seconds",
    "waiting_items",
)


def _state_key(name: str, unit: str) -> str:
    """``fresh_items`` -> ``fresh_examples`` / ``fresh_batches``; other names unchanged."""
    return name.replace("items", unit) if "items" in name else name


def item_counts(stats: object) -> tuple[float, float] | None:
    """(fresh items, items out) of an :class:`EchoStats` or any object with either pair of
    counters (``fresh_items``/``items_out``, else ``fresh_examples``/``examples_out``)."""
    for names in (("fresh_items", "items_out"), ("fresh_examples", "examples_out")):
        counts: list[Any] = [getattr(stats, name, None) for name in names]
        if all(isinstance(c, numbers.Real) for c in counts):
            return float(counts[0]), float(counts[1])
    return None


def item_unit(source: object) -> str:
    """What the items of ``source`` are: "batches" for a batching loader, else "examples".

    A batching loader is a ``torch.utils.data.DataLoader`` that batches (a ``batch_size`` or a
    ``batch_sampler``), or any other iterable with a ``batch_size`` that is not None (such as
    ``dataecho.EchoingDataLoader``). A stage over another stage (or over a torchdata
    ``IterableWrapper``) has the unit of what it wraps.
    """
    if isinstance(source, DataLoader):
        # batch_size is None with a custom batch_sampler, which batches all the same.
        return "batches" if source.batch_sampler is not None else "examples"
    if getattr(source, "batch_size", None) is not None and hasattr(source, "__iter__"):
        return "batches"
    stats = getattr(source, "stats", None)
    if isinstance(stats, EchoStats) and isinstance(source, BaseNode):  # a stage
        return stats.unit
    wrapped = getattr(source, "iterable", None)  # torchdata's IterableWrapper
    if wrapped is not None and wrapped is not source:
        return item_unit(wrapped)
    return "examples"


def batch_length(batch: Any) -> int:
    """Examples in a batch: dim 0 of a tensor/array, or of the first such field of a collated
    ``(x, y)`` / ``{"x": ...}``; else the length of a list of examples; a scalar counts 1.

    A list of uncollated example tensors reads as a collated ``[x, y]``: callers that know the
    batch size should say so.
    """
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    fields_ = list(batch.values()) if isinstance(batch, Mapping) else batch
    if isinstance(batch, (Mapping, list, tuple)):
        for value in fields_:  # a collated field: (strings, labels) counts the labels
            if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0:
                return int(value.shape[0])
        if isinstance(batch, Mapping):
            return batch_length(fields_[0]) if fields_ else 0
        return len(batch)
    return 1
