"""The counters every stage and the loader share: honest accounting of fresh vs echoed data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchdata.nodes import BaseNode

UNITS = ("examples", "batches")


@dataclass
class EchoStats:
    """Counts of one stage (or one loader) since it was built; kept across epochs and resumes.

    The item counters count ``unit``: "examples", or "batches" on a stage whose items are whole
    batches (its source is a batching loader, see :func:`item_unit`; for batch echoing). The
    loader always counts examples. The counter names keep "examples" whatever the unit.
    """

    fresh_examples: int = 0
    """Items (of ``unit``) read from upstream, echoed copies not counted."""
    examples_out: int = 0
    """Items (of ``unit``) emitted downstream, echoed copies included."""
    batches: int = 0
    """Batches emitted (loader only)."""
    wait_seconds: float = 0.0
    """Time the consumer spent blocked on upstream."""
    stall_seconds: float = 0.0
    """Time the consumer waited with nothing it was allowed to reuse (adaptive echoing)."""
    unit: str = field(default="examples", kw_only=True)
    """What the item counters count: "examples" or "batches". Not part of the state: it
    follows from the source, and a checkpoint holds numbers only."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(
                f"unit must be one of {', '.join(map(repr, UNITS))}, got {self.unit!r}; "
                f'use "batches" when each item is a whole batch'
            )

    def __repr__(self) -> str:
        # The unit first: it says how to read the counters after it.
        counters = ", ".join(f"{name}={getattr(self, name)!r}" for name in _counters())
        return f"{type(self).__name__}(unit={self.unit!r}, {counters})"

    @property
    def realized_factor(self) -> float:
        """examples_out / fresh_examples (0.0 before the first fresh item)."""
        return self.examples_out / self.fresh_examples if self.fresh_examples else 0.0

    @property
    def echoed_examples(self) -> int:
        """Emitted items (of ``unit``) that were echoed copies rather than first deliveries."""
        return max(self.examples_out - self.fresh_examples, 0)

    def state_dict(self) -> dict[str, float]:
        """The counters (numbers only; ``unit`` is not saved)."""
        return {name: getattr(self, name) for name in _counters()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Set the counters ``state`` has (older states may lack some); ``unit`` stays."""
        for name in _counters():
            if name in state:
                setattr(self, name, type(getattr(self, name))(state[name]))

    def as_dict(self) -> dict[str, float | str]:
        """``unit``, all counters and the derived figures, for logs and reports."""
        return {
            "unit": self.unit,
            **self.state_dict(),
            "realized_factor": self.realized_factor,
            "echoed_examples": self.echoed_examples,
        }


def _counters() -> tuple[str, ...]:
    return tuple(f.name for f in fields(EchoStats) if f.name != "unit")


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
