"""What an insertion point is: the questions every other module asks it, with the answers
of a point that echoes examples in the workers (overridden where a point differs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from torch.utils.data import default_collate

from dataecho.errors import DataechoValueError

if TYPE_CHECKING:
    from dataecho.loader.points.common import (
        Batches,
        MainChain,
        MainSide,
        Node,
        Options,
        Seeds,
        WorkerSide,
    )

# The default post-echo shuffle buffer where examples are echoed, in batches' worth: copies
# spread over about as many batches; as few fresh examples to a target as 40 batches' worth
# (benchmarks/augmentation), with a first batch after 10 / e batches' reads and the originals of
# 10 / e batches held per worker (benchmarks/spread).
SPREAD_BATCHES = 10


class InsertionPoint:
    """One value of ``where``. Stateless: one instance per name, in the registry."""

    name: ClassVar[str]
    #: The echo stage repeats whole batches, in the training process.
    batch_level: ClassVar[bool] = False
    #: The batches are echoed on ``device`` (``device=`` and ``device_transform=`` apply).
    on_device: ClassVar[bool] = False
    #: A dataset's own transform runs on each copy, lifted out of ``__getitem__``.
    lifts_dataset_transform: ClassVar[bool] = False
    #: The copies are identical by design: the augmentation runs before the echo stage.
    identical_copies: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<insertion point {self.name!r}>"

    @property
    def takes_loader(self) -> bool:
        """Whether a ``DataLoader`` may be the upstream (it hands over whole batches)."""
        return self.batch_level

    def defaults(self, opts: Options) -> dict[str, Any]:
        """The options' defaults derived from the others, for the fields left None."""
        echoes_examples = opts.echoes and not self.batch_level
        return {
            # Example echoing spreads each example's copies over batches by default (the
            # method's better variant); batch echoing repeats whole batches, apart already.
            "shuffle_buffer": SPREAD_BATCHES * opts.batch_size if echoes_examples else 0,
            "reuse_buffer": 1 if self.batch_level else opts.batch_size,
            # Examples: copies spread evenly over the buffer, as a fixed factor spreads them.
            "reuse_policy": "latest" if self.batch_level else "fewest",
            # "auto" reads ahead on its own; batch echoing leaves the worker's work as without.
            "read_ahead": opts.batch_size if echoes_examples and not opts.adaptive else 0,
        }

    def check(self, opts: Options) -> None:
        """Refuse options this point cannot honour (a clear error naming the fix); here, the
        device's options, which only a point on the device takes."""
        if opts.echo_device is not None:
            raise DataechoValueError(
                f"echo_device={opts.echo_device!r} applies to where='device' only (the echo "
                f"stage runs on that device), but where={opts.where!r}; pass where='device' to "
                f"echo on {opts.echo_device!r}, or drop echo_device= (batches stay on the host)"
            )
        if opts.device_transform is not None:
            raise DataechoValueError(
                f"device_transform={opts.device_transform!r} augments each copy on the "
                f"device, only with where='device', but where={opts.where!r}; pass "
                "where='device' (and echo_device='cuda' or 'cpu'), or pass the augmentation as "
                "batch_transform= (run in the workers)"
            )

    def worker_batches(self, node: Node, opts: Options, seed: Seeds, side: WorkerSide) -> Batches:
        """A worker's batches of tagged copies over its tagged reads ``node`` (asked by the
        worker's pipeline, :mod:`dataecho.loader.pipeline`)."""
        raise NotImplementedError

    def main_stages(self, workers: Node, opts: Options, seed: Seeds, side: MainSide) -> MainChain:
        """The main process's chain over the workers' batches and its counting stage (asked by
        ``EchoingDataLoader`` as it builds an epoch): here, the workers' batches as they are."""
        return workers, None

    def pool_counts(self, opts: Options) -> bool:
        """Whether fresh examples count as a pool on the device first delivers them, not by
        the workers' counts per batch."""
        return False

    def counting(self, opts: Options) -> dict[str, bool]:
        """How the workers node counts fresh examples (its keyword arguments): ``deferred``,
        when a main-process stage may read fresh batches ahead of the consumer and counts
        them as it hands them on; ``counted_downstream``, when a pool counts them instead."""
        return {"deferred": False, "counted_downstream": False}

    def copies_can_alias(
        self, opts: Options, collate_fn: Callable[[list[Any]], Any], transforms: bool
    ) -> bool:
        """Whether example copies must be separate objects (``opts.copy`` asks for it): only a
        per-example transform after the echo stage (``transforms``: the user's or the
        dataset's) or a custom collate can see two copies as one object; ``default_collate``
        stacks tensors and arrays into new memory (and keeps only immutable str/bytes as they
        are), so without those the copy would be a wasted memcpy."""
        return opts.copy and collate_fn is not default_collate
