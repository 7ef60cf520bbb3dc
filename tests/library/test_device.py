"""where="device": fresh batches moved to the device once, echoed and augmented there.

The CPU device runs the same nodes as CUDA in the training process; the CUDA-only test at the
end runs where a GPU is.
"""

from __future__ import annotations

import collections
import time

import pytest
import torch
from conftest import assert_same_stream, run_test_save_load_state, torch_roundtrip
from torch.utils.data import Dataset
from torchdata.nodes import IterableWrapper

from dataecho import EchoingDataLoader, LoaderOptions
from dataecho.loader.device import ToDevice, to_host

CPU = torch.device("cpu")
HAVE_CUDA = torch.cuda.is_available()


class Images(Dataset):
    """Example i: a 1x4x4 float image filled with i, label i; ``delay`` s per read."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        return torch.full((1, 4, 4), float(i)), i


class Jitter:
    """A device augmentation: per-sample random brightness from ``generator``; counts calls and
    remembers the generator's device."""

    def __init__(self) -> None:
        self.calls = 0
        self.devices: set[torch.device] = set()

    def __call__(self, batch, generator=None):
        x, y = batch
        self.calls += 1
        self.devices.add(generator.device)
        noise = torch.rand(x.shape[0], 1, 1, 1, generator=generator, device=x.device)
        return x + noise, y


def labels(batches) -> list[int]:
    return [int(y) for _, ys in batches for y in ys]


def device_loader(n: int = 20, **kwargs) -> EchoingDataLoader:
    args = {"batch_size": 4, "where": "device", "seed": 0, **kwargs}
    return EchoingDataLoader(Images(n), **args)


@pytest.mark.parametrize("mix", [0, 6])  # examples mixed across batches, or batches whole
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("factor", [1, 3, 2.5])
def test_counts_and_len_at_a_fixed_factor(factor, num_workers, mix):
    loader = device_loader(22, echo_factor=factor, num_workers=num_workers, shuffle=True,
                           shuffle_buffer=mix)  # fmt: skip
    expected = len(loader)  # read once, as a trainer does: every epoch yields it
    if factor == 2.5:  # 6 fresh batches, exactly 3 of them (chosen anew each epoch) thrice
        assert expected == 6 * 2 + 3
    for _ in range(2):
        before = loader.stats.examples_out
        batches = list(loader)
        assert len(batches) == expected == len(loader)
        counts = collections.Counter(labels(batches))
        assert set(counts) == set(range(22))
        if factor == int(factor):
            assert set(counts.values()) == {int(factor)}
        else:
            assert set(counts.values()) <= {2, 3}
        assert loader.stats.examples_out - before == sum(counts.values())
    s = loader.stats
    assert s.fresh_examples == 44
    assert s.realized_factor == s.examples_out / 44
    assert s.wait_seconds > 0
    if factor == 3:
        assert s.realized_factor == 3.0


def test_whole_batches_repeat_and_the_worker_runs_no_echo_stage():
    calls = collections.Counter()

    def per_example(example):
        calls["transform"] += 1
        return example

    def per_batch(batch):
        calls["batch_transform"] += 1
        return batch

    loader = device_loader(24, echo_factor=3, transform=per_example, batch_transform=per_batch)
    batches = [ys.tolist() for _, ys in loader]
    assert batches[:3] == [[0, 1, 2, 3]] * 3 and batches[3] == [4, 5, 6, 7]
    # The workers read, augment and batch once per fresh example, as without echoing.
    assert calls == {"transform": 24, "batch_transform": 6}


