"""Walking a batch's structure: tuples, named tuples, lists and dicts around leaves.

One walker for the loader's transport, its device path and the stages that work on whole
batches, so they all agree on what a batch's tensors are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with ``fn`` applied to each tensor in it (tuples, named tuples, lists and dicts
    rebuilt with their types; other leaves kept as they are)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    return rebuild(batch, lambda x: map_tensors(x, fn))


def map_leaves(batch: Any, fn: Callable[[Any], Any]) -> Any:
    """``batch`` with ``fn`` applied to every leaf: whatever is not a tuple, list or dict."""
    if isinstance(batch, (tuple, list, dict)):
        return rebuild(batch, lambda x: map_leaves(x, fn))
    return fn(batch)


def rebuild(batch: Any, fn: Callable[[Any], Any]) -> Any:
    """``batch`` with ``fn`` applied to each element of a tuple, list or dict (kept types);
    any other object as it is."""
    if isinstance(batch, tuple):
        items = [fn(x) for x in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, list):
        return [fn(x) for x in batch]
    if isinstance(batch, dict):
        return {k: fn(v) for k, v in batch.items()}
    return batch
