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

A worker's state (its position, RNG counters, the packed shuffle buffer) crosses with a batch
too, and :func:`send_once` decides how: its tensors cross pickled as bytes through the pipe, not
as torch's shared memory. That costs both processes less (no segment to make and map, no socket
hand-over of its descriptor), and a training process interrupted while receiving one (Ctrl-C
during a wait) leaves no hand-over half done in the worker. The worker diffs each state against
the previous one, so it holds the last one until the next: a second copy of the packed buffer
next to the buffer itself; large tensors are wrapped so the worker drops them once pickled,
which lowers its peak memory by about one buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from dataecho._structure import map_tensors, rebuild, tensors

PIPE_LIMIT = 512 * 1024  # bytes of tensor data per batch sent pickled through the pipe
SEND_ONCE_BYTES = 64 * 1024  # state tensors at least this large leave the worker with the state


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


class _SendOnce:
    """A large tensor of a worker's state: pickled once, then no longer held by the worker.

    It unpickles as a plain tensor equal to it, so the training process (and its checkpoints)
    never sees the wrapper. Equality is identity, so the worker's diff always sends it.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        tensor, self.tensor = self.tensor, None
        if tensor is None:
            raise RuntimeError(
                "a worker state tensor was pickled a second time after it was sent; this is a "
                "dataecho bug: please report it with the torchdata version"
            )
        if pipeable(tensor):
            return (_state_array, (tensor.numpy(),))
        return (_state_tensor, (tensor,))


class _InPipe:
    """A small tensor of a worker's state, pickled as its bytes: torch would give it a
    shared-memory segment and a descriptor hand-over of its own, which cost both processes
    more than the copy."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        return (_state_array, (self.tensor.numpy(),))


def _state_array(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


def _state_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def send_once(state: Any) -> Any:
    """``state`` with its tensors of :data:`SEND_ONCE_BYTES` or more wrapped in ``_SendOnce``,
    and the smaller ones that numpy holds in ``_InPipe``.

    Only for a state that a worker process hands to the loader's result queue. It opens only
    plain dicts and lists, the containers of a node state, and keeps every other object as it
    is (not :mod:`dataecho._structure`'s walk, which rebuilds tuples and dict subclasses).
    """
    if isinstance(state, torch.Tensor):
        if state.numel() * state.element_size() >= SEND_ONCE_BYTES:
            return _SendOnce(state)
        return _InPipe(state) if pipeable(state) else state
    if type(state) is dict:
        return {k: send_once(v) for k, v in state.items()}
    if type(state) is list:
        # A packed buffer's plain column is a list of thousands of numbers: one look at its
        # types (at C speed) instead of a call per number.
        if not any(issubclass(t, _OPENED) for t in set(map(type, state))):
            return state
        return [send_once(v) for v in state]
    return state


_OPENED = (torch.Tensor, dict, list)  # what send_once looks into or wraps
