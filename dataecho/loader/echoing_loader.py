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
:mod:`dataecho.loader.device`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Sampler, default_collate
from torchdata.nodes import BaseNode
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho import _validate
from dataecho.loader.dataset_transform import warn_identical_copies
from dataecho.loader.device import DeviceTransform, ToDevice, resolve_device
from dataecho.loader.epoch_iterator import EpochIterator, EpochStart, WeakCall
from dataecho.loader.length import epoch_batches, fresh_batches
from dataecho.loader.lifetime import DieWithParent
from dataecho.loader.options import (
    MAX_PREFETCH_FACTOR,
    LoaderOptions,
    check_dataloader_arguments,
    check_options_alone,
    default_prefetch,
)
from dataecho.loader.pipeline import (
    MAIN_PROCESS,
    PipelineDataset,
    close_chain,
    echo_stage,
    unwrap_identity,
)
from dataecho.loader.reading import data_parallel_rank, is_map_style, is_stateful
from dataecho.loader.snapshots import snapshot_interval
from dataecho.loader.workers import PersistentWorkers, WorkersNode
from dataecho.stages import EchoStats, MixExamples, Shuffle
from dataecho.stages.seeds import (
    STAGE_ECHO,
    STAGE_MIX,
    STAGE_SHUFFLE,
    STAGE_TRANSFORM,
    derive_seed,
    resolve_seed,
)


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
                           ``batch_size`` instead
    ``persistent_workers`` kept across epochs, as there (each epoch's order and seeds reach
                           them in shared memory); also stopped by ``close()`` and
                           ``load_state_dict``; restarted for a sampler's order longer than
                           any before
    ``drop_last``          drops each worker's last short batch (as with an iterable dataset)
    ``num_workers > 0``    a map-style dataset's epoch order is strided over the workers:
                           each example is read once, by one worker, and echoed there
    ``shuffle=True``       a new seeded order each epoch; ``seed`` (else ``generator``, else
                           torch's global RNG, drawn once here) fixes it
    ranks                  without a ``sampler``, each rank reads its own share (rank from an
                           initialised process group, else ``RANK``/``WORLD_SIZE``); with one
                           (``DistributedSampler``), the sampler's share, never split again
    ``pin_memory``         with ``where="device"`` on CUDA, on whatever is passed: each fresh
                           batch is copied from pinned memory to ``device`` once, and echoed
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
    ``device``, ``device_transform``), with the meaning and default its help gives; None (the
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
        device: str | torch.device | None = None,
        device_transform: Callable[..., Any] | None = None,
        snapshot_every_n_steps: int | None = None,
        options: LoaderOptions | None = None,
    ) -> None:
        echo = dict(echo_factor=echo_factor, max_echo_factor=max_echo_factor,
                    reuse_buffer=reuse_buffer, reuse_policy=reuse_policy, where=where,
                    shuffle_buffer=shuffle_buffer, transform=transform,
                    batch_transform=batch_transform, copy=copy, read_ahead=read_ahead,
                    device=device, device_transform=device_transform)  # fmt: skip
        self.num_workers = _validate.non_negative_int(
            num_workers, name="num_workers", hint="use 0 to read in the main process",
            high=_validate.MAX_WORKERS, why=_validate.WORKERS_WHY,
        )  # fmt: skip
        if prefetch_factor is not None:
            prefetch_factor = _validate.positive_int(
                prefetch_factor, name="prefetch_factor", high=MAX_PREFETCH_FACTOR,
                why="batches each worker keeps in flight, all held in memory; DataLoader's "
                "default is 2, or leave it None for the loader's own",
            )  # fmt: skip
        if options is None:
            check_dataloader_arguments(
                dataset, batch_size, shuffle, sampler, batch_sampler, persistent_workers,
                self.num_workers,
            )  # fmt: skip
            given: dict[str, Any] = {k: v for k, v in echo.items() if v is not None}
            options = LoaderOptions(
                batch_size=cast(int, batch_size),  # None was refused just above
                shuffle=bool(shuffle), drop_last=bool(drop_last), **given,
            )  # fmt: skip
        else:
            check_options_alone(options, echo, batch_size=batch_size, shuffle=shuffle,
                                drop_last=drop_last)  # fmt: skip
            check_dataloader_arguments(
                dataset, options.batch_size, options.shuffle, sampler, batch_sampler,
                persistent_workers, self.num_workers,
            )  # fmt: skip
        self.options = options
        # DataLoader's attributes, as Lightning and other frameworks read them.
        self.dataset = dataset
        self.batch_size = self.options.batch_size
        self.drop_last = self.options.drop_last
        self.sampler = sampler
        self.batch_sampler = None
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
        self.seed = resolve_seed(_validate.seed(seed))
        self.stats = EchoStats()
        opts = self.options
        if prefetch_factor is None and self.num_workers:
            prefetch_factor = default_prefetch(opts)
        self.prefetch_factor = prefetch_factor
        if snapshot_every_n_steps is None:
            snapshot_every_n_steps = snapshot_interval(opts, self.num_workers, prefetch_factor)
        # where="device": the device batches are echoed on (checked here, where it must exist).
        # LoaderOptions derives opts.device for where="device": it is a str there.
        self._device = resolve_device(cast(str, opts.device)) if opts.where == "device" else None
        # The copies to CUDA read pinned memory, pinned by the inner loader's own thread.
        pin = pin_memory or (self._device is not None and self._device.type == "cuda")
        self._pipeline = PipelineDataset(
            dataset, opts, self.collate_fn, persistent_workers=self.persistent_workers
        )
        # Pinning happens before our main-process code sees a batch: keep tensors for it.
        self._pipeline.pipe_small_batches = not pin
        with warnings.catch_warnings():
            # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on.
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            self._inner = StatefulDataLoader(
                self._pipeline,
                batch_size=None,
                num_workers=self.num_workers,
                collate_fn=unwrap_identity,
                pin_memory=pin,
                timeout=timeout,
                worker_init_fn=DieWithParent(worker_init_fn),
                multiprocessing_context=multiprocessing_context,
                # The workers' base seed comes from the pipeline seed, not from torch's global
                # RNG, which belongs to the training loop.
                generator=torch.Generator().manual_seed(self.seed),
                prefetch_factor=prefetch_factor,
                pin_memory_device=pin_memory_device,
                in_order=in_order,
                snapshot_every_n_steps=snapshot_every_n_steps,
                persistent_workers=self.persistent_workers,
            )
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
                raise ValueError(
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
        """Start the epoch: its chain, workers node, the stage that counts fresh batches handed
        out (or None), its count so far, and a first batch already taken (a resumed one)."""
        if not self._checked_copies:
            self._checked_copies = True
            warn_identical_copies(self.dataset, self.options)
        self._dropped = None
        resume, self._resume = self._resume, None
        asked, self._resume_asked = self._resume_asked, None
        must_end = asked == self._epoch + 1
        if resume is None:
            self._epoch += 1
        self._prepare_epoch(resume)
        root, workers, reader = self._build_root()
        root.reset(resume["root"] if resume else None)
        settled = reader.stats.fresh_items if reader is not None else 0
        workers.replaying(getattr(reader, "replayed_reads", 0))  # an adaptive reader's resume
        if resume is None:
            return EpochStart(root, workers, reader, settled, [])
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
        return EpochStart(root, workers, reader, settled, [first], resume["yielded"])

    def _prepare_epoch(self, resume: dict[str, Any] | None) -> None:
        """Hand the pipeline this epoch's seed, rank and (with a sampler) read order."""
        fields = self._pipeline.fields
        fields.epoch, fields.seed = self._epoch, self.seed
        rank, world = data_parallel_rank()
        # A sampler already chose this rank's share: the ranks keep their own seeds, but the
        # loader does not split the data a second time.
        fields.rank, fields.world = (rank, 1) if self.sampler is not None else (rank, world)
        if self.sampler is None:
            fields.indices = None
        elif resume is not None and resume.get("indices") is not None:
            fields.indices = resume["indices"].numpy()  # the order the checkpoint was read in
        else:
            fields.indices = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)

    def _build_root(self) -> tuple[BaseNode[Any], WorkersNode, Any]:
        """The main-process chain, its workers node, and the stage whose fresh batches count
        once handed on (one reading ahead of the consumer), else None."""
        opts = self.options
        if opts.where == "device":
            return self._build_device_root()
        batch_auto = opts.where == "batch" and opts.adaptive
        workers = WorkersNode(self._inner, self._pipeline, self.stats, deferred=batch_auto,
                              persistent=self._persistent)  # fmt: skip
        if opts.where != "batch":
            return workers, workers, None
        node: BaseNode[Any] = workers
        key = (self._epoch, MAIN_PROCESS)
        if opts.echoes:
            node = self._batch_echo(node, key)
        reader = node if batch_auto else None
        if opts.shuffle_buffer > 1:
            node = Shuffle(
                node, opts.shuffle_buffer, seed=derive_seed(self.seed, *key, STAGE_SHUFFLE)
            )
        return node, workers, reader

    def _build_device_root(self) -> tuple[BaseNode[Any], WorkersNode, Any]:
        """workers -> to the device -> echo stage -> example mixing -> device_transform on each
        copy."""
        opts, device = self.options, self._device
        assert device is not None
        # Fresh batches may be read ahead of the consumer (the next copy in flight, or "auto"'s
        # reader): their examples count once a stage hands them on.
        workers = WorkersNode(self._inner, self._pipeline, self.stats, deferred=True,
                              persistent=self._persistent)  # fmt: skip
        key = (self._epoch, MAIN_PROCESS)
        node: BaseNode[Any] = ToDevice(workers, device, ahead=self._copies_ahead())
        reader = node
        if opts.echoes:
            node = reader = self._batch_echo(node, key)
        if opts.shuffle_buffer > 1:  # the copies' examples spread over the batches that follow
            seed = derive_seed(self.seed, *key, STAGE_MIX)
            node = MixExamples(node, opts.shuffle_buffer, seed=seed, device=device)
        seed = derive_seed(self.seed, *key, STAGE_TRANSFORM)
        return DeviceTransform(node, device, opts.device_transform, seed=seed), workers, reader

    def _batch_echo(self, source: BaseNode[Any], key: tuple[int, int]) -> BaseNode[Any]:
        """The main process's echo stage over the fresh batches, told how many the workers
        deliver this epoch, so a fractional factor gives a fixed number of them an extra copy
        (and the epoch the ``len`` says)."""
        seed = derive_seed(self.seed, *key, STAGE_ECHO)
        return echo_stage(source, self.options, seed, length=fresh_batches(self))

    def _copies_ahead(self) -> bool:
        """Whether the device chain keeps the next fresh batch's copy in flight: on CUDA, with
        a fixed factor ("auto" reads on its own thread, which overlaps the copies already)."""
        return (
            self._device is not None and self._device.type == "cuda" and not self.options.adaptive
        )

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
        if not live and is_stateful(self.dataset) and is_map_style(self.dataset):
            # Between epochs, a map-style dataset's own state (a cache, counters) is kept. An
            # iterable one's is a position in the pass just finished, which would make the
            # next pass empty: its next iter() starts anew, as without a checkpoint.
            state["dataset"] = self.dataset.state_dict()
        return state

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
            self.dataset.load_state_dict(state["dataset"])

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
