"""The per-worker pipeline: read -> [echo, shuffle, transform in the order ``where`` gives
them (:mod:`dataecho.loader.chains`)] -> batch -> batch_transform.

With ``where="before_augment"`` and no ``transform=`` or ``batch_transform=``, a dataset that
augments in ``__getitem__`` (a torchvision transform attribute, a Hugging Face
``set_transform``) is read with that transform off, and the transform runs on each copy in
``transform=``'s place (:mod:`dataecho.loader.dataset_transform`).

Example echoing runs here, inside the worker (or the main process with ``num_workers=0``) that
read the example, so an echoed copy never costs a second upstream read. Each pipeline yields
``(batch, fresh_examples_in_it, (worker, waiting))`` so the main process can count fresh data
across workers, and the examples each worker has read but not yet delivered once (held in its
echo stage's buffers): with them, the examples read so far. Its last short batch goes
uncollated, as a :class:`~dataecho.loader.remainders.Remainder`, to be batched with the other
workers' in the main process.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from torch.utils.data import IterableDataset, default_collate, get_worker_info
from torchdata.nodes import BaseNode

from dataecho.loader.chains import close_chain
from dataecho.loader.dataset_transform import find_transform, lifts
from dataecho.loader.delivery import Delivery
from dataecho.loader.epoch_counts import rank_examples, share_sizes, split_copies, total_copies
from dataecho.loader.epoch_fields import EpochFields
from dataecho.loader.options import LoaderOptions
from dataecho.loader.points.common import WorkerSide
from dataecho.loader.read_ahead import read_ahead
from dataecho.loader.reading import (
    IndexedReader,
    IterableReader,
    Tagged,
    epoch_order,
    is_map_style,
    reader_index,
    reader_share,
)
from dataecho.loader.remainders import Remainder
from dataecho.loader.rng_scope import RngScope
from dataecho.loader.streams import find_stream
from dataecho.loader.transport import WorkerCollate, send_once, to_wire
from dataecho.stages.fixed_echo import known_length
from dataecho.stages.seeds import STAGE_ORDER, STAGE_TRANSFORM, derive_seed
from dataecho.transforms import guard_transform

# Over a streaming library's dataset, in batches: the default read-ahead of a worker at a fixed
# factor, and of "auto" at the batch level the recent batches a copy may be drawn from. A stream
# hands on a shard's worth of batches at once, then none while the next shard downloads: reading
# ahead keeps the downloads going, and a shard's worth to reuse fills the gap
# (benchmarks/streaming).
STREAM_BATCHES = 8


def over_stream(opts: LoaderOptions, stream: object | None) -> LoaderOptions:
    """The main process's options: ``opts``, with "auto"'s reuse buffer at the batch level
    :data:`STREAM_BATCHES` over a stream where it was left to its default."""
    if stream is None or not (opts.adaptive and opts.batch_level):
        return opts
    if "reuse_buffer" not in opts._derived:
        return opts
    return opts.with_changes(reuse_buffer=STREAM_BATCHES)


class PipelineDataset(IterableDataset):
    """What the inner ``StatefulDataLoader`` iterates: one pipeline per worker and epoch.

    The training process sets the epoch's ``fields`` before each ``iter()``; with
    ``persistent_workers`` they are in shared memory (:mod:`dataecho.loader.epoch_fields`).
    """

    def __init__(
        self,
        dataset: Any,
        options: LoaderOptions,
        collate_fn: Callable[[list[Any]], Any],
        *,
        persistent_workers: bool = False,
    ) -> None:
        self.dataset = dataset
        self.options = options
        self.collate_fn = collate_fn
        self.fields = EpochFields(shared=persistent_workers)
        self.pipe_small_batches = True  # see dataecho.loader.transport; off for pin_memory
        # A streaming library's dataset: read at explicit positions (dataecho.loader.streams).
        self.stream = find_stream(dataset)
        self._live: weakref.WeakSet[PipelineIterator] = weakref.WeakSet()

    def __iter__(self) -> PipelineIterator:
        # A new epoch in this process ends the previous one's pipeline: a persistent worker
        # lives on, and a pipeline dropped mid-epoch would leave its threads behind in it.
        self.close_iterators()
        it = PipelineIterator(self)
        self._live.add(it)
        return it

    def close_iterators(self) -> None:
        """Stop the background parts of this process's pipelines (``num_workers=0``)."""
        for it in list(self._live):
            close_chain(it.root)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to worker processes, which start with no live iterators of their own.
        return {**self.__dict__, "_live": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _live=weakref.WeakSet())


def read_indices(
    owner: PipelineDataset, *, worker: int, num_workers: int, epoch: int | None = None
) -> np.ndarray:
    """The indices worker ``worker`` reads in ``epoch`` (default: the owner's) of a map-style
    dataset (see :mod:`dataecho.loader.reading`)."""
    fields = owner.fields
    epoch = fields.epoch if epoch is None else epoch
    indices = fields.indices
    if indices is not None:  # the sampler decided, this rank's share included
        return reader_share(indices, index=worker, readers=num_workers, equal=False)
    shuffle = owner.options.shuffle
    order_seed = derive_seed(fields.seed, epoch, STAGE_ORDER) if shuffle else None
    order = epoch_order(len(owner.dataset), order_seed)
    ranks = reader_share(order, index=fields.rank, readers=fields.world, equal=fields.world > 1)
    return reader_share(ranks, index=worker, readers=num_workers, equal=False)


