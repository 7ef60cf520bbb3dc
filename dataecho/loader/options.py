"""The loader's echo options: a small validated dataclass (grain style)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataecho import _validate

WHERE_CHOICES = ("before_augment", "after_augment", "batch")


@dataclass(frozen=True)
class LoaderOptions:
    """Where and how much to echo; checked on construction.

    Attributes:
        batch_size: examples per batch (>= 1).
        echo_factor: mean copies per fresh item (>= 1; a fraction is drawn per item).
        where: insertion point: "before_augment", "after_augment" or "batch".
        shuffle_buffer: post-echo shuffle buffer in items (examples, or batches for "batch");
            0 or 1 means none.
        transform: per-example augmentation, or None.
        shuffle: read a map-style dataset in a new random order each epoch.
        drop_last: drop each worker's last incomplete batch.
        copy: echoed copies are independent objects (see ``dataecho.stages.copying``).
    """

    batch_size: int
    echo_factor: float = 1.0
    where: str = "before_augment"
    shuffle_buffer: int = 0
    transform: Callable[[Any], Any] | None = None
    shuffle: bool = False
    drop_last: bool = False
    copy: bool = True

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
        set_(self, "echo_factor", _validate.echo_factor(self.echo_factor, name="echo_factor"))
        _validate.one_of(self.where, WHERE_CHOICES, name="where")
        set_(
            self,
            "shuffle_buffer",
            _validate.non_negative_int(
                self.shuffle_buffer, name="shuffle_buffer", hint="use 0 for no post-echo shuffling"
            ),
        )
        if self.transform is not None and not callable(self.transform):
            raise TypeError(
                f"transform must be a callable (example -> example) or None, got "
                f"{type(self.transform).__name__}"
            )
