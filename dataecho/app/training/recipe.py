"""The run's workload as the training loop uses it (:mod:`dataecho.app.workloads`): model and
optimizer, loss, evaluation, and the step's own time (t_down); and the torch plumbing around
them (threads, the training device, evaluation on the CPU).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from dataecho.app import workloads
from dataecho.app.config import TrainConfig
from dataecho.app.upstream import Data


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's thread count set to ``n`` inside, the caller's restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_model(cfg: TrainConfig, data: Data) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    return workloads.get(cfg.workload).build_model(cfg, data.vocab_size)


def step_loss(cfg: TrainConfig, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return workloads.get(cfg.workload).loss(model, batch)


def evaluate_split(
    cfg: TrainConfig, model: torch.nn.Module, split: tuple, full: bool = False
) -> Any:
    """Accuracy (cnn) or validation loss (char-lm); with ``full``: (accuracy or None, loss)."""
    metric, accuracy, loss = workloads.get(cfg.workload).evaluate(model, split)
    return (accuracy, loss) if full else metric


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device`` (as it is on the CPU)."""
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


def on_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """The model on the CPU, where evaluation runs (a copy when training on a GPU)."""
    if next(model.parameters()).device.type == "cpu":
        return model
    return copy.deepcopy(model).cpu()


def metric_key(cfg: TrainConfig) -> str:
    return workloads.get(cfg.workload).metric


def better(cfg: TrainConfig, metric: float, target: float) -> bool:
    return workloads.get(cfg.workload).better(metric, target)


def measure_step_seconds(
    batch_size: int = 128, threads: int = 1, steps: int = 15, *, workload: str = "cnn",
    seq_len: int = 64,
) -> float:  # fmt: skip
    """Seconds per training step on a synthetic batch (t_down) on ``threads`` torch threads,
    median after warm-up steps; the caller's thread count is restored after."""
    with torch_threads(threads):
        return workloads.get(workload).measure_step_seconds(batch_size, steps, seq_len=seq_len)
