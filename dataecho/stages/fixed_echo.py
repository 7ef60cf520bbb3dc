"""The echo stage: emit each upstream item ``factor`` times on average (Choi et al. 2019).

A fractional factor repeats each item ``floor(factor)`` times, and a fixed number of the
epoch's ``n`` items once more: exactly ``floor(frac * n + 1/2)`` of them, ``frac`` being
``factor - floor(factor)`` (the factor read as the decimal it prints as, so 2.3 x 5 items is
11.5, which gives 12 copies). Which items get the extra copy is a seeded draw, uniform over the
subsets of that size: sequential selection sampling (item ``i`` gets it with probability
``extra_left / (n - i)``), which is resumable from two counters. So every epoch has the same
number of copies, and a training loop that reads ``len`` once sees every epoch whole.

A loader that shares one count out over its workers gives each worker's stage its part as
``copies`` (with ``length``): each item ``copies // length`` times, ``copies % length`` of them
once more, drawn as above.

``n`` is the stage's ``length``, else ``len(source)`` (a list, a sized Dataset, a DataLoader's
batch count), taken at each epoch's start. Items beyond ``n`` (a source longer than said) get
no extra copy; a shorter one leaves some extra copies out. With ``n`` unknown (a stream, a
generator), the extra copies are spread evenly from a seeded start ``u`` in [0, 1): item ``i``
(from 0) gets one when ``frac * (i + 1) + u`` passes a whole number that ``frac * i + u`` had
not, so any epoch of ``n`` items gets ``floor(frac * n)`` or ``ceil(frac * n)`` of them,
whatever ``n`` turns out to be: the count cannot drift from epoch to epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, TypeVar

from dataecho import _validate
from dataecho.errors import DataechoValueError
from dataecho.stages.base import Stage
from dataecho.stages.copying import copy_item, copy_pinned
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_ECHO

T = TypeVar("T")


def extra_copies(factor: float, n: int) -> int:
    """How many of ``n`` items get the extra copy at ``factor``: ``floor(frac * n + 1/2)``.

    Exact rational arithmetic on the factor as it prints (``repr``), so the tie 2.3 x 5 =
    11.5 rounds up as it would by hand, not down as the binary float 2.2999... would."""
    frac = Fraction(repr(float(factor))) % 1
    return math.floor(frac * n + Fraction(1, 2))


def epoch_copies(factor: float, n: int) -> int:
    """The items an echo stage at ``factor`` emits for an epoch of ``n`` fresh ones."""
    return n * math.floor(factor) + extra_copies(factor, n)


def known_length(source: object) -> int | None:
    """``len(source)``, or None where it has none (a generator, an unsized iterable dataset)."""
    try:
        return len(source)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None  # no __len__, or one that refuses (a DataLoader over an unsized stream)


def _split_count(copies: int, length: int | None) -> tuple[int, int]:
    """An epoch's ``copies`` of ``length`` items as (copies of each, items with one more)."""
    if length is None:
        raise DataechoValueError(
            f"copies={copies} without a length: the copies of an epoch are shared out over "
            "its items; pass length= (the items one epoch of the source has)"
        )
    copies = _validate.non_negative_int(
        copies, name="copies", hint="pass the copies one epoch of `length` items yields"
    )
    if length == 0:
        return 1, 0
    whole, extra = divmod(copies, length)
    if whole < 1:
        raise DataechoValueError(
            f"copies={copies} for length={length}: each item is emitted at least once, so "
            f"an epoch has at least {length} copies; pass copies >= length"
        )
    return whole, extra


