"""SIGINT/SIGTERM during a training loop: stop where the state is consistent, checkpoint, exit.

    on_exit = ExitCheckpoint(loader, save=write_checkpoint, log=print, label="e=4")
    with on_exit:
        for batch in on_exit.batches(loader):
            ...  # one step, its evaluation and periodic checkpoint
            on_exit.after_step()

A checkpoint is *consistent* when the model has taken exactly the steps whose batches the
loader state says were delivered. The loop passes two such points on every step:

- waiting for the next batch: the model has finished every delivered batch. A signal here
  interrupts the wait at once (an upstream may stall, or retry for a minute); the checkpoint
  holds the loader state taken just before the wait, so a batch that arrived together with the
  signal is delivered again after a resume, never skipped and never trained on twice. The
  state is taken before every wait, signal or not: a copy of what the loader holds in the
  training process (with ``where="device"``, its pool, to host memory), the measured cost of
  stopping at once (docs/faults-and-resume.md, "Signals").
- after a step (with its evaluation and periodic checkpoint): a signal during them only set a
  flag, so the step is never cut in half; the loop stops here.

``save(loader_state)`` writes the checkpoint and returns its path. Then the signal's usual
exception goes on, ``KeyboardInterrupt`` for SIGINT and :class:`Terminated` for SIGTERM, so
every ``finally`` on the way out runs (loader workers stop) and ``dataecho train`` exits with
130 or 143. A second signal before that interrupts at once: the user insists, and atomic
checkpoint writes leave no torn file. Without ``save`` (or off the main thread, where Python
cannot handle signals) the guard does nothing and signals keep their usual handlers.

Once a signal's exception is on its way out, a repeated one (Ctrl-C pressed again and again)
does not raise another: the first one's ``finally`` blocks (loader workers, a server) finish,
and the command still ends with 130 or 143 and its one line. :func:`command_handlers` are the
command's own handlers, which keep that up until the process has exited (its ``atexit``
callbacks included). Only a signal :data:`STOP_GRACE_SECONDS` after the first, while the
exception has not yet reached the command, interrupts again: the user insists on a cleanup
that hangs.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long after the first signal a repeated one is ignored while the first one's exception
# unwinds: cleanup (workers joining, a server stopping) takes a second or two; past this it
# hangs, and a signal interrupts it.
STOP_GRACE_SECONDS = 10.0


# A BaseException, not a DataechoError: it must pass every ``except Exception`` between the
# handler and the loop (a retrying upstream read, a framework's error handling), as
# KeyboardInterrupt does, or a SIGTERM could be swallowed and the run go on.
class Terminated(BaseException):
    """SIGTERM arrived. Raised in the main thread (a BaseException, as KeyboardInterrupt is, so
    that ``except Exception`` does not swallow it) so that every ``finally`` runs on the way
    out; the default SIGTERM action would end the process without any of that."""


def exception_for(signum: int) -> BaseException:
    """What a signal raises in the main thread: KeyboardInterrupt (SIGINT) or Terminated."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


class _Stop:
    """The process's stop: the first signal whose exception was raised, and since when."""

    signum: int | None = None
    since = 0.0
    caught = False  # the command has caught it: the process is on its way to exit


def stopping(signum: int) -> BaseException:
    """Record that ``signum``'s exception is being raised (the first one only) and return it."""
    if _Stop.signum is None:
        _Stop.signum, _Stop.since = signum, time.monotonic()
    return exception_for(signum)


def repeated_signal_raises() -> bool:
    """Whether a signal now should raise: no stop under way, or one past its grace period
    that the command has not caught yet (module docstring)."""
    if _Stop.signum is None:
        return True
    return not _Stop.caught and time.monotonic() - _Stop.since > STOP_GRACE_SECONDS


def _command_handler(signum: int, frame: object) -> None:
    if repeated_signal_raises():
        raise stopping(signum)


def command_handlers() -> dict[int, Any]:
    """Install the command's SIGINT and SIGTERM handlers (a new stop, none recorded): the first
    signal raises KeyboardInterrupt or :class:`Terminated`, a repeated one is ignored while that
    unwinds (module docstring). Returns the handlers before, for :func:`restore_handlers`;
    off the main thread installs nothing and returns ``{}``."""
    _Stop.signum, _Stop.caught = None, False
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            continue  # ignored on purpose (nohup, a background job): keep ignoring it
        previous[signum] = signal.signal(signum, _command_handler)
    return previous


