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
        if not drop_last:  # every example read is trained, floor or ceil of factor times
            assert set(counts) == read and set(counts.values()) <= {whole, whole + 1}
        epochs.append(counts)
    assert not epochs[0] == epochs[1] == epochs[2]  # each epoch chooses its own extra copies


@pytest.mark.parametrize(("num_workers", "shares"), [(0, [23]), (1, [23]), (2, [12, 11])])
def test_example_echoing_gives_each_worker_share_its_exact_extra_copies(num_workers, shares):
    # 23 examples at 1.5: a worker reading n of them emits n + floor(n / 2 + 1/2).
    loader = EchoingDataLoader(
        Numbers(23), batch_size=100, echo_factor=1.5, where="after_augment",
        num_workers=num_workers, seed=0,
    )  # fmt: skip
    want = [n + math.floor(n / 2 + 0.5) for n in shares]
    assert len(loader) == len(shares)  # one (short) batch per worker
    for _ in range(2):
        assert sorted(len(ys) for _, ys in loader) == sorted(want)


@pytest.mark.parametrize("where", ["batch", "device"])
def test_batch_echoing_gives_the_workers_fresh_batches_their_exact_extra_copies(where):
    # 2 workers x 12 and 11 examples in batches of 4: 3 + 3 fresh batches, 3 of them echoed
    # once more at 1.5 (drop_last: 3 + 2, and floor(2.5 + 1/2) = 3 of them).
    for drop_last, fresh, extra in ((False, 6, 3), (True, 5, 3)):
        loader = EchoingDataLoader(
            Numbers(23), batch_size=4, echo_factor=1.5, where=where, num_workers=2,
            drop_last=drop_last, seed=1,
        )  # fmt: skip
        assert len(loader) == fresh + extra
        for _ in range(2):
            batches = [tuple(ys.tolist()) for _, ys in loader]
            assert len(batches) == fresh + extra
            copies = collections.Counter(collections.Counter(batches).values())
            assert copies == {1: fresh - extra, 2: extra}


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
