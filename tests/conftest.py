"""Shared test harnesses for every resumable stream in dataecho (stages, the loader).

The main one is :func:`run_test_save_load_state`; :func:`assert_same_item` compares items or
batches (tensors, arrays, nested containers) exactly; :func:`torch_roundtrip` passes a state
through a checkpoint file the way training code saves one.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from dataecho.app.sources.nginx import INSTALL_HINT, NginxNotFoundError, find_nginx

# A shell starts background jobs (`make test &` in a script, `nohup ... &`) with SIGINT ignored,
# and an ignored signal stays ignored in every process started from here. The Ctrl-C tests
# (tests/app/test_shutdown.py, test_cli.py, ...) send SIGINT and need the usual KeyboardInterrupt:
# restore it for this process; a handler, unlike "ignore", is reset to the default in children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

try:
    find_nginx()
    HAVE_NGINX = True
except NginxNotFoundError:
    HAVE_NGINX = False
# Tests of the real server run wherever nginx is installed (`make test` installs it).
needs_nginx = pytest.mark.skipif(not HAVE_NGINX, reason=f"nginx not installed ({INSTALL_HINT})")

Factory = Callable[[], Any]


def assert_same_item(a: Any, b: Any, where: str = "item") -> None:
    """Assert ``a`` and ``b`` are equal, exactly: same type, same values, same dtypes."""
    assert type(a) is type(b), f"{where}: type {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)}"
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape}"
        assert np.array_equal(a, b), f"{where}: arrays differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same_item(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_item(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_stream(got: list[Any], want: list[Any], where: str) -> None:
    """Assert two lists of items are equal item by item (see :func:`assert_same_item`)."""
    assert len(got) == len(want), f"{where}: {len(got)} items, expected {len(want)}"
    for i, (x, y) in enumerate(zip(got, want, strict=True)):
        assert_same_item(x, y, f"{where}, item {i}")


def torch_roundtrip(state: Any) -> Any:
    """``state`` after ``torch.save`` to bytes and ``torch.load(weights_only=True)``.

    ``weights_only=True`` is the safe loader (no arbitrary pickles); a state that passes it can
    be stored in an ordinary training checkpoint and loaded without trusting the file.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _take(it: Iterator[Any], limit: int | None) -> list[Any]:
    return list(it) if limit is None else list(itertools.islice(it, limit))


def run_test_save_load_state(
    factory: Factory,
    *,
    epochs: int = 2,
    max_items: int | None = None,
    positions: Iterable[int] | None = None,
    roundtrip: bool = True,
    restore: Callable[[Any, Any], None] = lambda node, state: node.reset(state),
    new_epoch: Callable[[Any], None] = lambda node: node.reset(None),
    summary: Callable[[Any], Any] | None = None,
    end_may_start_next_epoch: bool = False,
) -> list[list[Any]]:
    """Check that a stream resumes exactly from a state taken at any position.

    Uses of it::

        run_test_save_load_state(lambda: echo(list(range(20)), 2.5, seed=3))
        run_test_save_load_state(make_loader, positions=[0, 5, 11],
                                 restore=lambda l, s: l.load_state_dict(s),
                                 new_epoch=lambda l: None, end_may_start_next_epoch=True)

    Steps:

    1. Build a node with ``factory`` and record ``epochs`` uninterrupted epochs (epoch 0 is the
       first ``iter(node)``; each later one begins with ``new_epoch(node)``).
    2. Build a second node and run the same epochs, taking ``node.state_dict()`` at every
       position ``k`` in ``positions`` of every epoch (default: each of 0..len, plus "after
       StopIteration" when epochs are drained), as a training loop checkpointing every step
       does: the stream must still equal the recording (taking states does not disturb it,
       and a fresh node gives the same stream: determinism).
    3. For each state, build another fresh node, ``restore(node, state)`` and assert that the
       rest of that epoch *and every later epoch* equal the recording exactly. This runs
       twice: from the in-memory state (held while the stream went on to its end, so it must
       not alias live objects) and, with ``roundtrip``, from a ``torch.save`` /
       ``torch.load(weights_only=True)`` copy taken at once.

    Args:
        factory: builds a *fresh* node each call, source included, with fixed seeds.
        epochs: how many epochs to record and check (>= 2 covers the epoch boundary).
        max_items: for infinite or long streams, items per epoch to compare.
        positions: resume points to check in every epoch (default: all).
        roundtrip: also resume from a checkpoint saved and safely loaded by torch.
        restore: how to load a state (default ``node.reset(state)``; a Loader-style object
            uses ``load_state_dict``).
        new_epoch: how to start the next epoch (default ``node.reset(None)``; an object whose
            ``iter()`` starts an epoch by itself passes ``lambda node: None``).
        summary: if given, ``summary(node)`` (e.g. its counters) after each epoch must match too.
        end_may_start_next_epoch: a state taken at the end of an epoch may resume straight
            into the next epoch (``torchdata.nodes.Loader`` does) instead of an empty rest.

    Returns:
        The recorded epochs, so the caller can assert they are not trivially empty.
    """
    # One more epoch on record when a resume at the last epoch's end may run into the next.
    n_rec = epochs + int(end_may_start_next_epoch)
    ref_node = factory()
    recorded: list[list[Any]] = []
    summaries: list[Any] = []
    for e in range(n_rec):
        if e:
            new_epoch(ref_node)
        recorded.append(_take(iter(ref_node), max_items))
        summaries.append(summary(ref_node) if summary else None)

    def check_rest(node: Any, e: int, k: int, what: str, it: Iterator[Any] | None = None) -> None:
        """Iterate ``node`` (or its open iterator ``it``) from item ``k`` of epoch ``e`` on."""
        got = _take(iter(node) if it is None else it, None if max_items is None else max_items - k)
        if got and end_may_start_next_epoch and max_items is None and k == len(recorded[e]):
            e, k = e + 1, 0  # resumed at an epoch's end straight into the next one
        for e2 in range(e, n_rec):
            if e2 > e:
                new_epoch(node)
                got = _take(iter(node), max_items)
            assert_same_stream(
                got, recorded[e2][k:] if e2 == e else recorded[e2], f"{what}, epoch {e2}"
            )
            if summary:
                assert summary(node) == summaries[e2], f"{what}: summary after epoch {e2}"

    # (epoch, position, in-memory state, torch.load copy) at every resume point checked.
    states: list[tuple[int, int, Any, Any]] = []
    node = factory()
    for e in range(n_rec):
        if e:
            new_epoch(node)
        it, n = iter(node), len(recorded[e])
        ks = set(range(n + 1)) if positions is None else {k for k in positions if k <= n}
        got: list[Any] = []
        while True:
            if e < epochs and len(got) in ks:
                state = node.state_dict()
                states.append((e, len(got), state, torch_roundtrip(state) if roundtrip else None))
            if max_items is not None and len(got) == max_items:
                break
            try:
                got.append(next(it))
            except StopIteration:
                break
        if e < epochs and max_items is None and positions is None:  # after StopIteration
            state = node.state_dict()
            states.append((e, -1, state, torch_roundtrip(state) if roundtrip else None))
        assert_same_stream(got, recorded[e], f"epoch {e}, taking a state at every position")
        if summary:
            assert summary(node) == summaries[e], f"summary after epoch {e}, taking states"
    for e, k, state, saved in states:
        what = f"resumed at epoch {e}, item {'end' if k < 0 else k}"
        for label, st in (("in-memory state", state), ("torch.load state", saved)):
            if st is None:
                continue
            resumed = factory()
            restore(resumed, st)
            check_rest(resumed, e, len(recorded[e]) if k < 0 else k, f"{what} from {label}")
    return recorded


