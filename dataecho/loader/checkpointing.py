"""The loader's checkpoint: ``state_dict`` / ``load_state_dict``, the position they hold, and
the epoch a loaded position continues (``epoch``, ``next_epoch``, ``set_epoch``).

A state names the epoch, the position in it (the main-process chain's root state, which holds
the workers', and the batches handed out), the seed, the counts and, with a sampler, the order
the epoch is read in. An iterator dropped mid-epoch leaves its position with the loader, so a
state taken after that still holds it. :class:`LoaderCheckpoint` is the part of
:class:`~dataecho.loader.echoing_loader.EchoingDataLoader` that does this.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from dataecho import _validate
from dataecho.errors import DataechoValueError
from dataecho.loader.epoch_iterator import EpochIterator
from dataecho.loader.options import LoaderOptions
from dataecho.loader.pipeline import PipelineDataset
from dataecho.loader.reading import is_map_style, is_stateful
from dataecho.loader.workers import PersistentWorkers
from dataecho.stages import EchoStats


def finish_restored_pass(dataset: Any, saved: Any) -> None:
    """Restore an iterable dataset's state saved after its pass ended, so that its next
    ``iter()`` is the next pass. A state that restores the end of the pass itself (a position)
    is run to that end first, as it was before it was saved; one that restores the start of
    the next pass (an epoch counter) is restored again after the item that showed it."""
    dataset.load_state_dict(saved)
    try:
        next(iter(dataset))
    except StopIteration:
        return
    dataset.load_state_dict(saved)


class LoaderCheckpoint:
    """``state_dict`` / ``load_state_dict`` and the epoch properties of ``EchoingDataLoader``
    (a base class of it)."""

    dataset: Any
    options: LoaderOptions
    seed: int
    stats: EchoStats
    _epoch: int
    _pipeline: PipelineDataset
    _persistent: PersistentWorkers | None
    _current: weakref.ref[EpochIterator] | None
    _dropped: dict[str, Any] | None  # the position of a dropped iterator
    _resume: dict[str, Any] | None  # a loaded position not yet iterated
    _resume_asked: int | None
    num_workers: int

    # The loader's own, declared here for the methods below.
    @property
    def _iterator(self) -> EpochIterator | None:  # the epoch's iterator, if still referenced
        raise NotImplementedError

    def __len__(self) -> int:  # batches per epoch
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated; -1 before the first; ``e - 1`` after
        ``set_epoch(e)`` until the next ``iter()`` starts epoch ``e``."""
        return self._epoch

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter()`` runs: ``epoch + 1``, or ``epoch`` while a position
        loaded by ``load_state_dict`` has batches of it left (its state's ``"next_epoch"``),
        or what ``set_epoch`` asked for."""
        if self._resume is None:
            return self._epoch + 1
        asked = self._resume_asked
        return int(self._resume["next_epoch"]) if asked is None else asked

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch``, whose order, echo draws and
        augmentations come from the seed and the epoch, as a sampler's ``set_epoch`` does.
        Frameworks that count epochs themselves (HF ``Trainer``) call it before each one.

        Without it the next ``iter()`` runs ``loader.next_epoch``. A position loaded by
        ``load_state_dict`` in epoch ``p`` is kept: ``set_epoch(p)`` continues it (nothing is
        left of it at the epoch's end), and so does ``set_epoch(p + 1)`` when that position is
        the end of epoch ``p`` (a checkpoint taken after its last batch; otherwise the first
        ``next()`` raises). An epoch being iterated ends, as a new ``iter()`` ends it
        (frameworks keep the iterator of an epoch they cut at ``len(loader)``): its ``next()``
        raises ``RuntimeError``.
        """
        epoch = _validate.non_negative_int(epoch, name="epoch", hint="epochs count from 0")
        it = self._iterator
        if it is not None and it.started:
            it.supersede()
            self._current = None
        if self._resume is not None:
            resumed = self._epoch
            if epoch not in (resumed, resumed + 1):
                raise DataechoValueError(
                    f"set_epoch({epoch}) on a loader that holds a loaded position in epoch "
                    f"{resumed}: set_epoch({resumed}) continues it (set_epoch({resumed + 1}) if "
                    f"it was saved after the epoch's last batch); to start epoch {epoch} "
                    "instead, use a new loader"
                )
            self._resume_asked = epoch
            return
        # A dropped iterator's position belongs to the epoch being left.
        self._dropped = None
        self._epoch = epoch - 1

    def _live_position(self) -> dict[str, Any] | None:
        """The epoch in progress (live or dropped mid-epoch): its root's state and the batches
        handed out; else None."""
        it = self._iterator
        if it is not None and it.started:
            return None if it.finished else it.position()
        return self._dropped

    def _keep_dropped(self, position: dict[str, Any]) -> None:
        self._dropped = position

    def _ended_at(self, yielded: int) -> bool:
        """Whether ``yielded`` batches are a whole epoch, known where ``len`` is exact (a
        map-style dataset at a fixed factor); elsewhere only its end tells."""
        exact = is_map_style(self.dataset) and not self.options.adaptive
        return exact and yielded >= len(self)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly here: epoch, pipeline positions, RNGs, counts.

        ``"next_epoch"`` is the epoch the next ``iter()`` after loading it runs: ``"epoch"``
        while batches of it are left, ``"epoch" + 1`` once its last batch was handed out and
        that is known (see docs/faults-and-resume.md). Between epochs it holds the dataset's
        own state, if it keeps one."""
        if self._resume is not None:  # loaded but not yet iterated: hand the same state on
            return {**self._resume, "stats": self.stats.state_dict()}
        position = self._live_position()
        live = position is not None
        ended = position is None or self._ended_at(position["yielded"])
        state: dict[str, Any] = {
            "epoch": self._epoch,
            "next_epoch": self._epoch + 1 if ended else self._epoch,
            "seed": self.seed,
            "root": position["root"] if position is not None else None,
            "yielded": position["yielded"] if position is not None else 0,
            "stats": self.stats.state_dict(),
        }
        indices = self._pipeline.fields.indices if live else None  # a copy
        if indices is not None:
            state["indices"] = torch.from_numpy(indices)
        if not live and self._keeps_own_state():
            # Between epochs, the dataset's own state (a cache, an epoch counter) is kept, as
            # StatefulDataLoader keeps it: the next epoch starts from it.
            state["dataset"] = self.dataset.state_dict()
        return state

    def _keeps_own_state(self) -> bool:
        """Whether the state between epochs holds the dataset's own: a map-style dataset's,
        or an iterable one's read in this process (``num_workers=0``: with workers each reads
        a copy, as with StatefulDataLoader). A streaming library's dataset is told the
        loader's epoch instead (:mod:`dataecho.loader.streams`)."""
        dataset = self.dataset
        if not is_stateful(dataset) or self._pipeline.stream is not None:
            return False
        return is_map_style(dataset) or self.num_workers == 0

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next ``iter()`` continues where it stopped.

        The loader is then exactly as ``state`` says: an iterator still live ends (its
        ``next()`` raises ``RuntimeError``, as after a newer ``iter()``) and a position kept
        from a dropped one is forgotten."""
        it = self._iterator
        if it is not None:
            it.supersede()  # stops its workers too
        if self._persistent is not None:  # kept workers hold the old position: new ones resume
            self._persistent.stop()
        self._current, self._dropped = None, None
        self.seed = int(state["seed"])
        self.stats.load_state_dict(state["stats"])
        self._epoch = int(state["epoch"])
        self._resume = state if state["root"] is not None else None
        self._resume_asked = None
        if state.get("dataset") is not None:
            # Restored now, before iter(), so that a call made between (a set_epoch) applies.
            if is_map_style(self.dataset):
                self.dataset.load_state_dict(state["dataset"])
            else:
                finish_restored_pass(self.dataset, state["dataset"])
