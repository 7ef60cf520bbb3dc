"""How many copies and batches one epoch has, counted over the whole rank, not per worker.

DataLoader batches one order, so its epoch ends on at most one short batch, and its ``len`` is
the same for any ``num_workers``. dataecho's workers each batch their own share; to keep
DataLoader's counts, the extra copies of a fractional factor are shared out over the rank's
examples as a whole (:func:`split_copies`: each worker's part of one count, not a count of its
own), and the workers' last short batches are batched together in the main process
(:mod:`dataecho.loader.remainders`).

With ``drop_last`` and echoing at the example level, the copies of a map-style dataset's epoch
are rounded to a whole number of batches (:func:`whole_batches`): dropping the last short batch
could drop every copy of an example, and rounding drops none. A loader that cannot split the
count (a stream, an iterable dataset) drops the short batch of the merged remainders instead.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import cast

from dataecho.loader.options import LoaderOptions
from dataecho.loader.reading import reader_share
from dataecho.stages.fixed_echo import epoch_copies


def rank_examples(n: int, *, rank: int, world: int) -> int:
    """The examples of an epoch of ``n`` that ``rank`` of ``world`` reads without a sampler
    (:mod:`dataecho.loader.reading`)."""
    return len(reader_share(range(n), index=rank, readers=world, equal=world > 1))


def share_sizes(examples: int, workers: int) -> list[int]:
    """The examples each of a rank's ``workers`` (at least 1) reads of the rank's
    ``examples``: its order strided over the workers."""
    return [len(range(w, examples, workers)) for w in range(workers)]


def whole_batches(copies: int, examples: int, batch_size: int) -> int:
    """``copies`` rounded to the nearest whole number of batches (a tie rounds down, as
    ``drop_last`` drops), but never below one copy of each of the ``examples``."""
    down = copies - copies % batch_size
    up = down + batch_size if copies % batch_size else down
    nearest = up if 2 * (copies - down) > batch_size else down
    return nearest if nearest >= examples else up


def total_copies(opts: LoaderOptions, examples: int, *, split: bool) -> int:
    """The copies one epoch of ``examples`` items yields (a rank's examples, or its fresh
    batches for batch echoing): exact at a fixed factor, the most ``"auto"`` can give.
    ``split``: the loader shares the count out over the workers (:func:`split_copies`), which
    ``drop_last`` then rounds (:func:`whole_batches`)."""
    if not opts.echoes:
        return examples
    if opts.adaptive:
        return examples * math.floor(opts.max_echo_factor)
    copies = epoch_copies(cast(float, opts.echo_factor), examples)
    if split and opts.drop_last:
        return whole_batches(copies, examples, opts.batch_size)
    return copies


def split_copies(total: int, shares: list[int]) -> list[int]:
    """``total`` copies shared out over workers reading ``shares`` examples each: the rank's
    examples in a row, worker after worker, each place ``p`` counting ``total / n`` copies up
    to it (rounded half up), so the parts add up to ``total`` whatever the split, and each
    worker's part is within one of its share's exact part."""
    n = sum(shares)
    if n == 0:
        return [0] * len(shares)
    rate, half = Fraction(total, n), Fraction(1, 2)
    parts, done, end = [], 0, 0
    for share in shares:
        end += share
        upto = math.floor(rate * end + half)
        parts.append(upto - done)
        done = upto
    return parts


def fresh_batch_count(examples: int, opts: LoaderOptions) -> int:
    """The fresh batches a rank's ``examples`` make for batch echoing: full ones, and the last
    short one, kept unless ``drop_last`` drops it. Echoing, ``drop_last`` fills it with copies
    of its own examples instead (:mod:`dataecho.loader.remainders`): dropped, its examples would
    have no copy at all."""
    full, short = divmod(examples, opts.batch_size)
    keep_short = short > 0 and (not opts.drop_last or opts.echoes)
    return full + int(keep_short)
