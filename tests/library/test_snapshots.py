"""The workers' state snapshots: the default interval (dataecho/loader/inner.py) and how a
state crosses (``send_once``, dataecho/loader/transport.py)."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from conftest import run_test_save_load_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from dataecho import EchoingDataLoader
from dataecho.loader.inner import CHEAP_BUFFER, snapshot_interval
from dataecho.loader.options import LoaderOptions
from dataecho.loader.transport import SEND_ONCE_BYTES, _InPipe, _SendOnce, send_once


def options(**kw) -> LoaderOptions:
    return LoaderOptions(**({"batch_size": 128, "echo_factor": 4} | kw))


def test_interval_is_one_buffer_of_batches_without_workers_or_with_a_cheap_buffer():
    assert snapshot_interval(options(shuffle_buffer=1024), 0, None) == 8
    small = options(batch_size=8, shuffle_buffer=CHEAP_BUFFER - 8)
    assert snapshot_interval(small, 2, 8) == (CHEAP_BUFFER - 8) // 8
    # Batch echoing buffers nothing in the workers; no buffer at all: one batch.
    assert snapshot_interval(options(where="batch", shuffle_buffer=1024), 2, 8) == 1
    assert snapshot_interval(options(shuffle_buffer=0), 1, 8) == 1


def test_interval_stretches_by_the_batches_in_flight_when_a_buffer_is_costly():
    # StatefulDataLoader asks for a state with every batch it puts in flight near a snapshot
    # step: workers x (prefetch + 1) + 1 of them per interval.
    opts = options(shuffle_buffer=1024, echo_factor=1)  # 8 batches per buffer
    assert snapshot_interval(opts, 1, 8) == (1 * 9 + 1) * 8
    assert snapshot_interval(opts, 4, None) == (4 * 3 + 1) * 8  # torch's default prefetch: 2


@pytest.mark.parametrize("factor", [2, 2.5, 4])
def test_echoed_examples_pack_a_buffer_per_buffer_of_fresh_batches(factor):
    # Each fresh batch leaves as e emitted ones: the interval, counted in emitted batches,
    # holds as many fresh reads at any factor.
    fresh = snapshot_interval(options(shuffle_buffer=1024, echo_factor=1), 1, 8)
    assert snapshot_interval(options(shuffle_buffer=1024, echo_factor=factor), 1, 8) == round(
        fresh * factor
    )


def test_loader_uses_the_interval_unless_given_one():
    data = [torch.zeros(2)] * 64
    kw = dict(batch_size=8, echo_factor=2, shuffle_buffer=256, num_workers=1)
    # Example echoing: prefetch_factor = 2 x ceil(e) = 4, so the window is 1 x 5 + 1 batches,
    # of 32 fresh batches each (a buffer's worth), emitted twice.
    assert EchoingDataLoader(data, **kw)._inner.snapshot_every_n_steps == 6 * 32 * 2
    given_one = EchoingDataLoader(data, snapshot_every_n_steps=5, **kw)
    assert given_one._inner.snapshot_every_n_steps == 5


def test_send_once_wraps_large_tensors_to_drop_and_small_ones_to_pipe():
    big = torch.arange(SEND_ONCE_BYTES // 8, dtype=torch.int64)  # exactly the threshold
    small = torch.ones(SEND_ONCE_BYTES // 4 - 1)  # one float short of it
    state = {"buffer": [{"data": big}, small, "x", 3], "rng": (big,)}
    sent = send_once(state)
    assert isinstance(sent["buffer"][0]["data"], _SendOnce)
    assert isinstance(sent["buffer"][1], _InPipe) and sent["buffer"][1].tensor is small
    assert sent["buffer"][2:] == ["x", 3]
    assert sent["rng"] == (big,)  # not a dict or list: left alone
    received = pickle.loads(pickle.dumps(sent))
    assert type(received["buffer"][0]["data"]) is torch.Tensor
    assert torch.equal(received["buffer"][0]["data"], big)
    assert type(received["buffer"][1]) is torch.Tensor and torch.equal(received["buffer"][1], small)
    assert sent["buffer"][0]["data"].tensor is None  # the sender no longer holds it


def test_a_sent_state_crosses_without_shared_memory():
    # The loader's result queue pickles with ForkingPickler, which gives every tensor left as
    # it is a shared-memory segment and a descriptor hand-over (torch's rebuild_storage_fd).
    import torch.multiprocessing  # noqa: F401 - registers torch's reductions

    state = {"pool": torch.zeros(SEND_ONCE_BYTES), "refs": torch.arange(9), "n": [torch.ones(2)]}
    assert b"rebuild_storage" in bytes(ForkingPickler.dumps(state))  # the check sees it
    wire = bytes(ForkingPickler.dumps(send_once(state)))
    assert b"rebuild_storage" not in wire
    assert same(state, pickle.loads(wire))


def test_a_second_pickle_of_a_sent_tensor_fails_loudly():
    sent = send_once(torch.zeros(SEND_ONCE_BYTES))
    pickle.dumps(sent)
    with pytest.raises(RuntimeError, match="pickled a second time"):
        pickle.dumps(sent)


tensors = st.integers(0, 3 * SEND_ONCE_BYTES // 4).map(lambda n: torch.arange(n, dtype=torch.int32))
leaves = st.one_of(tensors, st.integers(), st.text(max_size=3), st.none())
states = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return type(b) is torch.Tensor and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(map(same, a, b))
    return a == b


@settings(max_examples=40, deadline=None)
@given(states)
def test_a_sent_state_arrives_equal_to_the_original(state):
    assert same(state, pickle.loads(pickle.dumps(send_once(state))))


class Vectors(Dataset):
    """Example ``i``: 512 float32 (2 KiB) all ``i``, and ``i``; a buffer holds each original once:
    32 of them pack 64 KiB."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, i: int):
        return torch.full((512,), float(i)), i


def big_tensors(state, found: list) -> list:
    """Every tensor of at least SEND_ONCE_BYTES in ``state``; no wrapper may reach here."""
    assert not isinstance(state, _SendOnce)
    if isinstance(state, torch.Tensor) and state.numel() * state.element_size() >= SEND_ONCE_BYTES:
        found.append(state)
    if isinstance(state, dict | list):
        for v in state.values() if isinstance(state, dict) else state:
            big_tensors(v, found)
    return found


@pytest.mark.timeout(180)
def test_multi_worker_resume_is_exact_when_workers_send_their_buffer_once():
    # Two workers, a state after every batch (each packs a >= 64 KiB buffer that send_once
    # wraps, and the worker diffs every state against the last one it sent): the training
    # process's state holds plain tensors, survives torch.save / torch.load(weights_only=True),
    # and resumes exactly.
    def make():
        return EchoingDataLoader(Vectors(), batch_size=4, echo_factor=2, where="after_augment",
                                 shuffle_buffer=96, num_workers=2, seed=3, shuffle=True,
                                 snapshot_every_n_steps=1)  # fmt: skip

    loader = make()
    it = iter(loader)
    for _ in range(40):  # both workers' buffers full
        next(it)
    assert big_tensors(loader.state_dict(), []), "no state tensor large enough to be sent once"
    del it, loader
    run_test_save_load_state(
        make,
        epochs=1,
        positions=[0, 37],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
    )
