"""``len(EchoingDataLoader)``: how many batches one epoch yields, echoed ones included.

Counted over the rank's examples as one epoch, as DataLoader counts it, so the worker count
changes nothing: the workers' last short batches are batched together
(:mod:`dataecho.loader.remainders`) and a fractional factor's extra copies are one count shared
out over them (:mod:`dataecho.loader.epoch_counts`). At a fixed factor it is exact, the same
every epoch: an echo stage gives exactly ``floor(frac * n + 1/2)`` of its ``n`` items the extra
copy (:func:`dataecho.stages.fixed_echo.epoch_copies`). ``"auto"`` decides by timing, so its
count is the most it can yield (every item ``floor(max_echo_factor)`` times).
"""

from __future__ import annotations

from typing import Any

from dataecho.errors import DataechoTypeError
from dataecho.loader.epoch_counts import fresh_batch_count, rank_examples, total_copies
from dataecho.loader.options import LoaderOptions
from dataecho.loader.reading import data_parallel_rank, is_map_style
from dataecho.loader.upstream_loader import is_loader
from dataecho.stages.fixed_echo import known_length


def _batches(copies: int, opts: LoaderOptions) -> int:
    return copies // opts.batch_size if opts.drop_last else -(-copies // opts.batch_size)


def _examples(loader: Any) -> int | None:
    """The examples this rank reads in one epoch (see dataecho.loader.reading); None for an
    iterable dataset without a length."""
    dataset = loader.dataset
    if not is_map_style(dataset):
        return known_length(dataset)  # one stream: a dataset split over workers counts as one
    if loader.sampler is not None:  # the sampler holds this rank's share
        return len(loader.sampler)
    rank, world = data_parallel_rank()
    return rank_examples(len(dataset), rank=rank, world=world)


def epoch_fresh_batches(loader: Any) -> int | None:
    """Batches of fresh examples ``loader`` (an ``EchoingDataLoader``) echoes in one epoch at
    the batch level (:func:`dataecho.loader.epoch_counts.fresh_batch_count`), or the user's
    loader's ``len`` where it is the upstream. None for an iterable dataset without a length."""
    if is_loader(loader.dataset):
        return known_length(loader.dataset)
    examples = _examples(loader)
    return None if examples is None else fresh_batch_count(examples, loader.options)


def epoch_batches(loader: Any) -> int:
    """Batches ``loader`` (an ``EchoingDataLoader``) yields in one epoch."""
    opts: LoaderOptions = loader.options
    if is_loader(loader.dataset):  # the user's loader: its batches, echoed
        return total_copies(opts, len(loader.dataset), split=False)
    examples = _examples(loader)
    if examples is None:
        raise DataechoTypeError(
            f"len() of an EchoingDataLoader over an iterable dataset without __len__ "
            f"({type(loader.dataset).__name__}): the number of batches is unknown (as with "
            "DataLoader); give the dataset a __len__, or iterate without len()"
        )
    if opts.batch_level:  # whole batches echoed in the main process
        return total_copies(opts, fresh_batch_count(examples, opts), split=False)
    split = is_map_style(loader.dataset)  # the loader shares the copies out (epoch_counts)
    return _batches(total_copies(opts, examples, split=split), opts)
