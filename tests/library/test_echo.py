"""The echo stage (dataecho.stages.fixed_echo), the Stage base it shares, argument validation."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch
from conftest import assert_same_stream, run_test_save_load_state, torch_roundtrip
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset
from torchdata.nodes import IterableWrapper, Loader, Mapper

from dataecho import _validate
from dataecho.stages import (
    AdaptiveEcho,
    Echo,
    Stage,
    adaptive_echo,
    as_node,
    echo,
    mix_examples,
    shuffle,
    stochastic_echo,
)
from dataecho.stages.fixed_echo import epoch_copies


def runs(stream: list) -> list[tuple[object, int]]:
    """``stream`` as (item, run length) pairs of adjacent equal items."""
    return [(k, len(list(g))) for k, g in itertools.groupby(stream)]


# --- the factor -------------------------------------------------------------------------------


def test_fractional_factor_over_a_sized_source_is_exact() -> None:
    node = echo(range(20_000), 2.5, seed=0)
    out = list(node)
    assert len(out) == 50_000
    assert node.stats.realized_factor == 2.5


@pytest.mark.parametrize("n", [1, 7, 96, 1000, 20_001])
@pytest.mark.parametrize("factor", [2.5, 1.3, 3.9])
def test_fractional_factor_of_unknown_length_gives_floor_or_ceil_extra_copies(n, factor) -> None:
    # A generator has no len: the extra copies are spread evenly from a seeded start, so any
    # epoch of n items gets floor(frac * n) or ceil(frac * n) of them, every epoch.
    frac = factor - int(factor)
    node = echo((i for i in range(n)), factor, seed=0)
    counts = Counter(node)
    extras = sum(c - int(factor) for c in counts.values())
    assert math.floor(frac * n) <= extras <= math.ceil(frac * n)
    assert set(counts) == set(range(n)) and set(counts.values()) <= {int(factor), int(factor) + 1}
    assert node.state_dict()["unseen"] is None


def test_fractional_factor_of_unknown_length_spreads_the_extra_copies_from_a_seeded_start():
    # 2.5 over a stream: every other item gets a third copy, which ones depends on the seed.
    def thirds(seed: int) -> list[int]:
        counts = Counter(echo((i for i in range(40)), 2.5, seed=seed))
        return [i for i in range(40) if counts[i] == 3]

    picks = [thirds(seed) for seed in range(8)]
    assert all(len(p) == 20 for p in picks)
    assert all(b - a == 2 for p in picks for a, b in zip(p, p[1:], strict=False))
    assert len({p[0] for p in picks}) == 2, "the start is drawn from the seed"


@pytest.mark.parametrize("factor", [1, 2, 3, 5, 4.0])
def test_integer_factor_is_exact_in_order_and_adjacent(factor: float) -> None:
    src = list(range(50))
    out = list(echo(src, factor, seed=1))
    assert out == [x for x in src for _ in range(int(factor))]


def test_fractional_factor_gives_exactly_half_the_items_an_extra_copy() -> None:
    # One draw for the whole dataset (a bug seen in the wild) would give a single run length.
    src = list(range(2_000))
    lengths = Counter(n for _, n in runs(list(echo(src, 2.5, seed=7))))
    assert lengths == {2: 1000, 3: 1000}
    # Copies stay adjacent and in source order, and nothing is lost.
    assert [k for k, _ in runs(list(echo(src, 2.5, seed=7)))] == src


def expected_extras(factor: float, n: int) -> int:
    """floor(frac * n + 1/2), by hand: the factor as the decimal it prints as."""
    frac = Fraction(repr(float(factor))) % 1
    return math.floor(frac * n + Fraction(1, 2))


@pytest.mark.parametrize(
    ("n", "factor", "extras"),
    [
        (10, 2.5, 5), (3, 1.5, 2), (1, 1.5, 1), (1, 1.4, 0), (0, 2.5, 0), (7, 1.1, 1),
        (5, 2.3, 2),  # 1.5 rounds up, though the float 2.3 is 2.2999...
        (9, 4 / 3, 3), (6, 1.999, 6), (23, 1.7, 16), (100, 1.01, 1),
    ],
)  # fmt: skip
def test_extra_copies_per_epoch_are_round_half_up_of_frac_times_n(n, factor, extras) -> None:
    assert expected_extras(factor, n) == extras
    node = echo(list(range(n)), factor, seed=0)
    for _ in range(3):  # every epoch, whichever items
        out = list(node)
        assert len(out) == n * math.floor(factor) + extras
        assert len(out) == epoch_copies(factor, n)


@settings(max_examples=60, deadline=None)
@given(
    factor=st.floats(1, 6, allow_nan=False),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**32),
    explicit=st.booleans(),
)
def test_count_is_exact_for_any_factor_and_length(factor, n, seed, explicit) -> None:
    src = list(range(n))
    # A list's len, or the length said outright over a source without one.
    node = (
        echo(iter(src), factor, seed=seed, length=n) if explicit else echo(src, factor, seed=seed)
    )
    counts = Counter(node)
    whole = math.floor(factor)
    assert sum(counts.values()) == n * whole + expected_extras(factor, n)
    assert set(counts) == set(src)
    assert all(c in (whole, whole + 1) for c in counts.values())


def test_which_items_get_the_extra_copy_is_uniform_over_subsets() -> None:
    # 6 items at 1.5: 3 get a second copy; across seeds each of the 20 subsets of 3 shows up,
    # and each item is chosen about half the time.
    subsets = Counter()
    for seed in range(600):
        counts = Counter(echo(list(range(6)), 1.5, seed=seed))
        subsets[frozenset(i for i, c in counts.items() if c == 2)] += 1
    assert len(subsets) == 20 and all(len(s) == 3 for s in subsets)
    assert min(subsets.values()) >= 10  # 30 expected each
    chosen = Counter(i for s, k in subsets.items() for i in s for _ in range(k))
    assert all(250 <= chosen[i] <= 350 for i in range(6))  # 300 expected each
    # The last item too: sequential selection does not favour the start.
    node = echo(list(range(1000)), 1.1, seed=3)
    extras = [i for i, c in Counter(node).items() if c == 2]
    assert len(extras) == 100 and max(extras) > 800 and min(extras) < 200


def test_length_said_outright_bounds_the_extra_copies() -> None:
    # Shorter than the source: only the first 4 items may get an extra copy (2 of them).
    counts = Counter(echo(list(range(10)), 1.5, seed=0, length=4))
    assert sorted(counts.values()) == [1] * 8 + [2] * 2
    assert all(counts[i] == 1 for i in range(4, 10))
    # Longer than the source: the extra copies due to items never read are left out.
    counts = Counter(echo(list(range(4)), 1.5, seed=0, length=1000))
    assert sum(counts.values()) < 4 + 500 and set(counts.values()) <= {1, 2}
    # length=0: no item gets an extra copy.
    assert list(echo(list(range(3)), 2.5, seed=0, length=0)) == [0, 0, 1, 1, 2, 2]


def test_a_dataloader_source_counts_its_batches() -> None:
    loader = DataLoader(CountingDataset(), batch_size=5)  # 24 examples: 5 batches
    out = list(echo(loader, 1.5, seed=0))
    assert len(out) == 5 + 3  # floor(0.5 * 5 + 1/2) = 3 batches twice


@pytest.mark.parametrize("factor", [1.0, 1.3, 2.5, 3.999])
def test_nothing_lost_each_item_floor_or_ceil_times(factor: float) -> None:
    src = list(range(500))
    counts = Counter(echo(src, factor, seed=2))
    assert set(counts) == set(src)
    assert all(math.floor(factor) <= c <= math.ceil(factor) for c in counts.values())


def test_counts_add_up() -> None:
    node = echo(range(300), 2.5, seed=3)
    out = list(node)
    s = node.stats
    assert s.fresh_examples == 300
    assert s.examples_out == len(out)
    assert s.realized_factor == len(out) / 300
    assert s.echoed_examples == len(out) - 300
    d = s.as_dict()
    assert d["realized_factor"] == s.realized_factor and d["echoed_examples"] == s.echoed_examples
    # The counters run on across epochs.
    node.reset(None)
    out2 = list(node)
    assert (s.fresh_examples, s.examples_out) == (600, len(out) + len(out2))


def test_counts_mid_item() -> None:
    node = echo(range(10), 3, seed=0)
    assert [next(node) for _ in range(4)] == [0, 0, 0, 1]
    assert (node.stats.fresh_examples, node.stats.examples_out) == (2, 4)


# --- seeds and epochs ---------------------------------------------------------------------


def test_same_seed_same_stream_different_seed_different_stream() -> None:
    src = list(range(400))
    a, b, c = (list(echo(src, 2.5, seed=s)) for s in (11, 11, 12))
    assert a == b
    assert a != c


def test_new_epoch_draws_anew_and_replays_with_the_seed() -> None:
    src = list(range(400))
    node = echo(src, 2.5, seed=5)
    first = list(node)
    node.reset(None)
    second = list(node)
    assert first != second
    assert [k for k, _ in runs(second)] == src
    again = echo(src, 2.5, seed=5)
    assert list(again) == first
    again.reset(None)
    assert list(again) == second


def test_unseeded_stage_draws_a_seed_and_records_it() -> None:
    a, b = echo(range(10), 2.5), echo(range(10), 2.5)
    assert isinstance(a.seed, int) and a.seed >= 0
    assert a.seed != b.seed
    assert a.state_dict()["seed"] == a.seed


# --- resume ------------------------------------------------------------------------------------


# Each epoch starts either by reset(None) or by the iter() of the next for loop.
NEW_EPOCH = {"reset": lambda node: node.reset(None), "iter": lambda node: None}


@pytest.mark.parametrize("factor", [1, 2, 2.5, 1.2])
@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("new_epoch", sorted(NEW_EPOCH))
def test_resume_at_every_position(factor: float, copy: bool, new_epoch: str) -> None:
    # A state taken after the end resumes as ended: the next iter() starts the next epoch.
    rec = run_test_save_load_state(
        lambda: echo(list(range(15)), factor, seed=4, copy=copy),
        summary=lambda n: (n.stats.fresh_examples, n.stats.examples_out),
        new_epoch=NEW_EPOCH[new_epoch],
        end_may_start_next_epoch=True,
    )
    assert [len(epoch) for epoch in rec] == [epoch_copies(factor, 15)] * len(rec)
    if factor != int(factor):
        assert rec[0] != rec[1]  # a new epoch draws anew, also after a resume


@pytest.mark.parametrize(("items", "length"), [(8, 5), (5, 8), (6, 6)])
def test_resume_at_every_position_with_the_length_said_outright(items: int, length: int) -> None:
    # A node source has no len: the stage counts from the length given.
    rec = run_test_save_load_state(
        lambda: echo(IterableWrapper(list(range(items))), 1.5, seed=2, length=length),
        summary=lambda n: (n.stats.fresh_examples, n.stats.examples_out),
        end_may_start_next_epoch=True,
    )
    if items >= length:
        assert [len(epoch) for epoch in rec] == [items + expected_extras(1.5, length)] * 3


class ForgetfulEcho(Echo):
    """An echo stage with a resume bug: it forgets the copies still due."""

    def _load_stage_state(self, state: dict) -> None:
        super()._load_stage_state(state)
        self._remaining = 0


def test_the_harness_catches_a_resume_bug() -> None:
    with pytest.raises(AssertionError, match=r"resumed at epoch 0, item 1 from in-memory state"):
        run_test_save_load_state(lambda: ForgetfulEcho(list(range(5)), 3, seed=0))


def test_resume_with_tensor_items_and_a_node_source() -> None:
    def factory() -> Echo:
        items = [{"x": torch.full((3,), float(i)), "y": i} for i in range(8)]
        return echo(IterableWrapper(items), 2.5, seed=9)

    rec = run_test_save_load_state(
        factory, new_epoch=lambda node: None, end_may_start_next_epoch=True
    )
    assert len(rec[0]) >= 16
    assert factory().state_dict()["unseen"] is None  # a node has no len: per-item draws


def test_resume_of_an_unseeded_stage() -> None:
    # The factory builds a node with a new random seed; the state must carry the old one.
    saved = echo(list(range(30)), 2.5)
    head = [next(saved) for _ in range(10)]
    state = saved.state_dict()
    rest = list(saved)
    resumed = echo(list(range(30)), 2.5)
    resumed.reset(state)
    assert list(resumed) == rest and head


@settings(max_examples=25, deadline=None)
@given(
    factor=st.floats(1, 6),
    n=st.integers(0, 12),
    k=st.integers(0, 80),
    seed=st.integers(0, 2**32),
)
@pytest.mark.timeout(60)
def test_resume_at_random_points(factor: float, n: int, k: int, seed: int) -> None:
    run_test_save_load_state(lambda: echo(list(range(n)), factor, seed=seed), positions=[k])


# --- sources and the Stage base ---------------------------------------------------------------


def test_any_iterable_is_a_source() -> None:
    assert list(echo((i for i in range(3)), 2, seed=0)) == [0, 0, 1, 1, 2, 2]
    node = IterableWrapper([1, 2])
    assert as_node(node) is node
    with pytest.raises(TypeError, match=r"source must be an iterable .* got int"):
        echo(5, 2)


def test_stages_compose() -> None:
    out = list(echo(echo(range(3), 2, seed=0), 3, seed=0))
    assert out == [x for x in range(3) for _ in range(6)]


def test_exhausted_stage_keeps_raising_stop_iteration() -> None:
    node = echo(range(2), 2.5, seed=0)
    list(node)
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(node)


# --- epochs by plain for loops (Stage.__iter__) -----------------------------------------------


class CountingDataset(Dataset):
    """24 examples (x, y); counts the reads, so a test sees what a resume re-reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.reads += 1
        return torch.full((3,), float(i)), i


