"""before_augment at a fixed factor, one node per batch (dataecho.loader.example_batches), and
copies made together (dataecho.stages.copying.copy_items)."""

from __future__ import annotations

import collections
from collections import namedtuple

import numpy as np
import pytest
import torch
from conftest import Numbers, assert_same_item, run_test_save_load_state
from torch.utils.data import Dataset
from torchdata.nodes import Batcher, IterableWrapper, Mapper

from dataecho import EchoingDataLoader
from dataecho.loader.example_batches import ExampleBatches
from dataecho.loader.points.common import OnItem
from dataecho.stages import Echo, copy_item
from dataecho.stages.copying import copy_items

Pair = namedtuple("Pair", ["image", "label"])


def add_noise(example):
    x, y = example
    return x + torch.rand(x.shape), y


def add_one_in_place(example):
    """Writes into its input and hands it on: copies that shared memory would show it."""
    x, y = example
    x.add_(1)
    return x, y


class InMemory(Dataset):
    """Examples held in memory and handed out as they are (no copy), as a TensorDataset does."""

    def __init__(self, n: int) -> None:
        self.data = [(torch.full((4,), float(i)), i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.data[i]


def tagged(n: int, width: int = 3) -> list[tuple[int, tuple[torch.Tensor, int]]]:
    return [(i, (torch.full((width,), float(i)), i)) for i in range(n)]


@pytest.mark.parametrize("shuffle_buffer", [0, 16])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_write_to_one_copy_changes_no_other_copy_and_not_the_dataset(shuffle_buffer,
                                                                       num_workers):  # fmt: skip
    ds = InMemory(40)
    loader = EchoingDataLoader(ds, batch_size=8, echo_factor=3, shuffle_buffer=shuffle_buffer,
                               transform=add_one_in_place, num_workers=num_workers, seed=0)  # fmt: skip
    seen = collections.Counter()
    for xs, ys in loader:
        for x, y in zip(xs, ys, strict=True):
            assert torch.equal(x, torch.full((4,), float(y) + 1)), "a copy saw another's write"
            seen[int(y)] += 1
    assert seen == {i: 3 for i in range(40)}
    assert all(torch.equal(x, torch.full((4,), float(i))) for i, (x, _) in enumerate(ds.data))


@pytest.mark.parametrize("shuffle_buffer", [0, 12])
def test_copies_of_one_batch_share_no_memory_that_a_write_could_reach(shuffle_buffer):
    node = ExampleBatches(tagged(10), 4, batch_size=16, shuffle_buffer=shuffle_buffer, seed=1)
    batch = next(node)
    for k, (_, (x, _)) in enumerate(batch):
        before = [v.clone() for _, (v, _) in batch]
        x.mul_(-1)
        for j, (_, (v, _)) in enumerate(batch):
            assert torch.equal(v, -before[j] if j == k else before[j])


def old_chain(source, factor, batch_size, transform):
    """The per-example chain before_augment ran without a shuffle buffer: echo, transform,
    batcher."""
    echo = Echo(IterableWrapper(source), factor, seed=5, length=len(source))
    return Batcher(Mapper(echo, OnItem(transform)), batch_size, drop_last=False)


@pytest.mark.parametrize("factor", [1, 2, 2.5])
def test_without_a_shuffle_buffer_the_stream_is_the_per_example_chains(factor):
    def stream(node):
        torch.manual_seed(0)  # the transform draws from torch's global RNG, as torchvision's
        return list(node)

    want = stream(old_chain(tagged(21), factor, 4, add_noise))
    got = stream(ExampleBatches(tagged(21), factor, batch_size=4, transform=add_noise, seed=5,
                                length=21))  # fmt: skip
    assert_same_item(got, want)


@pytest.mark.parametrize("factor", [2, 2.5])
def test_the_buffer_mixes_copies_across_batches_and_gives_exact_counts(factor):
    node = ExampleBatches(tagged(400), factor, batch_size=16, shuffle_buffer=128, seed=2,
                          length=400)  # fmt: skip
    batches = list(node)
    assert [len(b) for b in batches[:-1]] == [16] * (len(batches) - 1)
    counts = collections.Counter(n for b in batches for n, _ in b)
    assert collections.Counter(counts.values()) == ({2: 400} if factor == 2 else {2: 200, 3: 200})
    # Copies spread out: a batch holds about 15 of 16 distinct examples (in order, 16 / factor),
    # and reads arrive out of order.
    distinct = [len({n for n, _ in b}) for b in batches[:-1]]
    assert sum(distinct) / len(distinct) > 13
    firsts = [n for b in batches for n, _ in b]
    assert firsts != sorted(firsts)


def test_each_batch_is_a_uniform_draw_from_the_buffer_in_random_order():
    """The buffer is kept in random order and a batch is its last entries: over seeds, every
    entry of the first buffer (63 + 8 - 1 of them) is as likely to be in the first batch, at
    any place in it."""
    counts, firsts = collections.Counter(), collections.Counter()
    for seed in range(1500):
        node = ExampleBatches(((i, i) for i in range(200)), 1, batch_size=8, shuffle_buffer=63,
                              seed=seed)  # fmt: skip
        batch = [n for n, _ in next(node)]
        counts.update(batch)
        firsts[batch[0]] += 1
    assert set(counts) == set(range(70))  # drawn from the first 70 reads only
    assert min(counts.values()) > 120 and max(counts.values()) < 220, counts  # 171 expected
    assert max(firsts.values()) < 50, firsts  # 21 expected


@pytest.mark.parametrize("shuffle_buffer", [0, 9])
def test_resumes_exactly_at_every_position(shuffle_buffer):
    run_test_save_load_state(
        lambda: ExampleBatches(tagged(23), 2.5, batch_size=4, shuffle_buffer=shuffle_buffer,
                               transform=lambda e: (e[0] * 2, e[1]), seed=3, length=23),
        summary=lambda n: (n.stats.fresh_items, n.stats.items_out),
        end_may_start_next_epoch=True,
    )  # fmt: skip


def test_the_buffer_state_holds_each_original_once():
    node = ExampleBatches(tagged(100, width=64), 4, batch_size=8, shuffle_buffer=64, seed=0)
    next(node)
    state = node.state_dict()
    assert len(state["refs"]) == len(node._entries) >= 64
    (images,) = [c["data"] for c in state["buffer"]["columns"] if c["kind"] == "tensor"]
    assert len(images) == len(set(state["refs"])) < len(state["refs"])


def test_auto_before_augment_still_echoes_each_copy_augmented():
    loader = EchoingDataLoader(Numbers(24), batch_size=4, echo_factor="auto", transform=add_noise,
                               max_echo_factor=3, seed=0)  # fmt: skip
    assert loader.stats.fresh_examples == 0
    assert len(list(loader)) >= 6 and loader.stats.fresh_examples == 24


# copy_items: the values and types of copy_item, as rows of one block where they can be.
ITEMS = {
    "tuple": lambda i: (torch.full((2, 3), float(i)), i),
    "list": lambda i: [torch.full((3,), float(i)), np.full(2, i), "s"],
    "dict": lambda i: {"x": torch.full((3,), float(i)), "y": np.full((2, 2), i), "id": i},
    "namedtuple": lambda i: Pair(torch.full((3,), float(i)), i),
    "nested": lambda i: ((torch.full((1,), float(i)), [np.full(1, i)]), {"k": i}),
    "shapes differ": lambda i: (torch.zeros(i + 1), i),
    "not contiguous": lambda i: (torch.full((3, 4), float(i)).t(), i),
    "0-d array": lambda i: (np.array(float(i)), i),
}


@pytest.mark.parametrize("name", list(ITEMS))
def test_copy_items_copies_as_copy_item_does_and_shares_no_memory(name):
    make = ITEMS[name]
    items = [make(i) for i in range(5)]
    copies = copy_items(items)
    for item, got in zip(items, copies, strict=True):
        assert_same_item(got, copy_item(item))
        for v, original in zip(_arrays(got), _arrays(item), strict=True):
            # A copy keeps its original's layout (a row of a block only where it is contiguous).
            strides = (
                (lambda a: a.stride()) if isinstance(v, torch.Tensor) else (lambda a: a.strides)
            )
            assert strides(v) == strides(original)
    for i in range(len(copies)):
        for v in _arrays(copies[i]):
            v += 1  # in place: no original and no other copy may see it
        for j in range(len(copies)):
            assert_same_item(items[j], make(j))
            if j > i:
                assert_same_item(copies[j], make(j))


def test_copy_items_of_tensors_outside_autograd_only_and_of_mixed_types_one_by_one():
    grads = [torch.ones(2, requires_grad=True) for _ in range(3)]
    assert all(c.grad_fn is not None and c._base is None for c in copy_items(grads))
    mixed = [(torch.zeros(2), 1), [torch.zeros(2), 1]]
    assert [type(c) for c in copy_items(mixed)] == [tuple, list]


def _arrays(x):
    """The tensors and arrays of ``x``, in order."""
    if isinstance(x, dict):
        return [v for y in x.values() for v in _arrays(y)]
    if isinstance(x, (tuple, list)):
        return [v for y in x for v in _arrays(y)]
    return [x] if isinstance(x, (torch.Tensor, np.ndarray)) else []


def test_copy_items_of_tensors_on_other_layouts_or_shapes_one_by_one():
    sparse = [torch.eye(3), torch.eye(3).to_sparse()]
    got = copy_items(sparse)
    assert [t.layout for t in got] == [torch.strided, torch.sparse_coo]
    assert all(t._base is None for t in copy_items([torch.zeros(2), torch.zeros(3)]))


def _shares_memory(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return np.shares_memory(a, b)


@pytest.mark.parametrize("kinds", [["tuple"], ["tuple", "not contiguous", "shapes differ"],
                                   list(ITEMS)])  # fmt: skip
def test_the_buffer_copies_examples_of_several_kinds_each_as_copy_item_does(kinds):
    """The buffer decides how to copy its originals as they enter (copying.copy_plan), not per
    batch of their copies: with examples of several kinds in it, each copy is still its
    original's, as copy_item makes it, in its layout and sharing no memory with it."""
    made = [ITEMS[kinds[i // 20 % len(kinds)]](i) for i in range(60)]  # kinds in turn
    node = ExampleBatches(list(enumerate(made)), 3, batch_size=8, shuffle_buffer=16, seed=0,
                          length=60)  # fmt: skip
    seen = collections.Counter()
    for batch in node:
        for n, got in batch:
            seen[n] += 1
            assert_same_item(got, copy_item(made[n]))
            for v, original in zip(_arrays(got), _arrays(made[n]), strict=True):
                assert not _shares_memory(v, original)
                stride = v.stride() if isinstance(v, torch.Tensor) else v.strides
                assert stride == (original.stride() if isinstance(v, torch.Tensor)
                                  else original.strides)  # fmt: skip
    assert seen == {n: 3 for n in range(60)}


def test_resumes_exactly_with_examples_of_several_kinds_in_the_buffer():
    kinds = [ITEMS["tuple"], ITEMS["not contiguous"], lambda i: {"x": torch.full((3,), i), "id": i}]
    made = [kinds[i % 3](i) for i in range(30)]
    run_test_save_load_state(
        lambda: ExampleBatches(list(enumerate(made)), 2.5, batch_size=4, shuffle_buffer=9,
                               seed=3, length=30),
        summary=lambda n: (n.stats.fresh_items, n.stats.items_out),
        end_may_start_next_epoch=True,
    )  # fmt: skip


def test_a_buffer_saved_in_another_order_is_refused_and_the_loaded_node_is_untouched():
    """A buffer saved by a version that took its batches from anywhere in it has no
    "random_order": taken from its end, it would give other batches, so it is refused."""
    node = ExampleBatches(tagged(60), 3, batch_size=8, shuffle_buffer=24, seed=1, length=60)
    before = [n for _ in range(4) for n, _ in next(node)]
    state = node.state_dict()
    del state["random_order"]
    resumed = ExampleBatches(tagged(60), 3, batch_size=8, shuffle_buffer=24, seed=1, length=60)
    with pytest.raises(ValueError, match="missing random_order; keys: .*start the run anew"):
        resumed.reset(state)
    state["random_order"] = True  # the same state, whole, still resumes every copy
    resumed.reset(state)
    after = [n for b in resumed for n, _ in b]
    assert collections.Counter(before + after) == {n: 3 for n in range(60)}
