"""A rank that dies or hangs: the other fails within the timeout, naming it (real processes)."""

from __future__ import annotations

import io
import os
import signal
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_distributed_sync import start_ranks

from dataecho.app.distributed import Guard, RankFailure
from dataecho.app.distributed.group import HEARTBEAT, init_group, shutdown_group

TIMEOUT = 4.0  # seconds a collective may wait: the hang case waits this long


def _until_failure(rank: int, how: str) -> dict[str, Any]:
    """Rank 1 dies (SIGKILL) or freezes (SIGSTOP) after 3 all-reduces; rank 0 keeps going."""
    info = init_group(TIMEOUT, torch.device("cpu"))
    guard = Guard(info)
    time.sleep(2 * HEARTBEAT)  # both heartbeats running: a frozen one is told from a slow start
    t = torch.ones(1000)
    try:
        for i in range(10_000):
            if rank == 1 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                guard.run("all-reduce", lambda: dist.all_reduce(t))
            except RankFailure as err:
                return {"message": str(err), "seconds": time.monotonic() - t0, "at": i}
            time.sleep(0.01)
        return {"message": "", "seconds": 0.0, "at": -1}
    finally:
        guard.close()
        shutdown_group()


def _rank0_result(how: str) -> dict[str, Any]:
    procs, queue = start_ranks(_until_failure, how)
    try:
        rank, status, payload = queue.get(timeout=120)
        assert (rank, status) == (0, "ok"), payload
        return torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:
            p.kill()  # rank 1 is dead or stopped; SIGKILL ends a stopped process too
            p.join(timeout=10)


@pytest.mark.timeout(120)
def test_a_killed_rank_is_named_at_once():
    r = _rank0_result("kill")
    assert r["at"] == 3  # the first all-reduce rank 1 never joined
    assert "rank 1 stopped responding" in r["message"], r["message"]
    assert "all-reduce #4" in r["message"]
    # Its sockets closed: no need to wait for the timeout (the diagnosis takes ~3 heartbeats).
    assert r["seconds"] < TIMEOUT + 10 * HEARTBEAT


@pytest.mark.timeout(120)
def test_a_frozen_rank_is_named_after_the_timeout():
    r = _rank0_result("stop")
    assert r["at"] == 3
    assert "rank 1 stopped responding" in r["message"], r["message"]
    assert f"{TIMEOUT:g} s timeout" in r["message"]
    assert TIMEOUT * 0.9 <= r["seconds"] < TIMEOUT + 30  # bounded: never a silent hang
