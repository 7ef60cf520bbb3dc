"""Real ``accelerate`` training loops over an EchoingDataLoader, on the CPU.

``Accelerator.prepare`` hands an EchoingDataLoader back as it is (it is no torch DataLoader), and
``save_state`` / ``load_state`` hold it only once it is registered: the one call users write is
``dataecho.frameworks.accelerate.register_loader(accelerator, loader)``. Each example's label is its index in the dataset, and every step records the labels it
trains on: the tests assert exactly which examples a resumed run trains, and its weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_same_stream
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dataecho import DataechoTypeError, DataechoValueError, EchoingDataLoader
from dataecho.frameworks.accelerate import register_loader

pytestmark = pytest.mark.usefixtures("one_thread")

N = 32  # examples: 16 batches an epoch at a batch size of 4, each example twice
EPOCHS = 2
STEPS = 32  # two epochs
LOADER = {"batch_size": 4, "echo_factor": 2, "where": "after_augment", "shuffle": True,
          "shuffle_buffer": 5, "seed": 0}  # fmt: skip


class Indexed(Dataset):
    """Example i is (4 features, label i): a batch's labels are the ids of its examples."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((4,), i / N), i


class Run:
    """One process's training set-up: a new Accelerator, model, optimizer and loader, prepared;
    with ``register``, the loader goes into the accelerator's checkpoints (``register_loader``)."""

    def __init__(self, *, register: bool) -> None:
        # accelerate is imported by the tests that use it, not at collection in every process.
        from accelerate import Accelerator

        self.accelerator = Accelerator(cpu=True)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = nn.Linear(4, 1)  # the same initial weights in every run
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loader = EchoingDataLoader(Indexed(), **LOADER)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)
        if register:
            assert register_loader(self.accelerator, self.loader) is self.loader
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def train(self, until_step: int) -> None:
        """Train until ``accelerator.step`` (batches trained, restored by ``load_state``) is
        ``until_step``: the loop a script writes, which continues a resumed epoch as is."""
        accelerator = self.accelerator
        while accelerator.step < until_step:
            for x, y in self.loader:
                self.batches.append((x, y))
                with accelerator.accumulate(self.model):
                    loss = nn.functional.mse_loss(self.model(x).squeeze(-1), y.float() / N)
                    accelerator.backward(loss)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                if accelerator.step == until_step:
                    return

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


@pytest.fixture(scope="module")
def uninterrupted() -> Run:
    run = Run(register=False)
    run.train(STEPS)
    return run


def test_prepare_hands_the_loader_back_as_it_is(uninterrupted):
    assert type(uninterrupted.loader) is EchoingDataLoader
    assert len(uninterrupted.loader) == 16
    assert len(uninterrupted.batches) == STEPS and uninterrupted.loader.epoch == EPOCHS - 1
    ids = [int(i) for _, y in uninterrupted.batches[:16] for i in y]
    assert sorted(ids) == sorted(list(range(N)) * 2)  # an epoch: every example twice


def test_skip_first_batches_is_not_a_way_to_resume_the_loader():
    # accelerate rebuilds a torch DataLoader from the loader's batch sampler: an
    # EchoingDataLoader's (its EpochHook) holds no batches, and names the way to resume.
    run = Run(register=False)
    with pytest.raises(DataechoTypeError, match=r"register_loader\(accelerator, loader\)"):
        next(iter(run.accelerator.skip_first_batches(run.loader, 3)))


@pytest.mark.parametrize("k", [5, 16, 21], ids=["mid-epoch-0", "end-of-epoch-0", "mid-epoch-1"])
def test_load_state_of_a_registered_loader_resumes_exactly(tmp_path: Path, uninterrupted, k):
    stopped = Run(register=True)
    stopped.train(k)
    stopped.accelerator.save_state(tmp_path)
    assert (tmp_path / "custom_checkpoint_0.pkl").exists()  # the loader's state
    assert_same_stream(stopped.batches, uninterrupted.batches[:k], "before the checkpoint")

    resumed = Run(register=True)
    resumed.accelerator.load_state(tmp_path)
    assert resumed.accelerator.step == k
    resumed.train(STEPS)
    assert_same_stream(resumed.batches, uninterrupted.batches[k:], "after the resume")
    for got, want in zip(resumed.weights(), uninterrupted.weights(), strict=True):
        assert torch.equal(got, want)


def test_an_unregistered_loader_silently_starts_its_epoch_over(tmp_path: Path, uninterrupted):
    # What the docs warn of: without register_loader the checkpoint holds no
    # loader, load_state says nothing, and the new loader starts epoch 0 from its first batch.
    k = 5
    stopped = Run(register=False)
    stopped.train(k)
    stopped.accelerator.save_state(tmp_path)
    assert not list(tmp_path.glob("custom_checkpoint_*"))

    resumed = Run(register=False)
    resumed.accelerator.load_state(tmp_path)
    assert resumed.accelerator.step == k
    resumed.train(STEPS)
    assert len(resumed.batches) == STEPS - k
    # 16 batches of epoch 0 (its first k trained a second time), then 11 of epoch 1.
    assert_same_stream(resumed.batches, uninterrupted.batches[: STEPS - k], "restarted")


def test_registering_on_one_side_only_fails_loudly(tmp_path: Path):
    saved_without = tmp_path / "without"
    stopped = Run(register=False)
    stopped.train(3)
    stopped.accelerator.save_state(saved_without)
    with pytest.raises(RuntimeError, match="does not match the number of registered objects"):
        Run(register=True).accelerator.load_state(saved_without)

    saved_with = tmp_path / "with"
    stopped = Run(register=True)
    stopped.train(3)
    stopped.accelerator.save_state(saved_with)
    with pytest.raises(RuntimeError, match="does not match the number of registered objects"):
        Run(register=False).accelerator.load_state(saved_with)


def test_register_loader_twice_is_refused():
    # A second registration would save the loader twice, and a resumed script that registers
    # it once would fail in load_state.
    run = Run(register=True)
    with pytest.raises(DataechoValueError, match="registered with this Accelerator already"):
        register_loader(run.accelerator, run.loader)
    assert run.accelerator._custom_objects == [run.loader]
    other = EchoingDataLoader(Indexed(), **LOADER)  # a second loader is a second object
    assert register_loader(run.accelerator, other) is other


def test_register_loader_takes_an_accelerator_and_an_echoing_loader():
    run = Run(register=False)
    with pytest.raises(DataechoTypeError, match="the arguments are swapped"):
        register_loader(run.loader, run.accelerator)
    with pytest.raises(DataechoTypeError, match="takes an accelerate.Accelerator first, got dict"):
        register_loader({}, run.loader)
    with pytest.raises(DataechoTypeError, match=r"goes through accelerator.prepare\(loader\)"):
        register_loader(run.accelerator, DataLoader(Indexed(), batch_size=4))
    assert run.accelerator._custom_objects == []  # nothing registered on the way