def make_source(kind: str) -> list[int] | DataLoader:
    """6 items per epoch: a list, or 6 batches of 4 from a real DataLoader."""
    return list(range(6)) if kind == "list" else DataLoader(CountingDataset(), batch_size=4)


# Stage kind -> (factory over a source, items out per epoch of 6 fresh ones or None: random).
STAGES = {
    "echo": (lambda src: echo(src, 2, seed=0), 12),
    "shuffle": (lambda src: shuffle(src, 4, seed=0), 6),
    "adaptive": (lambda src: adaptive_echo(src, max_factor=1, seed=0), 6),
    "stochastic": (lambda src: stochastic_echo(src, load_prob=0.5, buffer_size=2, seed=0), None),
}


@pytest.fixture
def stages():
    """Build stages through ``make(kind, source)``; afterwards stop any reader thread."""
    built: list[Stage] = []

    def make(kind: str, source: object) -> Stage:
        built.append(STAGES[kind][0](source))
        return built[-1]

    yield make
    for node in built:
        if isinstance(node, AdaptiveEcho):
            assert node.close(timeout=5.0)


def reference_epochs(make, kind: str, source_kind: str, epochs: int) -> list[list]:
    """``epochs`` epochs of an identical stage, each started by an explicit reset(None)."""
    node = make(kind, make_source(source_kind))
    out = []
    for _ in range(epochs):
        node.reset(None)
        out.append(drain(node))
    return out


