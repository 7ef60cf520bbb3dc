"""Loader workers live as long as the training process, whichever thread started them.

They survive the exit of the thread that created the iterator (like a plain DataLoader's), and
end within a second of a ``kill -9`` of the training process, even when blocked, or idle
between epochs (``persistent_workers``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from multiprocessing import resource_sharer

import pytest
import torch
from conftest import alive, needs_nginx, wait_until

from dataecho import EchoingDataLoader
from dataecho.app.sources.nginx import NginxServer
from dataecho.loader.lifetime import POLL_SECONDS, WorkerInit, quiet_broken_handovers

EXAMPLES = 64
# Within this of the training process's death its workers are gone (they poll every 0.1 s).
PROMPTLY = 1.0


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0]


def make_loader(kind: str) -> torch.utils.data.DataLoader | EchoingDataLoader:
    data = [(torch.zeros(2), i) for i in range(EXAMPLES)]
    if kind == "DataLoader":  # the reference behaviour
        return torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
    persistent = kind == "persistent"
    return EchoingDataLoader(data, batch_size=4, echo_factor=2, where="after_augment",
                             num_workers=2, persistent_workers=persistent)  # fmt: skip


def copies(kind: str) -> int:
    return 1 if kind == "DataLoader" else 2


def on_a_thread_that_exits(fn):
    """``fn()`` run on a thread, returned once that thread is gone from the process."""
    out = queue.SimpleQueue()
    thread = threading.Thread(target=lambda: out.put(fn()))
    thread.start()
    thread.join()
    # join() returns a little before the OS thread exits, which is what the kernel acts on.
    assert wait_until(lambda: not os.path.exists(f"/proc/self/task/{thread.native_id}"))
    time.sleep(0.2)  # a worker killed at that exit would be dead by now
    return out.get()


def check_epoch(kind: str, loader, batches: list) -> None:
    labels = collections.Counter(int(y) for _, ys in batches for y in ys)
    assert len(batches) == EXAMPLES * copies(kind) // 4
    assert labels == dict.fromkeys(range(EXAMPLES), copies(kind))  # each example, every copy
    if kind != "DataLoader":
        stats = loader.stats
        assert (stats.fresh_examples, stats.examples_out) == (EXAMPLES, 2 * EXAMPLES)


KINDS = ["DataLoader", "EchoingDataLoader", "persistent"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_an_epoch_continues_after_the_thread_that_started_it_exits(kind):
    loader = make_loader(kind)

    def start():
        it = iter(loader)
        return it, next(it)

    it, first = on_a_thread_that_exits(start)
    check_epoch(kind, loader, [first, *it])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_on_another_thread_over_an_iterator_whose_thread_exited(kind):
    loader = make_loader(kind)
    it = on_a_thread_that_exits(lambda: iter(loader))  # workers forked there, then it ends
    batches = on_a_thread_that_exits(lambda: [batch for batch in it])
    check_epoch(kind, loader, batches)


@pytest.mark.timeout(60)
def test_persistent_workers_forked_by_a_thread_that_exited_serve_the_next_epochs():
    loader = make_loader("persistent")
    first = on_a_thread_that_exits(lambda: list(loader))  # forked there; that thread ends
    pids = [w.pid for w in loader._inner._iterator._workers]
    second = list(loader)  # the main thread's epoch: the same workers, still alive
    assert [w.pid for w in loader._inner._iterator._workers] == pids
    assert len(first) == len(second) == EXAMPLES * 2 // 4
    loader.close()


SCRIPT = """
import sys, threading, time, torch, multiprocessing
from dataecho import EchoingDataLoader

start, block = sys.argv[1:]

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 32 if block == "idle" else 10_000
    def __getitem__(self, i):
        if i >= 16:  # each of the 2 workers makes its first batch (8 of its examples), then:
            if block == "sleep":  # a slow read
                time.sleep(600)
            if block == "gil":  # C code that never releases the GIL
                time.sleep(0.3)  # (let the worker send its first batch before)
                sum(range(10**14))
        return torch.zeros(12_000), i  # 8 x 48 KB: batches bigger than a pipe holds

seen = []
loader = EchoingDataLoader(Data(), batch_size=8, num_workers=2, read_ahead=0,
                           worker_init_fn=lambda worker_id: seen.append(worker_id),
                           persistent_workers=block == "idle")

