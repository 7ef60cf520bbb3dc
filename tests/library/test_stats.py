"""The shared counters (dataecho.stages.stats) and how stages keep them."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SlowIterable, torch_roundtrip
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
from torchdata.nodes import IterableWrapper

from dataecho import EchoingDataLoader
from dataecho.errors import DataechoAttributeError
from dataecho.stages import EchoStats, adaptive_echo, echo, shuffle, stochastic_echo
from dataecho.stages.stats import item_unit


def test_derived_figures() -> None:
    s = EchoStats()
    assert s.realized_factor == 0.0 and s.echoed_examples == 0
    s.fresh_examples, s.examples_out = 4, 10
    assert s.realized_factor == 2.5
    assert s.echoed_examples == 6
    assert s.as_dict() == {
        "unit": "examples",
        "fresh_examples": 4,
        "examples_out": 10,
        "batches": 0,
        "wait_seconds": 0.0,
        "stall_seconds": 0.0,
        "work_seconds": 0.0,
        "waiting_examples": 0,
        "realized_factor": 2.5,
        "echoed_examples": 6,
    }


def test_echoed_examples_never_negative() -> None:
    # A shuffle buffer that has read more than it emitted so far.
    assert EchoStats(fresh_examples=8, examples_out=3).echoed_examples == 0


def test_state_round_trips_through_json_and_torch() -> None:
    s = EchoStats(fresh_examples=3, examples_out=7, batches=2, wait_seconds=1.5)
    for state in (json.loads(json.dumps(s.state_dict())), torch_roundtrip(s.state_dict())):
        t = EchoStats()
        t.load_state_dict(state)
        assert t == s


def test_load_coerces_types_and_keeps_missing_fields() -> None:
    # JSON and older checkpoints may give floats for counts, or lack newer fields.
    t = EchoStats(batches=5)
    t.load_state_dict({"fresh_examples": 3.0, "examples_out": 6, "wait_seconds": 1})
    assert t == EchoStats(fresh_examples=3, examples_out=6, batches=5, wait_seconds=1.0)
    assert type(t.fresh_examples) is int and type(t.wait_seconds) is float


def test_stage_counters_survive_a_resume() -> None:
    node = echo(list(range(50)), 2.5, seed=0)
    [next(node) for _ in range(40)]
    state = node.state_dict()
    resumed = echo(list(range(50)), 2.5, seed=0)
    resumed.reset(state)
    assert resumed.stats == node.stats
    list(node), list(resumed)
    assert resumed.stats.examples_out == node.stats.examples_out
    assert resumed.stats.fresh_examples == 50


@pytest.mark.timeout(30)
@pytest.mark.parametrize("make", [lambda s: echo(s, 3, seed=0), lambda s: shuffle(s, 4, seed=0)])
def test_wait_seconds_counts_a_slow_source(make) -> None:
    delay, n = 0.02, 10
    node = make(SlowIterable(n, delay))
    out = list(node)
    assert len(out) >= n
    # Every fresh item waited at least its sleep; echoed copies and buffer hits add no sleep.
    assert node.stats.wait_seconds >= n * delay
    assert node.stats.fresh_examples == n


def test_wait_seconds_is_part_of_the_state() -> None:
    node = echo(SlowIterable(3, 0.01), 2, seed=0)
    list(node)
    waited = node.stats.wait_seconds
    assert waited >= 0.03
    resumed = echo(SlowIterable(3, 0.0), 2, seed=0)
    resumed.reset(node.state_dict())
    assert resumed.stats.wait_seconds == waited


# --- the unit: examples or batches -------------------------------------------------------------


def dataset(n: int = 24) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1), torch.arange(n))


class Batches:
    """A batching loader that is no DataLoader: a ``batch_size`` and ``__iter__``."""

    batch_size = 4

    def __iter__(self):
        return iter([torch.zeros(4, 2) for _ in range(3)])


def test_unit_is_batches_over_a_batching_loader() -> None:
    sampler = BatchSampler(SequentialSampler(range(24)), batch_size=4, drop_last=False)
    assert item_unit(DataLoader(dataset(), batch_size=4)) == "batches"
    assert item_unit(DataLoader(dataset(), batch_sampler=sampler)) == "batches"
    assert item_unit(Batches()) == "batches"
    assert item_unit(EchoingDataLoader(dataset(), batch_size=4)) == "batches"
    # Examples one by one: a DataLoader that does not batch, a dataset, a list.
    assert item_unit(DataLoader(dataset(), batch_size=None)) == "examples"
    assert item_unit(dataset()) == "examples"
    assert item_unit([1, 2, 3]) == "examples"
    # What a stage wraps: torchdata's IterableWrapper, another stage.
    assert item_unit(IterableWrapper(Batches())) == "batches"
    assert item_unit(echo(Batches(), 2, seed=0)) == "batches"
    assert item_unit(echo([1, 2], 2, seed=0)) == "examples"


# A stage over a source, and the items it reads per epoch of 24 examples in batches of 4.
OVER = {
    "echo": (lambda s: echo(s, 2, seed=0), 1),
    "shuffle": (lambda s: shuffle(s, 3, seed=0), 1),
    "stochastic": (lambda s: stochastic_echo(s, load_prob=1.0, buffer_size=2, seed=0), 1),
    "adaptive": (lambda s: adaptive_echo(s, max_factor=1, seed=0), 1),
    "shuffle over echo": (lambda s: shuffle(echo(s, 2, seed=0), 3, seed=1), 2),  # the copies
}


@pytest.mark.parametrize("kind", sorted(OVER))
def test_stages_over_a_dataloader_count_batches(kind: str) -> None:
    make, copies = OVER[kind]
    node = make(DataLoader(dataset(), batch_size=4))
    out = list(node)
    s = node.stats
    assert s.unit == "batches"
    assert s.fresh_items == 6 * copies  # 24 examples in 6 batches
    assert s.items_out == len(out)
    assert s.as_dict()["unit"] == "batches"
    assert s.as_dict()["fresh_batches"] == 6 * copies and "fresh_examples" not in s.as_dict()
    assert repr(s).startswith(f"EchoStats(unit='batches', fresh_items={6 * copies}, ")
    over_examples = make(DataLoader(dataset(), batch_size=None))  # examples one by one
    n = len(list(over_examples))
    assert over_examples.stats.unit == "examples"
    assert over_examples.stats.fresh_examples == over_examples.stats.fresh_items == 24 * copies
    assert over_examples.stats.examples_out == n


def test_the_examples_names_on_a_stage_that_counts_batches_name_the_counter_to_read() -> None:
    node = echo(DataLoader(dataset(), batch_size=4), 2, seed=0)
    list(node)
    s = node.stats
    for name, neutral in [("fresh_examples", "fresh_items"), ("examples_out", "items_out"),
                          ("echoed_examples", "echoed_items")]:  # fmt: skip
        with pytest.raises(DataechoAttributeError, match=rf"{name} counts examples.*counts "
                           rf"batches: read stats\.{neutral}"):  # fmt: skip
            getattr(s, name)
        assert getattr(s, name, None) is None  # an AttributeError: getattr's default applies
    with pytest.raises(AttributeError, match="fresh_examples"):
        s.fresh_examples = 1
    assert s.fresh_items == 6  # unchanged: 24 examples in batches of 4
    with pytest.raises(AttributeError, match="examples_out"):
        EchoStats(examples_out=3, unit="batches")


def test_unit_is_not_in_the_state_and_survives_a_resume() -> None:
    node = echo(DataLoader(dataset(), batch_size=4), 2, seed=0)
    [next(node) for _ in range(5)]
    state = node.stats.state_dict()
    assert "unit" not in state
    assert all(isinstance(v, (int, float)) for v in state.values())  # numbers only
    saved = torch_roundtrip(node.state_dict())
    resumed = echo(DataLoader(dataset(), batch_size=4), 2, seed=0)
    resumed.reset(saved)
    assert resumed.stats == node.stats and resumed.stats.unit == "batches"
    # A state from elsewhere never changes what this stage counts.
    resumed.stats.load_state_dict({**state, "unit": "examples"})
    assert resumed.stats.unit == "batches"


def test_a_state_names_the_item_counters_in_their_unit() -> None:
    t = EchoStats(fresh_items=3, items_out=6, wait_seconds=0.5, unit="batches")
    assert EchoStats(3, 6) == EchoStats(fresh_examples=3, examples_out=6)  # positional as before
    # Saved now, a batch-counting stage names its counters in batches; the loader in examples.
    assert set(t.state_dict()) == {"fresh_batches", "batches_out", "batches", "wait_seconds",
                                   "stall_seconds", "work_seconds", "waiting_batches"}  # fmt: skip
    assert EchoStats(3, 6).state_dict()["fresh_examples"] == 3
    u = EchoStats(unit="batches")
    u.load_state_dict(t.state_dict())
    assert u == t


def test_bad_unit_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unit must be one of 'examples', 'batches', got 'items'"):
        EchoStats(unit="items")
