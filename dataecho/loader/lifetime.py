"""Loader workers live as long as the training process: no shorter, and no longer after SIGKILL.

A DataLoader worker notices a dead parent only at its next poll, and one blocked writing a
batch into a full pipe that nobody drains, or sleeping in a slow ``__getitem__``, never gets
there: after ``kill -9`` of a training run such workers were seen alive, parented to PID 1,
8 minutes later. So each worker guards itself in two ways:

- A daemon thread polls ``os.getppid()`` every :data:`POLL_SECONDS` and ends the worker with
  ``os._exit`` once the parent process is gone (the worker is then re-parented). It runs while
  the worker's other threads block, since they block with the GIL released.
- On Linux, a worker forked by the parent's main thread also asks the kernel for SIGKILL when
  its parent dies (``prctl(PR_SET_PDEATHSIG)``): that stops even a worker stuck in C code that
  holds the GIL, where the thread cannot run. The kernel sends this signal when the *thread*
  that forked the worker exits, not the process, so a worker started from any other thread
  (an iterator created on a thread that then ends) would be killed mid-epoch: those rely on
  the polling thread alone, as do spawned workers. An at-fork hook records, in the forking
  thread, which thread it is and the parent's pid, so the worker can tell.

A worker also moves the objects it inherits into the collector's permanent generation
(``gc.freeze``), so the garbage collector's full passes, which the echo stages' allocations set
off, walk only the worker's own objects.

A forked process gets an epoll instance of its own for fsspec's event loop (the one behind
Hugging Face streams over HTTP, S3 and GCS), which it inherits but never runs: an epoll instance
is shared across a fork, and when the child's collector freed the filesystem objects it
inherited, their clean-up unregistered the parent's pooled connections from the parent's loop,
whose next read on one of them then waited forever.

A worker ignores SIGINT: Ctrl-C is for the training process, which stops its workers itself.
A signal that interrupts the training process while it fetches a batch's shared memory from a
worker breaks that hand-over off; the worker's hand-over thread would print the broken
connection as a traceback beside the run's clean stop, so it drops that one kind of error
(:func:`quiet_broken_handovers`).
And the training process takes a Ctrl-C or SIGTERM only once its workers are forked
(:func:`signals_after_forks`): an exception a handler raises inside an at-fork hook is dropped,
and one raised inside ``logging``'s leaves its lock held, so the next log call hangs.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_sharer
from types import TracebackType
from typing import Any

_PR_SET_PDEATHSIG = 1
# How often a worker checks its parent: a dead parent's workers are gone within this.
POLL_SECONDS = 0.1

# Set in the forking thread just before each os.fork(); a forked child's one thread keeps
# the values (a spawned worker, a fresh interpreter, has none).
_fork = threading.local()


def _before_fork() -> None:
    _fork.parent = os.getpid()
    _fork.from_main_thread = threading.current_thread() is threading.main_thread()
    # fsspec's own at-fork hook forgets its loop in the child: noted here, before that.
    asyn = sys.modules.get("fsspec.asyn")
    _fork.fsspec_loop = asyn.loop[0] if asyn is not None else None


def _after_fork_in_child() -> None:
    """Point the inherited fsspec loop's epoll descriptor at a new, empty epoll instance: what
    the child's clean-up unregisters from it no longer reaches the parent's loop."""
    selector = getattr(getattr(_fork, "fsspec_loop", None), "_selector", None)
    epoll = getattr(selector, "_selector", None)  # a selectors.EpollSelector's select.epoll
    if sys.platform == "linux" and isinstance(epoll, select.epoll) and not epoll.closed:
        own = select.epoll()
        os.dup2(own.fileno(), epoll.fileno(), inheritable=False)
        own.close()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os._exit(1)  # no cleanup: it could block on a pipe that nobody reads any more


class WorkerInit:
    """A ``worker_init_fn``: make the worker end with its parent, freeze the heap it inherits,
    then run the user's own."""

    def __init__(self, user_fn: Callable[[int], Any] | None = None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        parent = getattr(_fork, "parent", None) or os.getppid()
        if sys.platform == "linux" and getattr(_fork, "from_main_thread", False):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the guards were set
            os._exit(1)
        threading.Thread(
            target=_watch, args=(parent,), name="dataecho-parent-watch", daemon=True
        ).start()
        # Ctrl-C reaches the whole process group: the training process stops its workers in
        # order (after its final checkpoint). A worker that broke off on its own could die
        # while handing a batch's shared memory over, and print that thread's traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        quiet_broken_handovers()
        # The inherited heap (torch's and the training process's objects, 170,000 of them
        # here) lives as long as the worker: kept out of the collector, a full collection
        # no longer walks it (0.1 s each time), nor writes to its pages.
        gc.freeze()
        if self.user_fn is not None:
            self.user_fn(worker_id)


# The errors of a hand-over whose receiver hung up mid-way: at the handshake, or before asking.
_HUNG_UP = (EOFError, ConnectionError, multiprocessing.AuthenticationError)


def quiet_broken_handovers() -> None:
    """In this process, keep ``sys.excepthook`` from printing a shared-memory hand-over that
    the receiver broke off; every other error still reaches the previous hook.

    torch sends a tensor's shared memory as a file descriptor that the receiving process asks
    for from the sender's ``multiprocessing.resource_sharer`` thread. When a signal stops the
    receiver during that request, the thread's next read fails, and it reports that through
    ``sys.excepthook``. The worker loses nothing: the batch belonged to the iterator the signal
    stops.
    """
    previous = sys.excepthook
    serve = resource_sharer._ResourceSharer._serve.__code__  # type: ignore[attr-defined]

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, _HUNG_UP) and tb is not None and tb.tb_frame.f_code is serve:
            return
        previous(kind, error, tb)

    sys.excepthook = hook


# What a user or a scheduler sends to stop a run; a handler of theirs may raise.
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_after_forks() -> Iterator[None]:
    """Hold SIGINT and SIGTERM arriving inside the block until it ends, then deliver them to
    the handlers they would have met.

    Wrap the calls that fork workers. Only the main thread receives signals, so only there is
    anything held; a handler not installed from Python (``getsignal`` is ``None``), the default
    and "ignore" are left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    for signum in HELD_SIGNALS:
        if callable(signal.getsignal(signum)):
            previous[signum] = signal.signal(signum, lambda got, frame: held.append(got))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for got in dict.fromkeys(held):
            signal.raise_signal(got)
