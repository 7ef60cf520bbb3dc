"""Real Hugging Face ``transformers.Trainer`` runs over an EchoingDataLoader, on the CPU.

The loader comes from a ``Trainer`` subclass's ``get_train_dataloader``. Each example's label is
its index in the dataset, and every training step records the labels it trains on: the tests
assert which examples a resumed run trains against the uninterrupted run, and its weights.
Nothing is downloaded: the model is a small ``nn.Module`` built here that returns its loss.

``EchoingTrainer`` and ``LoaderStateCallback()`` (shipped in ``dataecho.frameworks.hf_trainer``)
are the lines docs/faults-and-resume.md gives users.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_same_stream
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from dataecho import DataechoTypeError, DataechoValueError, EchoingDataLoader
from dataecho.frameworks.hf_trainer import LoaderStateCallback

N = 32  # examples: 16 batches an epoch at a batch size of 4, each example twice
STEPS = 32  # two epochs
LOADER = {"echo_factor": 2, "where": "after_augment", "shuffle": True, "shuffle_buffer": 5}

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ignore_data_skip.*"),
    pytest.mark.usefixtures("one_thread"),
]


class Indexed(Dataset):
    """Example i: {"x": 4 features, "labels": i}; a batch's labels are its examples' ids."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((4,), i / N), "labels": torch.tensor(i)}


class Linear(nn.Module):
    """A model as Trainer takes one: keyword inputs from the batch, a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.net = nn.Linear(4, 1)  # the same initial weights in every run

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x).squeeze(-1), labels.float() / N)}


class EchoingTrainer(Trainer):
    """Trains on an EchoingDataLoader; ``trained`` records every batch a step trains on."""

    def get_train_dataloader(self) -> EchoingDataLoader:
        self.loader = EchoingDataLoader(
            self.train_dataset, batch_size=self.args.per_device_train_batch_size,
            seed=self.args.seed, **LOADER,
        )  # fmt: skip
        return self.loader

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained.append({k: v.clone() for k, v in inputs.items()})
        return super().training_step(model, inputs, num_items_in_batch)


class StopAt(TrainerCallback):
    """Checkpoints at step ``k`` and ends the run there: a run cut short (the schedule, set by
    ``max_steps``, stays the uninterrupted run's)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.k:
            control.should_save = control.should_training_stop = True


def train(output_dir: Path, *, callbacks=(), resume: bool = False, **arguments) -> EchoingTrainer:
    """``EchoingTrainer.train`` for ``STEPS`` steps on one CPU thread, quietly; with ``resume``,
    from the latest checkpoint in ``output_dir``."""
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=4,
        learning_rate=0.1, save_strategy="no", logging_strategy="no", report_to=[],
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, **arguments,
    )  # fmt: skip
    trainer = EchoingTrainer(
        model=Linear(), args=args, train_dataset=Indexed(), callbacks=list(callbacks)
    )
    trainer.trained = []
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer


def weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def assert_same_weights(got: Trainer, want: Trainer) -> None:
    for a, b in zip(weights(got), weights(want), strict=True):
        assert torch.equal(a, b)


