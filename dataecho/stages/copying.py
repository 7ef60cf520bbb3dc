"""Copy-on-echo: every emitted copy of an echoed item is its own object.

Why: training code and augmentations often work in place (``x.add_(noise)``,
``np.clip(a, out=a)``). If the echo stage emitted the same object twice, the second copy would
carry the first one's changes, and the source (a dataset in memory) would change too.

Cost: one memory copy of the item per emitted copy of an echoed item (items emitted once pass
through untouched). For an uint8 28x28 image that is under a microsecond; for large decoded
images it is a memcpy per copy. Pass ``copy=False`` to a stage when the consumer never writes
in place.
"""

from __future__ import annotations

import copy as _copy
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from dataecho._structure import map_leaves

# Immutable leaves: sharing them is safe and copying them wastes time.
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), frozenset, range)


def copy_item(item: Any) -> Any:
    """Return a copy of ``item`` that shares no mutable memory with it.

    Tensors are cloned, arrays copied, dicts/lists/tuples rebuilt around copied leaves (their
    subclasses' types kept); any other object goes through ``copy.deepcopy``.
    """
    # Plain containers and tensors first, without the general walk: an echoed example is
    # copied once per copy, and the walk's calls would cost more than cloning a small image.
    cls = type(item)
    if cls is tuple:
        return tuple([copy_item(x) for x in item])
    if cls is list:
        return [copy_item(x) for x in item]
    if cls is dict:
        return {k: copy_item(v) for k, v in item.items()}
    if cls is torch.Tensor:
        return item.clone()
    if cls in _IMMUTABLE:
        return item
    return map_leaves(item, _copy_leaf, keep_types=True)


def _copy_leaf(item: Any) -> Any:
    if isinstance(item, _IMMUTABLE):
        return item
    if isinstance(item, torch.Tensor):
        return item.clone()
    if isinstance(item, np.ndarray):
        return item.copy()
    if isinstance(item, np.generic):
        return item
    return _copy.deepcopy(item)


def copy_items(items: list[Any]) -> list[Any]:
    """``[copy_item(x) for x in items]``, with the tensors and arrays that the items hold at
    one place, in one shape and dtype, copied together.

    Why: one allocation per tensor copied costs the allocator more than the copy itself once
    a batch's worth of them is alive at a time (the heap grows and shrinks each batch). Copied
    together, they are rows of one new block: each copy is a view of its own row, so a write
    to one copy still changes no other copy and no original. Contiguous tensors and arrays
    only (a copy keeps its original's strides); anything else is copied as ``copy_item`` does.
    """
    if len(items) < 2:
        return [copy_item(x) for x in items]
    return _copy_column(items)


def _copy_column(values: list[Any]) -> list[Any]:
    """Copies of ``values``, the leaves or containers found at one place of each item."""
    # The checks run per value at C speed (map, set): they are most of this function's time.
    first = values[0]
    cls = type(first)
    if len(set(map(type, values))) > 1:
        return [copy_item(v) for v in values]
    if cls in _IMMUTABLE:
        return list(values)
    if cls is torch.Tensor:
        try:
            if _stackable_tensors(values, first):
                return list(torch.stack(values).unbind(0))
        except (RuntimeError, NotImplementedError):  # shapes, devices or layouts that differ
            pass
        return [copy_item(v) for v in values]
    if cls is np.ndarray and first.ndim and _stackable_arrays(values):
        return list(np.stack(values))
    if (cls is tuple or cls is list) and first and len(set(map(len, values))) == 1:
        columns = [_copy_column(list(c)) for c in zip(*values, strict=True)]
        return [cls(row) for row in zip(*columns, strict=True)]
    if cls is dict and first and len(set(map(tuple, values))) == 1:
        keys = list(first)
        columns = [_copy_column([v[k] for v in values]) for k in keys]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    return [copy_item(v) for v in values]


_SHAPE, _DTYPE, _GRAD = attrgetter("shape"), attrgetter("dtype"), attrgetter("requires_grad")


def _stackable_tensors(values: list[torch.Tensor], first: torch.Tensor) -> bool:
    """Whether ``torch.stack`` copies ``values`` as ``clone`` would, unless it refuses them
    (shapes, devices or layouts that differ): plain, contiguous, strided tensors outside
    autograd, of one dtype (which ``stack`` would promote)."""
    return (
        first.layout == torch.strided
        and len(set(map(_DTYPE, values))) == 1
        and all(map(torch.Tensor.is_contiguous, values))
        and not any(map(_GRAD, values))
    )


def _stackable_arrays(values: list[np.ndarray]) -> bool:
    return (
        len(set(map(_SHAPE, values))) == 1
        and len(set(map(_DTYPE, values))) == 1
        and all(v.flags.c_contiguous for v in values)
    )
