"""``persistent_workers=True``: the same workers every epoch, the batches of workers started
anew, exact resume, a sampler's order of any length, and nothing left running."""

from __future__ import annotations

import collections
import gc
import multiprocessing
import threading
import time

import pytest
import torch
from conftest import Numbers, alive, assert_same_stream, run_test_save_load_state, wait_until
from test_loader import NumberStream, add_noise, labels_of
from torch.utils.data import DistributedSampler, Sampler

from dataecho import EchoingDataLoader

# What these tests check is the workers' life, not augmentation: identical copies are meant.
pytestmark = pytest.mark.filterwarnings("ignore::dataecho.IdenticalCopiesWarning")

CASES = {
    "before_augment": dict(where="before_augment", echo_factor=2, shuffle_buffer=5,
                           transform=add_noise),
    "batch": dict(where="batch", echo_factor=2, shuffle_buffer=12, transform=add_noise),
    "device": dict(where="device", echo_factor=2, shuffle_buffer=6, transform=add_noise),
    "shuffle": dict(shuffle=True, echo_factor=1.5, transform=add_noise),
    "sampler": dict(sampler="distributed", echo_factor=2, transform=add_noise),
}  # fmt: skip


def worker_pids(loader: EchoingDataLoader) -> list[int]:
    return [w.pid for w in loader._inner._iterator._workers]


def gone(pids: list[int], timeout: float = 1.0) -> bool:
    return wait_until(lambda: not any(alive(p) for p in pids), timeout=timeout)


