"""A batch's examples as rows of wide words: how the example-mixing pool stores and moves them.

Why: on the CPU, scattering a batch of uint8 images into a pool moves one byte at a time;
viewed as int64 words, the same rows move about 6x faster (a GPU moves either quickly). Every
leaf of a batch must be a tensor with one row per example, in one dtype and row shape.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dataecho._structure import leaves, map_tensors
from dataecho.errors import DataechoTypeError, DataechoValueError

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)
_KEEP_WHOLE = "or pass shuffle_buffer=0 to keep batches whole"


class RowLayout:
    """Each leaf's dtype, row shape and word type, as the first batch (``template``) has them."""

    def __init__(self, template: Any) -> None:
        self.fields = [(t.dtype, tuple(t.shape[1:])) for t in tensor_leaves(template)]
        self.words = []
        for dtype, row in self.fields:
            row_bytes = math.prod(row) * dtype.itemsize
            self.words.append(next(w for w in _WORDS if row_bytes % w.itemsize == 0))

    def size(self, batch: Any) -> int:
        """Examples in ``batch``; a clear error unless its leaves match the layout."""
        leaves = tensor_leaves(batch)
        size = leaves[0].shape[0] if leaves[0].dim() else 0
        if any(t.dim() == 0 or t.shape[0] != size for t in leaves):
            raise DataechoValueError(
                f"mixing examples across batches needs every tensor of a batch to hold one row "
                f"per example; got shapes {[tuple(t.shape) for t in leaves]}; collate each "
                f"field to shape (batch, ...), {_KEEP_WHOLE}"
            )
        seen = [(t.dtype, tuple(t.shape[1:])) for t in leaves]
        if seen != self.fields:
            raise DataechoValueError(
                f"mixing examples across batches needs every batch's fields in one dtype and "
                f"shape; got {_named(seen)} after {_named(self.fields)}; pad or crop to one "
                f"shape, {_KEEP_WHOLE}"
            )
        return size

    def to_words(self, batch: Any) -> Any:
        """``batch`` with each leaf as a 2-D tensor of words, one row per example."""
        layout = iter(zip(self.fields, self.words, strict=True))

        def flat(t: torch.Tensor) -> torch.Tensor:
            (_, row), word = next(layout)
            raw = t.reshape(len(t), math.prod(row)).contiguous().view(torch.uint8)
            try:
                return raw.view(word)
            except RuntimeError:  # a view into memory not aligned for the word: copied
                return raw.clone().view(word)

        return map_tensors(batch, flat)

    def from_words(self, batch: Any) -> Any:
        """Undo :meth:`to_words` (views, no copy)."""
        fields = iter(self.fields)

        def shaped(t: torch.Tensor) -> torch.Tensor:
            dtype, row = next(fields)
            return t.view(torch.uint8).view(dtype).view(len(t), *row)

        return map_tensors(batch, shaped)


def tensor_leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of ``batch`` in order; a clear error for any other kind of leaf."""
    found = leaves(batch)
    for leaf in found:
        if not isinstance(leaf, torch.Tensor):
            raise DataechoTypeError(
                f"mixing examples across batches needs batches made of tensors (in tuples, "
                f"lists or dicts); got a {type(leaf).__name__} leaf ({leaf!r:.60}); collate it "
                f"into a tensor, {_KEEP_WHOLE}"
            )
    if not found:
        raise DataechoTypeError(
            "mixing examples across batches needs at least one tensor per batch"
        )
    return found


def _named(fields: list[tuple[torch.dtype, tuple[int, ...]]]) -> list[tuple[str, tuple]]:
    return [(str(dtype), row) for dtype, row in fields]
