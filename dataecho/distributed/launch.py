"""``dataecho train --nproc N``: start N ranks on this machine with PyTorch's elastic launcher.

    result = launch(TrainConfig(nproc=2, sync="local-echo", echo_factor=4))   # rank 0's result

The launcher is ``torch.distributed.launcher.elastic_launch``, the API behind ``torchrun
--standalone --nproc-per-node N``: a c10d rendezvous on a free local port, each rank in a new
process (spawn) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, no restarts. When a
rank fails, the launcher stops the others and :class:`LaunchError` names the rank(s) that failed
and why (their exception, or the signal that ended them).

Several machines: start ``torchrun`` on each one instead (see the README), e.g.
``torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400
--rdzv-id run1 -m dataecho.cli train --sync local-echo ...``; ``dataecho train`` sees it runs
under torchrun and joins the group.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from dataecho.config import TrainConfig


class LaunchError(RuntimeError):
    """A rank of a launched run failed; the message names it and its error."""


def launch(cfg: TrainConfig) -> Any:
    """Run ``cfg`` on ``cfg.nproc`` local ranks; return rank 0's result."""
    # Imported here: the elastic package costs ~0.4 s, which every other command would pay.
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.nproc,
        run_id=f"dataecho-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as torchrun --standalone picks
        max_restarts=0,  # a failed rank ends the run: a restart would not resume the stream
        monitor_interval=0.2,
        start_method="spawn",
    )
    # The ranks' DataLoader workers and torch threads share this machine's cores: torchrun
    # would set OMP_NUM_THREADS=1; the step's thread count comes from cfg.threads anyway.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The agent logs a failed rank's whole traceback; LaunchError says it in one line (the
    # rank's own stderr keeps the traceback).
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(config, _rank_main)(cfg)
    except ChildFailedError as err:
        raise LaunchError(describe_failure(err)) from None
    finally:
        quiet.setLevel(level)
    return results[0]


def describe_failure(err: Any) -> str:
    """One line per failed rank of a ``ChildFailedError``: which, how it ended, its error."""
    lines = []
    for rank, failure in sorted(err.failures.items()):
        how = (f"killed by {failure.signal_name()}" if failure.exitcode < 0
               else f"exit code {failure.exitcode}")  # fmt: skip
        message = failure.message
        if isinstance(message, dict):  # the error file's record
            message = message.get("message", "")
        first = str(message or "").strip().splitlines()
        lines.append(f"rank {rank} (local rank {failure.local_rank}) failed, {how}"
                     + (f": {first[0][:400]}" if first else ""))  # fmt: skip
    return "data-parallel run failed; " + "; ".join(lines)


def _rank_main(cfg: TrainConfig) -> Any:
    """What each launched rank runs."""
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: writes this rank's exception to the file the launcher reads into its error.
    return record(_train_rank)(cfg)


def _train_rank(cfg: TrainConfig) -> Any:
    import multiprocessing

    from dataecho.distributed.loop import train_distributed

    # The launcher spawns this process, which makes "spawn" its default start method; the
    # loader's workers are forked instead, as in a single-process run: spawning them (pickling
    # the dataset) crashed ranks with SIGSEGV here (torch 2.13, gloo group live).
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    return train_distributed(cfg)
