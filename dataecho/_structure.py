"""Walking a batch's structure: tuples, named tuples, lists and dicts around leaves.

The one walker for the loader's transport, its device path, the stages that work on whole
batches and copy-on-echo, so they all agree on what a batch's containers and leaves are.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable
from typing import Any

import torch

_CONTAINERS = (tuple, list, dict)


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with ``fn`` applied to each tensor in it (tuples, named tuples, lists and dicts
    rebuilt with their types; other leaves kept as they are)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    return rebuild(batch, lambda x: map_tensors(x, fn))


def map_leaves(batch: Any, fn: Callable[[Any], Any], *, keep_types: bool = False) -> Any:
    """``batch`` with ``fn`` applied to every leaf: whatever is not a tuple, list or dict.
    ``keep_types``: see :func:`rebuild`."""
    if isinstance(batch, _CONTAINERS):
        return rebuild(batch, lambda x: map_leaves(x, fn, keep_types=keep_types),
                       keep_types=keep_types)  # fmt: skip
    return fn(batch)


def leaves(batch: Any) -> list[Any]:
    """Every leaf of ``batch`` (whatever is not a tuple, list or dict), in order."""
    found: list[Any] = []
    _collect(batch, found)
    return found


def tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of ``batch``, in order (other leaves left out)."""
    return [x for x in leaves(batch) if isinstance(x, torch.Tensor)]


def _collect(batch: Any, found: list[Any]) -> None:
    if isinstance(batch, dict):
        for x in batch.values():
            _collect(x, found)
    elif isinstance(batch, (tuple, list)):
        for x in batch:
            _collect(x, found)
    else:
        found.append(batch)


def rebuild(batch: Any, fn: Callable[[Any], Any], *, keep_types: bool = False) -> Any:
    """``batch`` with ``fn`` applied to each element of a tuple, list or dict; any other object
    as it is. Tuples keep their type (named ones their fields); a subclass of list or dict
    (``OrderedDict``, ``defaultdict``) becomes a plain one, or with ``keep_types`` a shallow
    copy of itself (its type and extras kept) whose values are replaced."""
    if isinstance(batch, tuple):
        items = [fn(x) for x in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, list):
        if keep_types and type(batch) is not list:
            return _replaced(batch, enumerate(batch), fn)
        return [fn(x) for x in batch]
    if isinstance(batch, dict):
        if keep_types and type(batch) is not dict:
            return _replaced(batch, batch.items(), fn)
        return {k: fn(v) for k, v in batch.items()}
    return batch


def _replaced(container: Any, items: Any, fn: Callable[[Any], Any]) -> Any:
    # Subclasses take other constructor arguments: copied as they are, then refilled.
    out = _copy.copy(container)
    for k, v in items:
        out[k] = fn(v)
    return out
