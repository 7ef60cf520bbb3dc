"""Each insertion point's chain of stages (``where``), on both sides of the worker boundary.

=================  =========================================  ==================================
``where``          in each worker, between read and batcher   in the main process, after them
=================  =========================================  ==================================
before_augment     echo -> shuffle -> transform               (the workers' batches)
after_augment      transform -> echo -> shuffle               (the workers' batches)
batch              transform                                  echo -> shuffle
device             transform                                  to the device -> echo -> example
                                                              mixing -> ``device_transform``
=================  =========================================  ==================================

The worker side is built by :func:`example_batches` (in :mod:`dataecho.loader.pipeline`); at
``before_augment`` with a fixed factor one node does its echo, shuffle and transform a batch at a
time (:mod:`dataecho.loader.example_batches`). The main-process side is built by
:func:`batch_stages` (in :mod:`dataecho.loader.echoing_loader`): the order
of the stages at each ``where`` is decided here only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from torch.utils.data import default_collate
from torchdata.nodes import BaseNode, Batcher, Mapper

from dataecho.loader.device import DeviceTransform, ToDevice
from dataecho.loader.example_batches import ExampleBatches
from dataecho.loader.numbered import Numbered
from dataecho.loader.options import LoaderOptions
from dataecho.loader.read_ahead import stop_read_ahead
from dataecho.loader.spread import SpreadBatches
from dataecho.stages import Echo, MixExamples, Shuffle
from dataecho.stages.adaptive import AdaptiveEcho
from dataecho.stages.seeds import STAGE_ECHO, STAGE_MIX, STAGE_SHUFFLE, STAGE_TRANSFORM

# The main process's key among the reader indices: batch echoing draws its seeds there.
MAIN_PROCESS = 1 << 20

Seeds = Callable[[int], int]  # a stage id -> that stage's seed


class OnItem:
    """``(read_number, item) -> (read_number, fn(item))``: the user's function sees the item."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, tagged: tuple[int, Any]) -> tuple[int, Any]:
        return tagged[0], self.fn(tagged[1])


def example_batches(
    node: BaseNode[Any],
    opts: LoaderOptions,
    seed: Seeds,
    *,
    per_example: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any],
    length: int | None,
    copies: int | None = None,
) -> BaseNode[list[Any]]:
    """A worker's batches of tagged copies over its tagged reads ``node``: for
    ``before_augment`` at a fixed factor, the one node that echoes, mixes, copies and augments
    a batch at a time (:mod:`dataecho.loader.example_batches`); else the stages in
    ``opts.where``'s order and a batcher.

    ``per_example``: the transform run on each item (the user's or the dataset's), or None.
    ``length``: the items the worker reads this epoch, ``copies``: its part of the epoch's
    copies where the loader shares them out (see :func:`echo_stage`).
    """
    copy = copies_can_alias(opts, collate_fn, per_example is not None)
    buffer = shuffle_size(opts)
    if opts.where == "before_augment" and not opts.adaptive:
        return ExampleBatches(
            node, cast(float, opts.echo_factor), batch_size=opts.batch_size,
            shuffle_buffer=buffer, transform=per_example, seed=seed(STAGE_ECHO),
            copy=copy, length=length, copies=copies,
        )  # fmt: skip

    def transform(n: BaseNode[Any]) -> BaseNode[Any]:
        return n if per_example is None else Mapper(n, OnItem(per_example))

    def echo_and_shuffle(n: BaseNode[Any]) -> BaseNode[Any]:
        if opts.echoes:
            n = echo_stage(n, opts, seed(STAGE_ECHO), copy=copy, length=length, copies=copies)
        if buffer > 1:
            n = Shuffle(n, buffer, seed=seed(STAGE_SHUFFLE))
        return n

    if opts.where == "before_augment":  # with "auto": a fixed factor returned above
        stages = transform(echo_and_shuffle(node))
    elif opts.where == "after_augment":
        stages = echo_and_shuffle(transform(node))
    else:  # "batch" or "device": whole batches are echoed in the main process
        stages = transform(node)
        return Batcher(stages, opts.batch_size, drop_last=False)
    # With a shuffle buffer no two copies of an example share a batch: a copy that meets its
    # twin waits, up to the buffer's batches.
    if opts.echoes and buffer > 1:
        spread = buffer // opts.batch_size
        return SpreadBatches(stages, opts.batch_size, spread=spread, seed=seed(STAGE_SHUFFLE))
    return Batcher(stages, opts.batch_size, drop_last=False)


def shuffle_size(opts: LoaderOptions) -> int:
    """The post-echo shuffle buffer (derived on construction where not given: never None)."""
    return cast(int, opts.shuffle_buffer)


def counts_first_deliveries(opts: LoaderOptions) -> bool:
    """Whether fresh examples count as the device's pool first delivers them (its
    ``first_deliveries``), not by the workers' counts per batch."""
    return opts.where == "device" and shuffle_size(opts) > 1