def stop_caught(signum: int) -> None:
    """The command caught the stop of ``signum`` and exits now: every later SIGINT or SIGTERM
    is ignored, up to and through the interpreter's exit (``atexit`` callbacks)."""
    stopping(signum)
    _Stop.caught = True
    if threading.current_thread() is threading.main_thread():
        # SIG_IGN, not a Python handler: the interpreter puts the default action (which would
        # end the process by the signal, status -2) back for those as it finalises.
        for signum_ in SIGNALS:
            signal.signal(signum_, signal.SIG_IGN)


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`command_handlers` replaced; not after a stop the command
    caught, whose process exits with its handlers kept."""
    if _Stop.caught:
        return
    for signum, handler in previous.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)


class ExitCheckpoint:
    """Installs SIGINT/SIGTERM handlers for a training loop (see the module docstring).

    Args:
        loader: what the batches come from; its ``state_dict()`` goes into the checkpoint.
        save: writes the final checkpoint from a loader state and returns its path; None: off.
        log: where the one line about the signal and the checkpoint goes.
        label: prefix of that line (the run's name).
    """

    def __init__(
        self,
        loader: Any,
        save: Callable[[dict[str, Any]], Path] | None,
        *,
        log: Callable[[str], None] = print,
        label: str = "",
    ) -> None:
        self.loader, self.save, self.log = loader, save, log
        self.prefix = f"[{label}] " if label else ""
        self.signum: int | None = None  # the first signal seen
        self.path: Path | None = None  # the final checkpoint, once written
        self._waiting = False
        self._raised = False  # the signal's exception is on its way out
        self._previous: dict[int, Any] = {}

    @property
    def active(self) -> bool:
        """Whether this guard's handlers are installed."""
        return bool(self._previous)

    def __enter__(self) -> ExitCheckpoint:
        if self.save is None or threading.current_thread() is not threading.main_thread():
            return self
        for signum in SIGNALS:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # ignored on purpose (nohup, a background job): keep ignoring it
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            # None: the handler was not set from Python; the default is the closest we have.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if exc_type is None and self.signum is not None and not self._raised:
            # A signal after the last step's check: hand it to the usual handler now.
            signal.raise_signal(self.signum)

    def batches(self, batches: Iterable[T]) -> Iterator[T]:
        """``batches``, with the loader state taken before each wait (module docstring)."""
        if not self.active:
            yield from batches
            return
        it = iter(batches)
        while True:
            state = self.loader.state_dict()  # every batch delivered so far is trained on
            self._waiting = True
            try:
                if self.signum is not None:  # came between the last check and this wait
                    self._raised = True
                    raise stopping(self.signum)
                batch = next(it)
            except StopIteration:
                return
            except (KeyboardInterrupt, Terminated):
                self._waiting = False
                if self.path is None and self.signum is not None:
                    self._write(state, "while waiting for a batch")
                raise
            finally:
                self._waiting = False
            yield batch

    def after_step(self) -> None:
        """Call after each step and its checkpoint: a signal during them stops the loop here."""
        if self.signum is None or not self.active:
            return
        self._write(self.loader.state_dict(), "during a step (stopped after it)")
        self._raised = True
        raise stopping(self.signum)

    def _handle(self, signum: int, frame: object) -> None:
        if self._raised and not repeated_signal_raises():
            return  # the stop is on its way out: let its cleanup finish (module docstring)
        if self.signum is not None or self._waiting:
            self.signum = self.signum if self.signum is not None else signum
            self._raised = True
            raise stopping(signum)  # a wait, or a second signal: at once
        self.signum = signum  # during a step: after_step stops the loop

    def _write(self, loader_state: dict[str, Any], when: str) -> None:
        assert self.save is not None and self.signum is not None
        name = signal.Signals(self.signum).name
        self.path = self.save(loader_state)
        self.log(f"{self.prefix}{name} {when}: final checkpoint {self.path}; continue with "
                 "--resume")  # fmt: skip
