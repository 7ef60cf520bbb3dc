"""Echoing on the training device (``where="device"``): one host-to-device copy per fresh batch.

The main-process chain is workers -> :class:`ToDevice` -> with ``shuffle_buffer`` (in
examples), :class:`~dataecho.loader.reading.Tagged` (each fresh batch's number) -> echo stage
(fixed or ``"auto"``, batch level; ``copy=True`` clones on the device) -> with ``shuffle_buffer``,
:class:`~dataecho.stages.MixExamples`, which forms each batch from random examples of a pool on
the device, so a fresh batch's copies spread over the batches that follow as with example
echoing -> :class:`DeviceTransform`. The workers read, decode, augment and batch exactly as
without echoing; every copy is made, and augmented with its own random draws, on the device.
A fresh example counts (``stats.fresh_examples``) once its first copy leaves the pool, or,
without one, once the echo stage hands its batch on.

On CUDA, :class:`ToDevice` copies from pinned host memory (with workers, the inner loader pins
in a thread of its own; with ``num_workers=0`` it pins on the thread that reads, as
:class:`ToDevice` does with a batch that comes unpinned) with ``non_blocking`` copies on a side
stream. Read on the training thread (a fixed
factor) it keeps the next fresh batch's copy in flight while the current one is echoed, and the
training stream waits for a copy (``wait_event`` on the copy's event: the GPU waits, not the
host) only when the batch is handed over. Read by ``"auto"``'s reader thread it waits for each
copy to land on that thread instead, so a batch counts as arrived only once it is on the device
and the training thread never blocks on a transfer. Each copied tensor is ``record_stream``-ed
on the training stream (the one current as the batch is handed over; for ``"auto"``'s reader
thread, the one current as the epoch started), so the caching allocator does not hand its
memory to the next copy while training still reads it. ``"auto"`` keeps up to 16 fresh
batches in its read-ahead queue, here on the device: 16 batches' memory at most, held only
while the consumer is slower than the workers. The workers start with the echo device as
CUDA's current device, which is the one torch's pin thread pins for. This CUDA path has not
been run on a GPU yet; the CPU device runs the same nodes, with plain pass-through moves
(``tests/library/test_device.py``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torchdata.nodes import BaseNode

from dataecho._structure import map_tensors, tensors
from dataecho._validate import check_takes_generator
from dataecho.errors import DataechoValueError
from dataecho.loader.rng_scope import batch_seed
from dataecho.stages import EchoStats, copy_item


def resolve_device(name: str) -> torch.device:
    """``name`` as a ``torch.device`` this machine has, or a clear error naming the fix."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DataechoValueError(
                f"device={name!r}, but CUDA is not available here (torch.cuda.is_available() "
                "is False); pass device='cpu' to echo in the training process, or run where "
                "the GPU is"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DataechoValueError(
                f"device={name!r}, but this machine has {count} CUDA device(s) (cuda:0.."
                f"cuda:{count - 1}); pass one of those"
            )
        if device.index is None:  # the one "cuda" means now, as tensors on it will name it
            # torch's stubs type device.index as int; it is None for a bare "cuda".
            device = torch.device("cuda", torch.cuda.current_device())  # type: ignore[unreachable]
    return device


def as_current(device: torch.device | None) -> contextlib.AbstractContextManager[Any]:
    """Inside: ``device`` is CUDA's current device (else nothing changes). The epoch starts
    its workers in it, because torch's pin thread pins for the device current at the start:
    a loader on ``cuda:1`` would otherwise open a context on GPU 0 in every process."""
    if device is not None and device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def to_host(state: Any) -> Any:
    """``state`` with its device tensors copied to host memory: a checkpoint that loads on any
    machine. Host tensors are kept as they are."""
    return map_tensors(state, lambda t: t if t.device.type == "cpu" else t.cpu())


