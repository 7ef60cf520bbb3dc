"""Loader workers die with the training process, even after SIGKILL."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dataecho import EchoingDataLoader
from dataecho.loader.lifetime import DieWithParent

SCRIPT = """
import sys, time, torch
from dataecho import EchoingDataLoader

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.zeros(12_000), i  # 8 x 48 KB: batches bigger than a pipe holds

seen = []
loader = EchoingDataLoader(Slow(), batch_size=8, echo_factor=2, num_workers=1,
                           worker_init_fn=lambda worker_id: seen.append(worker_id))
it = iter(loader)
next(it)
import multiprocessing
print(*[c.pid for c in multiprocessing.active_children()], flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too: it only waits for its new parent to reap it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_workers_exit_when_the_training_process_is_killed():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert workers, "the loader started no worker"
        assert all(alive(p) for p in workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "a worker outlived the killed process"
    finally:
        proc.kill()
        proc.wait()


def mark_worker(folder, worker_id):
    (folder / f"worker-{worker_id}").write_text(str(os.getpid()))


@pytest.mark.timeout(60)
def test_the_users_worker_init_fn_still_runs(tmp_path):
    data = [(torch.zeros(2), i) for i in range(8)]
    loader = EchoingDataLoader(data, batch_size=4, num_workers=2,
                               worker_init_fn=functools.partial(mark_worker, tmp_path))  # fmt: skip
    assert len(list(loader)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0", "worker-1"]
    assert isinstance(loader._inner.worker_init_fn, DieWithParent)