def run_epochs(case: str, persistent: bool, epochs: int = 3, **extra):
    """Each epoch's batches, and the worker pids after each, of a loader for ``case``."""
    kwargs = {**CASES[case], **extra}
    sampler = None
    if kwargs.pop("sampler", None):
        sampler = DistributedSampler(Numbers(30), num_replicas=2, rank=0, seed=5)
    loader = EchoingDataLoader(Numbers(30), batch_size=4, num_workers=2, seed=9, sampler=sampler,
                               persistent_workers=persistent, **kwargs)  # fmt: skip
    batches, pids = [], []
    with loader:
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            batches.append(list(loader))
            pids.append(worker_pids(loader))
    return batches, pids


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES)
def test_every_epoch_yields_the_batches_of_workers_started_anew(case):
    want, started = run_epochs(case, persistent=False)
    got, kept = run_epochs(case, persistent=True)
    for epoch in range(3):
        assert_same_stream(got[epoch], want[epoch], f"{case}, epoch {epoch}")
    assert not torch.equal(want[0][0][0], want[1][0][0])  # each epoch draws anew
    assert kept[0] == kept[1] == kept[2] and gone(kept[0])
    assert len({tuple(p) for p in started}) == 3  # without: new workers every epoch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_resume_at_every_position_over_epochs_of_the_same_workers(num_workers):
    def make():
        return EchoingDataLoader(
            Numbers(4 * num_workers), batch_size=2, echo_factor=1.5, shuffle_buffer=3,
            transform=add_noise, num_workers=num_workers, seed=11, shuffle=True,
            persistent_workers=True,
        )  # fmt: skip

    recorded = run_test_save_load_state(
        make,
        epochs=2,  # and the epoch after, where a resume at an epoch's end runs into
        # Every position with one worker; three (a snapshot apart) with two, to keep it short.
        positions=None if num_workers == 1 else [0, 2, 5],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    assert all(len(epoch) >= 2 for epoch in recorded)


class VaryingSampler(Sampler[int]):
    """Epoch e reads ``range(lengths[e])`` backwards (``set_epoch`` as DistributedSampler's)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths, self.epoch = lengths, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.lengths[self.epoch]

    def __iter__(self):
        return iter(range(len(self) - 1, -1, -1))


@pytest.mark.timeout(60)
def test_a_sampler_order_of_another_length_is_read_whole_never_a_stale_one():
    lengths = [8, 4, 12, 6]
    sampler = VaryingSampler(lengths)
    loader = EchoingDataLoader(Numbers(12), batch_size=2, sampler=sampler, num_workers=1,
                               persistent_workers=True, seed=0)  # fmt: skip
    pids = []
    for epoch, n in enumerate(lengths):
        sampler.set_epoch(epoch)
        assert labels_of(loader) == list(range(n - 1, -1, -1)), f"epoch {epoch}"
        pids.append(worker_pids(loader))
    # Shorter orders fit the buffer the workers read; a longer one than any before needs a
    # new buffer, so new workers: epoch 2 only.
    assert pids[0] == pids[1] != pids[2] == pids[3]
    assert gone(pids[0])
    loader.close()
    assert gone(pids[2])


class ThreadCount(Numbers):
    """Example i's label: how many threads the process reading it runs."""

    def __getitem__(self, i: int):
        return torch.zeros(2), threading.active_count()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("echo", [{"echo_factor": 2, "read_ahead": 4},
                                  {"echo_factor": "auto"}])  # fmt: skip
def test_a_worker_runs_as_many_threads_in_its_fifth_epoch_as_in_its_first(echo):
    # 201 examples: each epoch ends on a short batch, which crosses as every batch does.
    loader = EchoingDataLoader(ThreadCount(201), batch_size=4, num_workers=1,
                               persistent_workers=True, seed=0, **echo)  # fmt: skip
    with loader:
        counts = []
        for epoch in range(6):
            it = iter(loader)
            counts.append(max(labels_of([next(it)])))
            if epoch == 3:
                assert len(list(it)) > 0  # one epoch read to its end
            del it  # the others dropped mid-epoch, their pipeline mid-read in the worker
        pids = worker_pids(loader)
    # Epoch 0 may read before the worker's queue feeder thread starts (with its first send).
    assert counts[1:] == [counts[1]] * 5 and counts[0] <= counts[1], counts
    assert counts[1] >= 3  # the worker's own thread, its queue's, its read-ahead or reader...
    assert gone(pids)


@pytest.mark.timeout(60)
def test_auto_with_persistent_workers_delivers_every_example_each_epoch():
    loader = EchoingDataLoader(Numbers(64), batch_size=4, echo_factor="auto", num_workers=2,
                               persistent_workers=True, shuffle=True, seed=2)  # fmt: skip
    with loader:
        for epoch in range(3):
            assert set(labels_of(loader)) == set(range(64)), epoch
            assert loader.stats.fresh_examples == 64 * (epoch + 1)


@pytest.mark.timeout(60)
def test_an_iterable_dataset_is_iterated_anew_each_epoch_by_the_same_workers():
    loader = EchoingDataLoader(NumberStream(40), batch_size=5, echo_factor=2, num_workers=2,
                               persistent_workers=True, seed=0)  # fmt: skip
    with loader:
        pids = set()
        for epoch in range(3):
            assert collections.Counter(labels_of(loader)) == {i: 2 for i in range(40)}, epoch
            pids.add(tuple(worker_pids(loader)))
    assert len(pids) == 1 and loader.stats.fresh_examples == 120


@pytest.mark.timeout(60)
def test_workers_stop_at_close_and_exit_and_start_again_for_the_next_epoch():
    before = set(threading.enumerate())
    want, _ = run_epochs("shuffle", persistent=False, epochs=2)
    loader = EchoingDataLoader(Numbers(30), batch_size=4, num_workers=2, seed=9,
                               persistent_workers=True, **CASES["shuffle"])  # fmt: skip
    assert loader.persistent_workers is True and loader._inner.persistent_workers is True
    with loader:
        assert_same_stream(list(loader), want[0], "epoch 0")
        first = worker_pids(loader)
        assert all(alive(p) for p in first)  # between epochs
    assert gone(first)
    assert_same_stream(list(loader), want[1], "epoch 1, new workers")
    second = worker_pids(loader)
    assert set(second).isdisjoint(first)
    loader.close()
    assert gone(second) and multiprocessing.active_children() == []
    # The queues' feeder threads finish flushing shortly after the workers stop.
    assert wait_until(lambda: set(threading.enumerate()) - before == set())


@pytest.mark.timeout(60)
def test_load_state_dict_starts_new_workers_that_resume_exactly():
    def make():
        return EchoingDataLoader(Numbers(30), batch_size=4, num_workers=2, seed=9,
                                 persistent_workers=True, **CASES["before_augment"])  # fmt: skip

    want, _ = run_epochs("before_augment", persistent=False, epochs=2)
    loader = make()
    assert_same_stream(list(loader), want[0], "epoch 0")
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    pids = worker_pids(loader)
    state = loader.state_dict()
    loader.load_state_dict(state)  # the same loader: its workers stop, new ones resume
    assert gone(pids)
    assert_same_stream(head + list(loader), want[1], "epoch 1, resumed")
    assert set(worker_pids(loader)).isdisjoint(pids)
    loader.close()


class FailsAtRead(Numbers):
    """``Numbers`` whose ``at``-th read in a process fails (a persistent worker's copy counts
    the reads of every epoch)."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at, self.reads = at, 0

    def __getitem__(self, i: int):
        self.reads += 1
        if self.reads == self.at:
            raise ValueError(f"read {i} failed")
        return super().__getitem__(i)


@pytest.mark.timeout(60)
def test_a_failure_in_a_later_epoch_reaches_the_loop_and_the_next_epoch_has_new_workers():
    loader = EchoingDataLoader(FailsAtRead(40, 50), batch_size=4, num_workers=1,
                               persistent_workers=True)  # fmt: skip
    assert labels_of(loader) == list(range(40))
    pids = worker_pids(loader)
    with pytest.raises(ValueError, match="read 9 failed"):
        list(loader)
    assert gone(pids)  # the inner iterator's state is unknown after a failure
    assert labels_of(loader) == list(range(40))  # a new worker, whose copy counts anew
    assert worker_pids(loader) != pids
    loader.close()


@pytest.mark.timeout(60)
def test_workers_outlive_a_dropped_iterator_and_go_with_the_last_holder():
    loader = EchoingDataLoader(Numbers(400), batch_size=2, num_workers=2, echo_factor=2,
                               persistent_workers=True)  # fmt: skip
    it = iter(loader)
    next(it)
    pids = worker_pids(loader)
    del it
    gc.collect()
    assert all(alive(p) for p in pids)  # kept for the next epoch
    assert len(labels_of(loader)) == 800 and worker_pids(loader) == pids
    start = time.monotonic()
    del loader
    assert time.monotonic() - start < 1.0 and gone(pids)
    # A loader dropped at once (``for batch in EchoingDataLoader(...)``): its iterator holds
    # the workers to the epoch's end, then lets them go.
    it = iter(EchoingDataLoader(Numbers(40), batch_size=4, num_workers=2,
                                persistent_workers=True))  # fmt: skip
    gc.collect()
    assert len(labels_of(it)) == 40
    del it
    assert wait_until(lambda: multiprocessing.active_children() == [], timeout=1.0)


@pytest.mark.timeout(60)
def test_a_loader_in_a_reference_cycle_stops_its_workers_without_the_join_timeout():
    class Trainer:
        pass

    trainer = Trainer()
    trainer.me = trainer  # a cycle of the user's own: only the garbage collector frees it
    trainer.loader = EchoingDataLoader(Numbers(400), batch_size=2, num_workers=2,
                                       persistent_workers=True)  # fmt: skip
    list(trainer.loader)
    pids = worker_pids(trainer.loader)
    del trainer
    start = time.monotonic()
    gc.collect()
    assert time.monotonic() - start < 3.0  # 3 s leaves room for a loaded machine
    assert gone(pids, timeout=3.0)


@pytest.mark.timeout(120)
def test_spawned_persistent_workers_read_each_epochs_fields():
    # A plain list: the spawned worker imports torch and dataecho, not the test modules.
    data = [(torch.full((2,), float(i)), i) for i in range(16)]

    def epochs(**kwargs):
        loader = EchoingDataLoader(data, batch_size=4, num_workers=1, seed=4, shuffle=True,
                                   echo_factor=1.5, **kwargs)  # fmt: skip
        with loader:
            return [list(loader) for _ in range(2)]

    want = epochs()
    got = epochs(persistent_workers=True, multiprocessing_context="spawn")
    assert labels_of(want[0]) != labels_of(want[1])  # each epoch's order and copies
    for epoch in range(2):
        assert_same_stream(got[epoch], want[epoch], f"epoch {epoch}")


def test_persistent_workers_need_workers():
    with pytest.raises(ValueError, match=r"persistent_workers=True needs num_workers > 0 .*"
                       r"pass num_workers=1 or more"):  # fmt: skip
        EchoingDataLoader(Numbers(4), batch_size=2, persistent_workers=True)
