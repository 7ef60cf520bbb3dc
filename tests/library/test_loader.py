"""EchoingDataLoader: insertion points, counts, workers, epochs, resume, copies and errors."""

from __future__ import annotations

import collections
import dataclasses
import gc
import multiprocessing
import threading
import time
import traceback

import pytest
import torch
from conftest import Numbers, assert_same_item, run_test_save_load_state, torch_roundtrip
from torch.utils.data import IterableDataset, get_worker_info

from dataecho import EchoingDataLoader, LoaderOptions

WHERES = ("before_augment", "after_augment", "batch", "device")


class NumberStream(IterableDataset):
    """The same examples as an iterable dataset that splits itself between workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, self.n, step):
            yield torch.full((3,), float(i)), i


def add_noise(example):
    """A random augmentation drawing from torch's global RNG, as torchvision's do."""
    x, y = example
    return x + torch.rand(x.shape), y


def labels_of(batches) -> list[int]:
    return [int(y) for _, ys in batches for y in ys]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("where", WHERES)
def test_every_example_delivered_exactly_factor_times(where, num_workers):
    loader = EchoingDataLoader(
        Numbers(50),
        batch_size=4,
        echo_factor=3,
        where=where,
        shuffle_buffer=7,
        num_workers=num_workers,
        seed=1,
        shuffle=True,
        transform=add_noise,
    )
    batches = list(loader)
    counts = collections.Counter(labels_of(batches))
    assert counts == {i: 3 for i in range(50)}
    s = loader.stats
    assert s.batches == len(batches)
    assert s.fresh_examples == 50
    assert s.examples_out == 150
    assert s.realized_factor == 3.0
    assert s.echoed_examples == 100
    assert s.wait_seconds > 0


def test_iterable_dataset_with_workers_reads_each_example_once():
    loader = EchoingDataLoader(
        NumberStream(40), batch_size=5, echo_factor=2, where="after_augment", num_workers=2, seed=0
    )
    assert collections.Counter(labels_of(loader)) == {i: 2 for i in range(40)}
    assert loader.stats.fresh_examples == 40


def test_fractional_factor_counts_add_up():
    loader = EchoingDataLoader(
        Numbers(2000), batch_size=50, echo_factor=2.5, where="after_augment", seed=4
    )
    counts = collections.Counter(labels_of(loader))
    assert set(counts) == set(range(2000))
    assert collections.Counter(counts.values()) == {2: 1000, 3: 1000}  # exactly half get 3
    assert loader.stats.examples_out == sum(counts.values()) == 5000
    assert loader.stats.realized_factor == 2.5


class CountingTransform:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, example):
        self.calls += 1
        return add_noise(example)


@pytest.mark.parametrize(
    ("where", "expected_calls"), [("before_augment", 80), ("after_augment", 20), ("batch", 20)]
)
def test_transform_calls_per_insertion_point(where, expected_calls):
    transform = CountingTransform()
    loader = EchoingDataLoader(
        Numbers(20), batch_size=4, echo_factor=4, where=where, transform=transform, seed=0
    )
    batches = list(loader)
    assert transform.calls == expected_calls
    assert loader.stats.examples_out == 80 and loader.stats.fresh_examples == 20
    values = collections.defaultdict(set)
    for xs, ys in batches:
        for x, y in zip(xs, ys, strict=True):
            values[int(y)].add(tuple(x.tolist()))
    distinct = {len(v) for v in values.values()}
    # Before augmentation every copy is augmented on its own; after it, copies are identical.
    assert distinct == ({4} if where == "before_augment" else {1})


def test_batch_echoing_repeats_whole_batches():
    loader = EchoingDataLoader(Numbers(24), batch_size=4, echo_factor=2, where="batch", seed=0)
    batches = [ys.tolist() for _, ys in loader]
    assert len(batches) == 12
    assert batches[0::2] == batches[1::2]  # no shuffle: copies adjacent
    assert sorted(sum(batches[0::2], [])) == list(range(24))


def test_batch_echoing_with_shuffle_spreads_copies():
    loader = EchoingDataLoader(
        Numbers(80), batch_size=4, echo_factor=2, where="batch", shuffle_buffer=32, seed=0
    )
    batches = [tuple(ys.tolist()) for _, ys in loader]
    assert collections.Counter(batches) == {b: 2 for b in set(batches)}
    adjacent = sum(a == b for a, b in zip(batches, batches[1:], strict=False))
    assert adjacent < len(batches) // 4


def stream(loader) -> list[tuple[list[float], list[int]]]:
    return [(xs.flatten().tolist(), ys.tolist()) for xs, ys in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_seed_same_stream_different_seed_different_stream(num_workers):
    def make(seed):
        return EchoingDataLoader(
            Numbers(30),
            batch_size=4,
            echo_factor=2.5,
            shuffle_buffer=6,
            transform=add_noise,
            num_workers=num_workers,
            seed=seed,
            shuffle=True,
        )

    assert stream(make(7)) == stream(make(7))
    assert stream(make(7)) != stream(make(8))


def test_each_epoch_has_a_new_order_and_new_augmentations():
    loader = EchoingDataLoader(
        Numbers(30),
        batch_size=5,
        echo_factor=2,
        shuffle_buffer=8,
        transform=add_noise,
        seed=3,
        shuffle=True,
    )
    first, second = stream(loader), stream(loader)
    assert [y for _, ys in first for y in ys] != [y for _, ys in second for y in ys]
    assert loader.epoch == 1
    assert loader.stats.fresh_examples == 60


def test_workers_get_distinct_seeds():
    zeros = [(torch.zeros(4), 0) for _ in range(16)]
    loader = EchoingDataLoader(zeros, batch_size=8, transform=add_noise, num_workers=2, seed=5)
    a, b = [xs for xs, _ in loader]
    assert not torch.equal(a, b)


def test_loader_does_not_disturb_the_callers_random_state():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    list(EchoingDataLoader(Numbers(12), batch_size=4, transform=add_noise, seed=0))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    ("where", "num_workers"),
    [
        ("before_augment", 0),
        ("after_augment", 0),
        ("batch", 0),
        ("before_augment", 2),
        ("batch", 2),
        ("device", 2),
    ],
)
def test_resume_at_every_position(where, num_workers):
    def make():
        return EchoingDataLoader(
            Numbers(14),
            batch_size=3,
            echo_factor=1.5,
            where=where,
            shuffle_buffer=4,
            transform=add_noise,
            num_workers=num_workers,
            seed=11,
            shuffle=True,
        )

    positions = range(0, 9) if num_workers == 0 else [0, 2, 5]
    recorded = run_test_save_load_state(
        make,
        positions=positions,
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        # A state taken after an epoch's last batch resumes into the next epoch.
        end_may_start_next_epoch=True,
    )
    assert all(len(epoch) >= 5 for epoch in recorded)  # 5 fresh batches at least


@pytest.mark.timeout(120)
def test_resume_between_worker_snapshots_replays_exactly():
    # shuffle_buffer // batch_size = 3 batches between worker snapshots: a resume in between
    # replays the worker from its last snapshot and must still continue exactly.
    def make():
        return EchoingDataLoader(
            Numbers(24),
            batch_size=3,
            echo_factor=2,
            shuffle_buffer=9,
            transform=add_noise,
            num_workers=2,
            seed=2,
            shuffle=True,
        )

    assert make()._inner.snapshot_every_n_steps == 3
    run_test_save_load_state(
        make,
        epochs=1,
        positions=[1, 4, 8],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
    )


def test_state_before_iteration_and_between_epochs():
    def make():
        return EchoingDataLoader(
            Numbers(10), batch_size=4, echo_factor=2, where="after_augment", seed=1, shuffle=True
        )

    loader = make()
    list(loader)
    state = loader.state_dict()  # between epochs: the next iter() starts epoch 1
    expected = stream(loader)
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict()["root"] is None
    assert stream(resumed) == expected
    assert resumed.epoch == 1


# Which state load_state_dict gets: (full epochs run before it is taken, batches after them).
LOADED_STATES = {"before iteration": (0, 0), "mid-epoch": (0, 3), "end of epoch": (1, 0)}


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("loaded", sorted(LOADED_STATES))
def test_load_state_dict_on_a_live_loader_supersedes_its_iterator(loaded, num_workers):
    def make():
        return EchoingDataLoader(Numbers(12), batch_size=2, echo_factor=2, shuffle=True,
                                 where="after_augment", seed=3,
                                 num_workers=num_workers)  # fmt: skip

    reference = make()
    want = [labels_of(reference) for _ in range(3)]
    epochs, k = LOADED_STATES[loaded]
    saved = make()
    for _ in range(epochs):
        list(saved)
    it = iter(saved)
    for _ in range(k):
        next(it)
    state = torch_roundtrip(saved.state_dict())
    saved.close()

    loader = make()  # live: in epoch 1, its iterator mid-epoch
    list(loader)
    live = iter(loader)
    live_head = [next(live) for _ in range(2)]
    assert live_head
    loader.load_state_dict(state)
    assert_same_item(loader.state_dict(), state, "state_dict() after load_state_dict")
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(live)
    # The next iter() starts where the loaded state says: in its epoch at its batch, or the
    # epoch after a state taken between epochs.
    assert labels_of(loader) == want[epochs][2 * k :]  # batches of 2 examples
    assert loader.epoch == epochs
    assert labels_of(loader) == want[epochs + 1]


def test_load_state_dict_forgets_the_position_of_a_dropped_iterator():
    def make():
        return EchoingDataLoader(Numbers(12), batch_size=2, shuffle=True, seed=3)

    initial = torch_roundtrip(make().state_dict())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    del it  # dropped mid-epoch: state_dict() would still hold its position
    gc.collect()
    assert head and loader.state_dict()["root"] is not None
    loader.load_state_dict(initial)
    assert_same_item(loader.state_dict(), initial, "state_dict() after load_state_dict")
    assert labels_of(loader) == labels_of(make()) and loader.epoch == 0


def epoch_loader(num_workers: int = 0) -> EchoingDataLoader:
    # A fractional factor: each epoch draws which items get the extra copy, and its order.
    return EchoingDataLoader(
        Numbers(13), batch_size=3, echo_factor=1.5, shuffle=True, shuffle_buffer=4,
        transform=add_noise, seed=3, num_workers=num_workers,
    )  # fmt: skip


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_makes_the_next_iter_run_that_epoch(num_workers):
    plain = epoch_loader(num_workers)
    epochs = []
    for _ in range(3):
        expected = len(plain)
        epochs.append(stream(plain))
        assert len(epochs[-1]) == expected
    assert len({repr(e) for e in epochs}) == 3  # each epoch its own draws
    loader = epoch_loader(num_workers)
    loader.set_epoch(2)
    assert loader.epoch == 1 and len(loader) == len(epochs[2])
    assert stream(loader) == epochs[2] and loader.epoch == 2
    loader.set_epoch(0)  # back to an earlier epoch: its order again
    assert stream(loader) == epochs[0]
    # As a framework calls it, before each epoch: the epochs a plain loop gets.
    loader = epoch_loader(num_workers)
    for e in range(3):
        loader.set_epoch(e)
        assert stream(loader) == epochs[e]
    state = loader.state_dict()
    loader.set_epoch(1)  # between epochs the state follows: the next iter() runs epoch 1
    assert loader.state_dict()["epoch"] == 0 and state["epoch"] == 2
    with pytest.raises(ValueError, match=r"epoch must be >= 0, got -1"):
        loader.set_epoch(-1)


def test_set_epoch_ends_an_epoch_being_iterated_as_a_new_iter_does():
    plain = epoch_loader()
    stream(plain)
    second = stream(plain)
    loader = epoch_loader()
    it = iter(loader)
    next(it)
    loader.set_epoch(1)
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(it)
    assert loader.state_dict()["root"] is None  # the epoch left behind holds no position
    assert stream(loader) == second
    # An iterator made but not started yet runs the epoch set (its epoch starts lazily).
    loader = epoch_loader()
    it = iter(loader)
    loader.set_epoch(1)
    assert stream(it) == second


def test_set_epoch_over_a_loaded_position_continues_it_or_refuses():
    plain = epoch_loader()
    epochs = [stream(plain) for _ in range(2)]
    loader = epoch_loader()
    list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    mid_epoch_1 = torch_roundtrip(loader.state_dict())
    del it, head
    resumed = epoch_loader()
    resumed.load_state_dict(mid_epoch_1)
    resumed.set_epoch(1)  # the epoch it holds: continues it
    assert stream(resumed) == epochs[1][2:]

    resumed = epoch_loader()
    resumed.load_state_dict(mid_epoch_1)
    with pytest.raises(
        ValueError, match=r"set_epoch\(3\) on a loader that holds a loaded position in epoch 1"
    ):
        resumed.set_epoch(3)
    resumed.set_epoch(2)  # epoch 1 has batches left: the first next() says so
    with pytest.raises(RuntimeError, match=r"has batches of that epoch left: call set_epoch\(1\)"):
        next(iter(resumed))
    state = resumed.state_dict()  # still the loaded position; the counts unchanged
    assert_same_item(state["root"], mid_epoch_1["root"], "the position after the refusal")
    for count in ("fresh_examples", "examples_out", "batches"):
        assert state["stats"][count] == mid_epoch_1["stats"][count]
    resumed.set_epoch(1)  # still loaded, counts and all: continues exactly
    assert stream(resumed) == epochs[1][2:]
    assert resumed.stats.batches == len(epochs[0]) + len(epochs[1])


def test_set_epoch_after_a_position_saved_at_an_epochs_last_batch_runs_the_next_epoch():
    # A framework that stops at len(loader) saves before the iterator sees the end.
    plain = epoch_loader()
    epochs = [stream(plain) for _ in range(2)]
    loader = epoch_loader()
    it = iter(loader)
    for _ in range(len(epochs[0])):
        next(it)
    at_the_end = torch_roundtrip(loader.state_dict())
    assert at_the_end["root"] is not None and at_the_end["epoch"] == 0
    resumed = epoch_loader()
    resumed.load_state_dict(at_the_end)
    resumed.set_epoch(1)
    assert stream(resumed) == epochs[1] and resumed.epoch == 1


def test_copies_never_alias_even_with_in_place_transforms():
    source = [(torch.zeros(3), i) for i in range(8)]

    def add_one_in_place(example):
        x, y = example
        x.add_(1)
        return x, y

    loader = EchoingDataLoader(source, batch_size=4, echo_factor=3, transform=add_one_in_place)
    for xs, _ in loader:
        assert torch.equal(xs, torch.ones_like(xs))
    assert all(torch.equal(x, torch.zeros(3)) for x, _ in source)


def test_copy_false_shares_the_objects():
    source = [(torch.zeros(3), i) for i in range(4)]

    def add_one_in_place(example):
        example[0].add_(1)
        return example

    loader = EchoingDataLoader(
        source,
        batch_size=2,
        echo_factor=2,
        transform=add_one_in_place,
        copy=False,
        shuffle_buffer=0,  # each example's copies side by side, in one batch
    )
    values = [float(x[0]) for xs, _ in loader for x in xs]
    # The opt-out: both copies are one object, so each saw both in-place additions.
    assert values == [2.0] * 8
    assert all(float(x[0]) == 2.0 for x, _ in source)


def test_copies_stay_apart_under_a_custom_collate():
    source = [(torch.zeros(3), i) for i in range(4)]
    loader = EchoingDataLoader(
        source, batch_size=4, echo_factor=2, where="after_augment", collate_fn=list
    )
    for batch in loader:
        # The batch is the examples themselves: the two copies of one must be two objects.
        tensors = [x for x, _ in batch]
        assert len({id(x) for x in tensors}) == len(tensors) == 4
        for x in tensors:
            x.add_(1)
    assert all(torch.equal(x, torch.zeros(3)) for x, _ in source)


def add_noise_to_batch(batch):
    """A batch augmentation: one draw per example from torch's global RNG."""
    xs, ys = batch
    return xs + torch.rand(len(xs), 1), ys


