"""SIGINT/SIGTERM in a data-parallel run: every rank stops after the same exchange.

    signals = StopSignals(enabled=cfg.checkpoint_on_exit)
    with signals:
        batch = signals.fetch(batches)         # None: too late to wait, join the exchange void
        votes = signals.votes(void=batch is None)   # a .control.Control: these votes set
        summed = <the exchange>                # every rank's Control, its votes in, reduced
        if summed.stopping: final checkpoint (unless summed.void); raise signals.exception(summed)

A signal reaches the ranks at different moments (the launcher forwards its own to each rank,
Ctrl-C reaches every process of the group, a scheduler may signal one rank), and a rank that
acted alone would leave the others in a collective it never joins. So a handler only sets a
flag; the flag rides in the control numbers of the next exchange (:mod:`.control`: no extra
collective; a separate 1-float all-reduce costs ~1 ms on gloo, ~7% of a CNN step here) and
every rank reads the same sum: all stop after the same exchange, where the models agree, the
point a periodic checkpoint is written at.

A rank waiting for data when the signal comes goes on waiting (its batch normally comes within
a step's time), for at most ``grace`` seconds after the signal: a third of torchelastic's
shutdown grace (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30 s; the launcher then sends
SIGKILL). Past it, the wait is cut short (a watcher thread re-sends the signal to the main
thread) and the rank joins the exchange *void*, without a step. Its step is missing, so no
state of that exchange is consistent: the ranks stop without a final checkpoint, and a resume
continues from the latest periodic one.

Loader workers forked while the handlers are in block both signals (their rank stops them):
it still needs batches after the signal, and one sent to the whole process group (Ctrl-C, a
shell's ``kill %1``, a scheduler signalling every process of a job) would end them mid-batch
(torch's worker dies on SIGTERM by a C handler, on SIGINT by KeyboardInterrupt).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

from dataecho.app.distributed.control import Control
from dataecho.app.shutdown import SIGNALS, exception_for

T = TypeVar("T")
_installed: list[StopSignals] = []  # the handlers in, in this process (forks block signals)


def _block_in_child() -> None:
    """After a fork (a loader worker) while a rank's handlers are in: block both signals.
    A mask, not a handler: torch's worker installs its own SIGTERM handler after the fork."""
    if _installed:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        _installed.clear()


os.register_at_fork(after_in_child=_block_in_child)


def default_grace() -> float:
    """A third of the launcher's shutdown grace: time left to step, exchange and save."""
    return float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")) / 3


# A BaseException: it is raised inside the wait for data (the loader's, an upstream's retry
# loop), and must get past every ``except Exception`` there to cut the wait short.
class _TooLate(BaseException):
    """Cuts a wait for data short (see :meth:`StopSignals.fetch`)."""


class StopSignals:
    """SIGINT/SIGTERM handlers of one rank (see the module docstring); off: a no-op.

    Args:
        enabled: install the handlers (``checkpoint_on_exit``).
        grace: seconds after the first signal that a wait for data may still take.
    """

    def __init__(self, enabled: bool, grace: float | None = None) -> None:
        self.enabled = enabled
        self.grace = default_grace() if grace is None else grace
        self.signum: int | None = None  # the first signal this rank got
        self.late = False  # the grace is over: waits are cut short
        self.acted = False  # the loop stopped on it (else it is handed on at exit)
        self._waiting = False
        self._previous: dict[int, Any] = {}
        # The handler only sets _signalled (starting a thread there could deadlock on a lock
        # the interrupted main thread holds); a watcher started beforehand times the grace.
        self._signalled, self._done = threading.Event(), threading.Event()
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()  # the watcher re-sends only while the handlers are in
        self._pid, self._main = os.getpid(), threading.get_ident()

    @property
    def active(self) -> bool:
        return bool(self._previous)

    def __enter__(self) -> StopSignals:
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return self
        self._pid, self._main = os.getpid(), threading.get_ident()
        for signum in SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored on purpose: keep it
                self._previous[signum] = signal.signal(signum, self._handle)
        _installed.append(self)
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name="dataecho-stop-grace")  # fmt: skip
        self._watcher.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        with self._lock:
            previous, self._previous = self._previous, {}
        for signum, handler in previous.items():  # first: no handler of ours runs below
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if self in _installed:
            _installed.remove(self)
        self._done.set()
        self._signalled.set()  # the watcher ends now
        if self._watcher is not None:
            self._watcher.join()
        if exc_type is None and self.signum is not None and not self.acted:
            # After the last exchange (the run ended): the usual exception, as a single
            # process hands a late signal on (dataecho.app.shutdown).
            raise exception_for(self.signum)

    def fetch(self, batches: Iterator[T]) -> T | None:
        """The next batch, or None when the grace after a signal is over (module docstring)."""
        if not self.active:
            return next(batches)
        try:
            self._waiting = True
            if self.late:
                return None
            return next(batches)
        except _TooLate:
            return None
        finally:
            self._waiting = False

    def votes(self, void: bool = False) -> Control:
        """This rank's votes for the next exchange (its signal; ``void``: it has no step),
        the other fields unset."""
        return Control(sigterm=self.signum == signal.SIGTERM,
                       sigint=self.signum == signal.SIGINT, void=void)  # fmt: skip

    def exception(self, summed: Control) -> BaseException:
        """What stops this rank after an exchange that voted to stop: its own signal's
        exception, or (signalled elsewhere) SIGTERM's when some rank got SIGTERM."""
        self.acted = True
        if self.signum is not None:
            return exception_for(self.signum)
        return exception_for(signal.SIGTERM if summed.sigterm else signal.SIGINT)

    def _handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self._pid:
            return  # a forked child that unblocked the signals: its rank decides
        if self.late:
            if self._waiting:  # the watcher's wake-up, or any signal past the grace
                self._waiting = False
                raise _TooLate
            return
        if self.signum is None:
            self.signum = signum
            self._signalled.set()

    def _watch(self) -> None:
        self._signalled.wait()
        if self._done.wait(self.grace):
            return
        with self._lock:
            if not self._previous:
                return  # the handlers are out: a signal now would reach the usual ones
            self.late = True
            assert self.signum is not None
            # To the main thread: its wait (a poll, a sleep) ends with EINTR, the handler runs.
            signal.pthread_kill(self._main, self.signum)