class Echo(Stage[T]):
    """Repeat every item of ``source``; see :func:`echo`.

    State: the source's state after the item being echoed, that item (held pristine), how many
    copies of it are still due, and the selection's two counters (items of the epoch not yet
    drawn for, extra copies still to give; None and 0 when the length is unknown), so a resume
    neither re-reads nor skips an item and gives the same extra copies.

    ``pinned``: a copy of a pinned tensor is pinned too (:func:`~dataecho.stages.copy_pinned`;
    main process only).
    """

    STAGE_ID = STAGE_ECHO
    STATE_KEYS: tuple[str, ...] = (
        "pending", "copies", "remaining", "unseen", "extra_left", "seen", "phase",
    )  # fmt: skip

    def __init__(
        self,
        source: Iterable[T],
        factor: float,
        *,
        seed: int | None = None,
        copy: bool = True,
        length: int | None = None,
        copies: int | None = None,
        pinned: bool = False,
    ) -> None:
        self.factor = _validate.echo_factor(factor)
        if length is not None:
            length = _validate.non_negative_int(
                length,
                name="length",
                hint="pass the number of items one epoch of the source has, or None to take "
                "len(source)",
            )
        super().__init__(source, seed=_validate.seed(seed))
        self.copy = bool(copy)
        self._copy_item = copy_pinned if pinned else copy_item
        self.length = length
        self._sized = source  # what len() is asked of, each epoch, when length is None
        self._whole = math.floor(self.factor)
        self._extra_prob = self.factor - self._whole
        self._extra_count: int | None = None  # the extra copies of an epoch of `length`
        if copies is not None:
            self._whole, self._extra_count = _split_count(copies, length)
        self._pending: Any = None
        self._copies = 0  # copies of _pending in all
        self._remaining = 0  # copies of _pending still to emit
        self._unseen: int | None = None  # items of the epoch not drawn for yet (None: unknown)
        self._extra_left = 0  # extra copies still to give among them
        # Length unknown: items drawn for so far, and the seeded start of the even spread.
        self._seen = 0
        self._phase = 0.0
        self._draining = False  # drain(): nothing more is read

    def _start_epoch(self) -> None:
        self._pending, self._copies, self._remaining = None, 0, 0
        self._draining = False
        n = self.length if self.length is not None else known_length(self._sized)
        self._unseen = n
        if n is None:
            self._extra_left = 0
        elif self._extra_count is not None and n == self.length:
            self._extra_left = self._extra_count
        else:
            self._extra_left = extra_copies(self.factor, n)
        self._seen = 0
        self._phase = self._rng.random() if n is None else 0.0

    def _draw_extra(self) -> bool:
        """Whether the item just read gets the extra copy."""
        if self._unseen is None:  # length unknown: spread evenly from the seeded start
            i, self._seen = self._seen, self._seen + 1
            frac, u = self._extra_prob, self._phase
            return math.floor(frac * (i + 1) + u) > math.floor(frac * i + u)
        if self._unseen == 0:  # beyond the epoch's length: no extra copy
            return False
        left, unseen = self._extra_left, self._unseen
        # Selection sampling: with k of the remaining m to choose, this one is chosen with
        # probability k / m, which makes every subset of the epoch's size equally likely.
        extra = left == unseen or (left > 0 and self._rng.random() * unseen < left)
        self._unseen, self._extra_left = unseen - 1, left - int(extra)
        return extra

    @property
    def copies_due(self) -> int:
        """Copies of the item last read still to emit."""
        return self._remaining

    def drain(self) -> None:
        """Read nothing more: emit the copies still due of the item last read, then stop
        (:attr:`drained`) without ending the epoch."""
        self._draining = True

    @property
    def drained(self) -> bool:
        return self._draining and self._remaining == 0

    def next(self) -> T:
        if self._remaining == 0:
            self._pending = self._pull()
            self.stats.fresh_items += 1
            self._copies = self._remaining = self._whole + int(self._draw_extra())
        self._remaining -= 1
        self.stats.items_out += 1
        item = self._pending
        if self._copies > 1 and self.copy:
            # Every copy is a fresh object; the original stays pristine for the next ones.
            item = self._copy_item(item)
        if self._remaining == 0:
            self._pending = None
        return item

    def _get_stage_state(self) -> dict[str, Any]:
        pending = pack([self._pending] if self._remaining else [])
        return {
            "pending": pending,
            "copies": self._copies,
            "remaining": self._remaining,
            "unseen": self._unseen,
            "extra_left": self._extra_left,
            "seen": self._seen,
            "phase": self._phase,
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        pending = unpack(state["pending"])
        self._pending = pending[0] if pending else None
        self._copies = int(state["copies"])
        self._remaining = int(state["remaining"])
        self._unseen = None if state["unseen"] is None else int(state["unseen"])
        self._extra_left = int(state["extra_left"])
        self._seen = int(state["seen"])
        self._phase = float(state["phase"])


def echo(
    source: Iterable[T],
    factor: float,
    *,
    seed: int | None = None,
    copy: bool = True,
    length: int | None = None,
) -> Echo[T]:
    """Iterate ``source`` emitting each item ``factor`` times (see the module docstring).

    Args:
        source: any iterable of items (examples or whole batches) or a torchdata node.
        factor: echo factor >= 1. A fraction gives exactly ``floor(frac * n + 1/2)`` of an
            epoch's ``n`` items one copy more, a seeded choice uniform over the items.
        seed: seed of the draws (None: fresh entropy, recorded in the state).
        copy: emit independent copies of echoed items (see :mod:`dataecho.stages.copying`).
        length: items in one epoch of ``source`` (None: ``len(source)`` at each epoch's start
            where it has one; else each item draws its extra copy on its own, and the count
            per epoch varies around the mean). Items beyond it get no extra copy.

    Returns:
        A resumable iterator (a ``torchdata.nodes.BaseNode``) with ``.stats``,
        ``state_dict()`` and ``reset(state)``. Once an epoch ended, the next ``iter()`` (a
        new ``for`` loop) starts the next one over the source iterated anew.
    """
    return Echo(source, factor, seed=seed, copy=copy, length=length)