@pytest.mark.parametrize(("where", "num_workers"), [("before_augment", 0), ("before_augment", 1),
                                                    ("batch", 0)])  # fmt: skip
def test_batch_transform_augments_every_copy_on_its_own(where, num_workers):
    def batches(seed):
        loader = EchoingDataLoader(Numbers(24), batch_size=6, echo_factor=2, where=where,
                                   shuffle_buffer=12 if where != "batch" else 0,
                                   batch_transform=add_noise_to_batch, num_workers=num_workers,
                                   seed=seed, shuffle=True)  # fmt: skip
        return list(loader)

    a, b = batches(3), batches(3)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b, strict=True))  # seeded
    noise = {}
    for xs, ys in a:
        for x, y in zip(xs, ys, strict=True):
            offset = float(x[0]) - int(y)
            assert 0 <= offset < 1 and torch.allclose(x - int(y), torch.full((3,), offset))
            noise.setdefault(int(y), []).append(offset)
    assert sorted(noise) == list(range(24)) and all(len(v) == 2 for v in noise.values())
    differ = sum(v[0] != v[1] for v in noise.values())
    # Example echoing: the copies are augmented apart; batch echoing repeats augmented batches.
    assert differ == (0 if where == "batch" else 24)


def test_resume_with_a_batch_transform_continues_its_random_stream():
    def make():
        return EchoingDataLoader(Numbers(14), batch_size=3, echo_factor=2, shuffle_buffer=4,
                                 batch_transform=add_noise_to_batch, seed=5, shuffle=True)  # fmt: skip

    run_test_save_load_state(
        make,
        positions=[0, 3, 7],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
    )