def drain(node: Stage) -> list:
    """The rest of the epoch through next() alone (no iter(), so no new epoch)."""
    out = []
    while True:
        try:
            out.append(next(node))
        except StopIteration:
            return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source_kind", ["list", "dataloader"])
@pytest.mark.parametrize("kind", sorted(STAGES))
def test_plain_for_loops_run_epoch_after_epoch(stages, kind: str, source_kind: str) -> None:
    node = stages(kind, make_source(source_kind))
    want = reference_epochs(stages, kind, source_kind, 3)
    per_epoch = STAGES[kind][1]
    for epoch in range(3):
        fresh0, out0 = node.stats.fresh_items, node.stats.items_out
        got = [item for item in node]
        assert_same_stream(got, want[epoch], f"epoch {epoch}")  # as reset(None) starts it
        assert node.stats.fresh_items - fresh0 == 6  # the source was read anew, once
        assert node.stats.items_out - out0 == len(got)
        if per_epoch is not None:
            assert len(got) == per_epoch
        assert node.state_dict()["epoch"] == epoch
    if kind == "stochastic":
        assert want[0] != want[1]  # each epoch draws anew from seed and epoch


@pytest.mark.parametrize("source_kind", ["list", "dataloader"])
@pytest.mark.parametrize("kind", sorted(STAGES))
def test_iter_mid_epoch_continues(stages, kind: str, source_kind: str) -> None:
    node = stages(kind, make_source(source_kind))
    want = reference_epochs(stages, kind, source_kind, 2)
    head = []
    for item in node:  # a loop left early: the next loop goes on in the same epoch
        head.append(item)
        if len(head) == 3:
            break
    rest = list(node)
    assert_same_stream(head + rest, want[0], "epoch 0")
    assert_same_stream(list(node), want[1], "epoch 1")


