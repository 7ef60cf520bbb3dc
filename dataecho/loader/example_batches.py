"""Example echo at a fixed factor: echo, mix, copy (and augment), a batch at a time.

Both example points use it: ``before_augment`` hands it the transform, which runs on each copy;
``after_augment`` runs the transform before it, so the copies are identical. ``"auto"`` runs the
per-example chain instead (:mod:`dataecho.loader.points.examples`).

Why one node: run as a chain of per-example nodes (echo, shuffle buffer, transform, batcher),
every copy pays each node's call, a walk of its structure to copy it and a shuffle buffer's
draw, about ten times what copying and collating the copy cost. Here a fresh example enters
a buffer as its copies' entries (references to the one original: nothing is copied yet); each
batch takes its entries from the buffer at once (the buffer is kept in random order, so a batch is
its last entries: see :meth:`ExampleBatches._from_buffer`), and only then is each taken entry
copied, where it must be, and handed to the per-example transform. Per copy that leaves one
copy and the transform's call.

- **Counts**: exactly the echo stage's (:class:`~dataecho.stages.fixed_echo.Echo`, whose
  selection sampling and state this extends): every fresh example ``floor(factor)`` times, a
  fractional factor's extra copies a fixed number per epoch.
- **Order**: without a shuffle buffer (``shuffle_buffer`` 0 or 1) the copies of each fresh
  example follow one another and each is augmented as its batch is formed, as the per-example
  chain does. With one, each batch is a uniform draw without replacement from a buffer of at
  least ``shuffle_buffer + batch_size - 1`` entries (what a shuffle buffer of that size draws
  a batch from); at the end of the source the buffer drains. A batch holds at most one copy of
  an example while the buffer has others to give (a further one is swapped for a random entry
  of the buffer: :func:`_spread`).
- **Copies**: with ``copy``, every copy of an example echoed more than once is a new object
  (:func:`~dataecho.stages.copying.copy_item`) made from the pristine original, which never
  leaves the node itself; an example emitted once is passed on as it is.
- **Randomness**: the transform runs on the batch's copies while that batch is formed, so in
  the loader it draws inside the batch's seeded scope (:mod:`dataecho.loader.rng_scope`).
- **State**: the echo stage's, the buffer's entries (each original stored once, with the
  entries that refer to it), the buffer's generator and whether the source ended.

Items in: ``(read_number, example)``; out: lists of ``(read_number, copy)``, one per batch
(the last one shorter), as :class:`torchdata.nodes.Batcher` gives them to
:class:`~dataecho.loader.delivery.Delivery`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

import numpy as np

from dataecho.stages.copying import Plan, copy_items, copy_plan
from dataecho.stages.fixed_echo import Echo
from dataecho.stages.packing import pack, unpack
from dataecho.stages.seeds import STAGE_SHUFFLE, derive_seed
from dataecho.transforms import GuardedTransform

# One buffer entry: (read number, the original example, whether its copy must be a new object).
Entry = tuple[int, Any, bool]
_NUMBER = itemgetter(0)
_MIXED: Plan = ("mixed",)  # buffered originals of more than one copy plan


def _spread(taken: list[Entry], buffer: list[Entry], rng: np.random.Generator) -> None:
    """Swap each further copy of an example in ``taken`` for a uniformly drawn entry of the
    buffer whose example ``taken`` does not hold yet, so that no batch holds two copies of one
    example while the buffer has others to give. The copy goes to that entry's random place: it
    stays as far from its twin as the buffer puts copies (not the next batch's)."""
    held: set[int] = set()
    for i, entry in enumerate(taken):
        if entry[0] not in held:
            held.add(entry[0])
            continue
        # A few draws find one (the buffer holds mostly other examples); a scan settles the rest.
        tries = rng.integers(0, len(buffer), size=8) if buffer else ()
        j = next((int(j) for j in tries if buffer[j][0] not in held), None)
        if j is None:
            j = next((k for k in range(len(buffer)) if buffer[k][0] not in held), None)
        if j is None:  # only copies of examples the batch holds are left (an epoch's end)
            continue
        taken[i], buffer[j] = buffer[j], entry
        held.add(taken[i][0])


class ExampleBatches(Echo[Any]):
    """Batches of ``batch_size`` copies of ``source``'s tagged examples; see the module
    docstring. ``transform``: run on each copy (None: copies pass as they are)."""

    # "random_order": the buffer is saved in the random order its batches are taken from (its
    # last entries); a buffer of a version that took them from anywhere is refused.
    STATE_KEYS = ("buffer", "refs", "new", "exhausted", "draws", "random_order")
    STATE_HOLDS = "shuffle buffer in random order"

    def __init__(
        self,
        source: Iterable[Any],
        factor: float,
        *,
        batch_size: int,
        shuffle_buffer: int = 0,
        transform: Callable[[Any], Any] | None = None,
        seed: int | None = None,
        copy: bool = True,
        length: int | None = None,
        copies: int | None = None,
    ) -> None:
        super().__init__(source, factor, seed=seed, copy=copy, length=length, copies=copies)
        self.batch_size = int(batch_size)
        self.shuffle_buffer = int(shuffle_buffer)
        self.transform = transform
        self._entries: list[Entry] = []  # the buffer (with a shuffle buffer)
        self._exhausted = False
        self._draws: np.random.Generator | None = None
        self._saved_draws: dict[str, Any] | None = None  # a resumed state, until it is used
        # How the buffer's originals are copied (copy_plan, made as they enter, so a batch of
        # their copies is not checked again); None: no original to copy buffered yet.
        self._plan: Plan | None = None

    @property
    def mixing(self) -> bool:
        """Whether batches are drawn from a buffer (a shuffle buffer of more than one)."""
        return self.shuffle_buffer > 1

    def _start_epoch(self) -> None:
        super()._start_epoch()
        self._entries, self._exhausted = [], False
        self._draws, self._saved_draws = None, None
        self._plan = None

    def _read(self) -> tuple[Any, int] | None:
        """The next fresh tagged example and its number of copies; None at the source's end."""
        try:
            tagged = self._pull()
        except StopIteration:
            self._exhausted = True
            return None
        self.stats.fresh_items += 1
        return tagged, self._whole + int(self._draw_extra())

    def next(self) -> list[tuple[int, Any]]:
        taken = self._from_buffer() if self.mixing else self._in_order()
        if not taken:
            raise StopIteration
        self.stats.items_out += len(taken)
        numbers, items, new = zip(*taken, strict=True)
        # The copies made together (copy_items: one block, not an allocation per copy).
        plan = self._plan if self.mixing and self._plan is not _MIXED else None
        if all(new):  # every example echoed (an integer factor): copies only
            examples = copy_items(list(items), plan)
        elif any(new):
            copied_ones = [x for x, copied in zip(items, new, strict=True) if copied]
            copies = iter(copy_items(copied_ones, plan))
            examples = [next(copies) if copied else x for x, copied in zip(items, new, strict=True)]
        else:
            examples = list(items)
        transform = self.transform
        if isinstance(transform, GuardedTransform):  # the user's: one call for the batch
            examples = transform.apply(examples)
        elif transform is not None:
            examples = list(map(transform, examples))
        return list(zip(numbers, examples, strict=True))

    def _in_order(self) -> list[Entry]:
        """The next batch's entries in the echo stage's order: each example's copies in a row."""
        out: list[Entry] = []
        while len(out) < self.batch_size:
            if self._remaining == 0:
                if self._exhausted or (read := self._read()) is None:
                    break
                self._pending, self._copies = read
                self._remaining = self._copies
            n = min(self._remaining, self.batch_size - len(out))
            number, item = self._pending
            out += [(number, item, self._copies > 1 and self.copy)] * n
            self._remaining -= n
            if self._remaining == 0:
                self._pending = None
        return out

    def _from_buffer(self) -> list[Entry]:
        """The next batch's entries: the buffer's last, the buffer refilled first.

        The buffer is kept in uniformly random order: each new entry goes to a uniformly random
        place among those before it (an inside-out Fisher-Yates shuffle), so its last
        ``batch_size`` entries are a uniform draw without replacement, in random order, and
        taking them leaves the rest in random order. Per batch that is one numpy call and a
        swap per new entry; nothing scans the buffer.
        """
        entries = self._entries
        have = len(entries)
        added: list[Entry] = []
        to_copy: list[Any] = []  # the originals whose copies must be new objects
        while not self._exhausted and have + len(added) < self.shuffle_buffer + self.batch_size - 1:
            read = self._read()
            if read is not None:
                (number, item), copies = read
                new = copies > 1 and self.copy
                added += [(number, item, new)] * copies
                if new:
                    to_copy.append(item)
        if to_copy:
            self._admit(to_copy)
        if added:
            entries += added
            # j uniform in 0..i for the entry at i: floor(u * (i + 1)), u in [0, 1) (< i + 1).
            bounds = np.arange(have + 1, len(entries) + 1)
            places = (self._generator().random(len(added)) * bounds).astype(np.int64)
            for i, j in enumerate(places.tolist(), start=have):
                entries[i], entries[j] = entries[j], entries[i]
        size = min(self.batch_size, len(entries))
        taken = entries[len(entries) - size :]
        del entries[len(entries) - size :]
        if len(set(map(_NUMBER, taken))) < size:
            _spread(taken, entries, self._generator())
        if not entries:
            self._plan = None
        return taken

    def _admit(self, items: list[Any]) -> None:
        """Originals to copy enter the buffer: the buffer's plan is theirs, unless they differ."""
        plan = copy_plan(items)
        if self._plan is None:
            self._plan = plan
        elif self._plan != plan:  # copies of both kinds: each batch's are checked anew
            self._plan = _MIXED

    def _generator(self) -> np.random.Generator:
        if self._draws is None:
            self._draws = np.random.default_rng(derive_seed(self.seed, STAGE_SHUFFLE, self._epoch))
            if self._saved_draws is not None:
                self._draws.bit_generator.state = self._saved_draws
                self._saved_draws = None
        return self._draws

    def _get_stage_state(self) -> dict[str, Any]:
        # Each original once: its copies' entries refer to it by its place in `stored`. Built
        # with C-speed maps, not a loop per entry: a worker packs this with every snapshot.
        numbers, items, news = zip(*self._entries, strict=True) if self._entries else ((), (), ())
        keys = list(zip(numbers, map(id, items), strict=True))
        # Each key's (number, item), the keys in the order of their first entries.
        original = dict(zip(keys, zip(numbers, items, strict=True), strict=True))
        places = {key: place for place, key in enumerate(original)}
        return {
            **super()._get_stage_state(),
            "buffer": pack(list(original.values())),
            # Plain lists: the state's bookkeeping survives a JSON round trip.
            "refs": list(map(places.__getitem__, keys)),
            "new": list(news),
            "exhausted": self._exhausted,
            "draws": self._saved_draws if self._draws is None else self._draws.bit_generator.state,
            "random_order": True,  # the buffer's order is random: a batch is its last entries
        }

    def _load_stage_state(self, state: dict[str, Any]) -> None:
        super()._load_stage_state(state)
        stored = unpack(state["buffer"])
        self._entries = [
            (*stored[int(place)], bool(new))
            for place, new in zip(state["refs"], state["new"], strict=True)
        ]
        self._exhausted = bool(state["exhausted"])
        self._draws, self._saved_draws = None, state["draws"]
        originals = {id(item): item for _, item, new in self._entries if new}
        self._plan = None
        if originals:
            self._admit(list(originals.values()))
