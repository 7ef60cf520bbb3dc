"""What every echo-family stage shares: a torchdata ``BaseNode`` over a wrapped source.

Stages compose by wrapping (``shuffle(echo(source, 2), 64)``). Any iterable can be a source: a
``BaseNode`` is used as is, anything else goes through ``torchdata.nodes.IterableWrapper``
(which resumes a plain iterable by fast-forwarding, and a stateful one through its own state).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode, IterableWrapper

from dataecho.stages.seeds import derive_seed, resolve_seed
from dataecho.stages.stats import EchoStats

T = TypeVar("T")


def as_node(source: Iterable[T]) -> BaseNode[T]:
    """``source`` as a resumable node."""
    if isinstance(source, BaseNode):
        return source
    if not isinstance(source, Iterable):
        raise TypeError(
            f"source must be an iterable (a list, a generator, a Dataset, a torchdata node), "
            f"got {type(source).__name__}"
        )
    return IterableWrapper(source)


class Stage(BaseNode[T], Generic[T]):
    """A stage over one source, with a seed, an epoch counter and :class:`EchoStats`.

    ``reset(None)`` starts the next epoch (its random stream derived from seed and epoch);
    ``reset(state)`` resumes exactly. Subclasses add their own fields to the state through
    ``_get_stage_state`` / ``_load_stage_state`` and implement ``next``.
    """

    STAGE_ID = 0

    def __init__(self, source: Iterable[Any], *, seed: int | None = None) -> None:
        super().__init__()
        self.source = as_node(source)
        self.seed = resolve_seed(seed)
        self.stats = EchoStats()
        self._epoch = -1
        self._rng = random.Random()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self._epoch += 1
            self.source.reset(None)
            self._rng = random.Random(derive_seed(self.seed, self.STAGE_ID, self._epoch))
            self._start_epoch()
        else:
            self._epoch = initial_state["epoch"]
            self.seed = initial_state["seed"]
            self.source.reset(initial_state["source"])
            self._rng.setstate(_as_rng_state(initial_state["rng"]))
            self.stats.load_state_dict(initial_state["stats"])
            self._load_stage_state(initial_state)

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "source": self.source.state_dict(),
            "rng": self._rng.getstate(),
            "stats": self.stats.state_dict(),
            **self._get_stage_state(),
        }

    def _pull(self) -> Any:
        """The next fresh item from the source, timing the wait and counting it."""
        start = time.perf_counter()
        try:
            return next(self.source)
        finally:
            self.stats.wait_seconds += time.perf_counter() - start

    # Hooks for subclasses.
    def _start_epoch(self) -> None:
        """Clear per-epoch fields at the start of a new epoch."""

    def _get_stage_state(self) -> dict[str, Any]:
        return {}

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        """Restore the fields that ``_get_stage_state`` wrote."""


def _as_rng_state(state: Any) -> tuple:
    # A checkpoint round trip (torch.save, JSON) may turn the state's tuples into lists.
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
