"""``len(EchoingDataLoader)``: how many batches one epoch yields, echoed ones included.

Each worker batches its own share of the epoch, so the count is summed per worker. At a fixed
factor it is exact by arithmetic, the same every epoch: each echo stage is told how many items
its epoch has (a worker's share of examples, or the fresh batches all workers deliver for
``where="batch"``/``"device"``) and gives exactly ``floor(frac * n + 1/2)`` of them the extra
copy (:func:`dataecho.stages.fixed_echo.epoch_copies`). ``"auto"`` decides by timing, so its
count is the most it can yield (every item ``floor(max_echo_factor)`` times).
"""

from __future__ import annotations

import math
from typing import Any

from dataecho.errors import DataechoTypeError
from dataecho.loader.options import LoaderOptions
from dataecho.loader.reading import data_parallel_rank, is_map_style, reader_index, reader_share
from dataecho.loader.upstream_loader import is_loader
from dataecho.stages.fixed_echo import epoch_copies, known_length


def _copies(items: int, opts: LoaderOptions) -> int:
    """Items the echo stage emits for an epoch of ``items`` fresh ones."""
    if not opts.echoes:
        return items
    if opts.adaptive:
        return items * math.floor(opts.max_echo_factor)
    return epoch_copies(float(opts.echo_factor), items)


def _batches(examples: int, batch_size: int, drop_last: bool) -> int:
    return examples // batch_size if drop_last else -(-examples // batch_size)


def _shares(loader: Any) -> list[int] | None:
    """Examples each worker of this rank reads in one epoch (see dataecho.loader.reading);
    None for an iterable dataset without a length."""
    dataset, workers = loader.dataset, max(loader.num_workers, 1)
    if not is_map_style(dataset):
        n = known_length(dataset)  # one stream: a dataset split over workers counts as one
        return None if n is None else [n]
    if loader.sampler is not None:  # the sampler's indices, strided over the workers
        n = len(loader.sampler)
        return [len(range(w, n, workers)) for w in range(workers)]
    rank, world = data_parallel_rank()
    order = range(len(dataset))  # the sizes of the shares do not depend on the order
    readers = world * workers
    return [
        len(reader_share(order, index=reader_index(rank, w, workers), readers=readers,
                         equal=world > 1))
        for w in range(workers)
    ]  # fmt: skip


def fresh_batches(loader: Any) -> int | None:
    """Batches the workers of ``loader`` (an ``EchoingDataLoader``) deliver in one epoch,
    before any batch echoing: each worker's share batched on its own (its last short batch
    dropped with ``drop_last``), or the user's loader's ``len`` where it is the upstream. None
    for an iterable dataset without a length."""
    if is_loader(loader.dataset):
        return known_length(loader.dataset)
    shares = _shares(loader)
    return None if shares is None else _fresh(shares, loader.options)


def _fresh(shares: list[int], opts: LoaderOptions) -> int:
    return sum(_batches(n, opts.batch_size, opts.drop_last) for n in shares)


def epoch_batches(loader: Any) -> int:
    """Batches ``loader`` (an ``EchoingDataLoader``) yields in one epoch."""
    opts: LoaderOptions = loader.options
    if is_loader(loader.dataset):  # the user's loader: its batches, echoed
        return _copies(len(loader.dataset), opts)
    shares = _shares(loader)
    if shares is None:
        raise DataechoTypeError(
            f"len() of an EchoingDataLoader over an iterable dataset without __len__ "
            f"({type(loader.dataset).__name__}): the number of batches is unknown (as with "
            "DataLoader); give the dataset a __len__, or iterate without len()"
        )
    if opts.batch_level:  # whole batches echoed in the main process
        return _copies(_fresh(shares, opts), opts)
    return sum(_batches(_copies(n, opts), opts.batch_size, opts.drop_last) for n in shares)
