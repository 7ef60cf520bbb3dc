"""The echo stage: emit each upstream item ``factor`` times on average (Choi et al. 2019).

A fractional factor repeats each item ``floor(factor)`` times plus once more with probability
``factor - floor(factor)``, drawn independently *per item* (a single draw for the whole dataset
is a known bug of one public implementation), so the mean is exactly ``factor``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeVar

from dataecho import _validate
from dataecho.stages.base import Stage
from dataecho.stages.copying import copy_item
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_ECHO

T = TypeVar("T")


class Echo(Stage[T]):
    """Repeat every item of ``source``; see :func:`echo`.

    State: the source's state after the item being echoed, that item (held pristine) and how
    many copies of it are still due, so a resume neither re-reads nor skips it.
    """

    STAGE_ID = STAGE_ECHO

    def __init__(
        self,
        source: Iterable[T],
        factor: float,
        *,
        seed: int | None = None,
        copy: bool = True,
    ) -> None:
        self.factor = _validate.echo_factor(factor)
        super().__init__(source, seed=_validate.seed(seed))
        self.copy = bool(copy)
        self._whole = math.floor(self.factor)
        self._extra_prob = self.factor - self._whole
        self._pending: Any = None
        self._copies = 0  # copies of _pending in all
        self._remaining = 0  # copies of _pending still to emit

    def _start_epoch(self) -> None:
        self._pending, self._copies, self._remaining = None, 0, 0

    def next(self) -> T:
        if self._remaining == 0:
            self._pending = self._pull()
            self.stats.fresh_items += 1
            extra = self._extra_prob > 0 and self._rng.random() < self._extra_prob
            self._copies = self._remaining = self._whole + int(extra)
        self._remaining -= 1
        self.stats.items_out += 1
        item = self._pending
        if self._copies > 1 and self.copy:
            # Every copy is a fresh object; the original stays pristine for the next ones.
            item = copy_item(item)
        if self._remaining == 0:
            self._pending = None
        return item

    def _get_stage_state(self) -> dict[str, Any]:
        pending = pack([self._pending] if self._remaining else [])
        return {"pending": pending, "copies": self._copies, "remaining": self._remaining}

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        pending = unpack(state["pending"])
        self._pending = pending[0] if pending else None
        self._copies = int(state["copies"])
        self._remaining = int(state["remaining"])


def echo(
    source: Iterable[T], factor: float, *, seed: int | None = None, copy: bool = True
) -> Echo[T]:
    """Iterate ``source`` emitting each item ``factor`` times on average.

    Args:
        source: any iterable of items (examples or whole batches) or a torchdata node.
        factor: echo factor >= 1; a fraction is drawn per item.
        seed: seed of the per-item draws (None: fresh entropy, recorded in the state).
        copy: emit independent copies of echoed items (see :mod:`dataecho.stages.copying`).

    Returns:
        A resumable iterator (a ``torchdata.nodes.BaseNode``) with ``.stats``,
        ``state_dict()`` and ``reset(state)``. Once an epoch ended, the next ``iter()`` (a
        new ``for`` loop) starts the next one over the source iterated anew.
    """
    return Echo(source, factor, seed=seed, copy=copy)
