"""Worker state snapshots: how often the workers send them, and what the sender keeps.

``StatefulDataLoader`` gets each worker's pipeline state (position, RNG counters, the packed
shuffle buffer) *with* a batch, so that ``state_dict()`` in the training process never waits
for a worker. Two costs come with it (the ``peers`` benchmark measures both):

- **How many.** For an iterable dataset (our pipeline is one) the loader does not ask for one
  state per ``snapshot_every_n_steps`` batches: it asks for the state with every batch put in
  flight near a snapshot step, about ``workers x (prefetch_factor + 1) + 1`` of them per
  interval. With a short interval and deep prefetch, every batch can carry a packed buffer,
  which costs the worker (and the training thread that unpacks it) more than the batch.
  :func:`snapshot_interval` stretches the interval by that window, so a buffer is packed
  about once per buffer's worth of fresh batches, as intended; the price is a longer replay on
  resume (the same upstream reads at any echo factor).
- **What the worker keeps.** The worker diffs each snapshot against the previous one, so it
  holds the last one until the next: a second copy of the packed buffer, next to the buffer
  itself. :func:`send_once` wraps large tensors so the worker drops them once pickled, which
  lowers the worker's peak memory by about one buffer.
- **How they cross.** The state's tensors cross pickled as bytes through the pipe, not as
  torch's shared memory (:func:`send_once` wraps the small ones too). That costs both
  processes less (no segment to make and map, no socket hand-over of its descriptor), and a
  training process interrupted while receiving one (Ctrl-C during a wait) leaves no hand-over
  half done in the worker.

A resume continues exactly either way: the worker restores the snapshot before the checkpoint
and replays (re-reads) the batches since, at most one interval.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from dataecho.loader.options import LoaderOptions
from dataecho.loader.transport import pipeable

# A worker buffer smaller than this packs in about a millisecond, no more than the rest of a
# snapshot (positions, RNG states) costs: such loaders keep one snapshot per buffer's worth of
# batches counted plainly, and replay little on resume.
CHEAP_BUFFER = 128  # examples
SEND_ONCE_BYTES = 64 * 1024  # state tensors at least this large leave the worker with the state


def snapshot_interval(opts: LoaderOptions, num_workers: int, prefetch_factor: int | None) -> int:
    """The default ``snapshot_every_n_steps``: about one packed buffer per buffer's worth of
    fresh batches (see the module docstring). A resume replays at most this many batches."""
    if opts.adaptive and not opts.batch_level and num_workers:
        # "auto" in a worker decides by timing, so a replay from an older snapshot would not
        # repeat its reuse decisions: the resumed stream would repeat some examples and skip
        # others. One snapshot per batch keeps the resume exact.
        return 1
    # Batch echoing shuffles whole batches in the training process; workers buffer nothing.
    # Derived on construction where not given: an int here.
    buffered = 0 if opts.batch_level else cast(int, opts.shuffle_buffer)
    per_buffer = max(1, buffered // opts.batch_size)
    if num_workers == 0 or buffered < CHEAP_BUFFER:
        return per_buffer
    window = num_workers * ((prefetch_factor or 2) + 1) + 1
    # Echoed examples leave the buffer e times per fresh read: count fresh batches, as the
    # buffer fills with them, so echoing packs no more buffers per fresh read than e = 1 does.
    return max(1, round(window * per_buffer * float(opts.echo_factor)))


class _SendOnce:
    """A large tensor of a worker's state: pickled once, then no longer held by the worker.

    It unpickles as a plain tensor equal to it, so the training process (and its checkpoints)
    never sees the wrapper. Equality is identity, so the worker's diff always sends it.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: torch.Tensor | None = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        tensor, self.tensor = self.tensor, None
        if tensor is None:
            raise RuntimeError(
                "a worker state tensor was pickled a second time after it was sent; this is a "
                "dataecho bug: please report it with the torchdata version"
            )
        if pipeable(tensor):
            return (_from_array, (tensor.numpy(),))
        return (_received, (tensor,))


class _InPipe:
    """A small tensor of a worker's state, pickled as its bytes: torch would give it a
    shared-memory segment and a descriptor hand-over of its own, which cost both processes
    more than the copy."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_array, (self.tensor.numpy(),))


def _from_array(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


def _received(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def send_once(state: Any) -> Any:
    """``state`` with its tensors of :data:`SEND_ONCE_BYTES` or more wrapped in ``_SendOnce``,
    and the smaller ones that numpy holds in ``_InPipe``.

    Only for a state that a worker process hands to the loader's result queue. It opens only
    plain dicts and lists, the containers of a node state, and keeps every other object as it
    is (not :mod:`dataecho._structure`'s walk, which rebuilds tuples and dict subclasses).
    """
    if isinstance(state, torch.Tensor):
        if state.numel() * state.element_size() >= SEND_ONCE_BYTES:
            return _SendOnce(state)
        return _InPipe(state) if pipeable(state) else state
    if type(state) is dict:
        return {k: send_once(v) for k, v in state.items()}
    if type(state) is list:
        # A packed buffer's plain column is a list of thousands of numbers: one look at its
        # types (at C speed) instead of a call per number.
        if not any(issubclass(t, _OPENED) for t in set(map(type, state))):
            return state
        return [send_once(v) for v in state]
    return state


_OPENED = (torch.Tensor, dict, list)  # what send_once looks into or wraps