def workers_counting(opts: LoaderOptions) -> dict[str, bool]:
    """How the workers node counts fresh examples (``WorkersNode``'s keywords): ``deferred``,
    its counts wait until a main-process stage hands their batch on (that stage may read fresh
    batches ahead of the consumer: the next copy to the device in flight, or "auto"'s reader
    thread); ``counted_downstream``, the device's pool counts them instead."""
    downstream = counts_first_deliveries(opts)
    deferred = opts.where == "device" or (opts.where == "batch" and opts.adaptive)
    return {"deferred": deferred and not downstream, "counted_downstream": downstream}


def handed_on(counting: Any) -> int:
    """What the counting stage has handed on so far: examples first delivered by a pool,
    else fresh batches."""
    return (
        counting.first_deliveries
        if isinstance(counting, MixExamples)
        else counting.stats.fresh_items
    )


def batch_stages(
    workers: BaseNode[Any],
    opts: LoaderOptions,
    seed: Seeds,
    *,
    device: Any = None,
    fresh_batches: Callable[[], int | None] = lambda: None,
    pinned: bool = False,
) -> tuple[BaseNode[Any], BaseNode[Any] | None]:
    """The main process's chain over the workers' batches, and its counting stage: the stage
    whose fresh batches count once it hands them on (:func:`workers_counting`), or whose first
    deliveries of examples count (:func:`counts_first_deliveries`), else None.

    ``device``: the ``torch.device`` of ``where="device"``. ``fresh_batches``: the batches the
    workers deliver this epoch, so that a fractional factor gives a fixed number of them an
    extra copy (and the epoch the ``len`` says). ``pinned``: the workers' batches come pinned
    (``pin_memory``), and so must the host's copies of them, for the training loop's
    ``non_blocking`` copy to the GPU.
    """
    if opts.where not in ("batch", "device"):
        return workers, None

    def batch_echo(n: BaseNode[Any]) -> BaseNode[Any]:
        # Into the device's pool, copies need not be separate objects: the pool copies their
        # rows into its slots, and every batch it emits is gathered anew.
        copy = opts.copy and not counts_first_deliveries(opts)
        return echo_stage(n, opts, seed(STAGE_ECHO), copy=copy, length=fresh_batches(),
                          pinned=pinned and opts.where == "batch")  # fmt: skip

    if opts.where == "batch":
        node = batch_echo(workers) if opts.echoes else workers
        counting = node if opts.adaptive else None
        if shuffle_size(opts) > 1:
            node = Shuffle(node, shuffle_size(opts), seed=seed(STAGE_SHUFFLE))
        return node, counting
    # On CUDA with a fixed factor the next fresh batch's copy stays in flight ("auto" reads on
    # its own thread, which overlaps the copies already).
    ahead = device.type == "cuda" and not opts.adaptive
    mixed = counts_first_deliveries(opts)
    node = counting = ToDevice(workers, device, ahead=ahead)
    if mixed:  # each copy carries its fresh batch's number to the pool
        node = Numbered(node)
    if opts.echoes:
        node = counting = batch_echo(node)
    if mixed:  # the copies' examples spread over the batches that follow
        # With drop_last the pool fills the epoch's short fresh batch (loader/remainders.py).
        fill_to = opts.batch_size if opts.drop_last and opts.echoes else 0
        node = counting = MixExamples(node, shuffle_size(opts), seed=seed(STAGE_MIX),
                                      device=device, numbered=True, fill_to=fill_to)  # fmt: skip
    root = DeviceTransform(node, device, opts.device_transform, seed=seed(STAGE_TRANSFORM))
    return root, counting


def drain_stage(root: Any) -> Any:
    """The stage where a drain of the main-process chain ``root`` starts
    (:meth:`~dataecho.loader.echoing_loader.EchoingDataLoader.drain`): its last stage that
    holds copies back (the device's pool, a shuffle buffer, an echo stage), if it can drain;
    else None (the copies wait in the workers, or "auto" reuses what it has)."""
    node = root.source if isinstance(root, DeviceTransform) else root
    return node if callable(getattr(node, "drain", None)) else None


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
    copies: int | None = None,
    pinned: bool = False,
) -> BaseNode[Any]:
    """The echo stage the options ask for: fixed factor, or adaptive for "auto".

    ``copy``: whether copies are separate objects (default: ``opts.copy``). ``length``: the
    items ``source`` delivers in the epoch, so that a fractional factor gives exactly its share
    of extra copies (see :mod:`dataecho.stages.fixed_echo`); "auto" needs none. ``copies``:
    the exact copies of those items, where the loader counts them for all workers at once
    (:mod:`dataecho.loader.epoch_counts`). ``pinned``: copies of pinned tensors are pinned
    (main process only).
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
            # make it reuse while fresh examples are on their way, and hold the reader thread back.
            queue_size=16 if opts.batch_level else max(16, 2 * opts.batch_size),
            pinned=pinned,
        )
    factor = cast(float, opts.echo_factor)  # a number: not "auto"
    return Echo(source, factor, seed=seed, copy=copy, length=length, copies=copies, pinned=pinned)


def close_chain(node: Any) -> None:
    """Stop every background part of a chain of nodes, from the consumer's end down."""
    while node is not None:
        if isinstance(node, AdaptiveEcho):
            # Bounded: its reader thread may sit in a source call that only the next close unblocks.
            node.close(timeout=5.0)
        elif hasattr(node, "close"):
            node.close()
        stop_read_ahead(node)
        node = getattr(node, "source", None)