@pytest.mark.parametrize("source_kind", ["list", "dataloader"])
@pytest.mark.parametrize("kind", sorted(STAGES))
def test_just_reset_or_unstarted_stage_is_not_reset_again(stages, kind, source_kind) -> None:
    node = stages(kind, make_source(source_kind))
    want = reference_epochs(stages, kind, source_kind, 2)
    assert iter(node) is node and iter(node) is node  # before the first item: still epoch 0
    assert_same_stream(list(node), want[0], "epoch 0")
    node.reset(None)  # the ended epoch is left by the explicit reset, not by iter() again
    assert_same_stream(list(node), want[1], "epoch 1")
    assert node.state_dict()["epoch"] == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source_kind", ["list", "dataloader"])
@pytest.mark.parametrize("kind", sorted(STAGES))
def test_resume_mid_epoch_then_for_continues_exactly(stages, kind, source_kind) -> None:
    want = reference_epochs(stages, kind, source_kind, 2)
    node = stages(kind, make_source(source_kind))
    it = iter(node)
    head = [next(it) for _ in range(5)]
    state = torch_roundtrip(node.state_dict())
    resumed = stages(kind, make_source(source_kind))
    resumed.reset(state)
    rest = [item for item in resumed]
    assert_same_stream(head + rest, want[0], "epoch 0")
    assert resumed.stats.fresh_items == 6
    assert_same_stream([item for item in resumed], want[1], "epoch 1")
    assert resumed.stats.fresh_items == 12


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source_kind", ["list", "dataloader"])
@pytest.mark.parametrize("kind", sorted(STAGES))
def test_resume_after_the_end_then_for_starts_the_next_epoch(stages, kind, source_kind) -> None:
    want = reference_epochs(stages, kind, source_kind, 2)
    node = stages(kind, make_source(source_kind))
    assert len([item for item in node]) == len(want[0])
    state = torch_roundtrip(node.state_dict())
    assert state["ended"] is True
    source = make_source(source_kind)
    resumed = stages(kind, source)
    resumed.reset(state)
    assert resumed.state_dict()["source"] == state["source"]  # saved again unchanged
    with pytest.raises(StopIteration):
        next(resumed)  # the epoch it resumed in is over; only iter() starts the next
    assert_same_stream([item for item in resumed], want[1], "epoch 1")
    assert resumed.stats.fresh_items == 12
    assert resumed.state_dict()["epoch"] == 1
    if source_kind == "dataloader":
        # The finished epoch is not read again to fast-forward the loader: one epoch's reads.
        assert source.dataset.reads == 24