def begin():
    global it
    it = iter(loader)
    next(it)
    if block == "idle":  # a whole epoch: the workers wait for the next one
        list(it)

if start == "thread":  # the workers' forking thread ends before the kill
    thread = threading.Thread(target=begin)
    thread.start()
    thread.join()
else:
    begin()
print(*[c.pid for c in multiprocessing.active_children()], flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize(
    ("start", "block"),
    [
        ("main", "pipe"),  # blocked writing into a full pipe that nobody drains
        ("thread", "pipe"),
        ("thread", "sleep"),  # asleep in a slow __getitem__
        ("main", "gil"),  # stuck holding the GIL: the kernel's parent-death signal stops it
        ("main", "idle"),  # persistent workers between epochs, waiting for the next
        ("thread", "idle"),
    ],
)
def test_workers_end_promptly_when_the_training_process_is_killed(start, block):
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, start, block], stdout=subprocess.PIPE, text=True
    )
    workers: list[int] = []
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2, "the loader did not start its 2 workers"
        if block == "gil":  # both running in sum(), not waiting
            assert wait_until(lambda: all(state(p) == "R" for p in workers))
        time.sleep(0.3 + 2 * POLL_SECONDS)  # blocked by now; any killed early would be dead
        assert all(alive(p) for p in workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        assert wait_until(lambda: not any(alive(p) for p in workers), timeout=PROMPTLY), (
            "a worker outlived the killed process"
        )
        print(f"workers gone {time.monotonic() - killed:.2f} s after the kill")
    finally:
        proc.kill()
        proc.wait()
        for pid in workers:
            if alive(pid):  # failed: do not leave it behind
                os.kill(pid, signal.SIGKILL)


def can_be_pid_1() -> bool:
    try:
        return (
            subprocess.run(
                ["unshare", "--pid", "--fork", "true"], stderr=subprocess.DEVNULL
            ).returncode
            == 0
        )
    except FileNotFoundError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    not can_be_pid_1(), reason="needs unshare and the right to make a PID namespace"
)
def test_workers_run_when_the_training_process_is_pid_1():
    # As in a container started without an init: the workers' parent is PID 1, which does not
    # mean that they were orphaned.
    script = (
        "import os, torch; from dataecho import EchoingDataLoader; assert os.getpid() == 1; "
        "data = [(torch.zeros(2), i) for i in range(16)]; "
        "print(len(list(EchoingDataLoader(data, batch_size=4, num_workers=2))))"
    )
    run = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert (run.returncode, run.stdout) == (0, "4\n"), run.stderr


def mark_worker(folder, worker_id):
    (folder / f"worker-{worker_id}").write_text(str(os.getpid()))


@pytest.mark.timeout(60)
def test_the_users_worker_init_fn_still_runs(tmp_path):
    data = [(torch.zeros(2), i) for i in range(8)]
    loader = EchoingDataLoader(data, batch_size=4, num_workers=2,
                               worker_init_fn=functools.partial(mark_worker, tmp_path))  # fmt: skip
    assert len(list(loader)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0", "worker-1"]
    assert isinstance(loader._inner.worker_init_fn, WorkerInit)


class FreezeCounts(torch.utils.data.Dataset):
    """Each example: how many objects the reading process's collector has frozen."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return gc.get_freeze_count()


def test_a_worker_keeps_the_heap_it_inherits_out_of_the_collector():
    frozen_here = gc.get_freeze_count()
    batches = list(EchoingDataLoader(FreezeCounts(), batch_size=4, num_workers=1))
    assert all(int(n) > frozen_here for batch in batches for n in batch)
    assert gc.get_freeze_count() == frozen_here  # the training process's own collector: as it was


class FreesInheritedFilesystem(torch.utils.data.IterableDataset):
    """In a worker: lets the collector at what it inherited, as a collection before the
    worker's ``gc.freeze`` does, and yields whether the filesystem ``inherited`` was freed."""

    def __init__(self, inherited: weakref.ref) -> None:
        self.inherited = inherited

    def __iter__(self):
        gc.unfreeze()
        gc.collect()
        yield torch.tensor(self.inherited() is None)


@needs_nginx
@pytest.mark.timeout(60)
def test_a_worker_freeing_an_inherited_fsspec_filesystem_leaves_the_parents_connections_alone(
    tmp_path,
):
    import aiohttp
    import fsspec

    (tmp_path / "a.txt").write_text("x" * 100)
    # Bounded: a read on a connection that the parent's loop no longer watches fails here.
    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=5)}}
    with NginxServer(tmp_path) as nginx:
        url = f"{nginx.url}/a.txt"
        # A keep-alive connection pooled in this process, its filesystem held by fsspec alone.
        assert fsspec.filesystem("http", **options).cat(url) == b"x" * 100
        inherited = weakref.ref(fsspec.filesystem("http", **options))
        loader = EchoingDataLoader(FreesInheritedFilesystem(inherited), batch_size=1, num_workers=1)
        assert [bool(batch) for batch in loader] == [True]  # freed, and its session closed there
        assert inherited() is not None  # here, the same one reads again on that connection
        assert fsspec.filesystem("http", **options).cat(url) == b"x" * 100


