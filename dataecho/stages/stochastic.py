"""Stochastic data echoing (ICLR 2025 submission): load fresh data with probability ``p_t``.

At step ``t`` (the number of items emitted so far) the stage loads a fresh item with probability
``p_t``, puts it in a FIFO echo buffer of ``buffer_size`` items and emits it; otherwise it emits
an item drawn uniformly from the buffer. A fresh item is thus used about ``1/p`` times on
average, with a random rather than fixed count, and reuses are spread over the last
``buffer_size`` fresh items instead of sitting next to each other.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from dataecho import _validate
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.schedules import check_probability
from dataecho.stages.base import Stage
from dataecho.stages.copying import copy_item
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_STOCHASTIC

T = TypeVar("T")

LoadProb = float | Callable[[int], float]


class StochasticEcho(Stage[T]):
    """Load fresh with probability ``p_t``, else reuse from a FIFO buffer; see
    :func:`stochastic_echo`.

    State: the buffer's items and the slot the next fresh item overwrites, the step count,
    whether the source ran out this epoch, the random state, the source's state and the stats.
    """

    STAGE_ID = STAGE_STOCHASTIC

    def __init__(
        self,
        source: Iterable[T],
        *,
        load_prob: LoadProb,
        buffer_size: int,
        seed: int | None = None,
        copy: bool = True,
    ) -> None:
        if not callable(load_prob):
            try:
                load_prob = check_probability(load_prob, name="load_prob")
            except TypeError as err:
                raise DataechoTypeError(
                    f"{err}, or a callable step -> probability such as "
                    f"dataecho.schedules.cosine_decreasing(1.0, 0.25, total_steps)"
                ) from None
        self.load_prob = load_prob
        self.buffer_size = _validate.buffer_size(
            buffer_size,
            low=1,
            hint="the buffer must hold at least the item just loaded; "
            "use buffer_size=1 to reuse only the latest fresh item",
        )
        super().__init__(source, seed=_validate.seed(seed))
        self.copy = bool(copy)
        # A constant p = 1 never reuses: skip the buffer and the copies it would need.
        self._reuses = callable(load_prob) or load_prob < 1.0
        self._buffer: list[Any] = []
        self._oldest = 0  # slot the next fresh item overwrites once the buffer is full
        self._step = 0  # items emitted since the stage was built, across epochs
        self._exhausted = False

    def _start_epoch(self) -> None:
        # The step count is kept: a schedule spans the whole run, not one epoch.
        self._buffer, self._oldest, self._exhausted = [], 0, False

    def _prob(self, step: int) -> float:
        if not callable(self.load_prob):
            return self.load_prob
        p = self.load_prob(step)
        # float first: type checkers take numbers.Real as unrelated to float.
        if isinstance(p, bool) or not isinstance(p, (float, numbers.Real)):
            raise DataechoTypeError(
                f"load_prob schedule {self.load_prob!r} returned {p!r} (type "
                f"{type(p).__name__}) at step {step}; it must return a float in (0, 1]"
            )
        if not 0.0 < p <= 1.0:  # NaN fails too
            raise DataechoValueError(
                f"load_prob schedule {self.load_prob!r} returned {p!r} at step {step}; it must "
                f"return a probability in (0, 1] at every step (0 never loads fresh data): "
                f"clamp its output or use a schedule from dataecho.schedules"
            )
        return float(p)

    def next(self) -> T:
        if self._exhausted:
            raise StopIteration
        p = self._prob(self._step)
        buf = self._buffer
        if not buf or self._rng.random() < p:
            try:
                item = self._pull()
            except StopIteration:
                # Stop at the first step that needs fresh data and finds none.
                self._exhausted = True
                raise
            self.stats.fresh_items += 1
            if self._reuses:
                if len(buf) < self.buffer_size:
                    buf.append(item)
                else:
                    buf[self._oldest] = item
                    self._oldest = (self._oldest + 1) % self.buffer_size
                if self.copy:
                    # The buffer keeps the pristine original for later reuses.
                    item = copy_item(item)
        else:
            item = buf[self._rng.randrange(len(buf))]
            if self.copy:
                item = copy_item(item)
        self._step += 1
        self.stats.items_out += 1
        return item

    def _get_stage_state(self) -> dict[str, Any]:
        # Packed (a copy), so a consumer changing an item later cannot change a saved state.
        return {
            "buffer": pack(self._buffer),
            "oldest": self._oldest,
            "step": self._step,
            "exhausted": self._exhausted,
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        self._buffer = unpack(state["buffer"])
        self._oldest = int(state["oldest"])
        self._step = int(state["step"])
        self._exhausted = bool(state["exhausted"])


def stochastic_echo(
    source: Iterable[T],
    *,
    load_prob: LoadProb,
    buffer_size: int,
    seed: int | None = None,
    copy: bool = True,
) -> StochasticEcho[T]:
    """Emit a fresh item with probability ``p_t``, else a random one of the recent fresh items.

    At step ``t`` (0-based count of items emitted, counted across epochs) the stage loads a fresh
    item with probability ``p_t``, stores it in a buffer of the last ``buffer_size`` fresh items
    (the oldest is evicted when full) and emits it; otherwise it emits an item drawn uniformly
    from the buffer. The first step of an epoch always loads, since its buffer is empty.
    Every fresh item is emitted at least once (when it is loaded); the mean reuse count is
    about ``1/p`` (``stats.realized_factor``).

    End of the source: the stream stops (``StopIteration``) at the first step that needs a fresh
    item and finds none; items still in the buffer are not drained.

    Args:
        source: any iterable of items (examples or whole batches) or a torchdata node.
        load_prob: a probability in (0, 1], or a callable ``step -> probability`` such as a
            schedule from :mod:`dataecho.schedules`; its output is checked at every step.
        buffer_size: how many recent fresh items may be reused (>= 1).
        seed: seed of the load/reuse draws (None: fresh entropy, recorded in the state).
        copy: emit independent copies (see :mod:`dataecho.stages.copying`); False emits the
            buffered objects themselves, safe only if the consumer never writes in place.

    Returns:
        A resumable iterator (a ``torchdata.nodes.BaseNode``) with ``.stats``,
        ``state_dict()`` and ``reset(state)``. Once an epoch ended, the next ``iter()`` (a
        new ``for`` loop) starts the next one over the source iterated anew.
    """
    return StochasticEcho(
        source, load_prob=load_prob, buffer_size=buffer_size, seed=seed, copy=copy
    )