class Positioned:
    """A stateful dataset: its state is a position; a loaded one is where the next pass starts,
    and a pass without one starts at 0 (as ShardDataset does)."""

    def __init__(self, n: int) -> None:
        self.n, self.pos, self._resume = n, 0, 0

    def __iter__(self):
        self.pos, self._resume = self._resume, 0  # taken at iter(), as ShardDataset does
        return self._pass()

    def _pass(self):
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = self.pos = int(state["pos"])


@pytest.mark.timeout(60)
def test_resume_after_the_end_over_a_loader_continues_its_epochs_exactly() -> None:
    from dataecho import EchoingDataLoader  # the loader, as one more re-iterable source

    data = CountingDataset()

    def make() -> Stage:
        loader = EchoingDataLoader(data, batch_size=4, shuffle=True, seed=3)
        return shuffle(echo(loader, 2, seed=0), 3, seed=1)

    node = make()
    want = [[item for item in node] for _ in range(3)]
    saved = make()
    for _ in range(2):
        assert len([item for item in saved]) == 12
    state = torch_roundtrip(saved.state_dict())
    resumed = make()
    resumed.reset(state)
    data.reads = 0
    # The loader's saved end already means its next epoch: it is started once, not twice.
    assert_same_stream([item for item in resumed], want[2], "epoch 2")
    assert data.reads == 24
    assert resumed.source.source.iterable.epoch == 2
    assert resumed.stats.fresh_items == 36 and resumed.stats.unit == "batches"


