"""Data-parallel echoing on ``torch.distributed`` (torchrun, gloo on CPU, NCCL on GPU).

    dataecho train --nproc 2 --sync local-echo --echo-factor 4      # 2 ranks on this machine
    torchrun --nproc-per-node 2 -m dataecho.app train --sync ddp    # the same, by hand

``sync="ddp"`` all-reduces gradients every step, echoed steps included (``e`` rounds per fresh
batch); ``sync="local-echo"`` takes echo steps locally and averages the model once per fresh
batch (one round, whatever ``e``), or with probability ``avg_prob``. See :mod:`.sync` for the
rule and :mod:`.strategy` for how the loop (:func:`dataecho.app.train.train`, the one loop of
every run) calls it, :mod:`.rank` and :mod:`.signals` for what only ranks do (stop together),
:mod:`.group` for failure reports, :mod:`dataecho.app.training.save_resume` for checkpoints.
"""

from __future__ import annotations

from dataecho.app.distributed.group import GroupInfo, Guard, RankFailure, in_torchrun
from dataecho.app.distributed.launch import LaunchError
from dataecho.app.distributed.sync import CommStats, GradientSync, ModelAveraging, sync_points

__all__ = [
    "CommStats",
    "GradientSync",
    "GroupInfo",
    "Guard",
    "LaunchError",
    "ModelAveraging",
    "RankFailure",
    "sync_points",
    "in_torchrun",
]