@pytest.mark.parametrize("factor", [3, "auto"])
def test_copies_never_alias(factor):
    data = Images(8, delay=0.01 if factor == "auto" else 0.0)
    loader = EchoingDataLoader(
        data, batch_size=4, echo_factor=factor, max_echo_factor=3, where="device", seed=0
    )
    batches = list(loader)
    by_labels = collections.defaultdict(list)
    for x, ys in batches:
        by_labels[tuple(ys.tolist())].append(x)
    copies = by_labels[(0, 1, 2, 3)]
    assert len(copies) >= 2
    assert len({x.data_ptr() for x in copies}) == len(copies)
    copies[0].add_(100.0)  # training code writing in place into one copy
    for other in copies[1:]:
        assert torch.equal(other[:, 0, 0, 0], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert data[0][0].max() == 0.0  # the dataset is untouched


def test_every_copy_is_augmented_with_its_own_draws_on_the_device():
    jitter = Jitter()
    loader = device_loader(16, echo_factor=4, device_transform=jitter, num_workers=1)
    batches = list(loader)
    assert jitter.calls == len(batches) == 16  # the fresh copy included
    assert jitter.devices == {CPU}
    noise = [x[:, 0, 0, 0] - ys.float() for x, ys in batches]
    for fresh in range(0, 16, 4):
        copies = noise[fresh : fresh + 4]
        for i in range(4):
            for j in range(i):
                assert not torch.equal(copies[i], copies[j]), (fresh, i, j)
        assert len(set(copies[0].tolist())) == 4  # per-sample parameters, not one per batch
    # Seeded from the pipeline seed: the same seed draws the same, another seed differs.
    again = [x for x, _ in device_loader(16, echo_factor=4, device_transform=Jitter())]
    other = [x for x, _ in device_loader(16, echo_factor=4, device_transform=Jitter(), seed=1)]
    assert all(torch.equal(a, b) for (a, _), b in zip(batches, again, strict=True))
    assert not torch.equal(batches[0][0], other[0])


def test_each_epoch_draws_new_augmentations():
    loader = device_loader(8, echo_factor=2, device_transform=Jitter())
    first, second = [x for x, _ in loader], [x for x, _ in loader]
    assert not torch.equal(first[0], second[0])


class AheadOnCpu(ToDevice):
    """The CUDA path's read-ahead (the next fresh batch in flight), forced on the CPU device;
    it records how many batches it has read and whether one was in flight."""

    made: list[AheadOnCpu] = []

    def __init__(self, source, device, *, ahead):
        super().__init__(source, device, ahead=True)
        self.reads, self.in_flight = 0, 0
        AheadOnCpu.made.append(self)

    def _read(self):
        flight = super()._read()
        self.reads += 1
        return flight

    def next(self):
        batch = super().next()
        self.in_flight += self._next is not None
        return batch


@pytest.fixture
def ahead_on_cpu(monkeypatch):
    import dataecho.loader.points.batches as batches

    AheadOnCpu.made = []
    monkeypatch.setattr(batches, "ToDevice", AheadOnCpu)
    return AheadOnCpu.made


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("ahead", "num_workers", "factor"),
    [(False, 0, 2), (False, 1, 1.5), (False, 0, 1), (True, 0, 2), (True, 1, 1.5)],
)
def test_resume_at_every_position_continues_batches_and_draws(request, ahead, num_workers, factor):
    made = request.getfixturevalue("ahead_on_cpu") if ahead else None

    def make():
        return EchoingDataLoader(
            Images(14),
            batch_size=3,
            echo_factor=factor,
            where="device",
            shuffle_buffer=3,
            device_transform=Jitter(),
            num_workers=num_workers,
            seed=5,
            shuffle=True,
        )

    recorded = run_test_save_load_state(
        make,
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        summary=lambda loader: (loader.stats.fresh_examples, loader.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    assert all(len(epoch) >= 5 for epoch in recorded)
    if made is not None:  # the read-ahead was taken, not the plain path
        assert made and sum(node.in_flight for node in made) > 0


def test_the_read_ahead_hands_on_an_epochs_first_batch_before_reading_the_second(ahead_on_cpu):
    loader = EchoingDataLoader(Images(12), batch_size=3, echo_factor=2, where="device",
                               shuffle_buffer=0, seed=0)  # fmt: skip
    it = iter(loader)
    next(it)
    (node,) = ahead_on_cpu
    assert node.reads == 1  # the first batch waited for no other read
    rest = list(it)
    assert len(rest) == len(loader) - 1 and node.reads == 4 and node.in_flight > 0


def test_read_ahead_node_resumes_exactly_and_raises_errors_in_order():
    batches = [torch.full((2,), float(i)) for i in range(5)]
    run_test_save_load_state(lambda: ToDevice(IterableWrapper(batches), CPU, ahead=True))

    def failing():
        yield torch.zeros(2)
        raise OSError("disk gone")

    node = ToDevice(IterableWrapper(failing()), CPU, ahead=True)
    node.reset()
    assert torch.equal(next(node), torch.zeros(2))  # the batch read before the failure
    with pytest.raises(OSError, match="disk gone"):
        next(node)


@pytest.mark.timeout(120)
def test_auto_reuses_only_while_the_next_fresh_batch_is_late():
    fast = device_loader(400, batch_size=8, echo_factor="auto", num_workers=1)
    for _ in fast:
        time.sleep(0.01)  # the step is slow, upstream fast: nothing to echo
    assert fast.stats.fresh_examples == 400
    assert fast.stats.realized_factor < 1.3

    jitter = Jitter()
    slow = EchoingDataLoader(
        Images(64, delay=0.01), batch_size=8, echo_factor="auto", max_echo_factor=3,
        where="device", device_transform=jitter, num_workers=1, seed=0,
    )  # fmt: skip
    batches = list(slow)  # the step is instant, upstream slow
    counts = collections.Counter(labels(batches))
    assert set(counts) == set(range(64))  # every fresh example delivered
    assert max(counts.values()) <= 3  # never more than max_echo_factor
    assert slow.stats.fresh_examples == 64
    assert slow.stats.realized_factor > 1.5
    assert jitter.calls == len(batches)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_auto_resume_loses_or_doubles_no_fresh_example(num_workers):
    def make():
        return EchoingDataLoader(
            Images(40, delay=0.003), batch_size=4, echo_factor="auto", where="device",
            device_transform=Jitter(), num_workers=num_workers, seed=1, shuffle=True,
        )  # fmt: skip

    first = make()
    it = iter(first)
    head = [next(it) for _ in range(6)]
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    fresh_head = set(labels(head))
    assert state["stats"]["fresh_examples"] == len(fresh_head)
    assert fresh_head | set(labels(rest)) == set(range(40))  # nothing lost
    assert resumed.stats.fresh_examples == 40  # nothing counted twice


def test_the_device_transform_is_work_not_a_wait_for_data():
    def slow_transform(batch, generator=None):
        time.sleep(0.02)
        return batch

    loader = device_loader(40, echo_factor=2, device_transform=slow_transform)
    batches = list(loader)
    assert len(batches) == 20
    assert loader.stats.wait_seconds < 0.02 * len(batches) / 2
    assert 0.02 * len(batches) <= loader.stats.work_seconds < 0.04 * len(batches)


def test_states_hold_host_tensors_only():
    loader = device_loader(12, echo_factor=3, shuffle_buffer=2, device_transform=Jitter())
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    found = []
    to_host_checked = to_host(state)  # a no-op here: every tensor is in host memory already

    def walk(value):
        if isinstance(value, torch.Tensor):
            found.append(value.device.type)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(to_host_checked)
    assert found and set(found) == {"cpu"}


def test_options_for_the_device_derive_their_defaults():
    opts = LoaderOptions(batch_size=8, echo_factor="auto", where="device")
    assert opts.echo_device == "cpu" and opts.batch_level
    assert (opts.reuse_buffer, opts.reuse_policy, opts.read_ahead) == (1, "latest", 0)
    assert opts.as_given()["echo_device"] is None  # derived, so a copy derives it again
    assert opts.with_changes(where="batch").echo_device is None
    assert (
        LoaderOptions(batch_size=8, where="device", echo_device=torch.device("cpu")).echo_device
        == "cpu"
    )
    assert LoaderOptions(batch_size=8, where="device", echo_device="cuda:1").echo_device == "cuda:1"
    assert device_loader(echo_factor=4).prefetch_factor is None  # no workers: DataLoader's
    assert device_loader(echo_factor=4, num_workers=1).prefetch_factor == 2  # fresh batches only


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"echo_device": "cpu"}, ValueError, ["echo_device='cpu'", "where='device'", "before_augment"]),
        ({"where": "batch", "device_transform": Jitter()}, ValueError,
         ["device_transform=", "where='device'", "batch_transform="]),
        ({"where": "device", "echo_device": "gpu"}, ValueError, ["echo_device", "'gpu'", "'cuda'", "'cpu'"]),
        ({"where": "device", "echo_device": 0}, TypeError, ["echo_device", "0", "int", "'cuda'"]),
        ({"where": "device", "device_transform": 3}, TypeError, ["device_transform", "callable"]),
        ({"where": "device", "device_transform": lambda batch: batch}, TypeError,
         ["generator=", "generator=None", "dataecho.augment"]),
        ({"where": "middle"}, ValueError, ["where", "'middle'", "'device'"]),
    ],
)  # fmt: skip
def test_bad_device_settings_name_value_range_and_fix(kwargs, error, words):
    with pytest.raises(error) as info:
        EchoingDataLoader(Images(4), batch_size=2, **kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.skipif(HAVE_CUDA, reason="checks the message given where CUDA is missing")
def test_cuda_without_a_gpu_names_the_fix():
    with pytest.raises(ValueError, match="CUDA is not available.*device='cpu'"):
        device_loader(echo_factor=2, echo_device="cuda")


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("factor", [3, "auto"])
def test_cuda_copies_match_the_cpu_path_and_resume_exactly(factor):
    def make(device, **kwargs):
        return EchoingDataLoader(
            Images(40), batch_size=4, echo_factor=factor, max_echo_factor=3, where="device",
            echo_device=device, num_workers=1, seed=2, shuffle=True, **kwargs,
        )  # fmt: skip

    got = list(make("cuda"))
    assert all(x.device.type == "cuda" for x, _ in got)
    if factor == 3:  # timing does not decide: the same batches as on the CPU device
        want = list(make("cpu"))
        assert_same_stream([(x.cpu(), y.cpu()) for x, y in got], want, "cuda vs cpu")
        for copy in got[:3]:  # read right after landing, each copy its own memory
            assert torch.equal(copy[0][:, 0, 0, 0].cpu(), copy[1].cpu().float())
        assert len({x.data_ptr() for x, _ in got[:3]}) == 3
    assert sorted(set(labels(got))) == list(range(40))

    jitter = Jitter()
    loader = make("cuda", device_transform=jitter)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    rest = [(x.cpu(), y.cpu()) for x, y in it]
    assert len(head) == 5 and rest
    assert {device.type for device in jitter.devices} == {"cuda"}
    if factor == 3:
        resumed = make("cuda", device_transform=Jitter())
        resumed.load_state_dict(state)
        assert_same_stream([(x.cpu(), y.cpu()) for x, y in resumed], rest, "cuda resume")


def test_the_library_ops_augment_every_copy_and_resume_exactly():
    from dataecho.augment import Compose, RandomResizedCrop, ShiftFlip

    def make():
        images = [(torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(i)), i)
                  for i in range(12)]  # fmt: skip
        ops = Compose([ShiftFlip(pad=2), RandomResizedCrop(8, scale=(0.5, 1.0))])
        return EchoingDataLoader(
            images, batch_size=4, echo_factor=2, where="device", device_transform=ops, seed=3
        )

    batches = list(make())
    assert len(batches) == 6 and not torch.equal(batches[0][0], batches[1][0])
    assert torch.equal(batches[0][1], batches[1][1])  # the targets are not augmented
    run_test_save_load_state(
        make,
        positions=[0, 1, 3],
        restore=lambda loader, state: loader.load_state_dict(state),
        new_epoch=lambda loader: None,
        end_may_start_next_epoch=True,
    )


