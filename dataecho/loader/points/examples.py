"""The points that echo examples in the workers: before the augmentation (each copy augmented
on its own) and after it (identical copies)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from torch.utils.data import default_collate
from torchdata.nodes import BaseNode, Batcher, Mapper

from dataecho.errors import DataechoValueError
from dataecho.loader.example_batches import ExampleBatches
from dataecho.loader.points.base import InsertionPoint
from dataecho.loader.points.common import OnItem, WorkerSide, echo_stage
from dataecho.loader.spread import SpreadBatches
from dataecho.stages import Shuffle
from dataecho.stages.seeds import STAGE_ECHO, STAGE_SHUFFLE

if TYPE_CHECKING:
    from dataecho.loader.points.common import Batches, Node, Options, Seeds


class _ExampleEcho(InsertionPoint):
    """Echo -> shuffle and the transform, then batches: the transform first where the copies
    are identical (``after_augment``), else on each copy (``before_augment``). At a fixed
    factor one node does the echo, the shuffle and the copies a batch at a time
    (:mod:`dataecho.loader.example_batches`); with ``"auto"``, the stages one by one."""

    def worker_batches(self, node: Node, opts: Options, seed: Seeds, side: WorkerSide) -> Batches:
        per_example, length, copies = side.per_example, side.length, side.copies
        copy = self.copies_can_alias(opts, side.collate_fn, per_example is not None)
        buffer = cast(int, opts.shuffle_buffer)  # derived on construction: never None

        def transform(n: BaseNode[Any]) -> BaseNode[Any]:
            return n if per_example is None else Mapper(n, OnItem(per_example))

        first = self.identical_copies  # the transform runs before the echo stage
        if not opts.adaptive:
            return ExampleBatches(
                transform(node) if first else node, cast(float, opts.echo_factor),
                batch_size=opts.batch_size, shuffle_buffer=buffer,
                transform=None if first else per_example, seed=seed(STAGE_ECHO), copy=copy,
                length=length, copies=copies,
            )  # fmt: skip

        def echo_and_shuffle(n: BaseNode[Any]) -> BaseNode[Any]:
            if opts.echoes:
                n = echo_stage(n, opts, seed(STAGE_ECHO), copy=copy, length=length, copies=copies)
            if buffer > 1:
                n = Shuffle(n, buffer, seed=seed(STAGE_SHUFFLE))
            return n

        stages = echo_and_shuffle(transform(node)) if first else transform(echo_and_shuffle(node))
        # With a shuffle buffer no two copies of an example share a batch: a copy that meets
        # its twin waits, up to the buffer's batches.
        if opts.echoes and buffer > 1:
            spread = buffer // opts.batch_size
            return SpreadBatches(stages, opts.batch_size, spread=spread, seed=seed(STAGE_SHUFFLE))
        return Batcher(stages, opts.batch_size, drop_last=False)


class BeforeAugment(_ExampleEcho):
    """Echo -> shuffle -> transform in each worker: every copy augmented with its own draws."""

    name = "before_augment"
    lifts_dataset_transform = True

    def copies_can_alias(
        self, opts: Options, collate_fn: Callable[[list[Any]], Any], transforms: bool
    ) -> bool:
        # The per-example transform runs on each copy, after the echo stage.
        return opts.copy and (transforms or collate_fn is not default_collate)


class AfterAugment(_ExampleEcho):
    """Transform -> echo -> shuffle in each worker: the copies are identical."""

    name = "after_augment"
    identical_copies = True

    def check(self, opts: Options) -> None:
        super().check(opts)
        if opts.batch_transform is not None:
            raise DataechoValueError(
                "batch_transform runs after batching, so with where='after_augment' the echoed "
                "copies would be augmented apart; pass the augmentation as transform= (per "
                "example) for identical copies, or use where='before_augment'"
            )
