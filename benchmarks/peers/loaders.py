"""The loaders that ``python -m benchmarks peers`` compares, built alike from one upstream.

Peers of :class:`dataecho.EchoingDataLoader`:

- ``dataloader``: PyTorch's ``DataLoader``, no echoing;
- ``monai``: MONAI's ``ThreadDataLoader(repeats=k)``: a background thread pulls batches from a
  ``DataLoader`` and the training loop gets each one ``k`` times (the same object, no shuffle);
- ``adjacent``: the tf.data idiom ``flat_map(lambda t: from_tensors(t).repeat(e))`` as a small
  ``IterableDataset`` (:class:`AdjacentRepeat`): each example read once and emitted ``e`` times
  in a row, each copy augmented on its own, no shuffle.

Every loader reads ``(image, label, index)`` examples (:class:`Indexed`), so the training loop
can count the *fresh* examples it actually received (distinct indices), whatever the loader
does in between; and every loader augments each emitted example with the same per-example
``Augment`` in its worker, except MONAI's repeats and dataecho's batch echoing, which repeat
augmented batches by design, and the dataecho case with ``batch_augment``, which augments each
emitted batch in one call (``batch_transform``: the same per-example draws, far less Python).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from dataecho import EchoingDataLoader

KINDS = ("dataloader", "monai", "adjacent", "dataecho")


@dataclass(frozen=True)
class Case:
    """One loader configuration. ``echo`` is the echo factor (or repeats) or "auto"."""

    kind: str
    echo: float | str = 1
    where: str = "-"  # dataecho's insertion point; "-" for the peers
    shuffle_buffer: int = 0  # dataecho's post-echo shuffle buffer, in examples
    batch_augment: bool = False  # dataecho: augment whole batches (batch_transform) instead
    # dataecho's worker state snapshots (for checkpoints): True = the loader's default
    # interval, False = none (no checkpoints then, like the peers), a number = that interval.
    snapshots: bool | int = True
    read_ahead: int | None = None  # dataecho's read-ahead (examples); None = the default

    @property
    def name(self) -> str:
        if self.kind == "dataloader":
            return "DataLoader (no echo)"
        e = "auto" if self.echo == "auto" else f"{self.echo:g}"
        if self.kind == "monai":
            return f"MONAI repeats={e}"
        if self.kind == "adjacent":
            return f"adjacent repeats={e}"
        shuffle = f", shuffle {self.shuffle_buffer}" if self.shuffle_buffer > 1 else ""
        batch_aug = ", batch aug" if self.batch_augment else ""
        snapshots = (
            "" if self.snapshots is True
            else ", no snapshots" if self.snapshots is False
            else f", snapshots every {self.snapshots}"
        )  # fmt: skip
        ahead = "" if self.read_ahead is None else f", read-ahead {self.read_ahead}"
        return f"dataecho e={e} ({self.where}{shuffle}{batch_aug}{snapshots}{ahead})"


class Indexed(Dataset):
    """``(image, label, index)`` for ``dataset[index]``; ``transform`` (if any) on each read."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Any] | None = None) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        example = (*self.dataset[index], index)
        return self.transform(example) if self.transform is not None else example


class AdjacentRepeat(IterableDataset):
    """Each example of ``dataset`` read once, emitted ``repeats`` times in a row.

    ``transform`` runs once per emitted copy (copies differ when it is random). The read order
    is a permutation drawn from ``order_seed`` (None: in order); DataLoader workers take strided
    shares of it, so no example is read twice.
    """

    def __init__(
        self,
        dataset: Any,
        repeats: int,
        transform: Callable[[Any], Any] | None = None,
        order_seed: int | None = None,
    ) -> None:
        if int(repeats) != repeats or repeats < 1:
            raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
        self.dataset = dataset
        self.repeats = int(repeats)
        self.transform = transform
        self.order_seed = order_seed

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        n = len(self.dataset)
        order = (
            np.random.default_rng(self.order_seed).permutation(n)
            if self.order_seed is not None
            else np.arange(n)
        )
        for index in order[worker::workers]:
            example = self.dataset[int(index)]
            for _ in range(self.repeats):
                yield self.transform(example) if self.transform is not None else example


class LoaderRun:
    """One iteration of a built loader: ``next()`` batches, then ``close()`` stops its workers."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._it: Any = iter(loader)

    def __iter__(self) -> LoaderRun:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def close(self) -> None:
        it, self._it = self._it, None
        if isinstance(self.loader, EchoingDataLoader):
            self.loader.close()
        elif hasattr(it, "close"):  # MONAI's generator: its `finally` joins the buffer thread
            it.close()
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:  # a DataLoader iterator: stop (and reap) its workers now
            shutdown()


def build(
    case: Case,
    dataset: Any,
    augment: Callable[[Any], Any] | None,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool,
    num_workers: int = 1,
    max_echo_factor: float = 16,
) -> LoaderRun:
    """Start ``case``'s loader over ``dataset`` (examples ``(image, label)``); see the module."""
    generator = torch.Generator().manual_seed(seed)
    common = dict(batch_size=batch_size, num_workers=num_workers, drop_last=True)
    if case.kind == "dataloader":
        loader: Any = DataLoader(
            Indexed(dataset, augment), shuffle=shuffle, generator=generator, **common
        )
    elif case.kind == "monai":
        from monai.data import ThreadDataLoader  # imported only when used: ~5-15 s

        loader = ThreadDataLoader(
            Indexed(dataset, augment),
            repeats=int(case.echo),
            shuffle=shuffle,
            generator=generator,
            **common,
        )
    elif case.kind == "adjacent":
        order_seed = seed if shuffle else None
        loader = DataLoader(
            AdjacentRepeat(Indexed(dataset), int(case.echo), augment, order_seed),
            generator=generator,
            **common,
        )
    elif case.kind == "dataecho":
        # Workers snapshot their pipeline state (shuffle buffer included) for checkpoints;
        # "no snapshots" asks for one so rarely that it never happens in a benchmark.
        snapshots = (
            {} if case.snapshots is True
            else {"snapshot_every_n_steps": 1 << 40} if case.snapshots is False
            else {"snapshot_every_n_steps": int(case.snapshots)}
        )  # fmt: skip
        loader = EchoingDataLoader(
            Indexed(dataset),
            echo_factor=case.echo,
            max_echo_factor=max_echo_factor,
            where=case.where,
            shuffle_buffer=case.shuffle_buffer,
            transform=None if case.batch_augment else augment,
            batch_transform=augment if case.batch_augment else None,
            seed=seed,
            shuffle=shuffle,
            read_ahead=case.read_ahead,
            **snapshots,
            **common,
        )
    else:
        raise ValueError(f"unknown loader kind {case.kind!r}; choose one of {', '.join(KINDS)}")
    return LoaderRun(loader)
