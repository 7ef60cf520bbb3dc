"""The cnn workload: a small CNN for 28x28 grey images trained on Fashion-MNIST (:data:`CNN`).

Sized for a CPU demo: two strided conv layers and one hidden layer, ~0.2 M parameters.
Strided convolutions stand in for conv + max-pool because CPU max-pooling in NCHW layout costs
more than both convolutions together. It learns Fashion-MNIST within a few epochs, so
echoing's effect on fresh examples shows quickly.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dataecho import augment
from dataecho.app.sources.fashion_mnist import FashionMNIST, load_split
from dataecho.app.workloads.base import (
    EvalSplits,
    RunSettings,
    Split,
    Transforms,
    Workload,
    digest,
)
from dataecho.app.workloads.image_augment import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    Augment,
    normalize,
)

if TYPE_CHECKING:
    from torch.utils.data import Dataset

from dataecho.errors import DataechoValueError
from dataecho.loader.points import point_named


class SmallCNN(nn.Module):
    """conv5x5/2(width) -> conv3x3/2(2 width) -> fc(128) -> fc(classes), ReLUs between.

    Input: float (N, C, 28, 28), normalised (see :class:`~dataecho.app.workloads.image_augment.Augment`).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 5, stride=2, padding=2)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(2 * width * 7 * 7, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))  # 28 -> 14
        x = F.relu(self.conv2(x))  # 14 -> 7
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


# Images per forward pass of an evaluation. A chunk's activations (the first convolution's: 250
# x 16 x 14 x 14 floats, 3 MB) stay near the core's cache; chunks of 1,000 took about twice as
# long on the CPU (benchmarks/evaluation).
EVAL_CHUNK = 250


@dataclass(frozen=True)
class EvalResult:
    """Accuracy (0..1) and mean cross-entropy over ``examples`` examples."""

    accuracy: float
    loss: float
    examples: int


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor] | Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    batch_size: int = EVAL_CHUNK,
) -> EvalResult:
    """Accuracy and loss of ``model`` on ``data``, in eval mode (the mode is restored after).

    ``data`` is either a pair of tensors ``(images, labels)`` (evaluated in chunks of
    ``batch_size``) or an iterable of such batches, e.g. a DataLoader. uint8 images are
    normalised with :func:`~dataecho.app.workloads.image_augment.normalize`; float ones are used as given.
    """
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        images, labels = data
        if len(images) != len(labels):
            raise DataechoValueError(
                f"{len(images)} images but {len(labels)} labels; pass matching sizes"
            )
        batches: Iterable = (
            (images[i : i + batch_size], labels[i : i + batch_size])
            for i in range(0, len(images), batch_size)
        )
    else:
        batches = data
    was_training = model.training
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    try:
        for x, y in batches:
            if x.dtype == torch.uint8:
                x = normalize(x)
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    finally:
        model.train(was_training)
    if count == 0:
        raise DataechoValueError("evaluate() got no examples; pass a non-empty test set")
    return EvalResult(accuracy=correct / count, loss=loss_sum / count, examples=count)


def device_augment(pad: int) -> augment.Compose:
    """The cnn augmentation as device ops: the same shift, flip and normalisation as
    :class:`~dataecho.app.workloads.image_augment.Augment`, drawn per copy on the training
    device."""
    return augment.Compose(
        [augment.ShiftFlip(pad), augment.Normalize(FASHION_MNIST_MEAN, FASHION_MNIST_STD)]
    )


class FashionMNISTCNN(Workload):
    """SmallCNN with SGD + Nesterov momentum on Fashion-MNIST; its metric: test accuracy."""

    name = "cnn"
    dataset = "fashion-mnist"
    shard_kind = "image"
    # Evaluations are sized to decide a target while costing a small share of a run's time.
    defaults = MappingProxyType(
        {"batch_size": 128, "lr": 0.05, "budget": 180_000, "eval_every": 6_000,
         "eval_examples": 5_000}
    )  # fmt: skip
    target_key = "target_accuracy"
    cli_target = 0.85  # reached within the default budget
    metric = "accuracy"
    summary = "a small CNN on Fashion-MNIST"
    data_folder = "Fashion-MNIST IDX folder"
    eval_split = "test"
    optimizer = "SGD"
    higher_is_better = True

    def combine(self, total: float, examples: int) -> float:
        # Whole counts of correct answers, so the same float as one pass over all.
        return round(total) / examples

    def default_data_dir(self) -> Path:
        from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR

        return DEFAULT_DATA_DIR

    def eval_splits(self, cfg: RunSettings) -> EvalSplits:
        test = FashionMNIST(cfg.data_dir, "test")
        n = min(cfg.eval_examples, len(test))
        eval_set = (normalize(test.images[:n]), test.labels[:n])  # normalised once, not per eval
        side = min(test.images.shape[-2:])
        if cfg.augment_pad >= side:  # checked here, not at the first image in a worker
            raise DataechoValueError(
                f"augment_pad must be below the image side ({side} pixels), got "
                f"{cfg.augment_pad}; 2-4 is usual for 28x28 images"
            )
        return EvalSplits(eval_set, (test.images, test.labels))

    def in_memory(self, cfg: RunSettings) -> tuple[Dataset, str, str]:
        train = FashionMNIST(cfg.data_dir, "train", limit=cfg.train_examples)
        return train, "Fashion-MNIST train", digest(train.images, train.labels)

    def transforms(self, cfg: RunSettings, *, sharded: bool) -> Transforms:
        # Echoing after augmentation needs the copies identical: per example, before echoing.
        # Elsewhere each example of a batch is drawn on its own in one call, much cheaper than
        # a call per example, and on the device for where="device". The workers shift and flip
        # uint8 batches and the step normalises them (loss): a float32 batch is 4x the bytes
        # that every copy would carry from the worker to the training process.
        point = point_named(cfg.where)
        if point.on_device:
            return Transforms(device_transform=device_augment(cfg.augment_pad))
        if point.identical_copies:
            return Transforms(transform=Augment(pad=cfg.augment_pad))
        return Transforms(batch_transform=augment.ShiftFlip(cfg.augment_pad))

    def write_shards(
        self, out: Path, data_dir: str | Path, *, examples: int | None, examples_per_shard: int,
        seq_len: int,
    ) -> dict[str, Any]:  # fmt: skip
        from dataecho.app.sources.shard_writer import write_image_shards

        images, labels = load_split(data_dir, "train")
        return write_image_shards(
            images[:examples], labels[:examples], out, examples_per_shard=examples_per_shard,
            prefix=self.dataset,
        )  # fmt: skip

    def build_model(
        self, cfg: RunSettings, vocab_size: int | None
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = SmallCNN()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True)
        return model, opt

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        if inputs.dtype == torch.uint8:  # shifted and flipped in the workers, not normalised
            inputs = normalize(inputs)
        return F.cross_entropy(model(inputs), targets)

    def evaluate(self, model: torch.nn.Module, split: Split) -> tuple[float, float | None, float]:
        r = evaluate(model, split)
        return r.accuracy, r.accuracy, r.loss

    def example_bytes(self, cfg: RunSettings) -> int:
        return 4 * 28 * 28  # a float32 image

    def measure_step_seconds(self, batch_size: int, steps: int, *, seq_len: int) -> float:
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

    def describe_metric(self, value: float) -> str:
        return f"test acc {value:.4f}"


CNN = FashionMNISTCNN()