def test_resume_after_the_end_over_a_stateful_dataset_restores_it_first() -> None:
    node = echo(Positioned(4), 2, seed=0)
    assert [item for item in node] == [0, 0, 1, 1, 2, 2, 3, 3]
    resumed = echo(Positioned(4), 2, seed=0)
    resumed.reset(node.state_dict())
    # Restored at its end, then reset: a full pass, as the uninterrupted stage reads next.
    assert [item for item in resumed] == [item for item in node] == [0, 0, 1, 1, 2, 2, 3, 3]


class ResumesInPass:
    """A stateful iterable: its state is its position in the pass; a loaded position is where
    the next pass resumes, taken when that pass starts to run (a generator's body), and a pass
    without one starts at 0. Restored at a pass's end, its next pass is empty, then a new one
    starts: torchdata's ``IterableWrapper`` protocol."""

    def __init__(self, items: list) -> None:
        self.items, self.pos, self._resume = items, 0, 0

    def __iter__(self):
        self.pos, self._resume = self._resume, 0
        while self.pos < len(self.items):
            self.pos += 1
            yield self.items[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = self.pos = int(state["pos"])


class BackToStartAtTheEnd:
    """A stateful iterable that is its own iterator; at a pass's end its position goes back to
    0, so its state saved at the end restores to the start of the next pass."""

    def __init__(self, items: list) -> None:
        self.items, self.pos = items, 0

    def __iter__(self) -> BackToStartAtTheEnd:
        return self

    def __next__(self):
        if self.pos == len(self.items):
            self.pos = 0
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = int(state["pos"])


STATEFUL_SOURCES = {"resumes_in_pass": ResumesInPass, "back_to_start": BackToStartAtTheEnd}


def ten_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, 3), float(i)), torch.tensor([2 * i, 2 * i + 1])) for i in range(10)]


# Stage kind -> (stage over a node, the items of one pass).
LOADER_STAGES = {
    "echo": (lambda node: echo(node, 2, seed=0), lambda: list(range(10))),
    "shuffle": (lambda node: shuffle(node, 4, seed=0), lambda: list(range(10))),
    "adaptive": (lambda node: adaptive_echo(node, max_factor=1, seed=0), lambda: list(range(10))),
    "stochastic": (
        lambda node: stochastic_echo(node, load_prob=0.5, buffer_size=2, seed=0),
        lambda: list(range(10)),
    ),
    "mix_examples": (lambda node: mix_examples(node, 5, seed=0), ten_batches),
}


