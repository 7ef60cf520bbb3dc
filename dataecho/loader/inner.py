"""The inner ``StatefulDataLoader``: the worker processes that run the pipelines.

``EchoingDataLoader`` hands it the per-worker pipeline (:mod:`dataecho.loader.pipeline`) as an
iterable dataset of ready batches; it decides here how those workers are set up: pinned memory
(also for ``where="device"`` on CUDA), prefetch depth and snapshot interval (their defaults
follow the echo options), the workers' base seed and their guard against an orphaned life.

Snapshots. ``StatefulDataLoader`` gets each worker's pipeline state *with* a batch, so that
``state_dict()`` in the training process never waits for a worker. For an iterable dataset (the
pipeline is one) it asks for the state with every batch put in flight near a snapshot step,
about ``workers x (prefetch_factor + 1) + 1`` of them per ``snapshot_every_n_steps`` batches:
with a short interval and deep prefetch every batch can carry a packed buffer, which costs the
worker (and the training thread that unpacks it) more than the batch. :func:`snapshot_interval`
stretches the interval by that window, so a buffer is packed about once per buffer's worth of
fresh batches; the price is a longer replay on resume (the same upstream reads at any echo
factor): the worker restores the snapshot before the checkpoint and replays the batches since,
at most one interval. The ``peers`` benchmark measures both costs; how a state crosses is
:mod:`dataecho.loader.transport`'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho.loader.lifetime import WorkerInit
from dataecho.loader.options import LoaderOptions, default_prefetch
from dataecho.loader.pipeline import PipelineDataset, unwrap_identity

# A worker buffer smaller than this packs in about a millisecond, no more than the rest of a
# snapshot (positions, RNG states) costs: such loaders keep one snapshot per buffer's worth of
# batches counted plainly, and replay little on resume.
CHEAP_BUFFER = 128  # examples


def snapshot_interval(opts: LoaderOptions, num_workers: int, prefetch_factor: int | None) -> int:
    """The default ``snapshot_every_n_steps``: about one packed buffer per buffer's worth of
    fresh batches (see the module docstring). A resume replays at most this many batches."""
    if opts.adaptive and not opts.batch_level and num_workers:
        # "auto" in a worker decides by timing, so a replay from an older snapshot would not
        # repeat its reuse decisions: the resumed stream would repeat some examples and skip
        # others. One snapshot per batch keeps the resume exact.
        return 1
    # Batch echoing shuffles whole batches in the training process; workers buffer nothing.
    # Derived on construction where not given: an int here.
    buffered = 0 if opts.batch_level else cast(int, opts.shuffle_buffer)
    per_buffer = max(1, buffered // opts.batch_size)
    if num_workers == 0 or buffered < CHEAP_BUFFER:
        return per_buffer
    window = num_workers * ((prefetch_factor or 2) + 1) + 1
    # Echoed examples leave the buffer e times per fresh read: count fresh batches, as the
    # buffer fills with them, so echoing packs no more buffers per fresh read than e = 1 does.
    return max(1, round(window * per_buffer * float(opts.echo_factor)))


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
    :func:`snapshot_interval`, or every batch over a streaming
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
