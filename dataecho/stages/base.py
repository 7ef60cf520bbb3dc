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

from torch.utils.data import DataLoader
from torchdata.nodes import BaseNode, IterableWrapper, Loader
from torchdata.nodes.types import Stateful

from dataecho import _validate
from dataecho.errors import DataechoTypeError
from dataecho.stages.seeds import derive_seed, resolve_seed
from dataecho.stages.stats import EchoStats, item_unit

T = TypeVar("T")

# What every stage's state holds (get_state), before the stage's own fields.
STAGE_STATE_KEYS = ("epoch", "seed", "source", "rng", "stats", "ended")


def as_node(source: Iterable[T]) -> BaseNode[T]:
    """``source`` as a resumable node."""
    if isinstance(source, BaseNode):
        return source
    if not isinstance(source, Iterable):
        raise DataechoTypeError(
            f"source must be an iterable (a list, a generator, a Dataset, a torchdata node), "
            f"got {type(source).__name__}"
        )
    return IterableWrapper(source)


class Stage(BaseNode[T], Generic[T]):
    """A stage over one source, with a seed, an epoch counter and :class:`EchoStats`.

    ``reset(None)`` starts the next epoch (its random stream derived from seed and epoch);
    ``reset(state)`` resumes exactly. ``iter()`` after the epoch's end (its ``StopIteration``)
    starts the next epoch too, so plain ``for`` loops over a re-iterable source (a list, a
    ``DataLoader``) run epoch after epoch; mid-epoch, just reset or just resumed, ``iter()``
    continues where the stage is. Subclasses add their own fields to the state through
    ``_get_stage_state`` / ``_load_stage_state`` and implement ``next``.

    ``stats.unit`` is "batches" when the source is a batching loader (see
    :func:`~dataecho.stages.stats.item_unit`), else "examples".
    """

    STAGE_ID = 0
    # The stage's own fields in its state, checked with every stage's (STAGE_STATE_KEYS) before
    # anything is loaded, and what the refusal says such a state lacks.
    STATE_KEYS: tuple[str, ...] = ()
    STATE_HOLDS = "stage position"

    def __init__(self, source: Iterable[Any], *, seed: int | None = None) -> None:
        super().__init__()
        self.source = as_node(source)
        self.stats = EchoStats(unit=item_unit(source))
        self.seed = resolve_seed(seed)
        self._epoch = -1
        self._rng = random.Random()
        self._ended = False  # this epoch raised StopIteration: the next iter() starts another
        self._source_at_end: Any = None  # a resumed end's source state, until the next epoch

    def __iter__(self) -> Stage[T]:
        """The stage itself; after the epoch's end, first the next epoch (``reset(None)``)."""
        if self._ended:
            self.reset(None)
        return self

    def __next__(self) -> T:
        # Ended: until the next epoch starts (the source may not even be restored). Drained:
        # not the epoch's end, which the state does not record.
        if self._ended or self.drained:
            raise StopIteration
        try:
            return super().__next__()
        except StopIteration:
            self._ended = True
            raise

    @property
    def drained(self) -> bool:
        """Whether a drain (a stage's ``drain()``: read nothing more, emit what is owed, for a
        run that stops) has emitted all it owed; False for a stage without one."""
        return False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self._epoch += 1
            self._ended = False
            self._restart_source()
            self._rng = random.Random(derive_seed(self.seed, self.STAGE_ID, self._epoch))
            self._start_epoch()
        else:
            keys = STAGE_STATE_KEYS + self.STATE_KEYS
            _validate.saved_state(initial_state, keys, holds=self.STATE_HOLDS)
            self._epoch = initial_state["epoch"]
            self.seed = initial_state["seed"]
            self._ended = bool(initial_state["ended"])
            self._source_at_end = initial_state["source"] if self._ended else None
            if not (self._ended and _restarted_from_saved_state(self.source)):
                # Only the next epoch reads a deferred source again. Restored now, a plain
                # iterable would be fast-forwarded through a whole epoch (a full read of a
                # DataLoader) for nothing, and a loader started on its next epoch twice.
                self.source.reset(initial_state["source"])
            self._rng.setstate(_as_rng_state(initial_state["rng"]))
            self.stats.load_state_dict(initial_state["stats"])
            self._load_stage_state(initial_state)

    def _restart_source(self) -> None:
        """Start the source's next epoch (after a resumed end: from its saved state)."""
        saved, self._source_at_end = self._source_at_end, None
        if saved is not None:
            if _restarted_from_saved_state(self.source):
                iterable = self.source.iterable
                if isinstance(iterable, Stateful):
                    # A loader's state from the end of an epoch makes its next iter() the next
                    # epoch, with its epoch count and seeds carried on.
                    iterable.load_state_dict(saved[IterableWrapper.ITERABLE_KEY])
            else:
                self._finish_restored_pass(saved)
        self.source.reset(None)

    def _finish_restored_pass(self, saved: Any) -> None:
        """Let the source, restored at its end, reach that end, as it did before its state was
        saved: a stateful dataset whose loaded position is taken up only when its pass starts
        to run would otherwise start its next pass at that position, empty."""
        try:
            next(self.source)
        except StopIteration:
            return
        # Its end state restores to the start of a new pass (its position went back to 0 at
        # the end): restored again, the item just read is not lost to that pass.
        self.source.reset(saved)

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "source": self._source_state_now(),
            "rng": self._rng.getstate(),
            "stats": self.stats.state_dict(),
            "ended": self._ended,
            **self._get_stage_state(),
        }

    def _source_state_now(self) -> Any:
        """The source's state, or the saved one while the stage is at a resumed end."""
        if self._source_at_end is not None:
            return self._source_at_end
        return self.source.state_dict()

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


def _restarted_from_saved_state(source: BaseNode[Any]) -> bool:
    """Whether ``source``, saved at its end, is best left unrestored until its next epoch.

    True for a torchdata ``IterableWrapper`` over a plain iterable (its state is a count) or
    over a stateful loader (a ``DataLoader``, a torchdata ``Loader``, anything batching such
    as ``EchoingDataLoader``): the loader's end state already means "next epoch". Other nodes
    and stateful datasets are restored as usual, then reset for the next epoch.
    """
    if not isinstance(source, IterableWrapper):
        return False
    iterable = source.iterable
    if not isinstance(iterable, Stateful):
        return True
    return isinstance(iterable, (DataLoader, Loader)) or item_unit(iterable) == "batches"


def _as_rng_state(state: Any) -> tuple:
    # A checkpoint round trip (torch.save, JSON) may turn the state's tuples into lists.
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
