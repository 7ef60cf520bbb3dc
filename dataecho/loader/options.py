"""The loader's echo options: one small validated dataclass (grain style), the one definition.

Each field carries its check and its help (``metadata``): the class docstring lists them, the
application's ``dataecho train`` flags and TOML keys are made from them, and construction runs
every check once. A field left None takes a default derived from the others, named in its help.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, cast

import torch

from dataecho._validate import (
    BATCH_WHY,
    BUFFER_WHY,
    MAX_BATCH,
    MAX_BUFFER,
    Bool,
    Check,
    Choice,
    EchoFactor,
    Int,
    OptionalCallable,
    Real,
    checked,
    one_of,
)
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader.points import POINTS, InsertionPoint, point_named
from dataecho.loader.points.base import SPREAD_BATCHES
from dataecho.loader.reading import is_map_style

# The insertion points' names, as registered (dataecho.loader.points).
WHERE_CHOICES = tuple(POINTS)

REUSE_POLICIES = ("uniform", "latest", "fewest")
AUTO = "auto"
# The most batches a worker keeps in flight by default: a huge echo factor would otherwise
# ask for that many times DataLoader's depth, all held in memory.
MAX_PREFETCH = 32
# The most a caller's prefetch_factor may ask: workers x factor batches are held in memory.
MAX_PREFETCH_FACTOR = 256


def _setting(check: Check, help: str, default: Any = MISSING) -> Any:
    return field(default=default, metadata={"check": check, "help": help})


class Where(Check):
    """The name of a registered insertion point (:data:`dataecho.loader.points.POINTS`)."""

    @property
    def choices(self) -> tuple[str, ...]:
        """The names registered now (a flag's choices, as :class:`Choice`'s)."""
        return tuple(POINTS)

    @property
    def metavar(self) -> str:  # type: ignore[override]  # read only, as Check's is in use
        return "{" + ",".join(self.choices) + "}"

    def check(self, name: str, value: Any) -> str | None:
        return one_of(value, self.choices, name=name)


class DeviceName(Check):
    """A torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``), kept as its
    name so the options stay plain values; or None."""

    none = "default"
    metavar = "DEVICE"

    def describe(self) -> str:
        return "a torch device such as 'cpu', 'cuda' or 'cuda:1'"

    def check(self, name: str, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, torch.device):
            return str(value)
        if not isinstance(value, str):
            raise DataechoTypeError(
                f"{name} must be {self.describe()} (or a torch.device), got {value!r} of type "
                f"{type(value).__name__}; pass e.g. {name}='cuda'"
            )
        try:
            return str(torch.device(value))
        except RuntimeError:
            raise DataechoValueError(
                f"{name} must be {self.describe()}, got {value!r}; pass e.g. {name}='cuda' "
                f"(the training GPU) or {name}='cpu'"
            ) from None


@dataclass(frozen=True)
class LoaderOptions:
    """Where and how much to echo; every field is checked on construction."""

    batch_size: int = _setting(
        Int(
            1, high=MAX_BATCH, why=BATCH_WHY, hint="pass the number of examples per batch, e.g. 128"
        ),
        "examples per batch; batches are formed after the echo stage",
    )
    echo_factor: float | str = _setting(
        EchoFactor(),
        "copies per fresh item (1 = off; 2.5 = 3 copies of exactly half the items of each "
        "epoch, chosen at random, and 2 of the rest), or 'auto': echo only while fresh data "
        "is late (dataecho.adaptive_echo)",
        1.0,
    )
    max_echo_factor: float = _setting(
        Real(1, hint="the most copies 'auto' may make of one item, e.g. 4"),
        "with echo factor 'auto': the most copies of one item",
        4.0,
    )
    reuse_buffer: int | None = _setting(
        Int(
            1,
            none="default",
            high=MAX_BUFFER,
            why=BUFFER_WHY,
            hint="the number of recent fresh items 'auto' may reuse",
        ),
        "with echo factor 'auto': how many recent fresh items a copy may be drawn from "
        "(default: one batch of examples, or for where=batch or device 1 batch, 8 over a "
        "streaming library's dataset)",
        None,
    )
    reuse_policy: str | None = _setting(
        Choice(REUSE_POLICIES, none="default"),
        "with echo factor 'auto': reuse an item emitted fewest times so far, one drawn "
        "uniformly from the buffer, or the latest (default: fewest for examples, latest for "
        "batches)",
        None,
    )
    where: str = _setting(
        Where(),
        "insertion point of the echo stage: before_augment (each copy augmented on its own: "
        "by transform or batch_transform, else by the dataset's own torchvision-style or "
        "Hugging Face transform, lifted out of __getitem__), after_augment (identical copies), "
        "batch (whole batches repeat) or device (whole batches repeat on the training device "
        "after one host-to-device copy, shuffle_buffer mixes their examples there, and "
        "device_transform augments each copy)",
        "before_augment",
    )
    shuffle_buffer: int | None = _setting(
        Int(
            0,
            none="default",
            high=MAX_BUFFER,
            why=BUFFER_WHY,
            hint="use 0 for no post-echo shuffling (each example's copies side by side)",
        ),
        "post-echo shuffle buffer in examples (for where=batch a multiple of batch_size: it "
        "shuffles whole batches; for where=device, the copies' examples mixed across batches "
        "on the device); 0 or 1 = none. Where "
        "examples are echoed (before_augment, after_augment) no batch then holds two copies of "
        "one example while the buffer has others to give. Default: "
        f"{SPREAD_BATCHES} batches' worth where examples are echoed (at a factor above 1, or "
        "'auto'), else 0",
        None,
    )
    transform: Callable[[Any], Any] | None = _setting(
        OptionalCallable("example"),
        "per-example random augmentation, seeded and checkpointed, or None; given, a "
        "transform the dataset applies itself stays in __getitem__ (once per fresh read)",
        None,
    )
    batch_transform: Callable[[Any], Any] | None = _setting(
        OptionalCallable("batch"),
        "augmentation of each collated batch, example by example (e.g. Augment), run where "
        "the batch is made, after the example-level echo stage, and seeded like transform; "
        "cheaper per example than transform from Python. Not with where=after_augment, whose "
        "copies must be identical",
        None,
    )
    shuffle: bool = _setting(
        Bool(), "read a map-style dataset in a new seeded order each epoch", False
    )
    drop_last: bool = _setting(
        Bool(),
        "drop the epoch's last incomplete batch (echoing: round the copies to whole batches)",
        False,
    )
    copy: bool = _setting(
        Bool(),
        "echoed copies are independent objects (one memcpy per copy, made only where a "
        "per-example transform or a custom collate could see them); false shares them",
        True,
    )
    read_ahead: int | None = _setting(
        Int(0, none="default", high=MAX_BUFFER, why=BUFFER_WHY,
            hint="the examples each worker reads ahead on a thread; 0 reads in step"),
        "examples each worker reads ahead on a background thread, so slow reads overlap the "
        "echo stage's work (dataecho.loader.read_ahead); a dataset whose __getitem__ draws "
        "random numbers is reproducible only with 0 (default: one batch when echoing examples "
        "at a fixed factor, else 0; over a streaming library's dataset at a fixed factor, 8 "
        "batches)",
        None,
    )  # fmt: skip
    echo_device: str | None = _setting(
        DeviceName(),
        "with where=device: the device batches are echoed on, e.g. 'cuda' (default: 'cpu', "
        "the same code path in the training process; pass the training GPU to echo there)",
        None,
    )
    device_transform: Callable[..., Any] | None = _setting(
        OptionalCallable("batch"),
        "with where=device: augmentation of every copy on the device, called as "
        "fn(batch, generator=g) with a torch.Generator on the device, seeded from the "
        "pipeline seed and checkpointed (e.g. dataecho.augment.ShiftFlip()), or None",
        None,
    )
    # The fields left None whose default was derived here: a copy made with ``with_changes``
    # derives them again from its own values.
    _derived: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    @property
    def adaptive(self) -> bool:
        """True for ``echo_factor="auto"``."""
        return self.echo_factor == AUTO

    @property
    def point(self) -> InsertionPoint:
        """The insertion point ``where`` names: every per-point decision is its own."""
        return point_named(self.where)

    @property
    def batch_level(self) -> bool:
        """True where the echo stage repeats whole batches, in the training process."""
        return self.point.batch_level

    @property
    def echoes(self) -> bool:
        """True when an echo stage is needed at all."""
        return self.adaptive or cast(float, self.echo_factor) > 1  # a number unless adaptive

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        for f in fields(self):
            if "check" in f.metadata:
                set_(self, f.name, checked(f.name, f.metadata["check"], getattr(self, f.name)))
        derived = self.point.defaults(self)
        taken = frozenset(name for name in derived if getattr(self, name) is None)
        for name in taken:
            set_(self, name, derived[name])
        set_(self, "_derived", taken)
        self.point.check(self)

    def as_given(self) -> dict[str, Any]:
        """The fields as they were passed: None where a default was derived."""
        return {
            f.name: None if f.name in self._derived else getattr(self, f.name)
            for f in fields(self)
            if f.init
        }

    def with_changes(self, **changes: Any) -> LoaderOptions:
        """A copy with ``changes``; fields left to a derived default derive it again (unlike
        ``dataclasses.replace``, which would keep, say, one batch's worth of reuse buffer
        after the batch size changed)."""
        return LoaderOptions(**{**self.as_given(), **changes})


def _document(cls: type) -> None:
    """Append each field's help to the class docstring, so ``help()`` shows the one text."""
    lines = [f"    {f.name}: {f.metadata['help']}." for f in fields(cls) if "help" in f.metadata]
    cls.__doc__ = f"{cls.__doc__}\n\n    Attributes:\n" + "\n".join(lines) + "\n"