class SlowIterable:
    """A re-iterable source that sleeps ``delay`` seconds before each of ``n`` items."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            time.sleep(self.delay)
            yield i


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: reaped first if it is an exited child of ours; a
    zombie is dead too (it only waits for its parent to reap it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Numbers(Dataset):
    """Example i is (a float tensor filled with i, label i)."""

    def __init__(self, n: int, width: int = 3) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((self.width,), float(i)), i


@pytest.fixture
def one_thread():
    """torch on one thread for the test (a framework's training step beside the suite's other
    processes on two cores), restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def wait_until(done: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``done()`` became true within ``timeout`` seconds (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def wait_for_log(proc: subprocess.Popen, read_log: Callable[[], str], needle: str,
                 deadline: float) -> None:  # fmt: skip
    """Until ``needle`` shows in ``read_log()``; fails with the log if ``proc`` exits first or
    ``deadline`` (``time.monotonic()``) passes."""
    while needle not in read_log():
        assert proc.poll() is None, read_log()
        assert time.monotonic() < deadline, f"no {needle!r} yet: {read_log()}"
        time.sleep(0.05)


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (torch, the libraries under test, every test module) lives as
    # long as the test process: kept out of the collector, the full collections that the tests'
    # allocations set off walk only the tests' own objects, and write less to pages the loader
    # workers forked from this process share with it.
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a test marked ``slow`` first, each file's tests in their own order.

    ``make test`` hands whole files to its three processes in this order (``--dist loadfile
    --no-loadscope-reorder``): the long files start early and overlap the many short ones,
    instead of one of them running alone at the end.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # a stable sort
    # make test collects only tests/benchmarks for its "alone" run (collecting every file
    # costs seconds): a test marked alone elsewhere would never run.
    benchmarks = Path(__file__).parent / "benchmarks"
    astray = [item.nodeid for item in items
              if item.get_closest_marker("alone") and benchmarks not in item.path.parents]  # fmt: skip
    if astray:
        raise pytest.UsageError(f"tests marked alone must live in tests/benchmarks/: {astray}")


# Burns CPU until its own CPU time reaches the first argument (seconds), however busy the cores
# are; the second names it for pkill.
BURN = "import sys, time\nwhile time.process_time() < float(sys.argv[1]): pass\n"


def orphan_burners(count: int, cpu_seconds: float, done: Path) -> None:
    """``count`` burners that are no child of this process (their shell exits at once): their
    CPU time is another program's; each touches ``done``.N when it has burnt its share."""
    for i in range(count):
        script = f"{sys.executable} -c '{BURN}' {cpu_seconds} {done}.{i} && touch {done}.{i}"
        subprocess.run(["sh", "-c", f"({script}) >/dev/null 2>&1 &"], check=True)


def wait_for(paths: list[Path], timeout: float = 60.0) -> None:
    """Wait until every path exists."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"burners not done: {paths}"
        time.sleep(0.05)
