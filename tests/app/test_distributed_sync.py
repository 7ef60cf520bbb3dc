"""Data-parallel sync on real processes: 2 ranks on localhost over gloo (no mocks).

One process group runs every scenario (the ranks' start-up is the expensive part): disjoint
reads, local-echo averaging (models equal after each average, one all-reduce per fresh batch
at every e), ddp (one gradient all-reduce per step: e per fresh batch), probabilistic
averaging drawn identically on both ranks, the control numbers (counts summed, votes any
rank's). The rank-splitting of the in-memory reader is also
checked in this process, with DataLoader workers.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dataecho.app.distributed import CommStats, GradientSync, Guard, ModelAveraging, sync_points
from dataecho.app.distributed.control import Control
from dataecho.app.distributed.group import init_group, shutdown_group
from dataecho.loader import EchoingDataLoader
from dataecho.loader.reading import data_parallel_rank

WORLD = 2
BATCH = 8
EXAMPLES = 96  # 48 per rank: 6 fresh batches each
FACTORS = (1, 2, 3)


# --- harness: real processes with torchrun's environment -------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Any, rank: int, port: int, queue: Any, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    try:
        # As bytes: a tensor put in a queue as is would be shared through a file descriptor
        # that dies with this process.
        buf = io.BytesIO()
        torch.save(fn(rank, *args), buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as err:  # reported to the test, which fails with it
        queue.put((rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def start_ranks(fn: Any, *args: Any, daemon: bool = True) -> tuple[list[Any], Any]:
    """Start WORLD processes running ``fn(rank, *args)``; returns (processes, result queue).

    Forked from this process, which has imported torch already (a spawned one would spend
    seconds importing it); this process never joins a process group, so nothing of one is
    copied. ``dataecho train --nproc`` itself spawns, as torchrun does (tested end to end).
    """
    ctx = mp.get_context("fork")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, port, queue, args), daemon=daemon)
             for r in range(WORLD)]  # fmt: skip
    for p in procs:
        p.start()
    return procs, queue


def run_ranks(fn: Any, *args: Any, timeout: float = 120, daemon: bool = True) -> list[Any]:
    """``fn(rank, *args)`` on every rank; their results by rank (a rank's error fails).
    ``daemon=False`` for ranks that start processes of their own (loader workers)."""
    procs, queue = start_ranks(fn, *args, daemon=daemon)
    try:
        results = {r: (status, out) for r, status, out in
                   (queue.get(timeout=timeout) for _ in procs)}  # fmt: skip
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for r, (status, out) in sorted(results.items()):
        assert status == "ok", f"rank {r}: {out}"
    return [torch.load(io.BytesIO(results[r][1]), weights_only=False) for r in range(WORLD)]


# --- what each rank runs -------------------------------------------------------------------


def _examples() -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(4, generator=g), i % 2) for i in range(EXAMPLES)]


def _loader(data: Any, e: float, where: str = "batch") -> EchoingDataLoader:
    return EchoingDataLoader(data, batch_size=BATCH, echo_factor=e, where=where, seed=0,
                             shuffle=True, drop_last=True, num_workers=0)  # fmt: skip


def _model(rank: int) -> torch.nn.Module:
    torch.manual_seed(100 + rank)  # different on purpose: the start must equalise them
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _local_echo(guard: Guard, e: float, where: str, avg_prob: float = 1.0) -> dict[str, Any]:
    data, model, stats = _examples(), _model(guard.info.rank), CommStats()
    averaging = ModelAveraging(model, guard, stats, avg_prob=avg_prob, seed=1)
    averaging.start()
    start = _flat(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, synced, snapshots, averaged, steps = _loader(data, e, where), 0, [], [], 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        now = loader.stats.fresh_examples
        if sync_points(now, BATCH) > synced:
            synced = sync_points(now, BATCH)
            summed = averaging.at_sync_point(Control(fresh=now, steps=steps))
            if summed is not None:
                averaged.append(stats.sync_points)
                snapshots.append(_flat(model))
    return {"stats": stats.as_dict(), "fresh": loader.stats.fresh_examples, "steps": steps,
            "start": start, "snapshots": snapshots, "averaged": averaged,
            "numel": averaging.numel, "read": None}  # fmt: skip


def _ddp(guard: Guard, e: float) -> dict[str, Any]:
    data, model, stats = _examples(), _model(guard.info.rank), CommStats()
    sync = GradientSync(model, guard, stats)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, steps, sums = _loader(data, e), 0, []
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(sync.model(x), y)
        opt.zero_grad()
        control = Control(fresh=len(y), steps=1, target=guard.info.rank == 1)
        sums.append(sync.exchange(loss, control))
        opt.step()
        steps += 1
    return {"stats": stats.as_dict(), "fresh": loader.stats.fresh_examples, "steps": steps,
            "sums": sums, "final": _flat(model)}  # fmt: skip


def _control(rank: int) -> Control:
    """Each rank's own control numbers, all-reduced as an exchange carries them."""
    mine = Control(fresh=10 + rank, steps=1 + rank, sigint=rank == 1, void=rank == 1)
    payload = mine.pack()
    dist.all_reduce(payload)
    return Control.unpack(payload)


def _scenarios(rank: int) -> dict[str, Any]:
    info = init_group(60, torch.device("cpu"))
    guard = Guard(info)
    try:
        out: dict[str, Any] = {}
        ids = list(range(EXAMPLES))
        for where in ("batch", "after_augment"):
            loader = _loader(ids, 2, where)
            out[f"read-{where}"] = sorted(int(i) for b in loader for i in b)
            out[f"fresh-{where}"] = loader.stats.fresh_examples
        for e in FACTORS:
            out[f"local-{e}"] = _local_echo(guard, e, "batch")
            out[f"ddp-{e}"] = _ddp(guard, e)
        out["local-example"] = _local_echo(guard, 2, "after_augment")
        out["local-prob"] = _local_echo(guard, 2, "batch", avg_prob=0.5)
        out["control"] = _control(rank)
        return out
    finally:
        guard.close()
        shutdown_group()


# --- the tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_scenarios)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("where", ["batch", "after_augment"])
def test_ranks_read_disjoint_shares_and_echo_only_their_own(ranks, where):
    r0, r1 = (set(r[f"read-{where}"]) for r in ranks)
    assert r0 and r1 and not r0 & r1  # no example read by both ranks
    assert r0 | r1 == set(range(EXAMPLES))  # 96 = a multiple of 2 ranks: nothing dropped
    for r in ranks:
        # Every copy a rank trained on is of an example it read itself, twice (e=2).
        assert len(r[f"read-{where}"]) == 2 * r[f"fresh-{where}"] == EXAMPLES


@pytest.mark.timeout(150)
@pytest.mark.parametrize("e", FACTORS)
def test_local_echo_one_allreduce_per_fresh_batch_and_equal_models(ranks, e):
    a, b = ranks[0][f"local-{e}"], ranks[1][f"local-{e}"]
    fresh_per_rank = EXAMPLES // WORLD // BATCH
    for r in (a, b):
        assert r["steps"] == e * fresh_per_rank  # e steps per fresh batch
        assert r["stats"]["allreduce_calls"] == fresh_per_rank  # 1 round, whatever e
        assert r["stats"]["allreduce_bytes"] == fresh_per_rank * (r["numel"] + Control.width()) * 4
        assert r["stats"]["other_calls"] == 1  # the starting broadcast
    assert torch.equal(a["start"], b["start"])  # rank 0's initial model on both
    assert len(a["snapshots"]) == fresh_per_rank
    for i, (x, y) in enumerate(zip(a["snapshots"], b["snapshots"], strict=True)):
        assert torch.equal(x, y), f"models differ after averaging {i + 1}"
    # Local steps do change the model between averages (echo steps are not no-ops).
    assert not torch.equal(a["snapshots"][0], a["snapshots"][1])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("e", FACTORS)
def test_ddp_one_allreduce_per_step_so_e_per_fresh_batch(ranks, e):
    a, b = ranks[0][f"ddp-{e}"], ranks[1][f"ddp-{e}"]
    fresh_batches_per_rank = EXAMPLES // WORLD // BATCH
    for r in (a, b):
        assert r["steps"] == e * fresh_batches_per_rank
        assert r["stats"]["allreduce_calls"] == r["steps"]  # one bucket: one round a step
        # The control numbers ride in the gradient round: summed over both ranks.
        assert r["sums"] == [Control(fresh=2 * BATCH, steps=2, target=True)] * r["steps"]
    assert torch.equal(a["final"], b["final"])  # averaged gradients: the same model


@pytest.mark.timeout(150)
def test_local_echo_with_example_echoing_syncs_once_per_batch_of_fresh_examples(ranks):
    for r in ranks:
        r = r["local-example"]
        assert r["stats"]["allreduce_calls"] == r["fresh"] // BATCH
        assert r["steps"] == 2 * r["fresh"] // BATCH
    a, b = ranks[0]["local-example"], ranks[1]["local-example"]
    assert torch.equal(a["snapshots"][-1], b["snapshots"][-1])


@pytest.mark.timeout(150)
def test_probabilistic_averaging_skips_the_same_sync_points_on_every_rank(ranks):
    a, b = ranks[0]["local-prob"], ranks[1]["local-prob"]
    assert a["averaged"] == b["averaged"]  # same draws, so no rank waits on a skipped one
    assert a["stats"]["sync_points"] == 6
    assert 0 < len(a["averaged"]) < 6  # seed 1 draws a mix (fixed, so this cannot flake)
    assert a["stats"]["allreduce_calls"] == len(a["averaged"])
    for x, y in zip(a["snapshots"], b["snapshots"], strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("workers", [0, 2])
def test_in_memory_reader_splits_over_ranks_then_workers(monkeypatch, workers):
    n, world = 103, 2  # not a multiple: each epoch cuts the order to equal shares of the ranks
    shares = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        loader = EchoingDataLoader(list(range(n)), batch_size=8, seed=5, shuffle=True,
                                   num_workers=workers)  # fmt: skip
        shares.append([int(i) for b in loader for i in b])
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert {len(s) for s in shares} == {n // world}  # equal, whatever the workers
    assert len(flat) == n - n % world


def test_in_memory_loader_with_workers_reads_disjoint_shares_per_rank(monkeypatch):
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = EchoingDataLoader(list(range(64)), batch_size=4, echo_factor=2,
                                   where="after_augment", seed=1, shuffle=True, drop_last=True,
                                   num_workers=2)  # fmt: skip
        seen.append({int(i) for b in loader for i in b})
        assert loader.stats.fresh_examples == 32
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(64))


def test_a_rank_outside_the_world_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=2 is outside 0..WORLD_SIZE-1"):
        data_parallel_rank()


@pytest.mark.timeout(150)
def test_control_numbers_all_reduced_over_two_ranks_sum_counts_and_or_votes(ranks):
    # Rank 0: 10 fresh, 1 step, no vote; rank 1: 11 fresh, 2 steps, SIGINT and void.
    want = Control(fresh=21, steps=3, target=False, sigterm=False, sigint=True, void=True)
    assert [r["control"] for r in ranks] == [want, want]
