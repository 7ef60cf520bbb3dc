"""Data-parallel echoing on ``torch.distributed`` (torchrun, gloo on CPU, NCCL on GPU).

    dataecho train --nproc 2 --sync local-echo --echo-factor 4      # 2 ranks on this machine
    torchrun --nproc-per-node 2 -m dataecho.app train --sync ddp    # the same, by hand

``sync="ddp"`` all-reduces gradients every step, echoed steps included (``e`` rounds per fresh
batch); ``sync="local-echo"`` takes echo steps locally and averages the model once per fresh
batch (one round, whatever ``e``), or with probability ``avg_prob``. See :mod:`.sync` for the
rule, :mod:`.loop` for the loop and the resume rule, :mod:`.group` for failure reports.
"""

from __future__ import annotations

from typing import Any

from dataecho.app.distributed.group import GroupInfo, Guard, RankFailure, in_torchrun
from dataecho.app.distributed.launch import LaunchError, launch
from dataecho.app.distributed.sync import CommStats, GradientSync, ModelAveraging, fresh_batches

__all__ = [
    "CommStats",
    "GradientSync",
    "GroupInfo",
    "Guard",
    "LaunchError",
    "ModelAveraging",
    "RankFailure",
    "fresh_batches",
    "in_torchrun",
    "launch",
    "run_distributed",
]


def run_distributed(cfg: Any, log: Any = print) -> Any:
    """``train(cfg)`` for a data-parallel run: this rank's part under torchrun, else launch
    ``cfg.nproc`` local ranks and return rank 0's result."""
    if in_torchrun():
        from dataecho.app.distributed.loop import train_distributed

        return train_distributed(cfg, log)
    return launch(cfg)
