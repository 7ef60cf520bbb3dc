"""Pack a buffer of items into a few stacked tensors for checkpoints.

Why: a shuffle buffer saved as one tensor per item sends every tensor through a worker's queue
as its own shared-memory segment, and ``StatefulDataLoader`` may snapshot its workers after
every batch. Stacked column by column, the same buffer is one copy and a handful of segments
(what snapshots cost: see the ``peers`` benchmark).

Items that share one structure (tuples, lists and dicts of tensors, numpy arrays and plain
Python values) are packed; anything else is kept as a list of copies. Either form holds only
tensors, lists, dicts, strings and numbers, so ``torch.load(weights_only=True)`` accepts it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataecho.stages.copying import copy_item

_PLAIN = (int, float, bool, str, type(None))


def _flatten(item: Any, leaves: list[Any]) -> Any:
    """The structure of ``item`` as nested lists; its leaves appended to ``leaves``.

    Not :mod:`dataecho._structure`'s walk: only plain tuples, lists and str-keyed dicts are
    opened, the containers a ``weights_only`` checkpoint can name and :func:`_unflatten` can
    rebuild; anything else (a named tuple, an ``OrderedDict``) is one leaf."""
    if type(item) in (tuple, list):
        return [type(item).__name__, [_flatten(x, leaves) for x in item]]
    if type(item) is dict and all(isinstance(k, str) for k in item):
        return ["dict", list(item), [_flatten(v, leaves) for v in item.values()]]
    leaves.append(item)
    return "leaf"


def _unflatten(structure: Any, leaves: list[Any], pos: list[int]) -> Any:
    if structure == "leaf":
        pos[0] += 1
        return leaves[pos[0] - 1]
    if structure[0] == "dict":
        return {
            k: _unflatten(s, leaves, pos) for k, s in zip(structure[1], structure[2], strict=True)
        }
    values = [_unflatten(s, leaves, pos) for s in structure[1]]
    return tuple(values) if structure[0] == "tuple" else values


def _column(values: list[Any]) -> dict[str, Any] | None:
    """One leaf position across all items, stacked; None if it cannot be."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        if all(
            isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return {"kind": "tensor", "data": torch.stack(values)}
        return None
    if isinstance(first, np.ndarray) and first.dtype.kind in "biuf":
        if all(
            isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return {"kind": "ndarray", "data": torch.from_numpy(np.stack(values))}
        return None
    if all(type(v) in _PLAIN for v in values):
        return {"kind": "plain", "data": list(values)}
    return None


def pack(items: list[Any]) -> dict[str, Any]:
    """A checkpoint-safe copy of ``items``; :func:`unpack` gives them back."""
    if not items:
        return {"format": "list", "items": []}
    structures, rows = [], []
    for item in items:
        leaves: list[Any] = []
        structures.append(_flatten(item, leaves))
        rows.append(leaves)
    if any(s != structures[0] for s in structures):
        return {"format": "list", "items": [copy_item(x) for x in items]}
    columns = [_column([row[i] for row in rows]) for i in range(len(rows[0]))]
    if any(c is None for c in columns):
        return {"format": "list", "items": [copy_item(x) for x in items]}
    return {"format": "columns", "n": len(items), "structure": structures[0], "columns": columns}


def unpack(packed: dict[str, Any]) -> list[Any]:
    """The items :func:`pack` stored, each its own object (no views into the packed tensors)."""
    if packed["format"] == "list":
        return list(packed["items"])
    columns = []
    for col in packed["columns"]:
        if col["kind"] == "tensor":
            columns.append([t.clone() for t in col["data"].unbind(0)])
        elif col["kind"] == "ndarray":
            columns.append([a.copy() for a in col["data"].numpy()])
        else:
            columns.append(list(col["data"]))
    return [
        _unflatten(packed["structure"], [c[i] for c in columns], [0]) for i in range(packed["n"])
    ]
