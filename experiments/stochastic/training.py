"""Training with batch-level stochastic echoing (:class:`dataecho.StochasticEcho`), in memory.

A small MLP (784-64-10, ReLU) on Fashion-MNIST without augmentation, plain SGD (no momentum,
as in the smooth non-convex analysis), so only the learning rate is tuned. The upstream yields
fresh batches of ``batch_size`` examples drawn without replacement; the stochastic echo stage
loads one with probability ``p_t`` and otherwise reuses one of the last ``M`` loaded batches.
"Data loads" are fresh examples: the stage's ``stats.fresh_items`` (fresh batches) times the batch size.

Why not :func:`experiments.common.trial_loop.run_trial`: that loop trains through the
echoing loader, which has no stochastic (load-probability) echoing; here the stage is driven
directly on whole batches, each tagged with its load index, which :func:`gradient_bias` needs
to measure a reused batch's lag. Like the trial loop it has no checkpoints and no upstream.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dataecho.app.sources.fashion_mnist import FashionMNIST
from dataecho.app.workloads.image_augment import normalize
from dataecho.schedules import constant, cosine_decreasing, cosine_increasing
from dataecho.stages import StochasticEcho
from experiments.common.tuning import Trial


@dataclass(frozen=True)
class Data:
    """Flattened, normalised training and test images and their labels."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


@functools.cache
def load_data(train: int, test: int) -> Data:
    """The first ``train`` / ``test`` examples, normalised and flattened, as tensors."""
    tr, te = FashionMNIST(split="train", limit=train), FashionMNIST(split="test", limit=test)
    return Data(normalize(tr.images).flatten(1), tr.labels,
                normalize(te.images).flatten(1), te.labels)  # fmt: skip


def make_model(seed: int) -> nn.Module:
    """The MLP 784-64-10, its initial weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def batches_of(data: Data, batch_size: int, seed: int) -> Iterator[tuple]:
    """Batches without replacement in a seeded order, each tagged with its load index."""
    gen = torch.Generator().manual_seed(seed)
    bid = 0
    while True:  # a new order each pass over the data
        order = torch.randperm(len(data.train_y), generator=gen)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield data.train_x[idx], data.train_y[idx], bid
            bid += 1


@dataclass(frozen=True)
class Setting:
    """One condition: mean load probability, schedule, echo buffer size (in batches)."""

    p: float
    schedule: str  # "constant", "cos_inc" (reuse early) or "cos_dec" (reuse late)
    buffer: int

    def load_prob(self, total_steps: int):  # noqa: ANN201
        """The schedule; the cosines run between p/2 and min(1, 3p/2) (mean about p)."""
        if self.schedule == "constant":
            return constant(self.p)
        lo, hi = self.p / 2, min(1.0, 1.5 * self.p)
        if self.schedule == "cos_inc":
            return cosine_increasing(lo, hi, total_steps)
        return cosine_decreasing(hi, lo, total_steps)


def accuracy(model: nn.Module, data: Data) -> float:
    """Test accuracy of ``model`` on ``data``'s test split."""
    with torch.no_grad():
        return float((model(data.test_x).argmax(1) == data.test_y).float().mean())


def train_stochastic(
    data: Data, setting: Setting, lr: float, seed: int, *, batch_size: int, target: float,
    max_loads: int, eval_every: int, limit: int | None = None, steps: int | None = None,
) -> Trial:  # fmt: skip
    """Train until ``target`` test accuracy (fresh examples then recorded) or the caps.

    With ``steps`` (fixed-horizon runs, the schedules) train exactly that many steps, the
    schedule spanning them, and record the final accuracy (evaluated once, at the end);
    otherwise stop at the target or at ``limit`` / ``max_loads`` fresh examples, evaluating
    every ``eval_every`` steps.
    """
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    horizon = steps or max(1, round(max_loads / batch_size / setting.p))
    stage = StochasticEcho(batches_of(data, batch_size, seed), seed=seed, copy=False,
                           load_prob=setting.load_prob(horizon), buffer_size=setting.buffer)  # fmt: skip
    cap = max_loads if limit is None else min(max_loads, limit)
    to_target, acc, step = None, math.nan, 0
    for x, y, _bid in stage:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        loads = stage.stats.fresh_items * batch_size
        if not math.isfinite(loss.item()):
            return Trial({"lr": lr}, None, {"metric": math.nan, "loads": loads, "steps": step})
        # Fixed-horizon runs evaluate once, at the end: evaluations cost more than steps.
        if (steps is None and step % eval_every == 0) or (steps is not None and step == steps):
            acc = accuracy(model, data)
            if to_target is None and acc >= target:
                to_target = loads
                if steps is None:
                    break
        if (steps is not None and step >= steps) or (steps is None and loads >= cap):
            break
    return Trial({"lr": lr}, to_target,
                 {"metric": acc, "loads": stage.stats.fresh_items * batch_size, "steps": step,
                  "realized_factor": stage.stats.realized_factor})  # fmt: skip


def gradient_bias(
    data: Data, p: float, buffer: int, lr: float, seed: int, *, batch_size: int, steps: int,
    every: int, ref_examples: int,
) -> list[dict]:  # fmt: skip
    """Per sampled step: the batch's lag and use count, and how its gradient compares with the
    gradient on ``ref_examples`` training examples (full-data gradient) and with the gradient
    of an independent fresh batch at the same weights (the no-reuse reference)."""
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    stage = StochasticEcho(batches_of(data, batch_size, seed), load_prob=p,
                           buffer_size=buffer, seed=seed, copy=False)  # fmt: skip
    # The reference set and the independent batches come from the end of the training data,
    # which the stream reaches only after len - ref_examples examples (beyond these runs).
    ref_x, ref_y = data.train_x[-ref_examples:], data.train_y[-ref_examples:]
    gen = torch.Generator().manual_seed(seed + 1)
    loaded_at: dict[int, int] = {}
    uses: dict[int, int] = {}
    rows = []

    def grad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        return torch.cat([q.grad.flatten() for q in model.parameters()])

    for step, (x, y, bid) in enumerate(stage):
        if step >= steps:
            break
        loaded_at.setdefault(bid, step)
        uses[bid] = uses.get(bid, 0) + 1
        if step % every == 0:
            g_full = grad(ref_x, ref_y)
            j = torch.randint(0, ref_examples - batch_size, (1,), generator=gen).item()
            g_ind = grad(ref_x[j : j + batch_size], ref_y[j : j + batch_size])
            g_b = grad(x, y)
            norm = g_full.norm().item()
            rows.append({
                "step": step, "lag": step - loaded_at[bid], "use": uses[bid],
                "cos_batch": F.cosine_similarity(g_b, g_full, dim=0).item(),
                "cos_fresh": F.cosine_similarity(g_ind, g_full, dim=0).item(),
                "rel_err_batch": (g_b - g_full).norm().item() / norm,
                "rel_err_fresh": (g_ind - g_full).norm().item() / norm,
            })  # fmt: skip
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return rows