# Ctrl-C pressed while the loader forks its workers: the SIGINT is sent from inside the fork
# itself (an at-fork hook, the worst moment), at every epoch's start.
CTRL_C_IN_FORK = """
import logging, os, signal, sys, torch
from dataecho import EchoingDataLoader
persistent = sys.argv[1] == "persistent"
data = [(torch.zeros(2), i) for i in range(16)]
loader = EchoingDataLoader(data, batch_size=4, echo_factor=2, where="after_augment",
                           num_workers=2, persistent_workers=persistent)
os.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGINT))
try:
    for epoch in range(3):
        for batch in loader:
            pass
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted in epoch", epoch)
logging.getLogger("after").error("logging still works")
"""


@pytest.mark.parametrize("kind", ["workers", "persistent"])
def test_ctrl_c_while_workers_fork_interrupts_the_loop_and_leaves_logging_usable(kind):
    run = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_FORK, kind], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "interrupted in epoch 0", run.stderr
    assert "logging still works" in run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


# Ctrl-C lands in the training process while it receives batches that cross in shared memory
# (16 leaves of 256 KiB: a file descriptor handed over from the worker for each), at a random
# moment, over and over. Without the worker's filter one stop in six to twelve printed the
# hand-over thread's broken connection.
CTRL_C_IN_HANDOVER = """
import os, random, signal, threading, torch
from dataecho import EchoingDataLoader
data = [tuple(torch.zeros(4096) for _ in range(16)) for _ in range(64)]
random.seed(0)
for attempt in range(40):
    loader = EchoingDataLoader(data, batch_size=16, echo_factor=2, where="after_augment",
                               num_workers=1)
    it = iter(loader)
    next(it)
    try:  # the timer may fire before start() returns
        threading.Timer(random.uniform(0.0, 0.02), os.kill, (os.getpid(), signal.SIGINT)).start()
        for batch in it:
            pass
        raise SystemExit("the epoch ended before the signal")
    except KeyboardInterrupt:
        pass
    del it
print("stopped 40 times")
"""


@pytest.mark.timeout(120)
def test_ctrl_c_while_receiving_shared_memory_prints_no_worker_traceback():
    run = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_HANDOVER], capture_output=True, text=True, timeout=100
    )
    assert run.returncode == 0 and run.stdout.strip() == "stopped 40 times", run.stderr
    assert "Traceback" not in run.stderr, run.stderr


class Handovers:
    """A resource sharer's listener whose accepts fail as ``errors`` say, then stop its thread."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)

    def accept(self):
        if self.errors:
            raise self.errors.pop(0)
        return contextlib.nullcontext(types.SimpleNamespace(recv=lambda: None))  # "stop"


def test_the_worker_hook_drops_only_broken_handovers(capsys):
    previous = sys.excepthook
    try:
        quiet_broken_handovers()
        sharer = resource_sharer._ResourceSharer()
        sharer._listener = Handovers(EOFError("receiver hung up"), ValueError("a real bug"))
        serving = threading.Thread(target=sharer._serve)  # it blocks signals: not this thread
        serving.start()
        serving.join(timeout=10)
    finally:
        sys.excepthook = previous
    printed = capsys.readouterr().err
    assert "receiver hung up" not in printed and "ValueError: a real bug" in printed
