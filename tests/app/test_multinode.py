"""Multi-node data parallelism on the launcher users use: two ``torchrun`` agents, the two
"nodes" of one c10d rendezvous on 127.0.0.1, started as a user starts them on two machines.

The loader (``tests/app/torchrun_shares.py`` on 2 x 2 ranks, gloo, CPU): without a sampler each of
the 4 ranks reads its own share (0 and 1 loader workers), with a ``DistributedSampler`` the
sampler's share; the shares are disjoint, cover the dataset, and every id is echoed
``echo_factor`` times by the rank that read it. Then ``dataecho train`` on 2 x 1 ranks from
shards served by a real nginx, whose access log shows every shard read once, by one rank.

Each agent has its own session and a tag in its environment that its ranks and their loader
workers inherit (torchrun starts each rank in a session of its own): a run past its time is
killed, tagged processes and all, and none may be left after a run.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import needs_nginx
from test_distributed_sync import free_port

from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset
from dataecho.app.sources.nginx import NginxServer
from dataecho.app.upstream import prepare

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # the venv's torchrun
NODES = 2
TAG = "DATAECHO_TEST_RUN"


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds ``TAG=tag``: an agent, its ranks, their workers."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # exited while we looked, or not ours to read
            continue
    return found


def kill_tagged(tag: str) -> None:
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun_nodes(tmp_path: Path, nproc_per_node: int, command: list[str],
                   timeout: float) -> list[str]:  # fmt: skip
    """Run ``torchrun --nnodes 2 --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint
    127.0.0.1:PORT --rdzv-id ID COMMAND`` twice, as two nodes; each node's output, once both
    agents exited 0 within ``timeout`` seconds (else every process of the run is killed)."""
    tag = uuid.uuid4().hex[:12]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, TAG: tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": path,
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    launch = [*TORCHRUN, "--nnodes", str(NODES), "--nproc-per-node", str(nproc_per_node),
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
              "--rdzv-id", f"test-{tag}", "--max-restarts", "0", *command]  # fmt: skip
    logs = [tmp_path / f"node-{node}.log" for node in range(NODES)]
    procs: list[subprocess.Popen] = []
    deadline, timed_out = time.monotonic() + timeout, False
    try:
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen(launch, cwd=REPO, env=env, stdout=out,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))  # fmt: skip
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True  # reported below, with the output so far
    finally:
        if any(proc.poll() is None for proc in procs):
            kill_tagged(tag)
            for proc in procs:
                proc.wait()
    texts = [log.read_text() for log in logs]
    shown = "\n".join(f"--- node {n} (exit {p.returncode}):\n{t}"
                      for n, (p, t) in enumerate(zip(procs, texts, strict=True)))  # fmt: skip
    if timed_out:
        shown = f"still running after {timeout:g} s, so killed\n{shown}"
    end = time.monotonic() + 5  # a rank's loader worker may still be on its way out
    while tagged_pids(tag) and time.monotonic() < end:
        time.sleep(0.05)
    left = tagged_pids(tag)
    kill_tagged(tag)
    assert not left, f"left behind: {left}\n{shown}"
    assert [p.returncode for p in procs] == [0] * NODES, shown
    return texts


# --- the loader: 2 nodes x 2 ranks -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_four_ranks_on_two_nodes_read_disjoint_shares_that_cover_the_data(tmp_path):
    from torchrun_shares import ECHO_FACTOR, EXAMPLES

    out = tmp_path / "shares"
    out.mkdir()
    torchrun_nodes(tmp_path, 2, [str(REPO / "tests" / "app" / "torchrun_shares.py"), str(out)],
                   timeout=120)  # fmt: skip
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2 * NODES)]
    assert {r.pop("world") for r in ranks} == {4}
    for scenario in ("workers=0", "workers=1", "sampler"):
        seen = [collections.Counter(r[scenario]) for r in ranks]
        shares = [set(count) for count in seen]
        assert sum(len(s) for s in shares) == EXAMPLES, scenario  # disjoint ...
        assert set().union(*shares) == set(range(EXAMPLES)), scenario  # ... and complete
        for rank, count in enumerate(seen):  # each id echoed by the rank that read it
            assert set(count.values()) == {ECHO_FACTOR}, (scenario, rank)
            assert len(count) == EXAMPLES // 4, (scenario, rank)


# --- dataecho train: 2 nodes x 1 rank --------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    small = write_subset(tmp_path_factory.mktemp("fmnist"), train=512, test=200)
    shards = tmp_path_factory.mktemp("shards")
    prepare(shards, data_dir=small, examples=512, examples_per_shard=128)
    return small, shards


@needs_nginx
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_dataecho_train_on_two_nodes_reads_every_shard_once(data, tmp_path):
    small, shards = data
    with NginxServer(shards) as server:
        texts = torchrun_nodes(
            tmp_path, 1,
            ["-m", "dataecho.app", "train", "--upstream", server.url, "--data-dir", str(small),
             "--sync", "local-echo", "--echo-factor", "2", "--where", "batch", "--budget", "512",
             "--batch-size", "64", "--num-workers", "0", "--eval-every", "256",
             "--eval-examples", "100", "--target-accuracy", "off", "--device", "cpu",
             "--no-progress"],
            timeout=120,
        )  # fmt: skip
        assert server.prefix is not None
        access = (server.prefix / "access.log").read_text().splitlines()
    out = "\n".join(texts)  # rank 0 reports, on whichever node it runs
    assert "[e=2] 2 ranks (gloo, sync local-echo); rank 0 upstream: shards over HTTP" in out
    assert "; training on cpu" in out
    assert "512 fresh + 384 echoed examples" in out, out  # e=2 but each rank's last copy
    for rank in (0, 1):  # 2 shards of 128 each, 4 fresh batches
        assert re.search(rf"rank {rank} \(local-echo\): 4 all-reduces .* 256 fresh examples, "
                         r"7 steps", out), out  # fmt: skip
    reads = collections.Counter(line.split()[2] for line in access if line.startswith("200 "))
    tars = {f"/{p.name}" for p in shards.glob("*.tar")}
    assert {uri: n for uri, n in reads.items() if uri in tars} == dict.fromkeys(tars, 1), reads
