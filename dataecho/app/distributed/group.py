"""The process group of a data-parallel run, and collectives that name the rank that failed.

    info = init_group(300, torch.device("cpu"))  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, ...
    guard = Guard(info)
    guard.run("all-reduce", lambda: dist.all_reduce(t))   # RankFailure names a dead rank
    shutdown_group()

gloo on CPU, NCCL on GPU (the rank's training device says which). ``timeout`` bounds every
collective: a rank that hangs makes the others fail after it; one that dies makes them fail at
once (its sockets close).

Naming the rank: torch's errors say "connection closed" or "timed out", never which rank is
gone. So each rank writes, in the group's rendezvous store, the number of the collective it
is entering (one small write per collective) and, from a daemon thread, a heartbeat counter
every ``HEARTBEAT`` seconds. When a collective fails, the rank reads them back: a rank whose
heartbeat stopped died or is frozen; a rank whose count is behind never reached the
collective (hangs elsewhere, or died before). :class:`RankFailure` names them.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from dataecho.errors import DataechoError, DataechoValueError

T = TypeVar("T")
HEARTBEAT = 0.5  # seconds between heartbeats; a failure is diagnosed over 3 of them
_PREFIX = "dataecho/"


class RankFailure(DataechoError, RuntimeError):
    """Another rank died or hangs; the message names it and the collective it missed."""


@dataclass(frozen=True)
class GroupInfo:
    """Where this process sits in the run."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    timeout: float


def in_torchrun() -> bool:
    """True inside a process that torchrun (or :mod:`dataecho.app.distributed.launch`) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_rank() -> int:
    """This process's rank on its machine (torchrun's ``LOCAL_RANK``; 0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_group(timeout: float, device: torch.device) -> GroupInfo:
    """Join the process group torchrun's environment describes (``env://``): NCCL when
    ``device``, where this rank trains, is a GPU (made the current one), else gloo.
    ``timeout``: seconds any collective may wait for the other ranks."""
    if not timeout > 0:
        raise DataechoValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    require_torchrun()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return GroupInfo(dist.get_rank(), dist.get_world_size(), local_rank(), backend, device,
                     timeout)  # fmt: skip


def require_torchrun() -> None:
    """Raise RuntimeError, naming what is missing, unless torchrun's environment is set."""
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"not started by torchrun: {', '.join(missing)} unset; launch with torchrun "
            "--nproc-per-node N (or dataecho train --nproc N)"
        )


def shutdown_group() -> None:
    """Leave the process group (a no-op when there is none)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class Guard:
    """Runs this rank's collectives; turns a failure into a :class:`RankFailure` naming the
    rank(s) at fault (see the module docstring). Call :meth:`close` at the end."""

    def __init__(self, info: GroupInfo) -> None:
        self.info = info
        self.count = 0  # collectives entered so far
        # Two clients of the rendezvous store: a store client is not safe to share between
        # threads (sharing one with the heartbeat thread crashed a rank).
        self._store = _store_client(info.timeout)
        beat_store = _store_client(info.timeout)
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None
        if self._store is not None and beat_store is not None:
            self._store.set(_key("at", info.rank), "0")
            self._store.set(_key("beat", info.rank), "0")
            self._beating = threading.Thread(target=self._heartbeat, args=(beat_store,),
                                             daemon=True, name="dataecho-heartbeat")  # fmt: skip
            self._beating.start()
        else:
            self._store = None

    def run(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, the collective(s) numbered ``self.count + 1``; ``what`` names it."""
        self.count += 1
        if self._store is not None:
            self._store.set(_key("at", self.info.rank), str(self.count))
        try:
            return fn()
        except RankFailure:
            raise
        except (RuntimeError, OSError) as err:  # gloo/NCCL raise RuntimeError subclasses
            raise self.diagnose(what, err) from err

    def diagnose(self, what: str, err: BaseException) -> RankFailure:
        """The :class:`RankFailure` for ``err``, naming the ranks that stopped or lag."""
        me, n = self.info.rank, self.count
        head = f"rank {me}: {what} #{n} failed"
        cause = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        if self._store is None:
            return RankFailure(f"{head} ({cause}); another rank died or hangs")
        try:
            others = [r for r in range(self.info.world_size) if r != me]
            before = {r: self._get(_key("beat", r)) for r in others}
            time.sleep(3 * HEARTBEAT)
            after = {r: self._get(_key("beat", r)) for r in others}
            at = {r: int(self._get(_key("at", r)) or 0) for r in others}
        except Exception:  # the store is gone with the process that hosted it
            return RankFailure(
                f"{head} ({cause}); the rendezvous store is unreachable too: rank 0 (its host "
                "when launched without torchrun's agent) or the launcher died"
            )
        dead = [r for r in others if before[r] == after[r]]
        behind = [r for r in others if r not in dead and at[r] < n]
        parts = [f"rank {r} stopped responding (died or frozen; it had reached {what} "
                 f"#{at[r]})" for r in dead]  # fmt: skip
        parts += [f"rank {r} never reached it (it is at #{at[r]}: hangs elsewhere)" for r in behind]
        if not parts:
            parts = ["no other rank looks dead or late: a network failure?"]
        return RankFailure(
            f"{head} within the {self.info.timeout:g} s timeout or at a peer's exit: "
            f"{'; '.join(parts)}. Cause: {cause}"
        )

    def close(self) -> None:
        """Stop the heartbeat, and wait for its thread (bounded): a thread still inside a store
        call as the process exits, with the store's host gone (another node's agent done),
        aborted the rank ("terminate called without an active exception")."""
        self._stop.set()
        if self._beating is not None:
            self._beating.join(timeout=5.0)

    def _get(self, key: str) -> str | None:
        assert self._store is not None
        return self._store.get(key).decode() if self._store.check([key]) else None

    def _heartbeat(self, store: Any) -> None:
        beat = 0
        while not self._stop.wait(HEARTBEAT):
            beat += 1
            try:
                store.set(_key("beat", self.info.rank), str(beat))
            except Exception:  # the store's host is gone: the next collective reports it
                return


def _key(kind: str, rank: int) -> str:
    # The run and attempt in the key: an agent's store outlives a restarted attempt.
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{_PREFIX}{run}/{attempt}/{kind}/{rank}"


def _store_client(timeout: float) -> Any:
    """A new client of the rendezvous store at MASTER_ADDR:MASTER_PORT (torchrun's agent's, or
    rank 0's), or None when it cannot be reached (failures are then reported without names)."""
    try:
        return dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=min(timeout, 30.0)),
        )  # fmt: skip
    except Exception:
        return None