@pytest.mark.parametrize("factor", [4, 2.5, "auto"])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_through_the_pool_an_example_counts_fresh_when_its_first_copy_is_delivered(
    factor, num_workers
):
    def make():
        return device_loader(40, echo_factor=factor, shuffle_buffer=12, num_workers=num_workers,
                             shuffle=True, device_transform=Jitter())  # fmt: skip

    loader, seen, waited = make(), set(), False
    it = iter(loader)
    head = []
    for batch in it:
        head.append(batch)
        seen |= set(labels([batch]))
        assert loader.stats.fresh_examples == len(seen)  # not the examples still in the pool
        # Those are waiting: with them, the examples read, in whole fresh batches of 4.
        read = loader.stats.fresh_examples + loader.stats.waiting_items
        assert read % 4 == 0 and read >= len(seen)
        waited = waited or read > len(seen)
        if len(head) == 9:
            break
    assert waited
    state = loader.state_dict()
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    for batch in resumed:
        seen |= set(labels([batch]))
        assert resumed.stats.fresh_examples == len(seen)
    assert seen == set(range(40)) and resumed.stats.fresh_examples == 40
    assert resumed.stats.waiting_items == 0


def test_data_parallel_ranks_draw_their_own_device_augmentations(monkeypatch):
    # The same seed on two ranks: each reads its own share, and augments it with its own draws
    # (the noise Jitter adds to an image of one value, position by position).
    noise = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = device_loader(12, echo_factor=2, device_transform=Jitter())
        x, y = next(iter(loader))
        noise.append(x - y.float().view(-1, 1, 1, 1))
    assert not torch.allclose(noise[0], noise[1])


def test_a_device_checkpoint_holds_a_batch_number_not_a_generator_state_of_one_device():
    # A CUDA generator's state is 16 bytes and a CPU one's 5,056: a state holding either loads
    # on that kind of device only. The batch number resumes on any, exactly on the same kind.
    def make():
        return device_loader(12, echo_factor=2, shuffle_buffer=3, device_transform=Jitter())

    whole = [x for x, _ in make()]
    loader = make()
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert set(state["root"]) == {"source", "batches"} and state["root"]["batches"] == 2
    resumed = make()
    resumed.load_state_dict(torch_roundtrip(state))
    assert all(torch.equal(a, b) for a, b in zip([x for x, _ in resumed], whole[2:], strict=True))