class PipelineIterator:
    """A stateful iterator over ``(batch, fresh_count, (worker, waiting))`` (see the module
    docstring); ``StatefulDataLoader`` checkpoints it."""

    def __init__(self, owner: PipelineDataset) -> None:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        opts, fields = owner.options, owner.fields
        # Each reader of a data-parallel run (rank x worker) draws its own echo, shuffle and
        # augmentation randomness; a single process keeps the plain worker id.
        index = reader_index(fields.rank, worker, num_workers)
        pipeline_seed, epoch = fields.seed, fields.epoch
        seed = lambda stage: derive_seed(pipeline_seed, epoch, index, stage)  # noqa: E731

        # The dataset's own transform, if it has one known there, runs on each copy instead.
        lifted = find_transform(owner.dataset) if lifts(opts) else None
        dataset = lifted.read_raw() if lifted is not None else owner.dataset
        if lifted is not None:
            per_example: Callable[[Any], Any] | None = lifted.per_copy
        elif opts.transform is not None:
            # A failure on an (input, target) sample names the fix: transforms.on_input.
            per_example = guard_transform(opts.transform)
        else:
            per_example = None

        if is_map_style(dataset):
            indices = read_indices(owner, worker=worker, num_workers=num_workers)
            source: BaseNode[Any] = IndexedReader(dataset, indices)
            share: int | None = len(indices)
        elif owner.stream is not None:
            source = owner.stream.reader(
                dataset, epoch=epoch, worker=worker, num_workers=num_workers,
                rank=fields.rank, world=fields.world,
            )  # fmt: skip
            # A worker's share of the stream, where the library says it up front.
            share = getattr(source, "share", None)
        else:
            source = IterableReader(dataset)
            # Its len, as len(loader) counts it (None: spread evenly). One that splits itself
            # over several workers does so where the loader cannot see: each worker then gives
            # its part of the whole's extra copies, and their total varies a little.
            share = known_length(dataset)
        # The options' defaults are derived on construction: read_ahead is an int here.
        ahead = cast(int, opts.read_ahead)
        if owner.stream is not None and "read_ahead" in opts._derived and not opts.adaptive:
            # A stream's reads come a shard at a time: reading ahead keeps its downloads going
            # while the batches already read are echoed (benchmarks/streaming).
            ahead = max(ahead, STREAM_BATCHES * opts.batch_size)
        self._tagged = Tagged(read_ahead(source, ahead))
        node: BaseNode[Any] = self._tagged
        # A map-style dataset's copies are counted for the rank and shared out (epoch_counts).
        copies = None
        if share is not None and is_map_style(dataset) and opts.echoes and not opts.adaptive:
            if fields.indices is not None:  # the sampler's, this rank's share already
                examples = len(fields.indices)
            else:
                examples = rank_examples(len(dataset), rank=fields.rank, world=fields.world)
            shares = share_sizes(examples, max(num_workers, 1))
            copies = split_copies(total_copies(opts, sum(shares), split=True), shares)[worker]
        # The insertion point's chain of this worker (dataecho.loader.points).
        side = WorkerSide(per_example, owner.collate_fn, length=share, copies=copies)
        batches = opts.point.worker_batches(node, opts, seed, side)
        self.root = Delivery(batches, opts.batch_size)
        self._pipe = info is not None and owner.pipe_small_batches
        collate_fn = owner.collate_fn
        if info is not None and collate_fn is default_collate:
            replaced = opts.batch_transform is not None
            collate_fn = WorkerCollate(replaced=replaced, piped=self._pipe)
        self._collate_fn = collate_fn
        self._batch_transform = opts.batch_transform
        self._rng = RngScope(seed(STAGE_TRANSFORM), exclusive=info is not None)
        self._in_worker = info is not None
        self._worker = worker

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> tuple[Any, int, tuple[int, int]]:
        delivery = self.root
        with self._rng:
            items = next(delivery)
            short = len(items) < delivery.batch_size
            if not short:
                batch = self._collate_fn(items)
                if self._batch_transform is not None:
                    batch = self._batch_transform(batch)
        waiting = self._tagged.count - delivery.delivered
        if short:  # the worker's last: batched with the other workers' (loader/remainders.py)
            items = to_wire(items) if self._pipe else items  # as a batch crosses
            return Remainder(items, delivery.firsts), 0, (self._worker, waiting)
        wire = to_wire(batch) if self._pipe else batch
        return wire, delivery.fresh, (self._worker, waiting)

    def state_dict(self) -> dict[str, Any]:
        state = {"root": self.root.state_dict(), "rng": self._rng.state_dict()}
        # A worker's state goes to the training process; its packed buffer need not stay here.
        return send_once(state) if self._in_worker else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.root.reset(state["root"])
        self._rng.load_state_dict(state["rng"])


def unwrap_identity(item: Any) -> Any:
    """The inner DataLoader's collate: batches are already collated by the pipeline."""
    return item