def on_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device`` (those already there unchanged)."""
    return map_tensors(batch, lambda t: t if t.device == device else t.to(device))


class _InFlight:
    """A batch whose copy to the device was issued, and the event that marks its landing."""

    __slots__ = ("batch", "landed")

    def __init__(self, batch: Any, landed: torch.cuda.Event | None) -> None:
        self.batch, self.landed = batch, landed


class ToDevice(BaseNode[Any]):
    """Moves each fresh batch of ``source`` to ``device`` once; see the module docstring.

    ``ahead``: keep the next batch's copy in flight while the current one is used (default:
    on CUDA, when not read by a reader thread of its own), from the second batch of an epoch
    on, so the first is handed on as soon as it is read. Its state is then the source's
    before that batch was read, so a resume reads it again rather than losing it; read ahead,
    its fresh examples wait in the workers node until a downstream stage counts them handed.
    ``stats.fresh_items`` counts the batches handed downstream.
    """

    def __init__(self, source: BaseNode[Any], device: torch.device, *, ahead: bool) -> None:
        super().__init__()
        self.source = source
        self.device = device
        self.ahead = ahead
        self.stats = EchoStats(unit="batches")
        cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if cuda else None
        self._consumer_stream: Any = None  # the training thread's, as its epoch started
        self._consumer_thread = 0
        self._next: _InFlight | None = None  # read ahead, its copy in flight
        self._before_next: Any = None  # the source's state before _next was read
        self._ended = False  # the source ended; nothing more is read this epoch
        self._started = False  # the source was reset this epoch
        self._saved: Any = None  # the source's state as resumed
        self._failure: Exception | None = None  # raised by the read ahead, due next
        self._first = True  # the epoch's (or the resume's) first batch is still to come

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        # Called on the training thread as its epoch starts: the stream it trains on.
        self._consumer_thread = threading.get_ident()
        if self._stream is not None:
            self._consumer_stream = torch.cuda.current_stream(self.device)
        self._next, self._before_next, self._failure = None, None, None
        self._first = True
        self._ended = bool(initial_state and initial_state.get("ended"))
        self._saved = initial_state["source"] if initial_state else None
        self._started = not self._ended  # an ended epoch reads nothing more
        if self._started:
            self.source.reset(self._saved)

    def next(self) -> Any:
        current = self._next if self._next is not None else self._read()
        self._next = None
        # Not before the first batch: it would wait for the second's read.
        first, self._first = self._first, False
        if self.ahead and not first and not self._ended and self._failure is None:
            self._before_next = self.source.state_dict()
            try:
                self._next = self._read()
            except StopIteration:
                pass  # _read marked the end; ``current`` is the last batch
            except Exception as error:  # raised after ``current``, as read in step it would be
                self._failure = error
        self.stats.fresh_items += 1
        self.stats.items_out += 1
        return self._land(current)

    def _read(self) -> _InFlight:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._ended:
            raise StopIteration
        try:
            batch = next(self.source)
        except StopIteration:
            self._ended = True
            raise
        if self._stream is None:  # no stream to overlap on: a plain (synchronous) move
            return _InFlight(on_device(batch, self.device), None)
        with torch.cuda.stream(self._stream):
            # Pinned by the inner loader; a tensor that is not is pinned here first.
            moved = map_tensors(batch, self._copy)
            landed = torch.cuda.Event()
            landed.record(self._stream)
        return _InFlight(moved, landed)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def _land(self, flight: _InFlight) -> Any:
        """The batch, safe to use on the training stream."""
        if flight.landed is None:
            return flight.batch
        if threading.get_ident() == self._consumer_thread:
            # The stream it trains on now: a loop may switch streams within an epoch.
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(flight.landed)  # the GPU waits for the copy, not the host
        else:
            # A reader thread: arrived once it is on the device. It cannot see the training
            # thread's stream of the moment; the one its epoch started on is kept from
            # reusing the memory too early.
            stream = self._consumer_stream
            flight.landed.synchronize()
        for t in tensors(flight.batch):
            if t.device.type == "cuda":
                t.record_stream(stream)  # freed only once the training stream is done with it
        return flight.batch

    def get_state(self) -> dict[str, Any]:
        if self._next is not None:  # the batch read ahead is read again on resume
            return {"source": copy_item(self._before_next), "ended": False}
        if not self._started:  # resumed at the end: the source was never restored
            return {"source": self._saved, "ended": True}
        return {"source": self.source.state_dict(), "ended": self._ended}

    def close(self) -> None:
        self._next = None


class DeviceTransform(BaseNode[Any]):
    """Applies ``fn(batch, generator=g)`` to every copy (None: none), with ``g`` a
    ``torch.Generator`` on ``device`` seeded anew for each batch from ``seed`` and the batch's
    number (:func:`~dataecho.loader.rng_scope.batch_seed`). The checkpoint holds that number,
    not the generator's state, which is a different size on each kind of device: a resume, on
    the same kind of device, draws exactly what the uninterrupted run drew, and a checkpoint
    taken on a GPU resumes on the CPU (with the CPU's draws from there on).

    It is the root of the device chain: it also puts on the device any tensor that a resume
    brought back from a checkpoint (:meth:`get_state` keeps every state tensor in host memory,
    so a checkpoint loads anywhere). ``work_seconds``: time spent in ``fn`` and in the source's
    own ``work_seconds`` (the example mixing), which is work of the training thread, not a
    wait for data.
    """

    def __init__(
        self,
        source: BaseNode[Any],
        device: torch.device,
        fn: Callable[..., Any] | None,
        *,
        seed: int,
    ) -> None:
        super().__init__()
        if fn is not None:
            check_takes_generator(fn)
        self.source = source
        self.device = device
        self.fn = fn
        self.seed = int(seed)
        self.generator = torch.Generator(device=device)
        self._batches = 0  # batches transformed this epoch
        self._fn_seconds = 0.0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
            self._batches = 0
        else:
            self.source.reset(initial_state["source"])
            self._batches = int(initial_state["batches"])

    def next(self) -> Any:
        batch = on_device(next(self.source), self.device)
        if self.fn is None:
            return batch
        # Seeding sets the generator's seed and offset on the host: no device work, no sync.
        self.generator.manual_seed(batch_seed(self.seed, self._batches))
        self._batches += 1
        start = time.perf_counter()
        try:
            return self.fn(batch, generator=self.generator)
        finally:
            self._fn_seconds += time.perf_counter() - start

    @property
    def work_seconds(self) -> float:
        return self._fn_seconds + getattr(self.source, "work_seconds", 0.0)

    def get_state(self) -> dict[str, Any]:
        return {
            "source": to_host(self.source.state_dict()),
            "batches": self._batches,
        }
