"""The per-worker pipeline: read -> [echo, shuffle, transform in the chosen order] -> batch
-> batch_transform.

With ``where="before_augment"`` and no ``transform=`` or ``batch_transform=``, a dataset that
augments in ``__getitem__`` (a torchvision transform attribute, a Hugging Face
``set_transform``) is read with that transform off, and the transform runs on each copy in
``transform=``'s place (:mod:`dataecho.loader.dataset_transform`).

Example echoing runs here, inside the worker (or the main process with ``num_workers=0``) that
read the example, so an echoed copy never costs a second upstream read. Each pipeline yields
``(batch, fresh_examples_in_it)`` so the main process can count fresh data across workers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from torch.utils.data import IterableDataset, default_collate, get_worker_info
from torchdata.nodes import BaseNode, Batcher, Mapper

from dataecho.loader.dataset_transform import find_transform, lifts
from dataecho.loader.delivery import Delivery
from dataecho.loader.epoch_fields import EpochFields
from dataecho.loader.options import LoaderOptions
from dataecho.loader.read_ahead import read_ahead, stop_read_ahead
from dataecho.loader.reading import (
    IndexedReader,
    IterableReader,
    Tagged,
    epoch_order,
    is_map_style,
    reader_share,
)
from dataecho.loader.rng_scope import RngScope
from dataecho.loader.snapshots import send_once
from dataecho.loader.transport import to_wire
from dataecho.stages import Echo, Shuffle
from dataecho.stages.adaptive import AdaptiveEcho
from dataecho.stages.fixed_echo import known_length
from dataecho.stages.seeds import (
    STAGE_ECHO,
    STAGE_ORDER,
    STAGE_SHUFFLE,
    STAGE_TRANSFORM,
    derive_seed,
)
from dataecho.transforms import guard_transform

# The main process's key among the worker ids: batch echoing draws its seeds there.
MAIN_PROCESS = 1 << 20


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
        return reader_share(indices, reader=worker, readers=num_workers, equal=False)
    shuffle = owner.options.shuffle
    order_seed = derive_seed(fields.seed, epoch, STAGE_ORDER) if shuffle else None
    order = epoch_order(len(owner.dataset), order_seed)
    readers = fields.world * num_workers
    reader = fields.rank * num_workers + worker
    return reader_share(order, reader=reader, readers=readers, equal=fields.world > 1)


class OnItem:
    """``(read_number, item) -> (read_number, fn(item))``: the user's function sees the item."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, tagged: tuple[int, Any]) -> tuple[int, Any]:
        return tagged[0], self.fn(tagged[1])


