"""The counters every stage and the loader share: honest accounting of fresh vs echoed data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch


@dataclass
class EchoStats:
    """Counts of one stage (or one loader) since it was built; kept across epochs and resumes.

    On a stage, "examples" means the items that pass through it: examples for example echoing,
    whole batches for batch echoing. The loader always counts examples.
    """

    fresh_examples: int = 0
    """Items read from upstream (echoed copies not counted)."""
    examples_out: int = 0
    """Items emitted downstream, echoed copies included."""
    batches: int = 0
    """Batches emitted (loader only)."""
    wait_seconds: float = 0.0
    """Time the consumer spent blocked on upstream."""
    stall_seconds: float = 0.0
    """Time the consumer waited with nothing it was allowed to reuse (adaptive echoing)."""

    @property
    def realized_factor(self) -> float:
        """examples_out / fresh_examples (0.0 before the first fresh item)."""
        return self.examples_out / self.fresh_examples if self.fresh_examples else 0.0

    @property
    def echoed_examples(self) -> int:
        """Emitted items that were echoed copies rather than first deliveries."""
        return max(self.examples_out - self.fresh_examples, 0)

    def state_dict(self) -> dict[str, float]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, float]) -> None:
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))

    def as_dict(self) -> dict[str, float]:
        """All counters plus the derived figures, for logs and reports."""
        return {
            **asdict(self),
            "realized_factor": self.realized_factor,
            "echoed_examples": self.echoed_examples,
        }


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
