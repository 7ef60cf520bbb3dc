"""The two reproduction workloads, in memory: Fashion-MNIST TinyCNN and the Austen char LM.

Built once per process (the data loads in ~0.5 s / ~3 s) and cached by their settings.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from dataecho.app.sources.austen import AustenChars, load_novels
from dataecho.app.sources.fashion_mnist import FashionMNIST
from dataecho.app.workloads import char_lm
from dataecho.app.workloads.augment import Augment, normalize
from experiments._lean_train import TinyCNN, Workload
from experiments.tuning import LogUniform

# SGD with Nesterov momentum: the learning rate and (1 - momentum), both log-uniform.
CNN_SPACE = {"lr": LogUniform(0.01, 0.5), "one_minus_momentum": LogUniform(0.03, 0.5)}
# AdamW (betas fixed at the library's 0.9 / 0.99): the learning rate alone.
LM_SPACE = {"lr": LogUniform(1e-3, 3e-2)}
LM_CONFIG = dict(context=32, d_model=32, n_layers=1, n_heads=2, ff_mult=2)


def _sgd(model: torch.nn.Module, params: dict[str, float]) -> torch.optim.Optimizer:
    momentum = 1.0 - params["one_minus_momentum"]
    return torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=momentum, nesterov=True)


def _cnn_loss(model: torch.nn.Module, batch) -> torch.Tensor:  # noqa: ANN001
    images, labels = batch
    return F.cross_entropy(model(images), labels)


@functools.cache
def cnn_workload(
    train_examples: int, eval_examples: int, target: float, eval_every: int, budget: int
) -> Workload:
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

    return Workload(
        name="cnn", train=train, transform=Augment(pad=2, flip=True), make_model=TinyCNN,
        make_optimizer=_sgd, loss=_cnn_loss, metric=accuracy, target=target,
        higher_is_better=True, eval_every=eval_every, budget=budget,
    )  # fmt: skip


@functools.cache
def lm_workload(eval_chunks: int, target: float, eval_every: int, budget: int) -> Workload:
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

    return Workload(
        name="char-lm", train=train, transform=None,
        make_model=lambda: char_lm.CharTransformer(cfg),
        make_optimizer=lambda m, p: char_lm.make_optimizer(m, lr=p["lr"]),
        loss=loss, metric=val_loss, target=target, higher_is_better=False,
        eval_every=eval_every, budget=budget,
    )  # fmt: skip
