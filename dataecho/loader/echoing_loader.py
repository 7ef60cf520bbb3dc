"""``EchoingDataLoader``: a drop-in DataLoader with the echo stage at the insertion point you pick.

    loader = EchoingDataLoader(dataset, batch_size=128, echo_factor=2, where="before_augment",
                               shuffle_buffer=1024, transform=augment, num_workers=1, seed=0)
    for epoch in range(3):
        for images, labels in loader:
            ...
    print(loader.stats.realized_factor)

Workers, prefetching and their checkpoints come from ``torchdata``'s ``StatefulDataLoader``;
each worker runs a :mod:`dataecho.loader.pipeline` (read, echo, shuffle, augment, batch) and
batch echoing runs in the main process on the batches the workers deliver.
"""

from __future__ import annotations

import collections
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import default_collate
from torchdata.nodes import BaseNode
from torchdata.stateful_dataloader import StatefulDataLoader

from dataecho import _validate
from dataecho.loader.lifetime import DieWithParent
from dataecho.loader.options import LoaderOptions
from dataecho.loader.pipeline import (
    PipelineDataset,
    close_chain,
    echo_stage,
    unwrap_identity,
)
from dataecho.loader.snapshots import snapshot_interval
from dataecho.loader.transport import from_wire
from dataecho.stages import EchoStats, Shuffle
from dataecho.stages.seeds import STAGE_ECHO, STAGE_SHUFFLE, derive_seed, resolve_seed
from dataecho.stages.stats import batch_length

# Worker ids are 0..num_workers-1; the main process's batch stages use a key no worker has.
_MAIN_PROCESS = 1 << 20
_NOT_ALLOWED = ("sampler", "batch_sampler", "persistent_workers")


