"""``len(EchoingDataLoader)`` (dataecho.loader.length): the batches each epoch yields, the same
every epoch, at fractional factors too, wherever the echo stage is, with workers, samplers and
drop_last."""

from __future__ import annotations

import collections
import math

import pytest
import torch
from conftest import Numbers, torch_roundtrip
from test_loader import NumberStream, add_noise, labels_of
from torch.utils.data import SubsetRandomSampler

from dataecho import EchoingDataLoader

WHERES = ("before_augment", "after_augment", "batch", "device")
SUBSET = [3, 17, 5, 11, 2, 8, 13, 21, 0, 19, 7, 14, 1, 16, 9, 22, 4, 12, 6]  # 19 of 23

# (num_workers, read order, drop_last, factor): each read order with and without workers,
# drop_last both ways, several fractions (ties that round up among them).
CASES = [
    (0, "in order", False, 2.5),
    (0, "sampler", True, 1.5),
    (1, "shuffle", True, 2.3),
    (1, "sampler", False, 1.3),
    (2, "in order", True, 1.7),
    (2, "sampler", False, 2.5),
]


def order_arguments(order: str) -> dict:
    if order == "sampler":
        sampler = SubsetRandomSampler(SUBSET, generator=torch.Generator().manual_seed(0))
        return {"sampler": sampler}
    return {"shuffle": order == "shuffle"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("num_workers", "order", "drop_last", "factor"), CASES)
@pytest.mark.parametrize("where", WHERES)
def test_len_is_what_every_epoch_yields(where, num_workers, order, drop_last, factor):
    loader = EchoingDataLoader(
        Numbers(23), batch_size=4, echo_factor=factor, where=where, num_workers=num_workers,
        drop_last=drop_last, shuffle_buffer=5, seed=3, transform=add_noise,
        **order_arguments(order),
    )  # fmt: skip
    expected = len(loader)  # read once, before the first epoch, as trainers and schedulers do
    whole = math.floor(factor)
    read = set(SUBSET) if order == "sampler" else set(range(23))
    epochs = []
    for _ in range(3):
        batches = list(loader)
        assert len(batches) == expected == len(loader)
        counts = collections.Counter(labels_of(batches))
        assert set(counts) == read  # every example read is trained, drop_last or not
        if not drop_last:  # floor or ceil of factor times
            assert set(counts.values()) <= {whole, whole + 1}
        elif where in ("before_augment", "after_augment"):  # copies rounded to whole batches
            assert sum(counts.values()) == 4 * expected
        epochs.append(counts)
    assert not epochs[0] == epochs[1] == epochs[2]  # each epoch chooses its own extra copies


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_example_echoing_gives_the_ranks_examples_their_exact_extra_copies(num_workers):
    # 23 examples at 1.5: 23 + floor(23 / 2 + 1/2) = 35 copies, whatever the workers (each
    # worker gives its part of the one count), in one batch.
    loader = EchoingDataLoader(
        Numbers(23), batch_size=100, echo_factor=1.5, where="after_augment",
        num_workers=num_workers, seed=0,
    )  # fmt: skip
    assert len(loader) == 1
    for _ in range(2):
        assert [len(ys) for _, ys in loader] == [35]


@pytest.mark.parametrize("where", ["batch", "device"])
def test_batch_echoing_gives_the_fresh_batches_their_exact_extra_copies(where):
    # 23 examples in batches of 4: 6 fresh batches (the last short one merged from the 2
    # workers' and, with drop_last, filled), 3 of them echoed once more at 1.5.
    for drop_last in (False, True):
        loader = EchoingDataLoader(
            Numbers(23), batch_size=4, echo_factor=1.5, where=where, num_workers=2,
            drop_last=drop_last, seed=1,
        )  # fmt: skip
        assert len(loader) == 6 + 3
        for _ in range(2):
            batches = [tuple(ys.tolist()) for _, ys in loader]
            assert len(batches) == 6 + 3
            copies = collections.Counter(collections.Counter(batches).values())
            assert copies == {1: 3, 2: 3}


class SizedStream(NumberStream):
    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("where", ["before_augment", "batch"])
def test_an_iterable_dataset_with_a_len_gets_an_exact_len(where, num_workers):
    loader = EchoingDataLoader(
        SizedStream(30), batch_size=4, echo_factor=2.5, where=where, num_workers=num_workers,
        seed=0, transform=add_noise,
    )  # fmt: skip
    expected = len(loader)
    assert expected == (20 if where == "batch" else 19)  # 8 batches x 2.5; or 75 examples / 4
    for _ in range(2):
        assert len(list(loader)) == expected


def test_len_is_the_same_mid_epoch_and_after_a_resume():
    def make() -> EchoingDataLoader:
        return EchoingDataLoader(
            Numbers(23), batch_size=4, echo_factor=2.5, where="batch", shuffle=True, seed=2
        )

    loader = make()
    expected = len(loader)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    assert len(loader) == expected
    resumed = make()
    resumed.load_state_dict(torch_roundtrip(loader.state_dict()))
    assert len(resumed) == expected
    assert len(head) + len(list(resumed)) == expected
    assert len(list(resumed)) == expected == len(resumed)