def test_batch_transform_is_refused_after_augmentation():
    with pytest.raises(ValueError, match=r"where='after_augment'.*pass the augmentation as "):
        EchoingDataLoader(Numbers(4), batch_size=2, where="after_augment", echo_factor=2,
                          batch_transform=add_noise_to_batch)  # fmt: skip
    with pytest.raises(TypeError, match="batch_transform must be a callable .*got int"):
        EchoingDataLoader(Numbers(4), batch_size=2, batch_transform=3)


class FailingDataset(Numbers):
    def __getitem__(self, i):
        if i == 9:
            raise_deep_inside(i)
        return super().__getitem__(i)


def raise_deep_inside(i):
    raise KeyError(f"record {i} is corrupt")


def test_upstream_error_reaches_consumer_with_original_traceback():
    loader = EchoingDataLoader(
        FailingDataset(20),
        batch_size=4,
        echo_factor=2,
        where="after_augment",
        seed=0,
        shuffle_buffer=0,  # no buffer to fill: batches arrive before the failing read
    )
    got = []
    with pytest.raises(KeyError, match="record 9 is corrupt") as info:
        for _, ys in loader:
            got += ys.tolist()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "raise_deep_inside" in frames
    assert sorted(set(got)) == list(range(8))  # the batches before the failure arrived


