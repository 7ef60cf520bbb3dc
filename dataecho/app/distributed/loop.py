"""``train_distributed``: a rank's part of a data-parallel run, an entry point kept for callers
of this module. The loop is :func:`dataecho.app.train.train`'s, the one loop of every run."""

from __future__ import annotations

from collections.abc import Callable

from dataecho.app.config import TrainConfig
from dataecho.app.distributed.group import require_torchrun
from dataecho.app.distributed.result import DistributedResult
from dataecho.app.train import train


def train_distributed(cfg: TrainConfig, log: Callable[[str], None] = print) -> DistributedResult:
    """This rank's part of the run ``cfg`` describes, under torchrun: :func:`train`."""
    require_torchrun()
    result = train(cfg, log)
    assert isinstance(result, DistributedResult)
    return result
