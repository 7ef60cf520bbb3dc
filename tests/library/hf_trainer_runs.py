"""The Hugging Face ``transformers.Trainer`` runs of test_hf_trainer.py.

A module of its own, imported by that file's ``hf`` fixture: transformers takes seconds to
import, paid by the test process that runs those tests rather than at collection in every one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from dataecho import EchoingDataLoader
from dataecho.frameworks.hf_trainer import LoaderStateCallback

__all__ = ["LoaderStateCallback", "TrainerCallback"]  # for the tests, beside the runs below

N = 32  # examples: 16 batches an epoch at a batch size of 4, each example twice
STEPS = 32  # two epochs
LOADER = {"echo_factor": 2, "where": "after_augment", "shuffle": True, "shuffle_buffer": 5}


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