@pytest.mark.timeout(60)
def test_worker_error_has_original_traceback_and_leaves_no_process():
    loader = EchoingDataLoader(FailingDataset(40), batch_size=4, num_workers=2, seed=0)
    with pytest.raises(KeyError) as info:
        list(loader)
    message = str(info.value)
    assert "record 9 is corrupt" in message
    assert "Original Traceback" in message and "raise_deep_inside" in message
    assert multiprocessing.active_children() == []


def test_transform_error_reaches_consumer():
    def broken(example):
        raise ValueError("augmentation failed")

    with pytest.raises(ValueError, match="augmentation failed"):
        list(EchoingDataLoader(Numbers(4), batch_size=2, transform=broken))


@pytest.mark.timeout(60)
def test_close_mid_epoch_stops_workers():
    before = set(threading.enumerate())
    loader = EchoingDataLoader(Numbers(400), batch_size=4, num_workers=2, seed=0)
    it = iter(loader)
    next(it)
    assert len(multiprocessing.active_children()) == 2
    loader.close()
    assert multiprocessing.active_children() == []
    # The queues' feeder threads finish flushing shortly after the workers stop.
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"batch_size": 0}, ValueError, ["batch_size", ">= 1", "0"]),
        ({"batch_size": -3}, ValueError, ["batch_size", "-3"]),
        ({"batch_size": 2.5}, TypeError, ["batch_size", "2.5", "integer"]),
        ({"echo_factor": 0.5}, ValueError, ["echo_factor", ">= 1", "0.5"]),
        ({"echo_factor": float("nan")}, ValueError, ["echo_factor", "nan", "finite"]),
        ({"echo_factor": float("inf")}, ValueError, ["echo_factor", "inf"]),
        ({"echo_factor": "2"}, TypeError, ["echo_factor", "'2'", "str"]),
        ({"where": "middle"}, ValueError, ["where", "'middle'", "before_augment", "batch"]),
        ({"shuffle_buffer": -1}, ValueError, ["shuffle_buffer", ">= 0", "-1"]),
        ({"num_workers": -1}, ValueError, ["num_workers", "-1"]),
        ({"transform": 3}, TypeError, ["transform", "callable", "int"]),
        ({"seed": -5}, ValueError, ["seed", "-5"]),
        (
            {"persistent_workers": True},
            ValueError,
            ["persistent_workers=True", "num_workers > 0", "num_workers=1"],
        ),
    ],
)
def test_bad_arguments_name_value_range_and_fix(kwargs, error, words):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(error) as info:
        EchoingDataLoader(Numbers(4), **args)
    for word in words:
        assert word in str(info.value)