def loader_epochs(root, epochs: int, state: dict | None = None) -> list[list]:
    """``epochs`` epochs of ``torchdata.nodes.Loader(root)``, after loading ``state``."""
    loader = Loader(root)
    if state is not None:
        loader.load_state_dict(state)
    out = [list(loader) for _ in range(epochs)]
    if isinstance(root, AdaptiveEcho):
        assert root.close(timeout=5.0)
    return out


def state_at_the_end(root) -> dict:
    """A ``torchdata.nodes.Loader``'s state after one full epoch of ``root``."""
    loader = Loader(root)
    assert list(loader)
    state = torch_roundtrip(loader.state_dict())
    if isinstance(root, AdaptiveEcho):
        assert root.close(timeout=5.0)
    return state


def test_under_a_torchdata_loader_an_end_state_resumes_the_next_epoch_as_mapper_does() -> None:
    def source() -> IterableWrapper:
        return IterableWrapper(ResumesInPass(list(range(10))))

    mapper = loader_epochs(
        Mapper(source(), lambda x: x), 2, state_at_the_end(Mapper(source(), lambda x: x))
    )
    assert mapper == [list(range(10))] * 2  # the source resumes as torchdata expects
    resumed = loader_epochs(
        echo(source(), 2, seed=0), 2, state_at_the_end(echo(source(), 2, seed=0))
    )
    assert resumed == [[x for x in epoch for _ in range(2)] for epoch in mapper]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", sorted(STATEFUL_SOURCES))
@pytest.mark.parametrize("kind", sorted(LOADER_STAGES))
def test_every_stage_under_a_torchdata_loader_resumes_from_an_end_state(kind, source) -> None:
    stage, items = LOADER_STAGES[kind]

    def make() -> Stage:
        return stage(IterableWrapper(STATEFUL_SOURCES[source](items())))

    want = loader_epochs(make(), 3)
    assert want[1]
    got = loader_epochs(make(), 2, state_at_the_end(make()))
    for epoch in range(2):
        assert_same_stream(got[epoch], want[epoch + 1], f"epoch {epoch + 1} after the resume")
    # Without a Loader: reset to the end state, then the for loop's iter() starts the next epoch.
    resumed = make()
    saved = make()
    assert list(saved)
    resumed.reset(torch_roundtrip(saved.state_dict()))
    assert_same_stream(list(resumed), want[1], "epoch 1 after reset")
    for node in (resumed, saved):
        if isinstance(node, AdaptiveEcho):
            assert node.close(timeout=5.0)


@pytest.mark.parametrize(
    ("kind", "key"),
    [("echo", "ended"), ("echo", "rng"), ("adaptive", "ended"), ("adaptive", "skip")],
)
def test_a_state_missing_a_field_is_refused_naming_it(kind, key) -> None:
    # A state of another version (a stage without its end flag, an adaptive stage without its
    # replay count) would resume at the wrong place if read with a default.
    make = {"echo": lambda: echo(list(range(4)), 2, seed=0),
            "adaptive": lambda: adaptive_echo(list(range(4)), max_factor=2, seed=0)}[kind]  # fmt: skip
    node = make()
    next(node)
    state = node.state_dict()
    del state[key]
    resumed = make()
    with pytest.raises(ValueError, match=f"missing {key}; keys: .*start the run anew"):
        resumed.reset(state)
    for stage in (node, resumed):
        if isinstance(stage, AdaptiveEcho):
            assert stage.close(timeout=5.0)


def test_composed_stages_each_start_their_next_epoch() -> None:
    node = shuffle(echo(list(range(5)), 2, seed=0), 3, seed=1)
    epochs = [sorted(node) for _ in range(3)]
    assert epochs == [sorted(list(range(5)) * 2)] * 3
    assert (node.stats.fresh_examples, node.source.stats.fresh_examples) == (30, 15)


