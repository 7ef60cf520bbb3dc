"""How a batch crosses from a worker process to the training process.

``torch.multiprocessing`` sends every tensor through its own shared-memory segment: a file
descriptor passed over a socket, then mapped and later unmapped by the receiver. For small
batches that fixed cost dominates: receiving the same bytes pickled through the pipe takes
less of the training process's CPU. For large batches copying the bytes costs more than the
mapping, so only batches up to :data:`PIPE_LIMIT` bytes go as plain arrays; larger ones keep
shared memory (``python -m benchmarks transport`` prices both ways per batch size).
With example-level echoing every emitted batch crosses, so this cost is paid e times per fresh
batch, on the core that runs the training step.

The same holds for how a worker collates. ``default_collate`` in a worker stacks a batch into a
new shared-memory segment, which saves a copy only when that batch crosses as it is, through
shared memory; a batch that a ``batch_transform`` replaces, or one sent through the pipe, pays
for the segment (about 0.2 ms per batch of 128 28x28 images here) and gains nothing.
:class:`WorkerCollate` stacks into plain memory there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from dataecho._structure import map_tensors, rebuild, tensors

PIPE_LIMIT = 512 * 1024  # bytes of tensor data per batch sent pickled through the pipe


class _Piped:
    """A tensor's data as a numpy array, to be pickled as bytes (not shared memory)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Piped, (self.array,))


def to_wire(batch: Any, limit: float = PIPE_LIMIT) -> Any:
    """``batch`` with its plain CPU tensors as :class:`_Piped` arrays, if its tensors hold at
    most ``limit`` bytes (``benchmarks/transport`` measures where the pipe stops paying)."""
    if _tensor_bytes(batch) > limit:
        return batch
    return map_tensors(batch, lambda t: _Piped(t.numpy()) if pipeable(t) else t)


def from_wire(batch: Any) -> Any:
    """Undo :func:`to_wire` (no copy: the tensors take over the unpickled arrays)."""
    return _map_piped(batch)


class WorkerCollate:
    """``default_collate`` for a worker's batches, into shared memory only where that saves a copy.

    ``replaced``: a ``batch_transform`` follows, so the collated batch never crosses. ``piped``:
    small batches cross through the pipe (:func:`to_wire`); once a batch is too large for it,
    the later ones are stacked into shared memory again, as they will cross there.
    """

    def __init__(self, *, replaced: bool, piped: bool) -> None:
        self.replaced = replaced
        self.shared = not replaced and not piped

    def __call__(self, examples: list[Any]) -> Any:
        if self.shared:
            return default_collate(examples)
        batch = collate(examples, collate_fn_map=_PLAIN_STACK)
        if not self.replaced and _tensor_bytes(batch) > PIPE_LIMIT:
            self.shared = True
        return batch


def _stack(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    if batch[0].is_nested or batch[0].layout != torch.strided:
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # torch's own errors
    return torch.stack(batch, 0)


_PLAIN_STACK = {**default_collate_fn_map, torch.Tensor: _stack}


def pipeable(t: torch.Tensor) -> bool:
    """Whether ``t`` can cross as a numpy array's bytes: numpy holds it exactly. Others (grad,
    bfloat16, sparse, tensor subclasses) keep torch's shared memory."""
    return (
        t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.requires_grad
        and t.dtype not in (torch.bfloat16,)
        and type(t) is torch.Tensor
    )


def _tensor_bytes(batch: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(batch))


def _map_piped(batch: Any) -> Any:
    if isinstance(batch, _Piped):
        return torch.from_numpy(batch.array)
    return rebuild(batch, _map_piped)
