"""The choi experiment's two workloads, in memory: a TinyCNN on Fashion-MNIST, an Austen char LM.

Each builder returns a :class:`~experiments.common.trial_loop.TrialWorkload` for
:func:`~experiments.common.trial_loop.run_trial`; it reads its data once per process and is
cached by its settings, so every cell of a grid (and every worker process) reuses it. The
models are a few times smaller than the application's (TinyCNN: SmallCNN at half width; the
char LM: 1 layer, d_model 32, context 32) so that hundreds of tuned trials fit on a few cores.
The search spaces of their optimizers are here too (:data:`CNN_SPACE`, :data:`LM_SPACE`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from dataecho.app.sources.austen import AustenChars, load_novels
from dataecho.app.sources.fashion_mnist import FashionMNIST
from dataecho.app.workloads import char_lm
from dataecho.app.workloads.image_augment import Augment, normalize
from experiments.common.trial_loop import TrialWorkload
from experiments.common.tuning import LogUniform

# SGD with Nesterov momentum: the learning rate and (1 - momentum), both log-uniform.
CNN_SPACE = {"lr": LogUniform(0.01, 0.5), "one_minus_momentum": LogUniform(0.03, 0.5)}
# AdamW (betas fixed at the library's 0.9 / 0.99): the learning rate alone.
LM_SPACE = {"lr": LogUniform(1e-3, 3e-2)}
LM_CONFIG = dict(context=32, d_model=32, n_layers=1, n_heads=2, ff_mult=2)


class TinyCNN(nn.Module):
    """conv5x5/2(8) -> conv3x3/2(16) -> fc(64) -> fc(10): SmallCNN's shape at half width."""

    def __init__(self, width: int = 8, hidden: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 5, stride=2, padding=2)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(2 * width * 49, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def _sgd(model: torch.nn.Module, params: dict[str, float]) -> torch.optim.Optimizer:
    momentum = 1.0 - params["one_minus_momentum"]
    return torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=momentum, nesterov=True)


def _cnn_loss(model: torch.nn.Module, batch) -> torch.Tensor:  # noqa: ANN001
    images, labels = batch
    return F.cross_entropy(model(images), labels)


@functools.cache
def cnn_workload(
    train_examples: int, eval_examples: int, target: float, eval_every: int, budget: int
) -> TrialWorkload:
    """TinyCNN on the first ``train_examples`` Fashion-MNIST images, random shift + flip."""
    train = FashionMNIST(split="train", limit=train_examples)
    test = FashionMNIST(split="test", limit=eval_examples)
    images, labels = normalize(test.images), test.labels

    @torch.no_grad()
    def accuracy(model: torch.nn.Module) -> float:
        model.eval()
        correct = sum(
            int((model(images[i : i + 1000]).argmax(1) == labels[i : i + 1000]).sum())
            for i in range(0, len(labels), 1000)
        )
        model.train()
        return correct / len(labels)

    return TrialWorkload(
        name="cnn", train=train, transform=Augment(pad=2, flip=True), make_model=TinyCNN,
        make_optimizer=_sgd, loss=_cnn_loss, metric=accuracy, target=target,
        higher_is_better=True, eval_every=eval_every, budget=budget,
    )  # fmt: skip


@functools.cache
def lm_workload(eval_chunks: int, target: float, eval_every: int, budget: int) -> TrialWorkload:
    """The 1-layer char Transformer on Austen chunks of 32 characters; no augmentation."""
    novels = load_novels()
    train = AustenChars("train", seq_len=LM_CONFIG["context"], novels=novels)
    val = AustenChars("val", seq_len=LM_CONFIG["context"], novels=novels)
    # Every 4th validation chunk: spread over all six novels' held-out ends.
    rows = val.chunks[:: max(1, len(val) // eval_chunks)][:eval_chunks]
    cfg = char_lm.CharLMConfig(len(train.vocab), **LM_CONFIG)

    def val_loss(model: torch.nn.Module) -> float:
        return char_lm.evaluate(model, [(rows[:, :-1], rows[:, 1:])])

    def loss(model: torch.nn.Module, batch) -> torch.Tensor:  # noqa: ANN001
        return char_lm.lm_loss(model, *batch)

    return TrialWorkload(
        name="char-lm", train=train, transform=None,
        make_model=lambda: char_lm.CharTransformer(cfg),
        make_optimizer=lambda m, p: char_lm.make_optimizer(m, lr=p["lr"]),
        loss=loss, metric=val_loss, target=target, higher_is_better=False,
        eval_every=eval_every, budget=budget,
    )  # fmt: skip
