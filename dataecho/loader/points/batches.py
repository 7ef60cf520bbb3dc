"""The points that echo whole batches in the training process: on the host (``batch``) and on
the training device after one copy there (``device``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdata.nodes import BaseNode, Batcher, Mapper

from dataecho._validate import check_takes_generator
from dataecho.loader.device import DeviceTransform, ToDevice
from dataecho.loader.points.base import InsertionPoint
from dataecho.loader.points.common import MainSide, OnItem, WorkerSide, echo_stage
from dataecho.loader.reading import Tagged
from dataecho.stages import MixExamples, Shuffle
from dataecho.stages.seeds import STAGE_ECHO, STAGE_MIX, STAGE_SHUFFLE, STAGE_TRANSFORM

if TYPE_CHECKING:
    from dataecho.loader.points.common import Batches, MainChain, Node, Options, Seeds


class _BatchEcho(InsertionPoint):
    """The workers read, transform and batch as without echoing; the main process echoes."""

    batch_level = True

    def worker_batches(self, node: Node, opts: Options, seed: Seeds, side: WorkerSide) -> Batches:
        fn = side.per_example
        stages = node if fn is None else Mapper(node, OnItem(fn))
        return Batcher(stages, opts.batch_size, drop_last=False)

    def copies_can_alias(
        self, opts: Options, collate_fn: Callable[[list[Any]], Any], transforms: bool
    ) -> bool:
        return False  # no example is echoed in the workers


class Batch(_BatchEcho):
    """Echo -> shuffle of whole batches in the main process: the shuffle buffer holds
    ``shuffle_buffer // batch_size`` batches (its examples in whole batches)."""

    name = "batch"

    def check(self, opts: Options) -> None:
        super().check(opts)
        buffer = opts.shuffle_buffer or 0
        if buffer > 1 and buffer % opts.batch_size:
            whole = buffer // opts.batch_size
            warnings.warn(
                f"shuffle_buffer={buffer} with where='batch': the buffer shuffles whole batches, "
                f"so it holds {whole} batch(es) of batch_size={opts.batch_size} "
                f"({whole * opts.batch_size} examples); pass a multiple of batch_size, e.g. "
                f"shuffle_buffer={max(1, whole) * opts.batch_size}",
                stacklevel=2,
            )

    def main_stages(self, workers: Node, opts: Options, seed: Seeds, side: MainSide) -> MainChain:
        node = workers
        if opts.echoes:
            node = echo_stage(node, opts, seed(STAGE_ECHO), copy=opts.copy,
                              length=side.epoch_fresh_batches(), pinned=side.pinned)  # fmt: skip
        counting = node if opts.adaptive else None
        batches = (opts.shuffle_buffer or 0) // opts.batch_size
        if batches > 1:
            node = Shuffle(node, batches, seed=seed(STAGE_SHUFFLE))
        return node, counting

    def counting(self, opts: Options) -> dict[str, bool]:
        # "auto"'s reader thread reads fresh batches ahead of the consumer.
        return {"deferred": opts.adaptive, "counted_downstream": False}


class Device(_BatchEcho):
    """To the device -> echo -> example mixing (``shuffle_buffer``, in examples) ->
    ``device_transform``, in the main process (:mod:`dataecho.loader.device`)."""

    name = "device"
    on_device = True

    def defaults(self, opts: Options) -> dict[str, Any]:
        # Without device=: the same code path, on the host.
        return {**super().defaults(opts), "echo_device": "cpu"}

    def check(self, opts: Options) -> None:
        if opts.device_transform is not None:
            check_takes_generator(opts.device_transform)

    def pool_counts(self, opts: Options) -> bool:
        return bool(opts.shuffle_buffer and opts.shuffle_buffer > 1)

    def counting(self, opts: Options) -> dict[str, bool]:
        # The copy to the device may be read ahead, or by "auto"'s reader thread; with a pool,
        # the pool counts what it first delivers.
        pool = self.pool_counts(opts)
        return {"deferred": not pool, "counted_downstream": pool}

    def main_stages(self, workers: Node, opts: Options, seed: Seeds, side: MainSide) -> MainChain:
        # On CUDA with a fixed factor the next fresh batch's copy stays in flight ("auto"
        # reads on its own thread, which overlaps the copies already).
        device = side.device
        ahead = device.type == "cuda" and not opts.adaptive
        mixed = self.pool_counts(opts)
        node: BaseNode[Any] = ToDevice(workers, device, ahead=ahead)
        counting: BaseNode[Any] = node
        if mixed:  # each copy carries its fresh batch's number to the pool
            node = Tagged(node)
        if opts.echoes:
            # Into the pool, copies need not be separate objects: the pool copies their rows
            # into its slots, and every batch it emits is gathered anew.
            node = counting = echo_stage(node, opts, seed(STAGE_ECHO), copy=opts.copy and not mixed,
                                         length=side.epoch_fresh_batches())  # fmt: skip
        if mixed:  # the copies' examples spread over the batches that follow
            # With drop_last the pool fills the epoch's short fresh batch (loader/remainders.py).
            fill_to = opts.batch_size if opts.drop_last and opts.echoes else 0
            node = counting = MixExamples(node, int(opts.shuffle_buffer or 0), seed=seed(STAGE_MIX),
                                          device=device, numbered=True, fill_to=fill_to)  # fmt: skip
        root = DeviceTransform(node, device, opts.device_transform, seed=seed(STAGE_TRANSFORM))
        return root, counting