# --- argument validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factor", "exc", "named"),
    [
        (0.5, ValueError, "0.5"),
        (0, ValueError, "0.0"),
        (-2, ValueError, "-2.0"),
        (float("nan"), ValueError, "nan"),
        (float("inf"), ValueError, "inf"),
        (float("-inf"), ValueError, "-inf"),
        ("2", TypeError, "'2'"),
        (None, TypeError, "None"),
        (True, TypeError, "True"),
        (torch.tensor(2.0), TypeError, "tensor(2.)"),
    ],
)
def test_bad_factor_errors_name_the_value_and_range(factor: object, exc: type, named: str) -> None:
    with pytest.raises(exc) as info:
        echo(range(3), factor)  # type: ignore[arg-type]
    msg = str(info.value)
    assert f"got {named}" in msg
    assert "factor must be" in msg and ">= 1" in msg
    assert "factor=" in msg  # the fix: an example of a valid call


@pytest.mark.parametrize(
    ("length", "exc", "named"),
    [(-1, ValueError, "-1"), (2.5, TypeError, "2.5"), ("3", TypeError, "'3'"),
     (True, TypeError, "True")],
)  # fmt: skip
def test_bad_length_errors_name_the_value_range_and_fix(length, exc, named) -> None:
    with pytest.raises(exc) as info:
        echo(range(3), 2.5, length=length)
    msg = str(info.value)
    assert f"got {named}" in msg and "length must be" in msg and ">= 0" in msg
    assert "number of items one epoch of the source has" in msg and "None" in msg
    assert echo(range(3), 2.5, length=torch.tensor(3).item()).length == 3


@pytest.mark.parametrize(("seed", "exc"), [(-1, ValueError), (1.5, TypeError), ("3", TypeError)])
def test_bad_seed_errors_name_the_value_and_range(seed: object, exc: type) -> None:
    with pytest.raises(exc, match=r"seed must be an integer >= 0|seed must be >= 0") as info:
        echo(range(3), 2, seed=seed)  # type: ignore[arg-type]
    assert f"got {seed!r}" in str(info.value)
    assert "non-negative int or None" in str(info.value)


def test_valid_factor_types_are_accepted() -> None:
    import fractions

    import numpy as np

    for f in (np.float32(2.5), np.int64(2), fractions.Fraction(5, 2), 1):
        assert echo(range(1), f).factor == float(f)
    assert isinstance(echo(range(1), np.int64(2)).factor, float)


def test_validate_helpers_not_yet_used_by_a_stage() -> None:
    assert _validate.positive_int(3, name="n") == 3
    with pytest.raises(ValueError, match=r"n must be >= 1, got 0; try 4"):
        _validate.positive_int(0, name="n", hint="try 4")
    with pytest.raises(TypeError, match=r"n must be an integer >= 1, got 2.0 of type float"):
        _validate.positive_int(2.0, name="n")
    assert _validate.one_of("a", ("a", "b"), name="mode") == "a"
    with pytest.raises(ValueError, match=r"mode must be one of 'a', 'b', got 'c'"):
        _validate.one_of("c", ("a", "b"), name="mode")
    with pytest.raises(ValueError, match=r"k must be >= 0, got -1; use 0 to disable"):
        _validate.non_negative_int(-1, name="k")
    assert _validate.seed(None) is None and _validate.seed(0) == 0


def test_echo_and_shuffle_name_the_functions() -> None:
    import dataecho.stages
    from dataecho.stages import fixed_echo, shuffle_buffer

    # The modules are fixed_echo and shuffle_buffer, so these names are only the functions.
    assert dataecho.stages.echo is fixed_echo.echo and callable(dataecho.stages.echo)
    assert dataecho.stages.shuffle is shuffle_buffer.shuffle


def test_a_drain_emits_the_copies_due_of_the_last_item_and_a_resume_the_rest() -> None:
    def make():
        return echo(list(range(6)), 3, seed=0)

    node = make()
    head = [next(node) for _ in range(4)]  # item 1's first copy
    node.drain()
    tail = list(node)
    assert node.drained and tail == [1, 1]
    resumed = make()
    resumed.reset(node.state_dict())
    assert Counter(head + tail + list(resumed)) == {i: 3 for i in range(6)}
