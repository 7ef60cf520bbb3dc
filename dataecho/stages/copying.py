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


def copy_pinned(item: Any) -> Any:
    """:func:`copy_item`, with a copy of a pinned tensor in pinned memory too.

    Why: a training loop copies a host batch to the GPU with ``non_blocking=True``, which is
    asynchronous only from pinned memory; a plain ``clone()`` of a pinned batch is not pinned,
    and its copy would block the host. For the main process only: ``is_pinned()`` asks the
    accelerator's runtime, which a forked worker must not start.
    """
    return map_leaves(item, _copy_leaf_pinned, keep_types=True)


def _copy_leaf_pinned(item: Any) -> Any:
    if isinstance(item, torch.Tensor) and item.is_pinned():
        return torch.empty_like(item, pin_memory=True).copy_(item)
    return _copy_leaf(item)


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


def copy_items(items: list[Any], plan: Plan | None = None) -> list[Any]:
    """``[copy_item(x) for x in items]``, with the tensors and arrays that the items hold at
    one place, in one shape and dtype, copied together.

    Why: one allocation per tensor copied costs the allocator more than the copy itself once
    a batch's worth of them is alive at a time (the heap grows and shrinks each batch). Copied
    together, they are rows of one new block: each copy is a view of its own row, so a write
    to one copy still changes no other copy and no original. Contiguous tensors and arrays
    only (a copy keeps its original's strides); anything else is copied as ``copy_item`` does.

    ``plan``: what :func:`copy_plan` gave for items that include these (their checks made
    once, not for every list of their copies); None: the checks run on ``items`` now.
    """
    if len(items) < 2:
        return [copy_item(x) for x in items]
    return _copy_by_plan(copy_plan(items) if plan is None else plan, items)


# How copy_items copies the values found at one place of each item, as its checks decide:
# ("same",) immutable leaves, kept; ("tensor", dtype) and ("array", shape, dtype) rows of one
# new block; ("seq", type, plans) and ("dict", keys, plans) rebuilt around their places'
# copies; ("each",) anything else, copy_item by copy_item.
Plan = tuple[Any, ...]
_SAME, _EACH = ("same",), ("each",)


def copy_plan(items: list[Any]) -> Plan:
    """How :func:`copy_items` copies ``items`` (non-empty). Two lists with equal plans have
    that plan together too, so a plan made for each list of items as it arrives holds for
    any list of their copies."""
    # The checks run per value at C speed (map, set): they are most of the copy's own time.
    first = items[0]
    cls = type(first)
    if len(set(map(type, items))) > 1:
        return _EACH
    if cls in _IMMUTABLE:
        return _SAME
    if cls is torch.Tensor:
        try:
            return ("tensor", first.dtype) if _stackable_tensors(items, first) else _EACH
        except (RuntimeError, NotImplementedError):  # layouts without strides
            return _EACH
    if cls is np.ndarray and first.ndim and _stackable_arrays(items):
        return ("array", first.shape, first.dtype)
    if (cls is tuple or cls is list) and first and len(set(map(len, items))) == 1:
        return ("seq", cls, tuple(copy_plan(list(c)) for c in zip(*items, strict=True)))
    if cls is dict and first and len(set(map(tuple, items))) == 1:
        keys = tuple(first)
        return ("dict", keys, tuple(copy_plan([v[k] for v in items]) for k in keys))
    return _EACH


def _copy_by_plan(plan: Plan, values: list[Any]) -> list[Any]:
    """Copies of ``values``, the leaves or containers found at one place of each item."""
    kind = plan[0]
    if kind == "same":
        return list(values)
    if kind == "tensor":
        try:
            block = torch.stack(values)
            # One in autograd: a block would tie the copies into one graph (clone does not).
            if not block.requires_grad:
                return list(block.unbind(0))
        except (RuntimeError, NotImplementedError):  # shapes, devices or layouts that differ
            pass
    elif kind == "array":
        return list(np.stack(values))
    elif kind == "seq":
        places = zip(*values, strict=True)
        columns = [_copy_by_plan(p, list(c)) for p, c in zip(plan[2], places, strict=True)]
        rows = zip(*columns, strict=True)  # tuples already
        return list(rows) if plan[1] is tuple else list(map(list, rows))
    elif kind == "dict":
        keys = plan[1]
        columns = [
            _copy_by_plan(p, [v[k] for v in values]) for p, k in zip(plan[2], keys, strict=True)
        ]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    return [copy_item(v) for v in values]


_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")


def _stackable_tensors(values: list[torch.Tensor], first: torch.Tensor) -> bool:
    """Whether ``torch.stack`` copies ``values`` as ``clone`` would, unless it refuses them
    (shapes, devices or layouts that differ) or its block is in autograd (checked on the
    block, once, not per tensor): plain, contiguous, strided tensors of one dtype (which
    ``stack`` would promote)."""
    return (
        first.layout == torch.strided
        and len(set(map(_DTYPE, values))) == 1
        and all(map(torch.Tensor.is_contiguous, values))
    )


def _stackable_arrays(values: list[np.ndarray]) -> bool:
    return (
        len(set(map(_SHAPE, values))) == 1
        and len(set(map(_DTYPE, values))) == 1
        and all(v.flags.c_contiguous for v in values)
    )
