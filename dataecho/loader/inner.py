"""The inner ``StatefulDataLoader``: the worker processes that run the pipelines.

``EchoingDataLoader`` hands it the per-worker pipeline (:mod:`dataecho.loader.pipeline`) as an
iterable dataset of ready batches; it decides here how those workers are set up: pinned memory
(also for ``where="device"`` on CUDA), prefetch depth and snapshot interval (their defaults
follow the echo options), the workers' base seed and their guard against an orphaned life.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho.loader.lifetime import WorkerInit
from dataecho.loader.options import default_prefetch
from dataecho.loader.pipeline import PipelineDataset, unwrap_identity
from dataecho.loader.snapshots import snapshot_interval


def prefetch_depth(pipeline: PipelineDataset, num_workers: int, given: int | None) -> int | None:
    """``prefetch_factor``: the one given, else the echo options' default (with workers)."""
    if given is None and num_workers:
        return default_prefetch(pipeline.options)
    return given


def inner_loader(
    pipeline: PipelineDataset,
    *,
    num_workers: int,
    seed: int,
    prefetch_factor: int | None,
    snapshot_every_n_steps: int | None,
    pin_memory: bool,
    device: torch.device | None,
    persistent_workers: bool,
    worker_init_fn: Callable[[int], Any] | None,
    **dataloader_args: Any,
) -> StatefulDataLoader:
    """The ``StatefulDataLoader`` over ``pipeline``; ``dataloader_args`` (``timeout``,
    ``multiprocessing_context``, ``pin_memory_device``, ``in_order``) go to it as they are.

    ``device``: where ``where="device"`` echoes, or None. ``snapshot_every_n_steps`` None:
    :func:`~dataecho.loader.snapshots.snapshot_interval`, or every batch over a streaming
    library's dataset, whose reads a replay from an older snapshot would fetch again.
    """
    if snapshot_every_n_steps is None and pipeline.stream is not None:
        snapshot_every_n_steps = 1
    if snapshot_every_n_steps is None:
        snapshot_every_n_steps = snapshot_interval(pipeline.options, num_workers, prefetch_factor)
    # The copies to CUDA read pinned memory, pinned by the inner loader's own thread.
    pin = pin_memory or (device is not None and device.type == "cuda")
    # Pinning happens before our main-process code sees a batch: keep tensors for it.
    pipeline.pipe_small_batches = not pin
    with warnings.catch_warnings():
        # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on.
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(
            pipeline,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=unwrap_identity,
            pin_memory=pin,
            worker_init_fn=WorkerInit(worker_init_fn),
            # The workers' base seed comes from the pipeline seed, not from torch's global
            # RNG, which belongs to the training loop.
            generator=torch.Generator().manual_seed(seed),
            prefetch_factor=prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
            persistent_workers=persistent_workers,
            **dataloader_args,
        )
