"""How a batch crosses from a worker process to the training process.

``torch.multiprocessing`` sends every tensor through its own shared-memory segment: a file
descriptor passed over a socket, then mapped and later unmapped by the receiver. For small
batches that fixed cost dominates: receiving the same bytes pickled through the pipe takes
less of the training process's CPU. For large batches copying the bytes costs more than the
mapping, so only batches up to :data:`PIPE_LIMIT` bytes go as plain arrays; larger ones keep
shared memory.
With example-level echoing every emitted batch crosses, so this cost is paid e times per fresh
batch, on the core that runs the training step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataecho._structure import map_tensors, rebuild, tensors

PIPE_LIMIT = 512 * 1024  # bytes of tensor data per batch sent pickled through the pipe


class _Piped:
    """A tensor's data as a numpy array, to be pickled as bytes (not shared memory)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Piped, (self.array,))


def to_wire(batch: Any) -> Any:
    """``batch`` with its plain CPU tensors as :class:`_Piped` arrays, if it is small enough."""
    if _tensor_bytes(batch) > PIPE_LIMIT:
        return batch
    return map_tensors(batch, lambda t: _Piped(t.numpy()) if _plain(t) else t)


def from_wire(batch: Any) -> Any:
    """Undo :func:`to_wire` (no copy: the tensors take over the unpickled arrays)."""
    return _map_piped(batch)


def _plain(t: torch.Tensor) -> bool:
    # Only tensors numpy can hold exactly; others (grad, bfloat16, sparse...) keep shared memory.
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
