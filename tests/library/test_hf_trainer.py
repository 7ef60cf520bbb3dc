"""Real Hugging Face ``transformers.Trainer`` runs over an EchoingDataLoader, on the CPU.

The loader comes from a ``Trainer`` subclass's ``get_train_dataloader``. Each example's label is
its index in the dataset, and every training step records the labels it trains on: the tests
assert which examples a resumed run trains against the uninterrupted run, and its weights.
Nothing is downloaded: the model is a small ``nn.Module`` built here that returns its loss.

``EchoingTrainer`` (in hf_trainer_runs.py) and ``LoaderStateCallback()`` (shipped in
``dataecho.frameworks.hf_trainer``) are the lines docs/faults-and-resume.md gives users.
"""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

import pytest
import torch
from conftest import assert_same_stream

from dataecho import DataechoTypeError, DataechoValueError, EchoingDataLoader

if TYPE_CHECKING:
    from pathlib import Path

    from hf_trainer_runs import EchoingTrainer
    from transformers import Trainer

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*ignore_data_skip.*"),
    pytest.mark.usefixtures("one_thread"),
]


def weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def assert_same_weights(got: Trainer, want: Trainer) -> None:
    for a, b in zip(weights(got), weights(want), strict=True):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def runs():
    """This file's Trainer runs (hf_trainer_runs), imported by the process that runs the file
    rather than at collection in every test process: transformers takes seconds to import.
    Every Trainer.train starts with a full gc.collect() (accelerate's free_memory) over the
    heap transformers makes large: what is alive once it is imported is kept out of them."""
    import hf_trainer_runs

    gc.freeze()
    return hf_trainer_runs


@pytest.fixture(scope="module")
def uninterrupted(runs, tmp_path_factory) -> EchoingTrainer:
    return runs.train(tmp_path_factory.mktemp("uninterrupted"))


@pytest.fixture(scope="module")
def stopped(runs, tmp_path_factory):
    """``stopped(k)``: the folder of a run checkpointed and cut short at step ``k``, with the
    loader's state in its checkpoint, and that run (each k once per module; a resumed run
    writes no checkpoint there, so the tests below share them)."""
    done: dict[int, tuple[Path, EchoingTrainer]] = {}

    def run(k: int) -> tuple[Path, EchoingTrainer]:
        if k not in done:
            folder = tmp_path_factory.mktemp(f"stopped-at-{k}")
            trainer = runs.train(folder, callbacks=[runs.LoaderStateCallback(), runs.StopAt(k)])
            assert (folder / f"checkpoint-{k}" / "loader_state_0.pt").exists()
            done[k] = folder, trainer
        return done[k]

    return run


def test_trainer_epoch_e_trains_the_loaders_epoch_e(runs, uninterrupted):
    # Trainer counts its steps from len(loader) and calls set_epoch(e) before each epoch.
    assert len(uninterrupted.loader) == 16 and uninterrupted.state.max_steps == runs.STEPS
    assert len(uninterrupted.trained) == runs.STEPS and uninterrupted.loader.epoch == 1
    twin = EchoingDataLoader(
        runs.Indexed(), batch_size=4, seed=uninterrupted.args.seed, **runs.LOADER
    )
    want = [batch for _ in range(2) for batch in twin]
    assert_same_stream(uninterrupted.trained, want, "two epochs")
    ids = [int(i) for batch in uninterrupted.trained[:16] for i in batch["labels"]]
    assert sorted(ids) == sorted(list(range(runs.N)) * 2)  # an epoch: every example twice


@pytest.mark.parametrize("k", [5, 16, 21], ids=["mid-epoch-0", "end-of-epoch-0", "mid-epoch-1"])
def test_with_the_loader_state_callback_a_resume_trains_what_the_uninterrupted_run_trains(
    runs, uninterrupted, stopped, k
):
    # The callback alone: it turns Trainer's own batch skipping off as the Trainer is made.
    folder, before = stopped(k)
    assert_same_stream(before.trained, uninterrupted.trained[:k], "before the checkpoint")
    resumed = runs.train(folder, callbacks=[runs.LoaderStateCallback()], resume=True)
    assert resumed.args.ignore_data_skip is True
    assert_same_stream(resumed.trained, uninterrupted.trained[k:], "after the resume")
    assert resumed.state.global_step == runs.STEPS
    assert_same_weights(resumed, uninterrupted)