_document(LoaderOptions)


def default_prefetch(opts: LoaderOptions) -> int:
    """Batches each worker keeps in flight by default (DataLoader's is 2).

    The queue holds *emitted* batches: with example echoing each fresh batch leaves as e of
    them, so e times the default depth keeps as much fresh data in flight as without echoing.
    Otherwise a pause of the training loop (an evaluation, a checkpoint) fills the queue with
    copies at once and the upstream stops reading, so the pause costs the echoed run upstream
    time that a run without echoing hides. Capped, since a huge factor would hold that many
    batches in memory.
    """
    if opts.batch_level or opts.adaptive:
        return 2
    return min(2 * math.ceil(cast(float, opts.echo_factor)), MAX_PREFETCH)  # not adaptive


def check_dataloader_arguments(
    dataset: Any,
    batch_size: Any,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    persistent_workers: Any,
    num_workers: int,
) -> None:
    """DataLoader's own argument rules, and the ones echoing adds (see the class docstring)."""
    if batch_size is None:
        raise DataechoValueError(
            "batch_size=None (no automatic batching) is not supported by EchoingDataLoader: "
            "the echo stage forms the batches; pass the number of examples per batch, e.g. 128"
        )
    if batch_sampler is not None:
        raise DataechoValueError(
            "batch_sampler is not supported by EchoingDataLoader: batches are formed after the "
            "echo stage, so a sampler's batches would not survive it; pass sampler= (the order "
            "of examples) and batch_size= instead"
        )
    if persistent_workers and num_workers == 0:
        raise DataechoValueError(
            f"persistent_workers={persistent_workers!r} needs num_workers > 0 (as with "
            "DataLoader): with num_workers=0 the main process reads and there are no workers "
            "to keep; pass num_workers=1 or more, or drop persistent_workers"
        )
    iterable = not is_map_style(dataset)
    if iterable and shuffle:
        raise DataechoValueError(
            f"shuffle={shuffle!r} with an iterable dataset ({type(dataset).__name__}): an "
            "iterable dataset decides its own order (as with DataLoader); shuffle it in the "
            "dataset, or use shuffle_buffer= to shuffle after the echo stage"
        )
    if iterable and sampler is not None:
        raise DataechoValueError(
            f"sampler= with an iterable dataset ({type(dataset).__name__}): a sampler picks "
            "indices of a map-style dataset (as with DataLoader); drop the sampler"
        )
    if sampler is not None and shuffle:
        raise DataechoValueError(
            f"sampler= and shuffle={shuffle!r} are mutually exclusive (as with DataLoader): "
            "the sampler decides the order; drop shuffle, or the sampler"
        )


