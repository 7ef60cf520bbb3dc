"""A small CNN for 28x28 grey images, and its evaluation.

Sized for a CPU demo: two strided conv layers and one hidden layer, ~0.2 M parameters.
Strided convolutions stand in for conv + max-pool because CPU max-pooling in NCHW layout costs
more than both convolutions together. It learns Fashion-MNIST within a few epochs, so
echoing's effect on fresh examples shows quickly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dataecho.app.workloads.image_augment import normalize


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
    batch_size: int = 1000,
) -> EvalResult:
    """Accuracy and loss of ``model`` on ``data``, in eval mode (the mode is restored after).

    ``data`` is either a pair of tensors ``(images, labels)`` (evaluated in chunks of
    ``batch_size``) or an iterable of such batches, e.g. a DataLoader. uint8 images are
    normalised with :func:`~dataecho.app.workloads.image_augment.normalize`; float ones are used as given.
    """
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        images, labels = data
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels; pass matching sizes")
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
        raise ValueError("evaluate() got no examples; pass a non-empty test set")
    return EvalResult(accuracy=correct / count, loss=loss_sum / count, examples=count)