def test_by_default_an_end_of_epoch_checkpoint_resumes_exactly_through_set_epoch(
    runs, uninterrupted, stopped
):
    # Trainer skips no batch there; the new loader's set_epoch(1) gives it epoch 1's order.
    folder, _ = stopped(16)
    resumed = runs.train(folder, resume=True)
    assert_same_stream(resumed.trained, uninterrupted.trained[16:], "epoch 1")
    assert_same_weights(resumed, uninterrupted)


def test_by_default_a_mid_epoch_resume_fails_naming_the_callback(runs, stopped):
    # Trainer skips the epoch's first batches with accelerate's skip_first_batches, which
    # rebuilds the loader as a torch DataLoader over its batch_sampler: an EchoingDataLoader's
    # (its EpochHook) holds no batches, and says what resumes the loader instead.
    folder, _ = stopped(5)
    with pytest.raises(DataechoTypeError, match=r"callbacks=\[dataecho\.frameworks\.hf_trainer"):
        runs.train(folder, resume=True)


def test_skipping_no_batch_without_the_callback_starts_the_epoch_over(runs, uninterrupted, stopped):
    # ignore_data_skip=True without the callback: nothing says so, and the resumed run trains
    # the whole of epoch 0 again (its first 5 batches twice), then 11 batches of epoch 1.
    folder, _ = stopped(5)
    resumed = runs.train(folder, resume=True, ignore_data_skip=True)
    assert_same_stream(resumed.trained, uninterrupted.trained[: runs.STEPS - 5], "started over")


def test_the_callback_refuses_a_torch_dataloader_before_the_first_step(runs, tmp_path):
    trainer = runs.PlainTrainer(
        model=runs.Linear(), args=runs.arguments(tmp_path), train_dataset=runs.Indexed(),
        callbacks=[runs.LoaderStateCallback()],
    )  # fmt: skip
    trainer.trained = []
    with pytest.raises(DataechoTypeError, match="return an EchoingDataLoader from your Trainer"):
        trainer.train()
    assert trainer.trained == []


def test_a_checkpoint_written_without_the_callback_is_refused_not_restarted(runs, tmp_path):
    # Without the loader's position the resumed epoch would start over: said before any step.
    runs.train(tmp_path, callbacks=[runs.StopAt(5)])  # a checkpoint without the loader's state
    with pytest.raises(DataechoValueError, match=r"checkpoint-5/loader_state_0\.pt does not exist"):
        runs.train(tmp_path, callbacks=[runs.LoaderStateCallback()], resume=True)


def test_the_callback_added_after_the_trainer_is_made_needs_ignore_data_skip(runs, tmp_path):
    trainer = runs.EchoingTrainer(
        model=runs.Linear(), args=runs.arguments(tmp_path), train_dataset=runs.Indexed()
    )
    trainer.add_callback(runs.LoaderStateCallback())
    trainer.trained = []
    assert trainer.args.ignore_data_skip is False  # on_init_end has passed: nothing turned it on
    with pytest.raises(DataechoValueError, match="Trainer\\(callbacks=\\[LoaderStateCallback"):
        trainer.train()
    assert trainer.trained == []


def test_the_callback_is_a_trainer_callback_and_says_when_transformers_is_missing(
    runs, monkeypatch
):
    import dataecho.frameworks.hf_trainer as glue
    from dataecho.frameworks import FrameworkMissingError

    assert issubclass(runs.LoaderStateCallback, runs.TrainerCallback)
    assert runs.LoaderStateCallback.__module__ == "dataecho.frameworks.hf_trainer"
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