def check_options_alone(
    options: Any, echo: dict[str, Any], *, batch_size: Any, shuffle: Any, drop_last: Any
) -> None:
    """With ``options=``, the echo keywords stay unset and DataLoader's arguments that options
    also holds (``batch_size``, ``shuffle``, ``drop_last``) are unset or agree with it."""
    if not isinstance(options, LoaderOptions):
        raise DataechoTypeError(
            f"options must be a LoaderOptions or None, got {type(options).__name__}"
        )
    given = [name for name, value in echo.items() if value is not None]
    if given:
        raise DataechoTypeError(
            f"options= and {', '.join(f'{name}=' for name in given)} both set echo settings; "
            f"put them in the options (options.with_changes({given[0]}=...)) or drop options="
        )
    for name, value, unset in (("batch_size", batch_size, 1), ("shuffle", shuffle, None),
                               ("drop_last", drop_last, False)):  # fmt: skip
        if value != unset and value != getattr(options, name):
            raise DataechoValueError(
                f"{name}={value!r} disagrees with options.{name}={getattr(options, name)!r}; "
                f"drop the {name} argument (the options set it) or change the options"
            )


def loader_options(
    dataset: Any,
    options: LoaderOptions | None,
    echo: dict[str, Any],
    *,
    batch_size: Any,
    shuffle: Any,
    drop_last: Any,
    sampler: Any,
    batch_sampler: Any,
    persistent_workers: Any,
    num_workers: int,
) -> LoaderOptions:
    """The loader's options, from ``options=`` or from the echo keywords ``echo`` and
    DataLoader's arguments, every rule checked before any work starts."""
    if options is None:
        check_dataloader_arguments(dataset, batch_size, shuffle, sampler, batch_sampler,
                                   persistent_workers, num_workers)  # fmt: skip
        given = {k: v for k, v in echo.items() if v is not None}
        # batch_size None was refused just above.
        return LoaderOptions(batch_size=cast(int, batch_size), shuffle=bool(shuffle),
                             drop_last=bool(drop_last), **given)  # fmt: skip
    check_options_alone(options, echo, batch_size=batch_size, shuffle=shuffle,
                        drop_last=drop_last)  # fmt: skip
    check_dataloader_arguments(dataset, options.batch_size, options.shuffle, sampler,
                               batch_sampler, persistent_workers, num_workers)  # fmt: skip
    return options
