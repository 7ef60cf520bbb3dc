"""The workers' last short batches, batched together (dataecho.loader.remainders): DataLoader's
``len`` and examples for any ``num_workers``, ``drop_last`` that drops at most the epoch's last
short batch and never every copy of an example, and a resume while remainders are held."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from conftest import Numbers, torch_roundtrip
from test_loader import add_noise, add_noise_to_batch, labels_of
from torch.utils.data import DataLoader

from dataecho import EchoingDataLoader


def loader_of(n: int, **kwargs) -> EchoingDataLoader:
    kwargs = {"batch_size": 4, "seed": 0, **kwargs}
    return EchoingDataLoader(Numbers(n), **kwargs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("n", "drop_last"), [(30, True), (30, False), (60, False)])
def test_without_echoing_len_and_examples_are_dataloaders_for_any_workers(n, drop_last):
    reference = DataLoader(Numbers(n), batch_size=4, drop_last=drop_last)
    want = sorted(labels_of(reference))
    for num_workers in (0, 1, 2):
        loader = loader_of(n, drop_last=drop_last, num_workers=num_workers, echo_factor=1)
        batches = list(loader)
        assert len(loader) == len(batches) == len(reference), num_workers
        labels = labels_of(batches)
        assert len(labels) == len(want) and len(set(labels)) == len(labels)  # none twice
        assert [len(ys) for _, ys in batches[:-1]] == [4] * (len(batches) - 1)
        if not drop_last:
            assert sorted(labels) == want
        assert loader.stats.fresh_examples == len(want)  # a dropped example is not counted


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["before_augment", "after_augment", "batch", "device"])
@pytest.mark.parametrize(("factor", "buffer"), [(2, 0), (1.5, 0), (2, 8)])
def test_drop_last_while_echoing_trains_every_example_in_full_batches(where, factor, buffer):
    # Copies side by side (shuffle_buffer=0): a dropped short batch would hold an example's
    # every copy; with a buffer on the device, the example pool fills the short fresh batch.
    # 30 examples in batches of 4 over 2 workers: 15 each, 3 left over each.
    lens = set()
    for num_workers in (0, 2):
        loader = loader_of(30, echo_factor=factor, where=where, drop_last=True,
                           shuffle_buffer=buffer, num_workers=num_workers,
                           transform=add_noise)  # fmt: skip
        batches = list(loader)
        lens.add(len(loader))
        assert len(batches) == len(loader)
        assert {len(ys) for _, ys in batches} == {4}
        assert set(labels_of(batches)) == set(range(30)), num_workers
        assert loader.stats.fresh_examples == 30
    assert len(lens) == 1  # the worker count changes nothing


def test_batch_echoing_fills_the_short_fresh_batch_with_new_copies_of_its_own_examples():
    # 30 examples, batches of 4: 7 full fresh batches and 2 left over, filled to 4.
    seen: list[list] = []

    def keep(examples):
        seen.append(examples)
        return torch.utils.data.default_collate(examples)

    loader = loader_of(30, echo_factor=2, where="batch", drop_last=True, collate_fn=keep)
    batches = list(loader)
    assert len(batches) == len(loader) == 16
    last = seen[-1]  # the filled one: made last, in the main process
    assert sorted(y for _, y in last) == sorted([28, 29, 28, 29])
    assert len({id(x) for x, _ in last}) == 4  # the copies are new objects
    assert collections.Counter(labels_of(batches))[28] == 4  # echoed twice, as a batch


@pytest.mark.timeout(120)
def test_the_merged_batches_go_through_batch_transform_seeded_as_the_workers_are():
    def run() -> list[torch.Tensor]:
        loader = loader_of(30, num_workers=2, echo_factor=1, batch_transform=add_noise_to_batch)
        return [xs for xs, _ in loader]

    first, again = run(), run()
    assert len(first) == 8
    for xs in first:  # every batch, the merged ones included, augmented
        assert not torch.equal(xs, xs.round())
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # reproducible


def unchanged(example: int) -> int:
    """A transform that keeps the examples JSON's plain ints."""
    return example


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["before_augment", "batch"])
def test_a_resume_while_remainders_are_held_continues_exactly(where):
    # 2 workers x 15 examples at factor 2: each worker's last copies wait in the main process;
    # the state after each of the last batches resumes the epoch's rest exactly: through JSON
    # where the loader holds only examples of plain ints (batch echoing holds tensors).
    def fresh() -> EchoingDataLoader:
        return EchoingDataLoader(list(range(30)), batch_size=4, num_workers=2, echo_factor=2,
                                 where=where, shuffle=True, seed=0, transform=unchanged)  # fmt: skip

    whole = [b.tolist() for b in fresh()]
    loader = fresh()
    states = []
    for _ in loader:
        state = loader.state_dict()
        if where == "before_augment":
            states.append(json.loads(json.dumps(state)))
        else:
            states.append(torch_roundtrip(state))
    for k in (len(whole) - 3, len(whole) - 2):
        resumed = fresh()
        resumed.load_state_dict(states[k])
        assert [b.tolist() for b in resumed] == whole[k + 1 :], k
        assert resumed.stats.fresh_examples == 30


def test_ranks_read_equal_shares_whatever_the_workers(monkeypatch):
    # 30 examples over 2 ranks: 15 each, as DistributedSampler gives, with or without workers.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    for num_workers in (0, 2):
        loader = loader_of(30, num_workers=num_workers, echo_factor=1)
        labels = labels_of(loader)
        assert len(loader) == 4 and len(set(labels)) == len(labels) == 15, num_workers
