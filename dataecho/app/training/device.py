"""The training device of a run: where its model and its step run (``TrainConfig.device``)."""

from __future__ import annotations

import torch

from dataecho.errors import DataechoValueError
from dataecho.loader.device import resolve_device


def default_device() -> str:
    """``"cuda"`` where ``torch.cuda.is_available()``, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def training_device(name: str | None, *, local_rank: int | None = None) -> torch.device:
    """``name`` (None: :func:`default_device`) as a device this machine has, else a
    ``ValueError`` naming the fix. Data parallel (``local_rank`` given): "cuda" is the local
    rank's GPU, ``cuda:LOCAL_RANK``, as each rank of a node takes its own."""
    device = torch.device(name or default_device())
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise DataechoValueError(
            f"device={name!r}, but CUDA is not available here (torch.cuda.is_available() is "
            "False); train on the CPU with --device cpu (device='cpu'), or leave --device out "
            "to take a GPU only where there is one"
        )
    if local_rank is None:
        return resolve_device(str(device))
    if device.index is not None:
        raise DataechoValueError(
            f"device={name!r}: in a data-parallel run each rank trains on its local rank's GPU "
            "(cuda:LOCAL_RANK); pass --device cuda, and choose the GPUs with CUDA_VISIBLE_DEVICES"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise DataechoValueError(
            f"the rank with LOCAL_RANK={local_rank} trains on cuda:{local_rank}, but this machine "
            f"has {count} CUDA device(s); start at most {count} rank(s) on it (--nproc, or "
            "torchrun --nproc-per-node), or pass --device cpu"
        )
    return torch.device("cuda", local_rank)
