"""``len(EchoingDataLoader)``: how many batches one epoch yields, echoed ones included.

Each worker batches its own share of the epoch, so the count is summed per worker. At an
integer factor it is exact by arithmetic. At a fractional factor the echo stage draws each
item's extra copy from a seeded stream, so the count is exact too: the draws are replayed
here from the same seeds (:class:`dataecho.stages.fixed_echo.Echo` draws one uniform number
per fresh item from ``random.Random(derive_seed(stage_seed, STAGE_ECHO, 0))``). ``"auto"``
decides by timing, so its count is the most it can yield (every item ``floor(max_echo_factor)``
times).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from dataecho.loader.options import LoaderOptions
from dataecho.loader.pipeline import MAIN_PROCESS
from dataecho.loader.reading import data_parallel_rank, is_map_style, reader_share
from dataecho.stages.seeds import STAGE_ECHO, derive_seed


def _copies(items: int, opts: LoaderOptions, stage_seed: int) -> int:
    """Items the echo stage emits for ``items`` fresh ones (replaying its draws)."""
    if not opts.echoes:
        return items
    if opts.adaptive:
        return items * math.floor(opts.max_echo_factor)
    whole = math.floor(opts.echo_factor)
    extra = opts.echo_factor - whole
    if extra == 0:
        return items * whole
    rng = random.Random(derive_seed(stage_seed, STAGE_ECHO, 0))
    return items * whole + sum(rng.random() < extra for _ in range(items))


def _batches(examples: int, batch_size: int, drop_last: bool) -> int:
    return examples // batch_size if drop_last else -(-examples // batch_size)


def _shares(loader: Any) -> list[int]:
    """Examples each worker of this rank reads in one epoch (see dataecho.loader.reading)."""
    dataset, workers = loader.dataset, max(loader.num_workers, 1)
    if not is_map_style(dataset):
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"len() of an EchoingDataLoader over an iterable dataset without __len__ "
                f"({type(dataset).__name__}): the number of batches is unknown (as with "
                "DataLoader); give the dataset a __len__, or iterate without len()"
            )
        return [len(dataset)]  # one stream: a dataset split over workers counts as one
    if loader.sampler is not None:  # the sampler's indices, strided over the workers
        n = len(loader.sampler)
        return [len(range(w, n, workers)) for w in range(workers)]
    rank, world = data_parallel_rank()
    order = np.arange(len(dataset))  # the sizes of the shares do not depend on the order
    return [
        len(
            reader_share(order, reader=rank * workers + w, readers=world * workers, equal=world > 1)
        )
        for w in range(workers)
    ]


def epoch_batches(loader: Any, epoch: int) -> int:
    """Batches ``loader`` (an ``EchoingDataLoader``) yields in ``epoch``."""
    opts: LoaderOptions = loader.options
    shares = _shares(loader)
    if opts.batch_level:  # whole batches echoed in the main process
        fresh = sum(_batches(n, opts.batch_size, opts.drop_last) for n in shares)
        return _copies(fresh, opts, derive_seed(loader.seed, epoch, MAIN_PROCESS, STAGE_ECHO))
    rank, _ = data_parallel_rank()
    total = 0
    for worker, n in enumerate(shares):
        reader = rank * len(shares) + worker
        stage_seed = derive_seed(loader.seed, epoch, reader, STAGE_ECHO)
        total += _batches(_copies(n, opts, stage_seed), opts.batch_size, opts.drop_last)
    return total