@pytest.fixture(scope="module", autouse=True)
def short_collections():
    # Every Trainer.train starts with a full gc.collect() (accelerate's free_memory), over a
    # heap transformers makes large: the objects alive now are left out of those collections.
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> EchoingTrainer:
    return train(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """``stopped(k)``: the folder of a run checkpointed and cut short at step ``k``, with the
    loader's state in its checkpoint, and that run (each k once per module; a resumed run
    writes no checkpoint there, so the tests below share them)."""
    runs: dict[int, tuple[Path, EchoingTrainer]] = {}

    def run(k: int) -> tuple[Path, EchoingTrainer]:
        if k not in runs:
            folder = tmp_path_factory.mktemp(f"stopped-at-{k}")
            trainer = train(folder, callbacks=[LoaderStateCallback(), StopAt(k)])
            assert (folder / f"checkpoint-{k}" / "loader_state_0.pt").exists()
            runs[k] = folder, trainer
        return runs[k]

    return run


def test_trainer_epoch_e_trains_the_loaders_epoch_e(uninterrupted):
    # Trainer counts its steps from len(loader) and calls set_epoch(e) before each epoch.
    assert len(uninterrupted.loader) == 16 and uninterrupted.state.max_steps == STEPS
    assert len(uninterrupted.trained) == STEPS and uninterrupted.loader.epoch == 1
    twin = EchoingDataLoader(Indexed(), batch_size=4, seed=uninterrupted.args.seed, **LOADER)
    want = [batch for _ in range(2) for batch in twin]
    assert_same_stream(uninterrupted.trained, want, "two epochs")
    ids = [int(i) for batch in uninterrupted.trained[:16] for i in batch["labels"]]
    assert sorted(ids) == sorted(list(range(N)) * 2)  # an epoch: every example twice


@pytest.mark.parametrize("k", [5, 16, 21], ids=["mid-epoch-0", "end-of-epoch-0", "mid-epoch-1"])
def test_with_the_loader_state_callback_a_resume_trains_what_the_uninterrupted_run_trains(
    uninterrupted, stopped, k
):
    # The callback alone: it turns Trainer's own batch skipping off as the Trainer is made.
    folder, before = stopped(k)
    assert_same_stream(before.trained, uninterrupted.trained[:k], "before the checkpoint")
    resumed = train(folder, callbacks=[LoaderStateCallback()], resume=True)
    assert resumed.args.ignore_data_skip is True
    assert_same_stream(resumed.trained, uninterrupted.trained[k:], "after the resume")
    assert resumed.state.global_step == STEPS
    assert_same_weights(resumed, uninterrupted)


def test_by_default_an_end_of_epoch_checkpoint_resumes_exactly_through_set_epoch(
    uninterrupted, stopped
):
    # Trainer skips no batch there; the new loader's set_epoch(1) gives it epoch 1's order.
    folder, _ = stopped(16)
    resumed = train(folder, resume=True)
    assert_same_stream(resumed.trained, uninterrupted.trained[16:], "epoch 1")
    assert_same_weights(resumed, uninterrupted)


def test_by_default_a_mid_epoch_resume_fails_naming_the_callback(stopped):
    # Trainer skips the epoch's first batches with accelerate's skip_first_batches, which
    # rebuilds the loader as a torch DataLoader over its batch_sampler: an EchoingDataLoader's
    # (its EpochHook) holds no batches, and says what resumes the loader instead.
    folder, _ = stopped(5)
    with pytest.raises(DataechoTypeError, match=r"callbacks=\[dataecho\.frameworks\.hf_trainer"):
        train(folder, resume=True)


def test_skipping_no_batch_without_the_callback_starts_the_epoch_over(uninterrupted, stopped):
    # ignore_data_skip=True without the callback: nothing says so, and the resumed run trains
    # the whole of epoch 0 again (its first 5 batches twice), then 11 batches of epoch 1.
    folder, _ = stopped(5)
    resumed = train(folder, resume=True, ignore_data_skip=True)
    assert_same_stream(resumed.trained, uninterrupted.trained[: STEPS - 5], "started over")


def arguments(output_dir: Path, **more) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(output_dir), max_steps=STEPS, per_device_train_batch_size=4,
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, **more,
    )  # fmt: skip


class PlainTrainer(Trainer):
    """Trainer's own torch DataLoader; ``trained`` counts the steps taken."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained.append(inputs)
        return super().training_step(model, inputs, num_items_in_batch)


def test_the_callback_refuses_a_torch_dataloader_before_the_first_step(tmp_path):
    trainer = PlainTrainer(model=Linear(), args=arguments(tmp_path), train_dataset=Indexed(),
                           callbacks=[LoaderStateCallback()])  # fmt: skip
    trainer.trained = []
    with pytest.raises(DataechoTypeError, match="return an EchoingDataLoader from your Trainer"):
        trainer.train()
    assert trainer.trained == []


def test_a_checkpoint_written_without_the_callback_is_refused_not_restarted(tmp_path):
    # Without the loader's position the resumed epoch would start over: said before any step.
    train(tmp_path, callbacks=[StopAt(5)])  # a checkpoint without the loader's state
    with pytest.raises(DataechoValueError, match=r"checkpoint-5/loader_state_0\.pt does not exist"):
        train(tmp_path, callbacks=[LoaderStateCallback()], resume=True)


def test_the_callback_added_after_the_trainer_is_made_needs_ignore_data_skip(tmp_path):
    trainer = EchoingTrainer(model=Linear(), args=arguments(tmp_path), train_dataset=Indexed())
    trainer.add_callback(LoaderStateCallback())
    trainer.trained = []
    assert trainer.args.ignore_data_skip is False  # on_init_end has passed: nothing turned it on
    with pytest.raises(DataechoValueError, match="Trainer\\(callbacks=\\[LoaderStateCallback"):
        trainer.train()
    assert trainer.trained == []


def test_the_callback_is_a_trainer_callback_and_says_when_transformers_is_missing(monkeypatch):
    import dataecho.frameworks.hf_trainer as glue
    from dataecho.frameworks import FrameworkMissingError

    assert issubclass(LoaderStateCallback, TrainerCallback)
    assert LoaderStateCallback.__module__ == "dataecho.frameworks.hf_trainer"
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    glue._callback_class.cache_clear()
    try:
        with pytest.raises(FrameworkMissingError, match="needs transformers.*pip install"):
            glue.LoaderStateCallback  # noqa: B018
        with pytest.raises(ImportError):  # what `except ImportError` catches
            from dataecho.frameworks.hf_trainer import LoaderStateCallback as _  # noqa: F401
    finally:
        glue._callback_class.cache_clear()
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        glue.Nope  # noqa: B018
