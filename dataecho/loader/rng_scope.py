"""Give the user's ``transform`` its own seeded random streams, reproducible and resumable.

Augmentations draw from the global RNGs of torch, ``random`` and numpy. Before each batch the
pipeline seeds those generators from (pipeline seed, epoch, worker, batch number), so a seeded
loader yields the same stream every time and a resumed one continues it exactly, while the
checkpoint holds only a batch counter rather than full RNG states, which would be copied into
every snapshot.

In a worker process the globals belong to the pipeline, so they are simply reseeded. In the
main process (``num_workers=0``) the caller's torch and ``random`` states are saved and restored
around each batch so training randomness (dropout, init) is untouched; numpy's legacy global
state is left alone there, because reading and writing it around every batch would cost more
than the reseeding itself, so a transform drawing from ``np.random`` is reproducible only with
workers. Prefer torch's RNG in
transforms (as torchvision does).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

_MASK63 = (1 << 63) - 1


def batch_seed(base: int, counter: int) -> int:
    """A well-spread 63-bit seed for batch ``counter`` (splitmix64's finaliser)."""
    z = (base + (counter + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & _MASK63


class RngScope:
    """``with scope:`` around each batch: global RNGs seeded for that batch, then restored."""

    def __init__(self, seed: int, *, exclusive: bool = False) -> None:
        self.seed = int(seed)
        self.exclusive = exclusive
        self.batches = 0
        self._saved: tuple[torch.Tensor, Any] | None = None

    def __enter__(self) -> RngScope:
        s = batch_seed(self.seed, self.batches)
        if self.exclusive:
            np.random.seed(s % 2**32)
        else:
            self._saved = (torch.get_rng_state(), random.getstate())
        # default_generator.manual_seed: torch.manual_seed also walks every device backend,
        # a cost paid on every batch for generators the transform does not use.
        torch.default_generator.manual_seed(s)
        random.seed(s)
        return self

    def __exit__(self, *exc: object) -> None:
        self.batches += 1
        if self._saved is not None:
            torch.set_rng_state(self._saved[0])
            random.setstate(self._saved[1])
            self._saved = None

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = int(state["batches"])
