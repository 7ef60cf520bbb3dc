"""Copies spread apart by default (dataecho/loader/spread.py, the example pool's draw in
dataecho/loader/example_batches.py, the default in dataecho/loader/options.py): no batch holds
two copies of one example while others are left, an explicit ``shuffle_buffer=0`` keeps them
side by side, and the spread resumes exactly."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import Numbers, run_test_save_load_state
from test_loader import labels_of
from torchdata.nodes import IterableWrapper

from dataecho import EchoingDataLoader
from dataecho.loader.options import SPREAD_BATCHES, LoaderOptions
from dataecho.loader.spread import SpreadBatches


def jitter(example):
    image, label = example
    return image + torch.rand(()), label


def loader(where: str, factor, **kw) -> EchoingDataLoader:
    transform = jitter if where == "before_augment" else None
    return EchoingDataLoader(Numbers(300), batch_size=16, echo_factor=factor, where=where,
                             shuffle=True, seed=0, transform=transform, **kw)  # fmt: skip


def batches_with_two_copies(batches: list[list[int]]) -> int:
    return sum(len(set(b)) < len(b) for b in batches)


@pytest.mark.parametrize("where", ["before_augment", "after_augment"])
@pytest.mark.parametrize("factor", [2.5, 4, "auto"])
def test_by_default_no_batch_holds_two_copies_of_an_example_but_at_the_end(where, factor):
    batches = [b.tolist() for _, b in loader(where, factor)]
    counts = collections.Counter(i for b in batches for i in b)
    assert set(counts) == set(range(300))
    # The epoch's last batches may: only copies of the examples they hold are left.
    assert batches_with_two_copies(batches[:-3]) == 0
    if factor == "auto":  # its copies depend on timing (few over a fast dataset)
        return
    # Spread over several batches, not only the next one.
    first = {}
    spans = []
    for k, b in enumerate(batches):
        for i in b:
            spans.append(k - first.setdefault(i, k))
    assert max(spans) > 2


def test_the_default_is_a_few_batches_where_examples_are_echoed_and_none_elsewhere():
    assert LoaderOptions(batch_size=16, echo_factor=2).shuffle_buffer == SPREAD_BATCHES * 16
    assert LoaderOptions(batch_size=16, echo_factor="auto",
                         where="after_augment").shuffle_buffer == SPREAD_BATCHES * 16  # fmt: skip
    assert LoaderOptions(batch_size=16).shuffle_buffer == 0  # no echo: DataLoader's batches
    assert LoaderOptions(batch_size=16, echo_factor=2, where="batch").shuffle_buffer == 0
    assert LoaderOptions(batch_size=16, echo_factor=2, shuffle_buffer=0).shuffle_buffer == 0


@pytest.mark.parametrize("where", ["before_augment", "after_augment"])
def test_an_explicit_shuffle_buffer_of_0_keeps_each_examples_copies_side_by_side(where):
    labels = labels_of(loader(where, 2, shuffle_buffer=0))
    assert labels[0::2] == labels[1::2]


@pytest.mark.parametrize(
    ("where", "workers"), [("before_augment", 0), ("after_augment", 0), ("after_augment", 1)]
)
def test_the_spread_resumes_exactly(where, workers):
    run_test_save_load_state(
        lambda: loader(where, 2.5, num_workers=workers), positions=[0, 20, 37],
        restore=lambda node, state: node.load_state_dict(state),
        new_epoch=lambda node: None, end_may_start_next_epoch=True,
    )  # fmt: skip


def tagged(numbers: list[int]) -> IterableWrapper:
    return IterableWrapper([(n, f"copy of {n}") for n in numbers])


def test_a_copy_waits_for_the_next_batch_and_goes_first_there():
    node = SpreadBatches(tagged([0, 0, 1, 2, 1, 3, 4, 5]), 3)
    assert [[n for n, _ in b] for b in node] == [[0, 1, 2], [0, 1, 3], [4, 5]]


def test_at_the_end_the_waiting_copies_fill_the_last_batches():
    node = SpreadBatches(tagged([7, 7, 8, 7]), 2)
    assert [[n for n, _ in b] for b in node] == [[7, 8], [7, 7]]


def test_at_most_a_batch_of_copies_waits():
    # One example's copies in a long row: past a batch's worth waiting, one joins its batch.
    node = SpreadBatches(tagged([5] * 9), 2)
    out = [[n for n, _ in b] for b in node]
    assert sum(map(len, out)) == 9 and max(len(b) for b in out) == 2


def test_the_waiting_copies_are_part_of_the_state():
    run_test_save_load_state(lambda: SpreadBatches(tagged([0, 0, 1, 2, 1, 3, 3, 4, 5, 6]), 3))
