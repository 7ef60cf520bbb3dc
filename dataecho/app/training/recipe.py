"""The workloads as the training loop uses them: model and optimizer, loss, evaluation, and
the step's own time (t_down). ``cnn``: SmallCNN with SGD + Nesterov momentum on Fashion-MNIST;
``char-lm``: CharTransformer with AdamW on Jane Austen's novels (:mod:`dataecho.app.workloads`).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from dataecho.app.config import TrainConfig
from dataecho.app.upstream import Data
from dataecho.app.workloads import char_lm
from dataecho.app.workloads.cnn import SmallCNN, evaluate


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
    if cfg.workload == "cnn":
        model = SmallCNN()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        return model, opt
    model = char_lm.CharTransformer(char_lm.CharLMConfig(data.vocab_size, context=cfg.seq_len))
    return model, char_lm.make_optimizer(model, lr=cfg.lr)


def step_loss(cfg: TrainConfig, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    if cfg.workload == "cnn":
        return F.cross_entropy(model(inputs), targets)
    return char_lm.lm_loss(model, inputs, targets)


def evaluate_split(
    cfg: TrainConfig, model: torch.nn.Module, split: tuple, full: bool = False
) -> Any:
    """Accuracy (cnn) or validation loss (char-lm); with ``full``: (accuracy or None, loss)."""
    if cfg.workload == "cnn":
        r = evaluate(model, split)
        return (r.accuracy, r.loss) if full else r.accuracy
    inputs, targets = split
    batches = ((inputs[i : i + 256], targets[i : i + 256]) for i in range(0, len(inputs), 256))
    loss = char_lm.evaluate(model, batches)
    return (None, loss) if full else loss


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
    return "accuracy" if cfg.workload == "cnn" else "val_loss"


def better(cfg: TrainConfig, metric: float, target: float) -> bool:
    return metric >= target if cfg.workload == "cnn" else metric <= target


def measure_step_seconds(
    batch_size: int = 128, threads: int = 1, steps: int = 15, *, workload: str = "cnn",
    seq_len: int = 64,
) -> float:  # fmt: skip
    """Seconds per training step on a synthetic batch (t_down) on ``threads`` torch threads,
    median after warm-up steps; the caller's thread count is restored after."""
    with torch_threads(threads):
        if workload == "char-lm":  # 82: the Austen vocabulary's size, <unk> included
            lm = char_lm.CharLMConfig(82, context=seq_len)
            return char_lm.measure_step_seconds(lm, batch_size, steps=steps)
        model = SmallCNN()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
        times = []
        for _ in range(steps + 3):  # 3 warm-up steps: first calls allocate and pick kernels
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[3:])
