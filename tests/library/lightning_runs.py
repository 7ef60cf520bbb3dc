"""The ``lightning.Trainer.fit`` runs of test_lightning.py, and of the DDP script it starts.

A module of its own, imported by that file's ``runs`` fixture: lightning takes a second to
import, paid by the test process that runs those tests rather than at collection in every one.
"""

from __future__ import annotations

import collections
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dataecho import EchoingDataLoader

__all__ = ["ModelCheckpoint"]  # for the tests, beside the runs below

N = 64  # examples in the training set


class Indexed(Dataset):
    """Example i is (4 features, label i): a batch's labels are the ids of its examples."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((4,), i / self.n), i


def jitter(example):
    """A per-example random augmentation that keeps the label."""
    x, y = example
    return x + 0.01 * torch.randn(4), y


class Recorder(L.LightningModule):
    """A linear model whose ``train_dataloader()`` is an EchoingDataLoader(``loader_kwargs``);
    ``trained`` gets (epoch, labels of the batch) for every training step."""

    def __init__(self, loader_kwargs: dict, *, one_cycle: bool = False, n: int = N) -> None:
        super().__init__()
        self.n = n  # examples in its training set
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.net = nn.Linear(4, 1)  # the same initial weights in every run
        self.loader_kwargs = loader_kwargs
        self.one_cycle = one_cycle
        self.loader: EchoingDataLoader | None = None
        self.trained: list[tuple[int, list[int]]] = []

    def train_dataloader(self):
        self.loader = EchoingDataLoader(Indexed(self.n), **self.loader_kwargs)
        return self.loader

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.trained.append((self.current_epoch, y.tolist()))
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y.float() / self.n)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.one_cycle:
            return opt
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def epochs(self) -> list[list[list[int]]]:
        """The batches trained, grouped by epoch."""
        grouped: dict[int, list[list[int]]] = collections.defaultdict(list)
        for epoch, ids in self.trained:
            grouped[epoch].append(ids)
        return [grouped[e] for e in sorted(grouped)]


class WithValidation(Recorder):
    """A Recorder with a small validation set; ``validations`` counts the validation runs."""

    def __init__(self, loader_kwargs: dict) -> None:
        super().__init__(loader_kwargs)
        self.validations = 0

    def val_dataloader(self):
        return DataLoader(Indexed(8), batch_size=4)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y.float() / 8)

    def on_validation_epoch_end(self):
        self.validations += 1


def fit(module: L.LightningModule, ckpt_path: str | Path | None = None, **kwargs) -> L.Trainer:
    """``Trainer(**kwargs).fit(module)`` on one CPU, quietly."""
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 2,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "num_sanity_val_steps": 0,
        **kwargs,
    }
    trainer = L.Trainer(**options)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer


class WorkerPids(WithValidation):
    """A WithValidation that records its loader's worker pids at every training step."""

    def __init__(self, loader_kwargs: dict) -> None:
        super().__init__(loader_kwargs)
        self.pids: set[tuple[int, ...]] = set()

    def training_step(self, batch, batch_idx):
        self.pids.add(tuple(w.pid for w in self.loader._inner._iterator._workers))
        return super().training_step(batch, batch_idx)
