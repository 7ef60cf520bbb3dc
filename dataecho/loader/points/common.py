"""What the insertion points share: what they read of the options, the seed of each stage,
a user's function on tagged items, and the echo stage the options ask for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, cast

from torchdata.nodes import BaseNode

from dataecho.stages import Echo
from dataecho.stages.adaptive import AdaptiveEcho

Seeds: TypeAlias = Callable[[int], int]  # a stage id -> that stage's seed
Node: TypeAlias = BaseNode[Any]
Batches: TypeAlias = BaseNode[list[Any]]  # a worker's batches, as lists of tagged copies
MainChain: TypeAlias = tuple[Node, Node | None]  # the main process's root and counting stage


class Options(Protocol):
    """What a point reads of the loader's options (a
    :class:`~dataecho.loader.options.LoaderOptions`, which asks its point in turn)."""

    @property
    def where(self) -> str: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def echo_factor(self) -> float | str: ...
    @property
    def max_echo_factor(self) -> float: ...
    @property
    def reuse_buffer(self) -> int | None: ...
    @property
    def reuse_policy(self) -> str | None: ...
    @property
    def shuffle_buffer(self) -> int | None: ...
    @property
    def batch_transform(self) -> Callable[[Any], Any] | None: ...
    @property
    def copy(self) -> bool: ...
    @property
    def echo_device(self) -> str | None: ...
    @property
    def device_transform(self) -> Callable[..., Any] | None: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def adaptive(self) -> bool: ...
    @property
    def echoes(self) -> bool: ...
    @property
    def batch_level(self) -> bool: ...


@dataclass(frozen=True)
class WorkerSide:
    """What a worker's chain is built from, besides the options and the seeds:
    ``per_example``, the transform run on each item (the user's or the dataset's) or None;
    ``collate_fn``; ``length``, the items the worker reads this epoch; ``copies``, its part of
    the epoch's copies where the loader shares them out (:func:`echo_stage`)."""

    per_example: Callable[[Any], Any] | None
    collate_fn: Callable[[list[Any]], Any]
    length: int | None
    copies: int | None = None


@dataclass(frozen=True)
class MainSide:
    """What the main process's chain is built from, besides the options and the seeds:
    ``device``, the ``torch.device`` of a point on the device (else None);
    ``epoch_fresh_batches``, the batches the workers deliver this epoch, so that a fractional
    factor gives a fixed number of them an extra copy; ``pinned``, whether the workers'
    batches come pinned (``pin_memory``), as the host's copies of them must too."""

    device: Any = None
    epoch_fresh_batches: Callable[[], int | None] = lambda: None
    pinned: bool = False


class OnItem:
    """``(read_number, item) -> (read_number, fn(item))``: the user's function sees the item."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, tagged: tuple[int, Any]) -> tuple[int, Any]:
        return tagged[0], self.fn(tagged[1])


def echo_stage(
    source: BaseNode[Any],
    opts: Options,
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
