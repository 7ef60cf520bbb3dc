"""The loader's echo options: a small validated dataclass (grain style)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataecho import _validate
from dataecho.loader.reading import is_map_style

WHERE_CHOICES = ("before_augment", "after_augment", "batch")
AUTO = "auto"
# The most batches a worker keeps in flight by default: a huge echo factor would otherwise
# ask for that many times DataLoader's depth, all held in memory.
MAX_PREFETCH = 32


@dataclass(frozen=True)
class LoaderOptions:
    """Where and how much to echo; checked on construction.

    Attributes:
        batch_size: examples per batch (>= 1).
        echo_factor: mean copies per fresh item (>= 1; a fraction is drawn per item), or
            "auto": reuse only while fresh data is late (``dataecho.adaptive_echo``).
        max_echo_factor: with "auto", the most times one item may be emitted.
        reuse_buffer: with "auto", how many recent fresh items may be reused (default: one
            batch's worth of examples, or 1 batch for batch echoing).
        reuse_policy: with "auto", "fewest", "uniform" or "latest" (default: "fewest" for
            examples, "latest" for batches).
        where: insertion point: "before_augment", "after_augment" or "batch".
        shuffle_buffer: post-echo shuffle buffer in items (examples, or batches for "batch");
            0 or 1 means none.
        transform: per-example augmentation, or None.
        batch_transform: augmentation of a whole collated batch (each example drawn on its
            own, e.g. ``Augment``), run where the batch is made, after the example-level echo
            stage; much cheaper per example than ``transform`` from Python. Not with
            "after_augment", whose copies must be identical.
        shuffle: read a map-style dataset in a new random order each epoch.
        drop_last: drop each worker's last incomplete batch.
        copy: echoed copies are independent objects (see ``dataecho.stages.copying``).
        read_ahead: examples each worker reads ahead on a background thread, so slow reads
            overlap the echo stage's work (``dataecho.loader.read_ahead``). None: one
            batch's worth when echoing examples at a fixed factor, else 0 ("auto" reads ahead
            on its own; batch echoing leaves the worker's work as without echo). A dataset
            whose ``__getitem__`` draws random numbers is reproducible only with 0.
    """

    batch_size: int
    echo_factor: float | str = 1.0
    max_echo_factor: float = 4.0
    reuse_buffer: int | None = None
    reuse_policy: str | None = None
    where: str = "before_augment"
    shuffle_buffer: int = 0
    transform: Callable[[Any], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    shuffle: bool = False
    drop_last: bool = False
    copy: bool = True
    read_ahead: int | None = None

    @property
    def adaptive(self) -> bool:
        """True for ``echo_factor="auto"``."""
        return self.echo_factor == AUTO

    @property
    def echoes(self) -> bool:
        """True when an echo stage is needed at all."""
        return self.adaptive or self.echo_factor > 1

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(
            self,
            "batch_size",
            _validate.positive_int(
                self.batch_size,
                name="batch_size",
                hint="pass the number of examples per batch, e.g. 128",
            ),
        )
        if self.echo_factor != AUTO:
            factor = _validate.echo_factor(self.echo_factor, name="echo_factor", auto_ok=True)
            set_(self, "echo_factor", factor)
        set_(
            self,
            "max_echo_factor",
            _validate.echo_factor(self.max_echo_factor, name="max_echo_factor"),
        )
        _validate.one_of(self.where, WHERE_CHOICES, name="where")
        batches = self.where == "batch"
        if self.reuse_buffer is None:
            set_(self, "reuse_buffer", 1 if batches else self.batch_size)
        set_(
            self,
            "reuse_buffer",
            _validate.positive_int(
                self.reuse_buffer,
                name="reuse_buffer",
                hint="the number of recent fresh items auto may reuse",
            ),
        )
        if self.reuse_policy is None:
            # Examples: copies spread evenly over the buffer, as a fixed factor spreads them;
            # at R ~ 2 that needed 14% fewer fresh examples to target than uniform draws
            # (docs/benchmarks.md, peers section).
            set_(self, "reuse_policy", "latest" if batches else "fewest")
        _validate.one_of(self.reuse_policy, ("uniform", "latest", "fewest"), name="reuse_policy")
        set_(
            self,
            "shuffle_buffer",
            _validate.non_negative_int(
                self.shuffle_buffer, name="shuffle_buffer", hint="use 0 for no post-echo shuffling"
            ),
        )
        if self.read_ahead is None:
            fixed_examples = self.echoes and not self.adaptive and self.where != "batch"
            set_(self, "read_ahead", self.batch_size if fixed_examples else 0)
        set_(
            self,
            "read_ahead",
            _validate.non_negative_int(
                self.read_ahead,
                name="read_ahead",
                hint="the examples each worker reads ahead on a thread; 0 reads in step",
            ),
        )
        for name, what in (("transform", "example"), ("batch_transform", "batch")):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(
                    f"{name} must be a callable ({what} -> {what}) or None, got "
                    f"{type(value).__name__}"
                )
        if self.batch_transform is not None and self.where == "after_augment":
            raise ValueError(
                "batch_transform runs after batching, so with where='after_augment' the echoed "
                "copies would be augmented apart; pass the augmentation as transform= (per "
                "example) for identical copies, or use where='before_augment'"
            )


def default_prefetch(opts: LoaderOptions) -> int:
    """Batches each worker keeps in flight by default (DataLoader's is 2).

    The queue holds *emitted* batches: with example echoing each fresh batch leaves as e of
    them, so e times the default depth keeps as much fresh data in flight as without echoing.
    Otherwise a pause of the training loop (an evaluation, a checkpoint) fills the queue with
    copies at once and the upstream stops reading, so the pause costs the echoed run upstream
    time that a run without echoing hides. Capped, since a huge factor would hold that many
    batches in memory.
    """
    if opts.where == "batch" or opts.adaptive:
        return 2
    return min(2 * math.ceil(opts.echo_factor), MAX_PREFETCH)


def check_dataloader_arguments(
    dataset: Any,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    persistent_workers: Any,
) -> None:
    """DataLoader's own argument rules, and the ones echoing adds (see the class docstring)."""
    if batch_size is None:
        raise ValueError(
            "batch_size=None (no automatic batching) is not supported by EchoingDataLoader: "
            "the echo stage forms the batches; pass the number of examples per batch, e.g. 128"
        )
    if batch_sampler is not None:
        raise ValueError(
            "batch_sampler is not supported by EchoingDataLoader: batches are formed after the "
            "echo stage, so a sampler's batches would not survive it; pass sampler= (the order "
            "of examples) and batch_size= instead"
        )
    if persistent_workers:
        raise ValueError(
            "persistent_workers=True is not supported by EchoingDataLoader: each epoch's "
            "workers carry that epoch's order and seeds; drop the persistent_workers argument"
        )
    iterable = not is_map_style(dataset)
    if iterable and shuffle:
        raise ValueError(
            f"shuffle={shuffle!r} with an iterable dataset ({type(dataset).__name__}): an "
            "iterable dataset decides its own order (as with DataLoader); shuffle it in the "
            "dataset, or use shuffle_buffer= to shuffle after the echo stage"
        )
    if iterable and sampler is not None:
        raise ValueError(
            f"sampler= with an iterable dataset ({type(dataset).__name__}): a sampler picks "
            "indices of a map-style dataset (as with DataLoader); drop the sampler"
        )
    if sampler is not None and shuffle:
        raise ValueError(
            f"sampler= and shuffle={shuffle!r} are mutually exclusive (as with DataLoader): "
            "the sampler decides the order; drop shuffle, or the sampler"
        )
