"""An epoch's copies counted for the rank and shared out over its workers
(dataecho.loader.epoch_counts)."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from dataecho.loader.epoch_counts import share_sizes, split_copies, whole_batches

shares = st.lists(st.integers(0, 500), min_size=1, max_size=8)


@given(shares, st.integers(1, 4), st.integers(0, 99))
def test_split_copies_add_up_and_give_each_worker_its_part_within_one(shares, whole, extra):
    n = sum(shares)
    total = whole * n + min(extra, n)
    parts = split_copies(total, shares)
    assert sum(parts) == total
    for share, part in zip(shares, parts, strict=True):
        exact = Fraction(total, n or 1) * share
        assert math.floor(exact) - 1 <= part <= math.ceil(exact) + 1
        assert part >= share * (total // (n or 1))  # every example at least its whole copies


@given(st.integers(1, 5000), st.integers(1, 300), st.integers(1, 256))
def test_whole_batches_is_the_nearest_multiple_that_keeps_a_copy_of_each(copies, examples, size):
    examples = min(examples, copies)  # an epoch has at least one copy of each example
    rounded = whole_batches(copies, examples, size)
    assert rounded % size == 0 and rounded >= examples
    if rounded - size >= examples:  # the one below was allowed: this is the nearest
        assert abs(rounded - copies) <= size / 2


def test_share_sizes_stride_the_ranks_examples_over_the_workers():
    assert share_sizes(30, 4) == [8, 8, 7, 7]
    assert share_sizes(3, 1) == [3]