class _WorkersNode(BaseNode[Any]):
    """The inner StatefulDataLoader as a node: yields batches, counts their fresh examples.

    With ``deferred``, an adaptive stage's reader thread pulls batches ahead of the consumer:
    their fresh counts wait in ``pending`` until :meth:`settle` is told those batches reached it.
    """

    def __init__(
        self,
        loader: StatefulDataLoader,
        pipeline: PipelineDataset,
        stats: EchoStats,
        *,
        deferred: bool = False,
    ) -> None:
        super().__init__()
        self._loader = loader
        self._pipeline = pipeline
        self._stats = stats
        self.deferred = deferred
        self.pending: collections.deque[int] = collections.deque()
        # Only worker processes send small batches as pickled arrays (loader/transport.py).
        self._piped = loader.num_workers > 0 and pipeline.pipe_small_batches
        self._it: Iterator[Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.close()
        if initial_state is not None:
            self._loader.load_state_dict(initial_state)
        self._it = iter(self._loader)
        self.pending.clear()  # a resume re-reads what was read ahead but not handed out

    def next(self) -> Any:
        batch, fresh = next(self._it)
        if self._piped:
            batch = from_wire(batch)
        if self.deferred:
            self.pending.append(fresh)  # deque.append is atomic: safe from the reader thread
        else:
            self._stats.fresh_examples += fresh
        return batch

    def settle(self, batches: int) -> None:
        """``batches`` read-ahead batches reached the consumer: count their fresh examples."""
        for _ in range(batches):
            self._stats.fresh_examples += self.pending.popleft()

    def get_state(self) -> dict[str, Any]:
        return self._loader.state_dict()

    def close(self) -> None:
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = None
        self._pipeline.close_iterators()


class EchoingDataLoader:
    """Batches of ``dataset`` with data echoing; see the module docstring for an example.

    Args:
        dataset: map-style or iterable dataset of upstream examples (read and decoded).
        batch_size: examples per batch.
        echo_factor: mean copies per fresh example (or batch, for ``where="batch"``); 1 = off;
            "auto" = reuse only while fresh data is late (see ``dataecho.adaptive_echo``).
        max_echo_factor: with "auto", the most times one item may be emitted.
        reuse_buffer: with "auto", how many recent fresh items may be reused.
        reuse_policy: with "auto", "fewest" (default for examples), "uniform" or "latest"
            (default for batches) choice among them.
        where: "before_augment" (each copy gets its own ``transform`` call), "after_augment"
            (identical copies) or "batch" (whole batches repeat).
        shuffle_buffer: post-echo shuffle buffer, in examples (or batches for "batch").
        transform: per-example random augmentation; its randomness is seeded and checkpointed.
        batch_transform: random augmentation of each collated batch, example by example (e.g.
            ``Augment``): after the example-level echo stage, seeded like ``transform``, far
            cheaper per example; not with ``where="after_augment"``.
        num_workers: DataLoader worker processes; echoing runs where the example was read.
        seed: one pipeline seed; every stage, worker and epoch derives its own from it.
        shuffle: read a map-style dataset in a new random order each epoch.
        drop_last: drop each worker's last incomplete batch.
        copy: echoed copies never alias (costs one memcpy per copy, made only where a
            per-example transform or a custom collate could see them); False to share them.
        read_ahead: examples each worker reads ahead on a thread while the echo stage works
            (None: one batch when echoing examples at a fixed factor, else 0).
        collate_fn: how examples become a batch (default: ``torch.utils.data.default_collate``).
        **dataloader_kwargs: passed to the inner ``StatefulDataLoader`` (pin_memory, timeout,
            prefetch_factor, multiprocessing_context, snapshot_every_n_steps, ...).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        echo_factor: float | str = 1.0,
        max_echo_factor: float = 4.0,
        reuse_buffer: int | None = None,
        reuse_policy: str | None = None,
        where: str = "before_augment",
        shuffle_buffer: int = 0,
        transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        seed: int | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        copy: bool = True,
        read_ahead: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        self.options = LoaderOptions(
            batch_size=batch_size,
            echo_factor=echo_factor,
            max_echo_factor=max_echo_factor,
            reuse_buffer=reuse_buffer,
            reuse_policy=reuse_policy,
            where=where,
            shuffle_buffer=shuffle_buffer,
            transform=transform,
            batch_transform=batch_transform,
            shuffle=shuffle,
            drop_last=drop_last,
            copy=copy,
            read_ahead=read_ahead,
        )
        self.num_workers = _validate.non_negative_int(
            num_workers, name="num_workers", hint="use 0 to read in the main process"
        )
        for key in _NOT_ALLOWED:
            if dataloader_kwargs.get(key):
                raise ValueError(
                    f"{key}={dataloader_kwargs[key]!r} is not supported by EchoingDataLoader: "
                    "the read order is derived from `seed` and `shuffle`, and each epoch's "
                    f"workers carry that epoch's seeds; drop the {key} argument"
                )
            dataloader_kwargs.pop(key, None)
        self.seed = resolve_seed(_validate.seed(seed))
        self.stats = EchoStats()
        # The inner DataLoader draws its workers' base seed from this generator rather than
        # from torch's global RNG, which belongs to the training loop.
        dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(self.seed))
        opts = self.options
        if self.num_workers and opts.where != "batch" and not opts.adaptive:
            # The workers' queue holds *emitted* batches: with example echoing each fresh batch
            # leaves as e of them, so e times the default depth keeps as much fresh data in
            # flight as without echoing. Otherwise a pause of the training loop (an
            # evaluation, a checkpoint) fills the queue with copies at once and the upstream
            # stops reading, so the pause costs the echoed run upstream time that a run
            # without echoing hides.
            dataloader_kwargs.setdefault("prefetch_factor", 2 * math.ceil(opts.echo_factor))
        # Workers send their pipeline's state with snapshots, shuffle buffer included: about one
        # per buffer's worth of batches keeps that cost small (loader/snapshots.py); a resume
        # between snapshots replays (re-reads) at most one interval of batches in the worker,
        # then continues exactly where the checkpoint was.
        dataloader_kwargs.setdefault(
            "snapshot_every_n_steps",
            snapshot_interval(opts, self.num_workers, dataloader_kwargs.get("prefetch_factor")),
        )
        dataloader_kwargs["worker_init_fn"] = DieWithParent(dataloader_kwargs.get("worker_init_fn"))
        self._pipeline = PipelineDataset(dataset, self.options, collate_fn or default_collate)
        # Pinning happens before our main-process code sees a batch: keep tensors for it.
        self._pipeline.pipe_small_batches = not dataloader_kwargs.get("pin_memory", False)
        with warnings.catch_warnings():
            # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on.
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            self._inner = StatefulDataLoader(
                self._pipeline,
                batch_size=None,
                num_workers=self.num_workers,
                collate_fn=unwrap_identity,
                **dataloader_kwargs,
            )
        self._epoch = -1
        self._iterator: _EpochIterator | None = None
        self._resume: dict[str, Any] | None = None

    @property
    def epoch(self) -> int:
        """The epoch being (or last) iterated; -1 before the first."""
        return self._epoch

    def __iter__(self) -> Iterator[Any]:
        self.close()
        resume, self._resume = self._resume, None
        if resume is None:
            self._epoch += 1
        self._pipeline.epoch = self._epoch
        self._pipeline.seed = self.seed
        root, workers, reader = self._build_root()
        root.reset(resume)
        self._iterator = _EpochIterator(self, root, workers, reader)
        return self._iterator

    def _build_root(self) -> tuple[BaseNode[Any], _WorkersNode, Any]:
        """The main-process chain, its workers node, and the adaptive stage reading ahead."""
        opts = self.options
        batch_auto = opts.where == "batch" and opts.adaptive
        workers = _WorkersNode(self._inner, self._pipeline, self.stats, deferred=batch_auto)
        if opts.where != "batch":
            return workers, workers, None
        node: BaseNode[Any] = workers
        key = (self._epoch, _MAIN_PROCESS)
        if opts.echoes:
            node = echo_stage(node, opts, derive_seed(self.seed, *key, STAGE_ECHO))
        reader = node if batch_auto else None
        if opts.shuffle_buffer > 1:
            node = Shuffle(
                node, opts.shuffle_buffer, seed=derive_seed(self.seed, *key, STAGE_SHUFFLE)
            )
        return node, workers, reader

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly here: epoch, pipeline positions, RNGs, counts."""
        it = self._iterator
        if self._resume is not None:  # loaded but not yet iterated: hand the same state on
            root = self._resume
        else:
            root = it.root.state_dict() if it is not None and not it.finished else None
        return {
            "epoch": self._epoch,
            "seed": self.seed,
            "root": root,
            "stats": self.stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next ``iter()`` continues where it stopped."""
        self.close()
        self.seed = int(state["seed"])
        self.stats.load_state_dict(state["stats"])
        self._epoch = int(state["epoch"])
        self._resume = state["root"]

    def close(self) -> None:
        """Stop the current epoch's workers now (also done at the end of each epoch)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def __enter__(self) -> EchoingDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to clean
            pass


class _EpochIterator:
    """One epoch's iterator: times the consumer's waits and counts what it hands out."""

    def __init__(
        self,
        loader: EchoingDataLoader,
        root: BaseNode[Any],
        workers: _WorkersNode,
        reader: Any,
    ) -> None:
        self.loader = loader
        self.root = root
        self.finished = False
        self._workers = workers
        self._reader = reader  # the adaptive stage whose fresh emissions settle the counts
        self._settled = reader.stats.fresh_examples if reader is not None else 0

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        stats = self.loader.stats
        start = time.perf_counter()
        try:
            batch = next(self.root)
        except StopIteration:
            self.finished = True
            self.close()
            raise
        except BaseException:
            # The original exception (and its traceback) goes on; the workers stop now.
            self.finished = True
            self.close()
            raise
        finally:
            stats.wait_seconds += time.perf_counter() - start
        if self._reader is not None:
            handed = self._reader.stats.fresh_examples
            self._workers.settle(handed - self._settled)
            self._settled = handed
        stats.batches += 1
        stats.examples_out += batch_length(batch)
        return batch

    def close(self) -> None:
        close_chain(self.root)
