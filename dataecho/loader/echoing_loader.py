"""``EchoingDataLoader``: a drop-in DataLoader with the echo stage at the insertion point you pick.

    loader = EchoingDataLoader(dataset, batch_size=128, echo_factor=2, where="before_augment",
                               shuffle_buffer=1024, transform=augment, num_workers=1, seed=0)
    for epoch in range(3):
        for images, labels in loader:
            ...
    print(loader.stats.realized_factor)

Workers, prefetching and their checkpoints come from ``torchdata``'s ``StatefulDataLoader``;
each worker runs a :mod:`dataecho.loader.pipeline` (read, echo, shuffle, augment, batch) and
batch echoing runs in the main process on the batches the workers deliver: on the host
(``where="batch"``) or on the training device after one copy there (``where="device"``, see
:mod:`dataecho.loader.device`). Each ``where``'s stages, on both sides, are put in order by
:mod:`dataecho.loader.chains`; the inner loader is set up by :mod:`dataecho.loader.inner`. The loader's epoch, its
iteration and its checkpoint (``state_dict``, ``load_state_dict``, ``set_epoch``) are here.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch
from torch.utils.data import Sampler, default_collate
from torchdata.nodes import BaseNode

from dataecho import _validate
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader.chains import (
    MAIN_PROCESS,
    close_chain,
)
from dataecho.loader.dataset_transform import warn_identical_copies
from dataecho.loader.device import as_current, resolve_device
from dataecho.loader.epoch_iterator import EpochIterator, EpochStart, WeakCall
from dataecho.loader.fresh_count import FreshCount
from dataecho.loader.inner import inner_loader, prefetch_depth
from dataecho.loader.length import epoch_batches, epoch_fresh_batches
from dataecho.loader.options import MAX_PREFETCH_FACTOR, LoaderOptions, loader_options
from dataecho.loader.pipeline import PipelineDataset, over_stream
from dataecho.loader.points.common import MainSide
from dataecho.loader.reading import finish_restored_pass, is_map_style, is_stateful
from dataecho.loader.upstream_loader import LoaderUpstream, check_loader_upstream, is_loader
from dataecho.loader.workers import PersistentWorkers, WorkersNode
from dataecho.stages import EchoStats
from dataecho.stages.seeds import derive_seed, fit_seed, resolve_seed

NO_BATCHES = (
    "an EchoingDataLoader forms its batches after the echo stage, so its batch_sampler has no "
    "batches to skip or re-batch (accelerate's skip_first_batches does that, and HF Trainer "
    "through it on a mid-epoch resume): resume the loader from its own state_dict() instead; "
    "under HF Trainer pass callbacks=[dataecho.frameworks.hf_trainer.LoaderStateCallback()], "
    "under accelerate call dataecho.frameworks.accelerate.register_loader(accelerator, loader)"
)


class EpochHook:
    """``loader.batch_sampler``: where frameworks that drive a DataLoader's epoch look for
    ``set_epoch`` (``loader.batch_sampler.set_epoch(e)``, as timm does, or
    ``loader.batch_sampler.sampler.set_epoch(e)``, as Lightning does): it calls the loader's
    :meth:`EchoingDataLoader.set_epoch`, so they set the epoch
    whose order and seeds the next ``iter()`` runs. It holds no batches: iterating it or taking
    its ``len`` raises ``DataechoTypeError``, naming the way to resume instead.
    """

    def __init__(self, loader: EchoingDataLoader) -> None:
        self.loader = loader

    @property
    def sampler(self) -> EpochHook:
        """Itself: ``batch_sampler.sampler.set_epoch`` reaches the loader too."""
        return self

    def set_epoch(self, epoch: int) -> None:
        """``loader.set_epoch(epoch)``."""
        self.loader.set_epoch(epoch)

    def __bool__(self) -> bool:  # truthy as a batch sampler, whatever __len__ says
        return True

    def __iter__(self) -> Iterator[Any]:
        raise DataechoTypeError(NO_BATCHES)

    def __len__(self) -> int:
        raise DataechoTypeError(NO_BATCHES)

    def __repr__(self) -> str:
        return f"<EpochHook: set_epoch of {type(self.loader).__name__} at {id(self.loader):#x}>"


class EchoingDataLoader:
    """``torch.utils.data.DataLoader`` with data echoing; see the module docstring.

    The DataLoader arguments mean what they mean there; the echo arguments are keyword-only.
    Where echoing forces a difference from DataLoader, it is listed here:

    =====================  ==================================================================
    DataLoader             EchoingDataLoader
    =====================  ==================================================================
    ``len(loader)``        batches an epoch yields, echoed ones included (exact and the same
                           every epoch at a fixed factor, whatever the workers; an upper bound
                           for ``"auto"``)
    ``batch_size=None``    refused: the echo stage forms the batches
    ``batch_sampler``      refused: batches are formed after echoing; pass ``sampler`` and
                           ``batch_size`` instead. The attribute is an :class:`EpochHook`:
                           its ``set_epoch`` is the loader's (frameworks call it there)
    ``persistent_workers`` kept across epochs, as there (each epoch's order and seeds reach
                           them in shared memory); also stopped by ``close()`` and
                           ``load_state_dict``; restarted for a sampler's order longer than
                           any before
    ``drop_last``          as there without echoing. Echoing, no example loses every copy: a
                           map-style dataset's copies are rounded to whole batches, and a
                           short fresh batch for batch echoing is filled with copies of its
                           own examples (:mod:`dataecho.loader.remainders`)
    ``num_workers > 0``    a map-style dataset's epoch order is strided over the workers:
                           each example is read once, by one worker, and echoed there; the
                           workers' last short batches are batched together, so the epoch's
                           batches and ``len`` are the same for any ``num_workers``
    ``shuffle=True``       a new seeded order each epoch; ``seed`` (else ``generator``, else
                           torch's global RNG, drawn once here) fixes it
    ranks                  without a ``sampler``, each rank reads its own share (rank from an
                           initialised process group, else ``RANK``/``WORLD_SIZE``); with one
                           (``DistributedSampler``), the sampler's share, never split again
    ``pin_memory``         with ``where="device"`` on CUDA, on whatever is passed: each fresh
                           batch is copied from pinned memory to ``echo_device`` once, and echoed
                           there (:mod:`dataecho.loader.device`)
    several iterators      a new ``iter()`` (or ``load_state_dict``) ends the previous one:
                           its ``next()`` raises ``RuntimeError`` (the state belongs to one
                           epoch at a time)
    =====================  ==================================================================

    Augmentation in the dataset: with ``where="before_augment"`` (the default), echoing on and
    neither ``transform=`` nor ``batch_transform=`` given, a dataset that augments in
    ``__getitem__`` through a torchvision-style ``transform`` / ``target_transform`` /
    ``transforms`` attribute, or a Hugging Face ``datasets.Dataset`` through ``set_transform``
    / ``with_transform``, is read with that transform off (through a copy: the dataset passed
    here is left as it is), and its transform runs on each copy, seeded and resumed as
    ``transform=`` is (:mod:`dataecho.loader.dataset_transform`). Given ``transform=``, the
    dataset's own transform stays in ``__getitem__`` (once per fresh read) and ``transform=``
    runs on each copy. Any other dataset's copies are identical, and the loader warns once
    (``IdenticalCopiesWarning``) unless ``where="after_augment"`` says they are meant to be.

    Echo args (keyword-only): each of :class:`~dataecho.loader.options.LoaderOptions`' fields
    (``echo_factor``, ``max_echo_factor``, ``reuse_buffer``, ``reuse_policy``, ``where``,
    ``shuffle_buffer``, ``transform``, ``batch_transform``, ``copy``, ``read_ahead``,
    ``echo_device``, ``device_transform``), with the meaning and default its help gives; None (the
    default here) takes that default. Or pass them all at once:

        options: a :class:`~dataecho.loader.options.LoaderOptions`, instead of the echo
            keywords. ``batch_size``, ``shuffle`` and ``drop_last`` then come from it; given
            here as well, they must agree with it.
        seed: one pipeline seed; every stage, worker and epoch derives its own from it.
        snapshot_every_n_steps: how often workers send their state (``StatefulDataLoader``);
            None: about once per shuffle buffer's worth of batches (every batch for "auto"
            with workers, whose replay would not repeat the same reuse decisions: a longer
            interval there makes a resume repeat some examples and skip others).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        echo_factor: float | str | None = None,
        max_echo_factor: float | None = None,
        reuse_buffer: int | None = None,
        reuse_policy: str | None = None,
        where: str | None = None,
        shuffle_buffer: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        seed: int | None = None,
        copy: bool | None = None,
        read_ahead: int | None = None,
        echo_device: str | torch.device | None = None,
        device_transform: Callable[..., Any] | None = None,
        snapshot_every_n_steps: int | None = None,
        options: LoaderOptions | None = None,
    ) -> None:
        echo = dict(echo_factor=echo_factor, max_echo_factor=max_echo_factor,
                    reuse_buffer=reuse_buffer, reuse_policy=reuse_policy, where=where,
                    shuffle_buffer=shuffle_buffer, transform=transform,
                    batch_transform=batch_transform, copy=copy, read_ahead=read_ahead,
                    echo_device=echo_device, device_transform=device_transform)  # fmt: skip
        self.num_workers = _validate.non_negative_int(
            num_workers, name="num_workers", hint="use 0 to read in the main process",
            high=_validate.MAX_WORKERS, why=_validate.WORKERS_WHY,
        )  # fmt: skip
        timeout = _validate.timeout(timeout)
        if timeout and not self.num_workers:
            raise DataechoValueError(
                f"timeout={timeout:g} limits the wait for a worker's batch, but num_workers=0 "
                "reads in the main process (torch's DataLoader asserts there); pass "
                "num_workers >= 1, or timeout=0"
            )
        if prefetch_factor is not None:
            prefetch_factor = _validate.positive_int(
                prefetch_factor, name="prefetch_factor", high=MAX_PREFETCH_FACTOR,
                why="batches each worker keeps in flight, all held in memory; DataLoader's "
                "default is 2, or leave it None for the loader's own",
            )  # fmt: skip
        self.options = options = loader_options(
            dataset, options, echo, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
            sampler=sampler, batch_sampler=batch_sampler, persistent_workers=persistent_workers,
            num_workers=self.num_workers,
        )  # fmt: skip
        if is_loader(dataset):  # the user's own loader: its batches are the upstream
            check_loader_upstream(dataset, options, self.num_workers)
        # DataLoader's attributes, as Lightning and other frameworks read them.
        self.dataset = dataset
        self.batch_size = self.options.batch_size
        self.drop_last = self.options.drop_last
        self.sampler = sampler  # the user's, or None; batch_sampler: the property below
        self.collate_fn = collate_fn or default_collate
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.persistent_workers = bool(persistent_workers)
        self.in_order = in_order
        # Without a seed, draw one as DataLoader draws its base seed: from ``generator``, else
        # torch's global RNG, so torch.manual_seed(...) makes the run reproducible.
        if seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        self.seed = fit_seed(resolve_seed(_validate.seed(seed)))
        self.stats = EchoStats()
        opts = self.options
        # where="device": the device batches are echoed on (checked here, where it must exist).
        # LoaderOptions derives opts.echo_device for where="device": it is a str there.
        self._device = resolve_device(cast(str, opts.echo_device)) if opts.point.on_device else None
        self._pipeline = PipelineDataset(
            dataset, opts, self.collate_fn, persistent_workers=self.persistent_workers
        )
        self.prefetch_factor = prefetch_depth(self._pipeline, self.num_workers, prefetch_factor)
        self._inner = inner_loader(
            self._pipeline, num_workers=self.num_workers, seed=self.seed,
            prefetch_factor=self.prefetch_factor, snapshot_every_n_steps=snapshot_every_n_steps,
            pin_memory=pin_memory, device=self._device,
            persistent_workers=self.persistent_workers, worker_init_fn=worker_init_fn,
            timeout=timeout, multiprocessing_context=multiprocessing_context,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )  # fmt: skip
        # persistent_workers: the workers, held here and by each epoch's chain.
        self._persistent = (
            PersistentWorkers(self._inner, self._pipeline.fields)
            if self.persistent_workers
            else None
        )
        self._epoch = -1
        # The epoch's iterator, held weakly: dropping it (or this loader) stops its workers;
        # persistent ones stop once both are gone.
        self._current: weakref.ref[EpochIterator] | None = None
        self._dropped: dict[str, Any] | None = None  # the position of a dropped iterator
        self._resume: dict[str, Any] | None = None
        # set_epoch(p) or set_epoch(p + 1) over a loaded position of epoch p, else None: with
        # p + 1 that position must be p's end.
        self._resume_asked: int | None = None
        self._checked_copies = False  # whether the identical-copies warning was considered

    @property
    def batch_sampler(self) -> EpochHook:
        """An :class:`EpochHook` (a new one each read, so the loader holds no cycle that would
        keep it and its workers alive): ``set_epoch`` reaches the loader from where frameworks
        call it on a DataLoader's batch sampler; ``sampler`` stays the user's (or None), as
        Lightning and accelerate read it."""
        return EpochHook(self)

    def drain(self) -> bool:
        """End the run's reading here, for a stop at a budget of fresh examples: the batches
        that follow hold only the copies still due of the examples already counted fresh (the
        echo stage's, a shuffle buffer's, the device's pool's), so each is trained on as often
        as the factor says; then iteration stops without ending the epoch, and ``state_dict()``
        keeps what was not delivered, for a resumed run. Where copies wait in the main
        process: ``where="batch"`` or ``"device"`` (not "auto" without a buffer, which reuses
        rather than owes). Returns False, changing nothing, elsewhere (the copies wait in the
        workers) and before an epoch has started: call it between batches.
        """
        it = self._iterator
        return it is not None and it.drain()

    @property
    def drained(self) -> bool:
        """Whether a :meth:`drain` has emitted every copy it owed."""
        it = self._iterator
        return it is not None and it.drained

    def __len__(self) -> int:
        """Batches one epoch yields, the same every epoch: for a map-style dataset, exact at a
        fixed factor (a fractional one gives a fixed number of items the extra copy), at most
        this many for "auto"; for an iterable dataset, from its ``len`` as DataLoader does
        (``TypeError`` without one)."""
        return epoch_batches(self)

    @property
    def _iterator(self) -> EpochIterator | None:
        """The epoch's iterator, if it is still referenced."""
        return self._current() if self._current is not None else None

    @_iterator.setter
    def _iterator(self, value: None) -> None:
        # Frameworks reset DataLoader._iterator to None to stop its workers (Lightning, at the
        # end of fit; persistent ones too, as DataLoader's): stop them, and keep the epoch's
        # position for state_dict().
        if value is not None:
            raise ValueError("EchoingDataLoader._iterator can only be reset to None")
        it = self._iterator
        if it is not None:
            if it.started and not it.finished:
                self._keep_dropped(it.position())
            it.supersede()
        self._current = None
        if self._persistent is not None:
            self._persistent.stop()

    def __iter__(self) -> Iterator[Any]:
        """An iterator over the next epoch (or the resumed one). The epoch starts at its first
        ``next()``: an iterator made and dropped unused (as frameworks do to check that a loader
        is iterable) starts no workers and uses up no epoch."""
        if self._iterator is not None:
            self._iterator.supersede()
        it = EpochIterator(self.stats, self._start_epoch, WeakCall(self, "_keep_dropped"))
        self._current = weakref.ref(it)
        return it

    def _start_epoch(self) -> EpochStart:
        """Start the epoch: its chain, workers node, counting stage (whose fresh batches count
        once handed on, or None), its count so far, and a first batch already taken (a resumed
        one)."""
        if not self._checked_copies:
            self._checked_copies = True
            warn_identical_copies(self.dataset, self.options)
        self._dropped = None
        resume, self._resume = self._resume, None
        asked, self._resume_asked = self._resume_asked, None
        must_end = asked == self._epoch + 1
        if resume is None:
            self._epoch += 1
        saved = resume.get("indices") if resume is not None else None
        self._pipeline.fields.prepare(self._epoch, self.seed, self.sampler, saved)
        if self._pipeline.stream is not None:
            self._pipeline.stream.start_epoch(self._epoch)
        root, count, counting = self._build_root()
        with as_current(self._device):  # the pin thread's device (loader/device.py)
            root.reset(resume["root"] if resume else None)
        count.start(counting)
        if resume is None:
            return EpochStart(root, count, [])
        try:
            first = next(root)
        except StopIteration:
            close_chain(root)
            if (resume["next_epoch"] if asked is None else asked) > self._epoch:
                # Saved after the epoch's last batch, and said so (or set_epoch asked for the
                # next one): go on with the next epoch, as torchdata.nodes.Loader does.
                return self._start_epoch()
            # This epoch was named (by the state, its end not yet known, or by set_epoch):
            # its rest is empty.
            raise StopIteration from None
        if must_end:
            close_chain(root)
            # Still loaded, as it was: set_epoch(its epoch) continues it.
            self._resume = resume
            self.stats.load_state_dict(resume["stats"])
            raise RuntimeError(
                f"set_epoch({self._epoch + 1}) was called, but the position loaded in epoch "
                f"{self._epoch} has batches of that epoch left: call "
                f"set_epoch({self._epoch}) to finish it first"
            )
        return EpochStart(root, count, [first], resume["yielded"])

    def _build_root(self) -> tuple[BaseNode[Any], FreshCount, BaseNode[Any] | None]:
        """The main-process chain (the insertion point's ``main_stages``), the epoch's
        fresh count, and its counting stage (or None)."""
        opts = over_stream(self.options, self._pipeline.stream)
        count = FreshCount(self.stats, **opts.point.counting(opts))
        workers: WorkersNode | LoaderUpstream
        if is_loader(self.dataset):
            workers = LoaderUpstream(self.dataset, count)
        else:
            workers = WorkersNode(self._inner, self._pipeline, count, persistent=self._persistent)
        # Each rank draws its own main-process randomness (the device's augmentation and pool,
        # batch echoing's choices), as each rank's workers draw their own.
        epoch, rank = self._epoch, self._pipeline.fields.rank
        # Pinned by the inner loader, or by a DataLoader passed as the dataset.
        pins = self.pin_memory or bool(getattr(self.dataset, "pin_memory", False))
        side = MainSide(self._device, lambda: epoch_fresh_batches(self),
                        pinned=pins and torch.cuda.is_available())  # fmt: skip
        seeds = lambda stage: derive_seed(self.seed, epoch, MAIN_PROCESS, rank, stage)  # noqa: E731
        root, counting = opts.point.main_stages(workers, opts, seeds, side)
        return root, count, counting

    # The checkpoint: the position it holds, and the epoch a loaded position continues. A
    # state names the epoch, the position in it (the main-process chain's root state, which
    # holds the workers', and the batches handed out), the seed, the counts and, with a
    # sampler, the order the epoch is read in. An iterator dropped mid-epoch leaves its
    # position with the loader, so a state taken after that still holds it.

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

    def close(self) -> None:
        """Stop the workers now: done at the end of each epoch too, except with
        ``persistent_workers``, whose workers stop here (or when the loader is collected)."""
        it = self._iterator
        if it is not None:
            it.close()
        if self._persistent is not None:
            self._persistent.stop()

    def __enter__(self) -> EchoingDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
