"""``dataecho train --nproc N``: start N ranks on this machine with PyTorch's elastic launcher.

    result = launch_ranks(TrainConfig(nproc=2, sync="local-echo"), train)   # rank 0's result

Each rank runs ``entry(cfg)`` (:func:`dataecho.app.train.train`, which sees torchrun's
environment and trains its part).

The launcher is ``torch.distributed.launcher.elastic_launch``, the API behind ``torchrun
--standalone --nproc-per-node N``: a c10d rendezvous on a free local port, each rank in a new
process (spawn) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, no restarts. When a
rank fails, the launcher stops the others and :class:`LaunchError` names the rank(s) that failed
and why (their exception, or the signal that ended them).

Signals: the launcher forwards SIGINT/SIGTERM to every rank, waits up to
TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) and then kills them; ``dataecho train`` exits 130/143.
A rank stopped by a signal (with ``checkpoint_on_exit``: after the final checkpoint,
:mod:`.signals`) exits 130/143 too, quietly; ranks that all end so (the launcher itself was
not signalled: e.g. a scheduler signalled the ranks) make :func:`launch_ranks` raise the signal's
exception rather than a :class:`LaunchError`.

Several machines: start ``torchrun`` on each one instead (see the README), e.g.
``torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400
--rdzv-id run1 -m dataecho.app train --sync local-echo ...``; ``dataecho train`` sees it runs
under torchrun and joins the group.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from dataecho.app.config import TrainConfig
from dataecho.app.shutdown import Terminated, exception_for
from dataecho.errors import DataechoError


class LaunchError(DataechoError, RuntimeError):
    """A rank of a launched run failed; the message names it and its error."""


def launch_ranks(cfg: TrainConfig, entry: Callable[[TrainConfig], Any]) -> Any:
    """Run ``entry(cfg)`` on ``cfg.nproc`` local ranks; return rank 0's result. ``entry`` must
    be a module-level function: the ranks are spawned, and it travels pickled by name."""
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
    handlers = _handlers()  # the launcher installs its own and leaves them behind
    try:
        results = elastic_launch(config, _rank_main)(entry, cfg)
    except ChildFailedError as err:
        signum = stopped_by(err)
        if signum is not None:
            raise exception_for(signum) from None
        raise LaunchError(describe_failure(err)) from None
    finally:
        quiet.setLevel(level)
        for signum, handler in handlers.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    return results[0]


def _handlers() -> dict[int, Any]:
    """This process's handlers of the signals torchelastic handles (none off the main thread,
    where the launcher installs none)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    found = [getattr(signal, n.strip(), None) for n in names.split(",")]
    return {s: signal.getsignal(s) for s in found if isinstance(s, signal.Signals)}


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


def stopped_by(err: Any) -> int | None:
    """SIGTERM or SIGINT when the ranks of a ``ChildFailedError`` ended on a signal (some
    exited 130/143 after stopping on it; others may have been killed by the launcher's
    SIGTERM on the way out); None when any failed otherwise."""
    codes = [f.exitcode for f in err.failures.values()]
    ok = {128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM}
    if not codes or not set(codes) <= ok or not any(c > 0 for c in codes):
        return None
    term = any(abs(c) in (signal.SIGTERM, 128 + signal.SIGTERM) for c in codes)
    return signal.SIGTERM if term else signal.SIGINT


def _rank_main(entry: Callable[[TrainConfig], Any], cfg: TrainConfig) -> Any:
    """What each launched rank runs."""
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: writes this rank's exception to the file the launcher reads into its error.
    return record(_train_rank)(entry, cfg)


def _train_rank(entry: Callable[[TrainConfig], Any], cfg: TrainConfig) -> Any:
    import multiprocessing

    # The launcher spawns this process, which makes "spawn" its default start method; the
    # loader's workers are forked instead, as in a single-process run: spawning them (pickling
    # the dataset) crashed ranks with SIGSEGV here (torch 2.13, gloo group live).
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    try:
        return entry(cfg)
    except (KeyboardInterrupt, Terminated) as stop:
        # Stopped by a signal, every `finally` run (final checkpoint written, workers stopped,
        # group left): end with 130/143 as the command would, without a traceback (the
        # launcher reports it; left to torch, KeyboardInterrupt would exit 0) and without the
        # interpreter's teardown of torch and gloo: ~5 s on 2 busy cores, out of the
        # launcher's grace before SIGKILL.
        sig = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + sig)
