"""How the training loop's processes agree: the sync mode as a strategy the loop calls.

    sync = make_sync(cfg, model, rank)          # none (one process), ddp or local-echo
    ... a resume loads sync.state_dict() ...
    sync.start(fresh_examples)                  # every rank from rank 0's model
    loss = step_loss(cfg, sync.net, batch)
    summed = sync.backward(loss, control)       # ddp: the gradient round is the exchange
    optimizer.step()
    summed = summed or sync.after_step(fresh_examples, control)   # local-echo: a sync point

An *exchange* returns the control numbers reduced over the ranks (a :class:`.control.Control`):
the loop takes its decisions (evaluate, checkpoint, stop) after one, from those, so every rank
takes the same ones. One process exchanges with itself after every step.
"""

from __future__ import annotations

from typing import Any

import torch

from dataecho.app.config import TrainConfig
from dataecho.app.distributed.control import Control
from dataecho.app.distributed.sync import GradientSync, ModelAveraging, sync_points


class SingleProcess:
    """``none``: one process, nothing to agree on; every step is an exchange."""

    keeps_local_optimizer = False

    def __init__(self, model: torch.nn.Module) -> None:
        self.net = model

    def start(self, fresh_examples: int) -> None:
        pass

    def backward(self, loss: torch.Tensor, control: Control) -> Control | None:
        loss.backward()
        return None

    def after_step(self, fresh_examples: int, control: Control) -> Control | None:
        return control

    def void_exchange(self, control: Control, probe: Any, optimizer: Any) -> Control:
        raise AssertionError("a single process never joins an exchange without a step")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class DDPSync(SingleProcess):
    """``ddp``: gradients all-reduced every step, the control numbers in the first bucket."""

    def __init__(self, model: torch.nn.Module, rank: Any) -> None:
        # DDP's constructor broadcasts rank 0's parameters; a resume then loads the same
        # checkpoint on every rank, so they start equal either way.
        self.gradients = GradientSync(model, rank.guard, rank.stats)
        self.net = self.gradients.model

    def backward(self, loss: torch.Tensor, control: Control) -> Control | None:
        return self.gradients.exchange(loss, control)

    def after_step(self, fresh_examples: int, control: Control) -> Control | None:
        return None  # exchanged in the backward pass

    def void_exchange(self, control: Control, probe: Any, optimizer: Any) -> Control:
        """The gradient round without a batch of ours: ``probe()``'s loss (one evaluation
        example) gives the backward pass its buckets; no rank steps on this exchange."""
        loss = probe(self.net)
        optimizer.zero_grad(set_to_none=True)
        return self.gradients.exchange(loss, control)


class LocalEchoSync(SingleProcess):
    """``local-echo``: local steps; the model averaged at each sync point (a fresh batch's
    worth of data arrived: :func:`.sync.sync_points`), with probability ``avg_prob``.
    Each rank keeps its own optimizer state (momentum), so checkpoints keep every rank's."""

    keeps_local_optimizer = True

    def __init__(self, model: torch.nn.Module, rank: Any, cfg: TrainConfig) -> None:
        self.net, self.batch_size = model, cfg.batch_size
        self.averaging = ModelAveraging(model, rank.guard, rank.stats, avg_prob=cfg.avg_prob,
                                        seed=cfg.seed)  # fmt: skip
        self.synced = 0  # sync points passed

    def start(self, fresh_examples: int) -> None:
        self.averaging.start()
        self.synced = sync_points(fresh_examples, self.batch_size)

    def after_step(self, fresh_examples: int, control: Control) -> Control | None:
        arrived = sync_points(fresh_examples, self.batch_size)
        if arrived <= self.synced:
            return None
        self.synced = arrived  # one sync point per arrival
        return self.averaging.at_sync_point(control)

    def void_exchange(self, control: Control, probe: Any, optimizer: Any) -> Control:
        return self.averaging.average(control)

    def state_dict(self) -> dict[str, Any]:
        return self.averaging.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.averaging.load_state_dict(state)


def make_sync(cfg: TrainConfig, model: torch.nn.Module, rank: Any) -> SingleProcess:
    """The strategy of ``cfg.sync`` for this process (``rank``: its group, None alone)."""
    if rank is None:
        return SingleProcess(model)
    if cfg.sync == "local-echo":
        return LocalEchoSync(model, rank, cfg)
    return DDPSync(model, rank)