class PipelineIterator:
    """A stateful iterator over ``(batch, fresh_count)``; ``StatefulDataLoader`` checkpoints it."""

    def __init__(self, owner: PipelineDataset) -> None:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        opts, fields = owner.options, owner.fields
        # Each reader of a data-parallel run (rank x worker) draws its own echo, shuffle and
        # augmentation randomness; a single process keeps the plain worker id.
        reader = fields.rank * num_workers + worker
        pipeline_seed, epoch = fields.seed, fields.epoch
        seed = lambda stage: derive_seed(pipeline_seed, epoch, reader, stage)  # noqa: E731

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
        else:
            source = IterableReader(dataset)
            # Its len, as len(loader) counts it (None: per-item draws). One that splits itself
            # over several workers does so where the loader cannot see: each worker then gives
            # its part of the whole's extra copies, and their total varies a little.
            share = known_length(dataset)
        # The options' defaults are derived on construction: read_ahead is an int here.
        node: BaseNode[Any] = Tagged(read_ahead(source, cast(int, opts.read_ahead)))

        def transform(n: BaseNode[Any]) -> BaseNode[Any]:
            return n if per_example is None else Mapper(n, OnItem(per_example))

        def echo_and_shuffle(n: BaseNode[Any]) -> BaseNode[Any]:
            if opts.echoes:
                copy = copies_can_alias(opts, owner.collate_fn, per_example is not None)
                n = echo_stage(n, opts, seed(STAGE_ECHO), copy=copy, length=share)
            if opts.shuffle_buffer > 1:
                n = Shuffle(n, opts.shuffle_buffer, seed=seed(STAGE_SHUFFLE))
            return n

        if opts.where == "before_augment":
            node = transform(echo_and_shuffle(node))
        elif opts.where == "after_augment":
            node = echo_and_shuffle(transform(node))
        else:  # "batch" or "device": whole batches are echoed in the main process
            node = transform(node)
        self._delivery = Delivery(
            Batcher(node, opts.batch_size, drop_last=False),
            opts.batch_size,
            drop_last=opts.drop_last,
        )
        self.root: BaseNode[Any] = Mapper(self._delivery, owner.collate_fn)
        if opts.batch_transform is not None:
            self.root = Mapper(self.root, opts.batch_transform)
        self._rng = RngScope(seed(STAGE_TRANSFORM), exclusive=info is not None)
        self._pipe = info is not None and owner.pipe_small_batches
        self._in_worker = info is not None

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> tuple[Any, int]:
        with self._rng:
            batch = next(self.root)
        return (to_wire(batch) if self._pipe else batch), self._delivery.fresh

    def state_dict(self) -> dict[str, Any]:
        state = {"root": self.root.state_dict(), "rng": self._rng.state_dict()}
        # A worker's state goes to the training process; its packed buffer need not stay here.
        return send_once(state) if self._in_worker else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.root.reset(state["root"])
        self._rng.load_state_dict(state["rng"])


def copies_can_alias(
    opts: LoaderOptions, collate_fn: Callable[[list[Any]], Any], transforms_examples: bool
) -> bool:
    """Whether example copies must be separate objects (``opts.copy`` asks for it).

    Only a per-example transform after the echo stage (``transforms_examples``: the user's or
    the dataset's) or a custom collate can see two copies as one object: ``default_collate``
    stacks tensors and arrays into new memory (and keeps only immutable str/bytes as they
    are), so without those the copy would be a wasted memcpy.
    """
    downstream_transform = opts.where == "before_augment" and transforms_examples
    return opts.copy and (downstream_transform or collate_fn is not default_collate)


def echo_stage(
    source: BaseNode[Any],
    opts: LoaderOptions,
    seed: int,
    *,
    copy: bool | None = None,
    length: int | None = None,
) -> BaseNode[Any]:
    """The echo stage the options ask for: fixed factor, or adaptive for "auto".

    ``copy``: whether copies are separate objects (default: ``opts.copy``). ``length``: the
    items ``source`` delivers in the epoch, so that a fractional factor gives exactly its share
    of extra copies (see :mod:`dataecho.stages.fixed_echo`); "auto" needs none.
    """
    copy = opts.copy if copy is None else copy
    if opts.adaptive:
        return AdaptiveEcho(
            source,
            max_factor=opts.max_echo_factor,
            # Derived on construction where not given: never None here.
            buffer_size=cast(int, opts.reuse_buffer),
            policy=cast(str, opts.reuse_policy),
            seed=seed,
            copy=copy,
            # The batcher takes a whole batch at once: a read-ahead shorter than a batch would
            # make it reuse while fresh examples are on their way, and hold the reader back.
            queue_size=16 if opts.batch_level else max(16, 2 * opts.batch_size),
        )
    factor = cast(float, opts.echo_factor)  # a number: not "auto"
    return Echo(source, factor, seed=seed, copy=copy, length=length)


def close_chain(node: Any) -> None:
    """Stop every background part of a chain of nodes, from the consumer's end down."""
    while node is not None:
        if isinstance(node, AdaptiveEcho):
            # Bounded: its reader may sit in a source call that only the next close unblocks.
            node.close(timeout=5.0)
        elif hasattr(node, "close"):
            node.close()
        stop_read_ahead(node)
        node = getattr(node, "source", None)


def unwrap_identity(item: Any) -> Any:
    """The inner DataLoader's collate: batches are already collated by the pipeline."""
    return item
