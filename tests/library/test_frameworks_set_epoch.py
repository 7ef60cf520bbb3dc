"""Frameworks that drive a DataLoader's epoch (timm, Lightning, mmcv and scripts like them) call
``set_epoch`` on ``loader.dataset``, ``loader.batch_sampler``, ``loader.sampler`` or
``loader.batch_sampler.sampler``, never on the loader: an EchoingDataLoader's ``batch_sampler``
(an ``EpochHook``) takes it there, so a run that starts at epoch ``e`` (a resume from a
checkpoint of the model alone, or of the loader too) trains the order and seeds
``loader.set_epoch(e)`` gives, and the user's dataset is left as it is.

The calls below are the ones those frameworks make, written out here (timm is not installed;
Lightning's own runs are in test_lightning.py).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import assert_same_stream
from torch.utils.data import Dataset, DistributedSampler

from dataecho import DataechoTypeError, EchoingDataLoader
from dataecho.loader.echoing_loader import EpochHook

N = 24
EPOCHS = 4
LOADER = {"batch_size": 4, "echo_factor": 2, "shuffle_buffer": 5, "seed": 0}


class Indexed(Dataset):
    """Example i: (i, its augmentation's draw) after ``noisy``; a plain map-style dataset."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.tensor([float(i)]), i


def noisy(example):
    """A seeded per-copy augmentation: its draw shows the epoch's augmentation seeds."""
    x, y = example
    return x + torch.rand(1), y


def make(**more) -> EchoingDataLoader:
    return EchoingDataLoader(Indexed(), transform=noisy, **{"shuffle": True, **LOADER, **more})


def timm_style(loader, epoch: int) -> None:
    """The loader epoch calls of timm's training loop: the dataset's, the batch sampler's and
    the sampler's ``set_epoch``, each where it exists."""
    for obj in (loader.dataset, loader.batch_sampler, loader.sampler):
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)


def lightning_style(loader, epoch: int) -> None:
    """Lightning's: the sampler's and the batch sampler's sampler's, once per object."""
    objects = {id(o): o for o in (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
               if o is not None}  # fmt: skip
    for obj in objects.values():
        if callable(getattr(obj, "set_epoch", None)):
            obj.set_epoch(epoch)


@pytest.fixture(scope="module")
def uninterrupted() -> list[list]:
    """Each epoch's batches of a loader iterated ``EPOCHS`` times, no set_epoch called."""
    loader = make()
    return [list(loader) for _ in range(EPOCHS)]


@pytest.mark.parametrize("drive", [timm_style, lightning_style])
def test_a_run_started_at_a_later_epoch_through_the_framework_calls_trains_that_epoch(
    uninterrupted, drive
):
    # A run resumed from a model-only checkpoint at epoch 2: without the hook, epoch 0's order
    # and augmentation draws again.
    loader = make()
    for epoch in (2, 3):
        drive(loader, epoch)
        assert_same_stream(list(loader), uninterrupted[epoch], f"epoch {epoch}")
    assert loader.epoch == 3


def test_the_batch_sampler_set_epoch_is_the_loaders():
    by_hook, by_loader = make(), make()
    by_hook.batch_sampler.set_epoch(3)
    by_loader.set_epoch(3)
    assert by_hook.next_epoch == by_loader.next_epoch == 3
    assert_same_stream(list(by_hook), list(by_loader), "epoch 3")


@pytest.mark.parametrize("drive", [timm_style, lightning_style])
def test_a_resume_from_the_loaders_state_continues_through_the_framework_calls(
    uninterrupted, drive
):
    # A run the framework started at epoch 2, checkpointed mid-epoch: on the resume its
    # set_epoch(2) continues the loaded position, and set_epoch(3) then runs epoch 3.
    stopped = make()
    drive(stopped, 2)
    it = iter(stopped)
    first = [next(it) for _ in range(5)]
    state = stopped.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    drive(resumed, 2)
    assert_same_stream(first + list(resumed), uninterrupted[2], "epoch 2 across the resume")
    drive(resumed, 3)
    assert_same_stream(list(resumed), uninterrupted[3], "epoch 3")


def test_a_state_taken_at_an_epochs_end_goes_on_with_the_next_epoch_the_framework_names(
    uninterrupted,
):
    stopped = make()
    timm_style(stopped, 1)
    list(stopped)
    resumed = make()
    resumed.load_state_dict(stopped.state_dict())
    timm_style(resumed, 2)
    assert resumed.next_epoch == 2
    assert_same_stream(list(resumed), uninterrupted[2], "epoch 2")


def test_with_a_users_sampler_both_it_and_the_loader_get_the_epoch():
    # The sampler's set_epoch orders the epoch; the loader's gives its echo and augmentation
    # seeds: a run started at epoch 2 trains the uninterrupted run's epoch 2.
    def with_sampler() -> EchoingDataLoader:
        sampler = DistributedSampler(Indexed(), num_replicas=1, rank=0, shuffle=True, seed=1)
        return EchoingDataLoader(Indexed(), sampler=sampler, transform=noisy, **LOADER)

    plain = with_sampler()
    want = []
    for epoch in range(3):
        plain.sampler.set_epoch(epoch)  # the loop a DDP script writes
        want.append(list(plain))
    later = with_sampler()
    timm_style(later, 2)
    assert later.sampler.epoch == 2 and later.next_epoch == 2
    assert_same_stream(list(later), want[2], "epoch 2")


def test_the_users_dataset_and_sampler_are_left_as_they_are():
    dataset = Indexed()
    loader = EchoingDataLoader(dataset, transform=noisy, **LOADER)
    timm_style(loader, 5)
    assert loader.dataset is dataset and not hasattr(dataset, "set_epoch")
    assert loader.sampler is None  # DataLoader's attribute as Lightning and accelerate read it
    hook = loader.batch_sampler
    assert isinstance(hook, EpochHook) and hook.sampler is hook


def test_the_hook_holds_no_batches_and_says_how_to_resume():
    hook = make().batch_sampler
    assert bool(hook)  # a batch sampler is there, whatever its len says
    for call in (iter, len):
        with pytest.raises(DataechoTypeError, match=r"no batches to skip.*state_dict\(\)"):
            call(hook)


def test_the_loader_holds_no_hook_so_dropping_it_needs_no_garbage_collection():
    # Dropping the loader stops its workers at once; a hook kept on it would make a cycle that
    # only the collector breaks.
    loader = make()
    loader.batch_sampler.set_epoch(1)
    gone = weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert gone() is None
    finally:
        gc.enable()