class SlowNumbers(Numbers):
    """Numbers whose every read takes ``delay`` seconds, like a slow storage read."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return super().__getitem__(i)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "num_workers"), [("after_augment", 0), ("batch", 1),
                                                    ("before_augment", 0), ("before_augment", 1)])  # fmt: skip
def test_auto_echoes_only_while_fresh_data_is_late(where, num_workers):
    # Before augmentation each copy is augmented (identical copies would be refused there).
    augment = {"transform": add_noise} if where == "before_augment" else {}
    fast = EchoingDataLoader(
        Numbers(400), batch_size=8, echo_factor="auto", where=where, num_workers=num_workers,
        **augment,
    )  # fmt: skip
    for _ in fast:
        time.sleep(0.01)  # the step is slow, upstream instant: nothing to echo
    assert fast.stats.fresh_examples == 400
    assert fast.stats.realized_factor < 1.3

    slow = EchoingDataLoader(
        SlowNumbers(64, delay=0.01),
        batch_size=8,
        echo_factor="auto",
        max_echo_factor=3,
        where=where,
        num_workers=num_workers,
        seed=0,
        **augment,
    )
    counts = collections.Counter(labels_of(slow))  # the step is instant, upstream slow
    assert set(counts) == set(range(64))  # every fresh example delivered
    assert max(counts.values()) <= 3  # never more than max_echo_factor
    assert slow.stats.fresh_examples == 64
    assert slow.stats.realized_factor > 1.5


def add_one_in_place(example):
    """Writes into its input: a copy that shared memory with another would show it."""
    x, y = example
    x.add_(1)
    return x, y


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_auto_before_augment_hands_each_copy_to_the_transform_as_its_own_object(num_workers):
    # Upstream slow, step instant: most emissions reuse an example; every copy must still
    # start from the pristine example, however often it was emitted before.
    loader = EchoingDataLoader(
        SlowNumbers(48, delay=0.01), batch_size=8, echo_factor="auto", max_echo_factor=4,
        shuffle_buffer=16, transform=add_one_in_place, num_workers=num_workers, seed=0,
    )  # fmt: skip
    batches = list(loader)
    counts = collections.Counter(labels_of(batches))
    assert set(counts) == set(range(48)) and max(counts.values()) <= 4
    assert loader.stats.realized_factor > 1.5
    for xs, ys in batches:
        assert torch.equal(xs, (ys.float() + 1)[:, None].expand_as(xs))


@pytest.mark.timeout(60)
def test_auto_close_mid_epoch_leaves_no_thread():
    before = set(threading.enumerate())
    loader = EchoingDataLoader(
        SlowNumbers(200, 0.005), batch_size=4, echo_factor="auto", where="after_augment"
    )
    it = iter(loader)
    next(it)
    assert len(set(threading.enumerate()) - before) == 1  # the reader thread
    loader.close()
    del it
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()


@pytest.mark.timeout(120)
def test_auto_resume_continues_the_fresh_examples_exactly():
    def make():
        return EchoingDataLoader(
            SlowNumbers(40, 0.002), batch_size=4, echo_factor="auto", where="after_augment",
            seed=1, shuffle=True,
        )  # fmt: skip

    first = make()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    fresh_before = state["stats"]["fresh_examples"]
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    seen = set(labels_of(head)) | set(labels_of(rest))
    assert seen == set(range(40))  # nothing lost
    assert resumed.stats.fresh_examples == 40  # nothing read twice in the accounting
    assert fresh_before == len(set(labels_of(head)))


def test_auto_arguments_are_checked():
    with pytest.raises(ValueError, match="max_echo_factor"):
        EchoingDataLoader(Numbers(4), batch_size=2, echo_factor="auto", max_echo_factor=0.5)
    with pytest.raises(ValueError, match="reuse_policy"):
        EchoingDataLoader(Numbers(4), batch_size=2, echo_factor="auto", reuse_policy="newest")
    with pytest.raises(TypeError, match="auto"):
        EchoingDataLoader(Numbers(4), batch_size=2, echo_factor="automatic")


@pytest.mark.timeout(120)
def test_batch_auto_counts_fresh_examples_when_the_step_gets_them():
    # The reader thread reads batches ahead; they count as fresh only once handed out.
    loader = EchoingDataLoader(
        Numbers(400), batch_size=8, echo_factor="auto", where="batch", num_workers=1, seed=0
    )
    it = iter(loader)
    handed = []
    for _ in range(5):
        handed.append(next(it))
        time.sleep(0.05)  # a slow step: the reader runs ahead meanwhile
        assert loader.stats.fresh_examples <= loader.stats.examples_out
    assert loader.stats.realized_factor >= 1.0
    rest = list(it)
    assert loader.stats.fresh_examples == 400
    assert set(labels_of(handed + rest)) == set(range(400))


def test_data_parallel_ranks_draw_their_own_augmentations(monkeypatch):
    def noise_on_rank(rank):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        data = [(torch.zeros(3), i) for i in range(16)]
        loader = EchoingDataLoader(data, batch_size=4, transform=add_noise, seed=0)
        return [round(float(x[0]), 6) for xs, _ in loader for x in xs]

    first, second = noise_on_rank(0), noise_on_rank(1)
    assert len(first) == len(second) == 8  # disjoint halves of the 16 examples
    # One pipeline seed, but each rank's stream of random draws is its own.
    assert first != second


def test_example_echoing_keeps_as_much_fresh_data_in_flight_as_no_echo():
    def depth(**kwargs):
        return EchoingDataLoader(Numbers(8), batch_size=2, num_workers=1, **kwargs)._inner

    assert depth().prefetch_factor == 2
    assert depth(echo_factor=4).prefetch_factor == 8
    assert depth(echo_factor=2.5).prefetch_factor == 6
    assert depth(echo_factor=4, where="batch").prefetch_factor == 2  # only fresh batches cross
    assert depth(echo_factor=4, prefetch_factor=3).prefetch_factor == 3  # the user's choice


def test_options_given_whole_load_the_same_as_the_keywords():
    def labels(**kw):
        return labels_of(EchoingDataLoader(Numbers(30), seed=3, **kw))

    keywords = dict(batch_size=4, shuffle=True, echo_factor=2.5, where="after_augment",
                    shuffle_buffer=8)  # fmt: skip
    options = LoaderOptions(**keywords)
    assert EchoingDataLoader(Numbers(30), options=options).options == options
    assert labels(options=options) == labels(**keywords)
    assert labels(options=options, batch_size=4, shuffle=True) == labels(**keywords)  # agreeing
    with pytest.raises(TypeError, match=r"options= and echo_factor= both set echo settings"):
        EchoingDataLoader(Numbers(30), options=options, echo_factor=2)
    with pytest.raises(ValueError, match=r"batch_size=8 disagrees with options.batch_size=4"):
        EchoingDataLoader(Numbers(30), 8, options=options)
    with pytest.raises(TypeError, match="options must be a LoaderOptions or None, got dict"):
        EchoingDataLoader(Numbers(30), options=keywords)


def test_loader_options_derive_their_defaults_and_say_them_once():
    examples = LoaderOptions(batch_size=16, echo_factor="auto")
    assert (examples.reuse_buffer, examples.reuse_policy, examples.read_ahead) == (16, "fewest", 0)
    batches = examples.with_changes(where="batch")
    assert (batches.reuse_buffer, batches.reuse_policy) == (1, "latest")
    assert examples.with_changes(echo_factor=2).read_ahead == 16
    assert examples.with_changes(batch_size=4, reuse_buffer=9).reuse_buffer == 9
    assert examples.as_given()["reuse_buffer"] is None
    doc = LoaderOptions.__doc__
    for f in dataclasses.fields(LoaderOptions):
        if f.init:
            assert f"{f.name}: {f.metadata['help']}." in doc, f.name
    with pytest.raises(
        TypeError, match=r"batch_size must be an integer in 1..1048576, got 2.0 of type"
    ):
        LoaderOptions(batch_size=2.0)
    with pytest.raises(ValueError, match=r"max_echo_factor must be a finite number >= 1, got 0.5"):
        LoaderOptions(batch_size=2, max_echo_factor=0.5)


EPOCHS = 2


def resume_loader(num_workers: int, dataset=None) -> EchoingDataLoader:
    return EchoingDataLoader(
        dataset if dataset is not None else Numbers(160),
        batch_size=16,
        echo_factor=2,
        where="after_augment",
        shuffle=dataset is None,
        seed=3,
        num_workers=num_workers,
    )


def state_at(make, epoch: int, batches: int, *, past_the_end: bool = False):
    """The ids each epoch yields before a state taken after ``batches`` batches of ``epoch``
    (``past_the_end``: after the iterator also raised StopIteration), and that state."""
    loader = make()
    seen: dict[int, list[int]] = collections.defaultdict(list)
    for e in range(epoch):
        seen[e] = labels_of(loader)
    it = iter(loader)
    seen[epoch] += labels_of(next(it) for _ in range(batches))
    if past_the_end:
        assert next(it, None) is None
    return seen, torch_roundtrip(loader.state_dict())


# Where the state is taken: (epoch, batches into it, after its StopIteration); 20 batches an epoch.
RESUME_POINTS = {
    "mid-epoch": (0, 7, False),
    "at the epoch's last batch": (0, 20, False),
    "between epochs": (0, 20, True),
    "last epoch's last batch": (1, 20, False),
}


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("point", sorted(RESUME_POINTS))
def test_resumed_loops_counting_steps_or_epochs_read_the_uninterrupted_run(point, num_workers):
    epoch, batches, past_the_end = RESUME_POINTS[point]
    plain = resume_loader(num_workers)
    expected = {e: labels_of(plain) for e in range(EPOCHS)}
    assert len(expected[0]) == 320 and len(resume_loader(num_workers)) == 20
    seen, state = state_at(lambda: resume_loader(num_workers), epoch, batches,
                           past_the_end=past_the_end)  # fmt: skip
    ended = batches == 20
    assert state["epoch"] == epoch and state["next_epoch"] == epoch + ended

    # Counting epochs from the loader: each runs its own, and the run reads what it would have.
    by_epoch = resume_loader(num_workers)
    by_epoch.load_state_dict(state)
    assert by_epoch.epoch == epoch and by_epoch.next_epoch == epoch + ended
    counted = {e: list(ids) for e, ids in seen.items()}
    for e in range(by_epoch.next_epoch, EPOCHS):
        counted[e] = counted.get(e, []) + labels_of(by_epoch)
        assert by_epoch.epoch == e
    assert counted == expected

    # The same loop calling set_epoch before each epoch, as frameworks do.
    with_set_epoch = resume_loader(num_workers)
    with_set_epoch.load_state_dict(state)
    counted = {e: list(ids) for e, ids in seen.items()}
    for e in range(with_set_epoch.next_epoch, EPOCHS):
        with_set_epoch.set_epoch(e)
        counted[e] = counted.get(e, []) + labels_of(with_set_epoch)
    assert counted == expected

    # Counting steps: the batches left to the uninterrupted run's total, in its order.
    by_steps = resume_loader(num_workers)
    by_steps.load_state_dict(state)
    total = [i for e in range(EPOCHS) for i in expected[e]]
    done = sum(len(ids) for ids in seen.values())
    rest: list[int] = []
    while len(rest) < len(total) - done:
        rest += labels_of(by_steps)
    assert rest == total[done:]


def test_state_at_a_last_batch_only_its_end_tells_names_that_epoch():
    # An iterable dataset's length is not exact: the state names its epoch, whose rest is empty.
    make = lambda: resume_loader(0, NumberStream(160))  # noqa: E731
    plain = make()
    expected = {e: labels_of(plain) for e in range(EPOCHS)}
    seen, state = state_at(make, 0, 20)
    assert state["next_epoch"] == 0
    loader = make()
    loader.load_state_dict(state)
    assert loader.next_epoch == 0
    assert labels_of(loader) == [] and loader.epoch == 0 and loader.next_epoch == 1
    assert labels_of(loader) == expected[1]
    assert seen[0] == expected[0]


def test_set_epoch_over_a_state_at_an_epochs_last_batch_names_the_epoch_the_next_iter_runs():
    plain = resume_loader(0)
    expected = [labels_of(plain) for _ in range(EPOCHS)]
    _, state = state_at(lambda: resume_loader(0), 0, 20)
    assert state["root"] is not None and state["next_epoch"] == 1
    loader = resume_loader(0)
    loader.load_state_dict(state)
    loader.set_epoch(0)  # continues epoch 0, whose rest is empty
    assert loader.next_epoch == 0 and labels_of(loader) == [] and loader.epoch == 0
    assert loader.next_epoch == 1 and labels_of(loader) == expected[1]
    loader.load_state_dict(state)
    loader.set_epoch(1)
    assert loader.next_epoch == 1 and labels_of(loader) == expected[1] and loader.epoch == 1


# On the device with a pool (24 examples), only the copies of examples already delivered.
@pytest.mark.parametrize(("where", "buffer"),
                         [("batch", 6), ("batch", 0), ("device", 0), ("device", 24)])  # fmt: skip
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_drain_trains_every_copy_of_what_was_counted_fresh_and_a_resume_the_rest(
    where, buffer, num_workers
):
    def make():
        return EchoingDataLoader(Numbers(40), batch_size=4, echo_factor=3, where=where,
                                 shuffle_buffer=buffer, num_workers=num_workers, shuffle=True,
                                 seed=0)  # fmt: skip

    def labels(batches):
        return [int(y) for _, ys in batches for y in ys]

    loader = make()
    assert not loader.drain()  # no epoch under way: nothing to drain
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    assert loader.drain()
    fresh = loader.stats.fresh_examples
    tail = list(it)
    assert loader.drained and loader.stats.fresh_examples == fresh < 40
    counts = collections.Counter(labels(head + tail))
    assert len(counts) == fresh and set(counts.values()) == {3}
    state = loader.state_dict()
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert collections.Counter(labels(head + tail + rest)) == {i: 3 for i in range(40)}
    assert resumed.stats.fresh_examples == 40


@pytest.mark.parametrize("where", ["before_augment", "after_augment"])
def test_a_drain_changes_nothing_where_the_copies_wait_in_the_workers(where):
    loader = EchoingDataLoader(Numbers(12), batch_size=4, echo_factor=2, where=where,
                               shuffle_buffer=4, seed=0, transform=lambda x: x)  # fmt: skip
    it = iter(loader)
    first = next(it)
    assert not loader.drain() and not loader.drained
    rest = [int(y) for _, ys in [first, *it] for y in ys]
    assert collections.Counter(rest) == {i: 2 for i in range(12)}


class CountedNumbers(Numbers):
    """Numbers that count their reads, across worker processes (a shared counter)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.reads = multiprocessing.get_context("fork").Value("i", 0)

    def __getitem__(self, i: int):
        with self.reads.get_lock():
            self.reads.value += 1
        return super().__getitem__(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_examples_held_in_a_workers_shuffle_buffer_count_as_read_not_yet_fresh(num_workers):
    data = CountedNumbers(400)
    loader = EchoingDataLoader(
        data, batch_size=8, echo_factor=4, shuffle_buffer=64, transform=add_noise,
        num_workers=num_workers, read_ahead=0, seed=0,
    )  # fmt: skip
    it = iter(loader)
    for _ in range(10):
        next(it)
    stats = loader.stats
    # The buffer holds examples whose first copy has not left it: read, not yet fresh.
    assert stats.waiting_items > 0
    read = stats.fresh_examples + stats.waiting_items
    if num_workers == 0:
        assert read == data.reads.value  # in step: every read so far
    else:
        assert read <= data.reads.value  # the worker has read on since that batch
    assert len(list(it)) > 0  # the rest of the epoch
    assert stats.fresh_examples == 400 and stats.waiting_items == 0  # all delivered: none waits
