"""EchoingDataLoader keeps torch.utils.data.DataLoader's contract (and StatefulDataLoader's for
state) wherever echoing does not force a difference: signature, attributes, ``len``, samplers,
seeds, ranks, several iterators, dataset state, exact accounting."""

from __future__ import annotations

import gc
import itertools
import json
import math
import multiprocessing
import os
import socket
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import Numbers, alive, run_test_save_load_state, torch_roundtrip
from test_loader import NumberStream, add_noise, labels_of
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from dataecho import EchoingDataLoader, adaptive_echo, stochastic_echo
from dataecho._validate import CPU_COUNT, MAX_BATCH, MAX_BUFFER, MAX_WORKERS
from dataecho.loader.echoing_loader import EpochHook
from dataecho.loader.options import MAX_PREFETCH, MAX_PREFETCH_FACTOR
from dataecho.stages import MixExamples, Shuffle

WHERES = ("before_augment", "after_augment", "batch", "device")


def test_positional_arguments_and_attributes_are_dataloaders():
    ds = Numbers(10)
    loader = EchoingDataLoader(ds, 4, False, None, None, 0, None, False, True)
    plain = DataLoader(ds, 4, False, None, None, 0, None, False, True)
    for name in ("dataset", "batch_size", "drop_last", "num_workers", "pin_memory", "timeout"):
        assert getattr(loader, name) == getattr(plain, name), name
    # batch_sampler: where frameworks call set_epoch (see test_frameworks_set_epoch.py).
    assert loader.sampler is None and isinstance(loader.batch_sampler, EpochHook)
    assert loader.generator is None and loader.persistent_workers is False
    assert loader.prefetch_factor is None and loader.collate_fn is not None
    assert len(loader) == len(plain) == 2
    assert labels_of(loader) == labels_of(plain) == list(range(8))
    assert EchoingDataLoader(ds).batch_size == 1  # DataLoader's default
    kept = EchoingDataLoader(ds, 4, num_workers=1, persistent_workers=True)
    plain = DataLoader(ds, 4, num_workers=1, persistent_workers=True)
    assert kept.persistent_workers is plain.persistent_workers is True
    assert labels_of(kept) == labels_of(kept) == labels_of(plain) == list(range(10))
    kept.close()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("factor", [1, 3, 1.7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_is_the_number_of_batches_an_epoch_yields(num_workers, where, factor, drop_last):
    loader = EchoingDataLoader(
        Numbers(23), batch_size=4, echo_factor=factor, where=where, num_workers=num_workers,
        drop_last=drop_last, shuffle=True, shuffle_buffer=5, seed=7,
        transform=add_noise,  # as a run augments, so that before_augment's copies differ
    )  # fmt: skip
    expected = len(loader)  # read once, before the first epoch, as a trainer does
    for _ in range(3 if factor != int(factor) else 2):  # each epoch its own extra copies
        assert len(list(loader)) == expected == len(loader)


def test_len_of_auto_is_an_upper_bound_and_of_iterables_follows_dataloader():
    auto = EchoingDataLoader(
        Numbers(20), batch_size=4, echo_factor="auto", where="after_augment", max_echo_factor=3
    )
    assert len(auto) == 15 and len(list(auto)) <= 15
    with pytest.raises(TypeError, match="without __len__"):
        len(EchoingDataLoader(NumberStream(8), batch_size=4))

    class Sized(NumberStream):
        def __len__(self) -> int:
            return self.n

    assert len(EchoingDataLoader(Sized(10), batch_size=4, echo_factor=2)) == 5
    assert len(EchoingDataLoader(Sized(10), batch_size=4)) == len(DataLoader(Sized(10), 4))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_decides_which_examples_an_epoch_reads(num_workers):
    indices = [3, 17, 5, 11, 2, 8, 13]
    loader = EchoingDataLoader(
        Numbers(20), batch_size=2, sampler=SubsetRandomSampler(indices), echo_factor=2,
        where="after_augment", num_workers=num_workers, seed=0,
    )  # fmt: skip
    got = labels_of(loader)
    assert sorted(got) == sorted(indices * 2)  # each read once, echoed twice
    assert loader.stats.fresh_examples == 7 and loader.stats.examples_out == 14
    weighted = WeightedRandomSampler([0.0] * 10 + [1.0] * 10, num_samples=12)
    loader = EchoingDataLoader(Numbers(20), batch_size=4, sampler=weighted, seed=0)
    assert len(loader) == 3 and all(y >= 10 for y in labels_of(loader))


def test_distributed_sampler_is_honoured_and_set_epoch_changes_the_order():
    def epoch_labels(rank: int, epoch: int) -> list[int]:
        sampler = DistributedSampler(Numbers(16), num_replicas=2, rank=rank, seed=1)
        sampler.set_epoch(epoch)
        loader = EchoingDataLoader(Numbers(16), batch_size=4, sampler=sampler, num_workers=2)
        return labels_of(loader)

    ranks = [epoch_labels(0, 0), epoch_labels(1, 0)]
    assert [len(r) for r in ranks] == [8, 8]  # the sampler's share, not split again
    assert sorted(ranks[0] + ranks[1]) == list(range(16))
    assert sorted(epoch_labels(0, 1)) != sorted(ranks[0])  # set_epoch: a new share


@pytest.mark.parametrize("source", ["generator", "manual_seed"])
def test_without_a_seed_generator_or_torch_seed_make_runs_reproducible(source):
    def run(seed: int) -> list[int]:
        if source == "generator":
            kwargs = {"generator": torch.Generator().manual_seed(seed)}
        else:
            torch.manual_seed(seed)
            kwargs = {}
        loader = EchoingDataLoader(Numbers(30), batch_size=5, shuffle=True, **kwargs)
        return labels_of(loader)

    assert run(1) == run(1)
    assert run(1) != run(2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, queue) -> None:
    # What Lightning and accelerate do: a process group, but no RANK in the environment.
    os.environ.pop("RANK", None)
    os.environ["WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for use_sampler in (False, True):  # the loader's own split, then a DistributedSampler
            ds = Numbers(24)
            sampler = DistributedSampler(ds, shuffle=False) if use_sampler else None
            loader = EchoingDataLoader(ds, batch_size=3, sampler=sampler, num_workers=1, seed=0)
            queue.put((use_sampler, rank, len(loader), labels_of(loader)))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_ranks_come_from_the_process_group_without_a_rank_variable():
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=90) for _ in range(2 * len(procs)))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for use_sampler in (False, True):
        (_, _, len0, first), (_, _, len1, second) = [r for r in results if r[0] == use_sampler]
        assert len(first) == len(second) == 12 and len0 == len1 == 4, use_sampler
        assert sorted(first + second) == list(range(24)), use_sampler  # halves, never one twice


def test_bad_dataloader_arguments_are_refused_with_the_reason():
    cases = [
        ({"batch_size": None}, "batch_size=None"),
        ({"batch_sampler": [[0, 1]]}, "pass sampler= (the order"),
        ({"persistent_workers": True}, "needs num_workers > 0"),
        ({"sampler": [0, 1], "shuffle": True}, "mutually exclusive"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(")):
            EchoingDataLoader(Numbers(4), **kwargs)
    with pytest.raises(ValueError, match="iterable dataset decides its own order"):
        EchoingDataLoader(NumberStream(4), batch_size=2, shuffle=True)


def test_a_huge_echo_factor_keeps_a_bounded_prefetch():
    loader = EchoingDataLoader(
        Numbers(4), batch_size=2, echo_factor=1e6, where="after_augment", num_workers=1
    )
    assert loader.prefetch_factor == MAX_PREFETCH
    it = iter(loader)
    assert labels_of(itertools.islice(it, 3)) == [0, 0, 0, 0, 0, 0]
    loader.close()


def test_a_new_iterator_ends_the_previous_one_with_a_clear_error():
    loader = EchoingDataLoader(Numbers(12), batch_size=2, num_workers=1)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(first)
    assert len(list(second)) == 6


def test_state_survives_the_iterator_being_dropped_mid_epoch():
    loader = EchoingDataLoader(Numbers(12), batch_size=2, shuffle=True, seed=3)
    want = labels_of(EchoingDataLoader(Numbers(12), batch_size=2, shuffle=True, seed=3))
    for i, _ in enumerate(loader):
        if i == 2:
            break
    gc.collect()
    resumed = EchoingDataLoader(Numbers(12), batch_size=2, shuffle=True, seed=3)
    resumed.load_state_dict(torch_roundtrip(loader.state_dict()))
    assert labels_of(resumed) == want[6:]


def _worker_pids(loader) -> list[int]:
    it = loader._iterator
    return [w.pid for w in it.root._it._workers]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("drop", ["loader", "iterator"])
def test_dropping_a_loader_mid_epoch_releases_its_workers_within_a_second(drop):
    loader = EchoingDataLoader(
        Numbers(400), batch_size=2, num_workers=2, echo_factor=2, where="after_augment"
    )
    it = iter(loader)
    next(it)
    pids = _worker_pids(loader)
    start = time.monotonic()
    if drop == "loader":
        del it, loader
    else:
        del it
    assert time.monotonic() - start < 1.0
    deadline = time.monotonic() + 1.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in pids)


class SelfIterating(IterableDataset):
    """A dataset that is its own iterator and builds its position in ``__iter__``, with
    StatefulDataLoader's state protocol (each worker yields its own residue class)."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        self.start, self.step = (info.id, info.num_workers) if info else (0, 1)
        self.pos = 0
        return self

    def __next__(self) -> int:
        value = self.start + self.pos * self.step
        if value >= self.n:
            raise StopIteration
        self.pos += 1
        return value

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_that_is_its_own_iterator_resumes_without_replay(num_workers):
    def make():
        return EchoingDataLoader(SelfIterating(100), batch_size=5, num_workers=num_workers)

    loader = make()
    it = iter(loader)
    head = [int(v) for b in itertools.islice(it, 7) for v in b]
    resumed = make()
    resumed.load_state_dict(torch_roundtrip(loader.state_dict()))
    rest = [int(v) for b in resumed for v in b]
    assert len(head) + len(rest) == 100
    assert sorted(head + rest) == list(range(100))
    assert resumed.stats.fresh_examples == 100


class CountingEpochs(Numbers):
    """A map-style dataset with state of its own: how many epochs it has been asked for."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.epochs = 0

    def state_dict(self) -> dict[str, int]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epochs = state["epochs"]


def test_a_state_saved_between_epochs_keeps_the_datasets_own_state():
    ds = CountingEpochs(6)
    loader = EchoingDataLoader(ds, batch_size=3)
    list(loader)
    ds.epochs = 5
    state = torch_roundtrip(loader.state_dict())
    fresh = CountingEpochs(6)
    resumed = EchoingDataLoader(fresh, batch_size=3)
    resumed.load_state_dict(state)
    assert labels_of(resumed) == list(range(6)) and fresh.epochs == 5
    assert resumed.epoch == 1


def test_a_second_load_state_dict_wins_and_state_before_iteration_is_handed_on():
    def make():
        return EchoingDataLoader(
            Numbers(20), batch_size=2, shuffle=True, seed=4, echo_factor=2, where="after_augment"
        )

    want = labels_of(make())
    states = []
    for k in (3, 8):
        loader = make()
        it = iter(loader)
        for _ in range(k):
            next(it)
        states.append(torch_roundtrip(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(states[0])
    resumed.load_state_dict(states[1])
    handed_on = torch_roundtrip(resumed.state_dict())
    assert labels_of(resumed) == want[16:]
    again = make()
    again.load_state_dict(handed_on)
    assert labels_of(again) == want[16:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_with_a_shuffle_buffer_counts_only_delivered_examples(num_workers):
    loader = EchoingDataLoader(
        Numbers(600), batch_size=32, echo_factor=2, where="after_augment", shuffle_buffer=64,
        drop_last=True, num_workers=num_workers, seed=3, shuffle=True,
    )  # fmt: skip
    for _ in range(2):
        fresh, out = loader.stats.fresh_examples, loader.stats.examples_out
        labels = labels_of(loader)
        assert loader.stats.fresh_examples - fresh == len(set(labels))
        assert loader.stats.examples_out - out == len(labels)
        assert len(set(labels)) <= 600


class SlowNumbers(Numbers):
    def __getitem__(self, i: int):
        time.sleep(0.0005)
        return super().__getitem__(i)


def noise(example):
    x, y = example
    return x + torch.rand(x.shape), y


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["after_augment", "before_augment"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_auto_with_a_shuffle_buffer_resumes_without_loss_and_with_the_right_counts(
    num_workers, where
):
    def make():
        return EchoingDataLoader(
            SlowNumbers(400), batch_size=8, echo_factor="auto", where=where,
            shuffle_buffer=64, num_workers=num_workers, seed=1, shuffle=True, transform=noise,
        )  # fmt: skip

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(20)]
    state = torch_roundtrip(loader.state_dict())
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    labels = labels_of(head + rest)
    assert set(labels) == set(range(400))  # every example delivered
    assert resumed.stats.fresh_examples == 400  # and counted once
    assert resumed.stats.examples_out == len(labels)
    assert math.isclose(resumed.stats.realized_factor, len(labels) / 400)


@pytest.mark.timeout(60)
def test_a_loader_inside_a_reference_cycle_is_collected_without_the_workers_join_timeout():
    class Trainer:
        pass

    trainer = Trainer()
    trainer.me = trainer  # a cycle of the user's own: only the garbage collector frees it
    trainer.loader = EchoingDataLoader(
        Numbers(400), batch_size=2, num_workers=2, echo_factor=2, where="after_augment"
    )
    trainer.it = iter(trainer.loader)
    next(trainer.it)
    pids = _worker_pids(trainer.loader)
    del trainer
    # Without the finalizer, collecting the cycle waits out the workers' 10 s join timeout;
    # with it, a fraction of a second (3 s leaves room for a loaded machine).
    start = time.monotonic()
    gc.collect()
    assert time.monotonic() - start < 3.0
    deadline = time.monotonic() + 3.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize(
    ("kwargs", "name", "ceiling"),
    [({"num_workers": 2**64}, "num_workers", MAX_WORKERS),
     ({"num_workers": MAX_WORKERS + 1}, "num_workers", MAX_WORKERS),
     ({"num_workers": 1, "prefetch_factor": 2**64}, "prefetch_factor", MAX_PREFETCH_FACTOR),
     ({"shuffle_buffer": MAX_BUFFER + 1}, "shuffle_buffer", MAX_BUFFER),
     ({"echo_factor": "auto", "reuse_buffer": 2**64}, "reuse_buffer", MAX_BUFFER),
     ({"echo_factor": 2, "read_ahead": 2**64}, "read_ahead", MAX_BUFFER),
     ({"batch_size": MAX_BATCH + 1}, "batch_size", MAX_BATCH)],
)  # fmt: skip
def test_a_count_past_its_ceiling_is_refused_before_a_worker_starts(kwargs, name, ceiling):
    start = time.perf_counter()
    with pytest.raises(
        ValueError, match=rf"{name} must be an integer in [01]\.\.{ceiling}( or 'default')?, got"
    ):
        EchoingDataLoader(Numbers(10), **{"batch_size": 2, **kwargs})
    assert time.perf_counter() - start < 1.0 and multiprocessing.active_children() == []


def test_the_worker_ceiling_names_the_cpu_count_and_is_itself_accepted():
    with pytest.raises(ValueError, match=rf"this machine has {CPU_COUNT} CPU cores"):
        EchoingDataLoader(Numbers(10), batch_size=2, num_workers=2**64)
    with pytest.warns(UserWarning, match="worker processes in total"):  # DataLoader's own
        loader = EchoingDataLoader(Numbers(10), batch_size=2, num_workers=MAX_WORKERS,
                                   prefetch_factor=MAX_PREFETCH_FACTOR)  # fmt: skip
    assert loader.num_workers == MAX_WORKERS  # no worker starts before iteration


@pytest.mark.parametrize(
    "make",
    [lambda n: Shuffle(range(3), n),
     lambda n: MixExamples(range(3), n),
     lambda n: stochastic_echo(range(3), load_prob=0.5, buffer_size=n),
     lambda n: adaptive_echo(range(3), max_factor=2, buffer_size=n),
     lambda n: adaptive_echo(range(3), max_factor=2, queue_size=n)],
)  # fmt: skip
def test_a_stage_buffer_past_its_ceiling_is_refused(make):
    with pytest.raises(
        ValueError, match=rf"must be an integer in [01]\.\.{MAX_BUFFER}, got {2**64}"
    ):
        make(2**64)
    make(MAX_BUFFER)  # the ceiling itself: a buffer fills as items come, nothing is allocated


def json_roundtrip(state: Any) -> Any:
    """``state`` after ``json.dumps`` / ``json.loads``, as torchdata's own tests take it."""
    return json.loads(json.dumps(state))


@pytest.mark.parametrize(
    ("where", "factor", "buffer"),
    [("before_augment", 2.5, 0), ("after_augment", 2, 16), ("batch", 2, 0), ("batch", 3, 4)],
)
@pytest.mark.filterwarnings("ignore:.*the copies of each example are identical")
def test_a_state_over_plain_examples_survives_json_and_resumes_exactly(where, factor, buffer):
    # dataecho's own bookkeeping is numbers and lists: over examples that are ints (batches
    # kept as lists, so that a batch held for its copies is JSON too), the whole state is
    # JSON, and a loader restored from its JSON copy goes on exactly.
    def make() -> EchoingDataLoader:
        return EchoingDataLoader(list(range(30)), batch_size=4, echo_factor=factor, seed=0,
                                 where=where, shuffle=True, shuffle_buffer=buffer,
                                 collate_fn=list)  # fmt: skip

    run_test_save_load_state(
        make, positions=[0, 3, 10], roundtrip=False,
        restore=lambda loader, state: loader.load_state_dict(json_roundtrip(state)),
        new_epoch=lambda loader: None, end_may_start_next_epoch=True,
    )  # fmt: skip


def tensors_in(state: Any, path: str = "") -> list[str]:
    """Where ``state`` holds tensors."""
    if isinstance(state, dict):
        return [p for k, v in state.items() for p in tensors_in(v, f"{path}/{k}")]
    if isinstance(state, (list, tuple)):
        return [p for i, v in enumerate(state) for p in tensors_in(v, f"{path}[{i}]")]
    return [path] if isinstance(state, torch.Tensor) else []


@pytest.mark.parametrize("buffer", [0, 16])
def test_on_the_device_only_the_users_batches_are_tensors_in_the_state(buffer):
    # The batches held for their copies are the user's data, on the device as tensors; the
    # augmentation's batch number and the pool's bookkeeping are plain numbers and lists.
    loader = EchoingDataLoader(list(range(30)), batch_size=4, echo_factor=2.5, seed=0,
                               where="device", echo_device="cpu", shuffle_buffer=buffer)  # fmt: skip
    it = iter(loader)
    for _ in range(5):
        next(it)
        state = loader.state_dict()
        assert all(p.rsplit("/", 1)[-1] in ("data", "pool") for p in tensors_in(state)), tensors_in(
            state
        )
        assert isinstance(state["root"]["batches"], int)
    loader.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_seed_of_any_size_runs_and_resumes(workers):
    # torch's generators take 63 bits; the pipeline's seeds derive from the whole seed.
    def make() -> EchoingDataLoader:
        return EchoingDataLoader(list(range(12)), batch_size=4, echo_factor=2, seed=2**64 + 5,
                                 where="after_augment",
                                 num_workers=workers, shuffle=True)  # fmt: skip

    loader = make()
    it = iter(loader)
    next(it)
    state = torch_roundtrip(loader.state_dict())
    rest = [b.tolist() for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    assert sorted(i for b in make() for i in b.tolist()) == sorted(list(range(12)) * 2)
