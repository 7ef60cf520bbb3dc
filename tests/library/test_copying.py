"""Copy-on-echo (dataecho.stages.copying): an in-place change never leaks between copies."""

from __future__ import annotations

from collections import Counter, defaultdict, namedtuple
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_test_save_load_state
from PIL import Image

from dataecho.stages import Echo, copy_item, copy_pinned, echo, shuffle

Pair = namedtuple("Pair", ["image", "label"])


class Record:
    """An arbitrary user object holding mutable state."""

    def __init__(self) -> None:
        self.pixels = [1, 2, 3]
        self.meta = {"seen": 0}


class Tagged(list):
    """A list subclass with an attribute, as some datasets return."""

    tag = "t"


def _add_one(x: torch.Tensor | np.ndarray) -> None:
    x += 1  # in place for both tensors and arrays


# (name, make an item, change it in place, snapshot of its values)
CASES: list[tuple[str, Callable[[], Any], Callable[[Any], None], Callable[[Any], Any]]] = [
    ("tensor", lambda: torch.arange(4.0), lambda x: x.add_(1), lambda x: x.tolist()),
    (
        "uint8 image tensor",
        lambda: torch.zeros(2, 3, 3, dtype=torch.uint8),
        _add_one,
        lambda x: x.tolist(),
    ),
    ("ndarray", lambda: np.arange(6).reshape(2, 3), _add_one, lambda x: x.tolist()),
    (
        "dict",
        lambda: {"x": torch.ones(3), "y": np.zeros(2), "ids": [1, 2]},
        lambda d: (d["x"].mul_(5), _add_one(d["y"]), d["ids"].append(3)),
        lambda d: (d["x"].tolist(), d["y"].tolist(), list(d["ids"])),
    ),
    (
        "list",
        lambda: [torch.zeros(2), [np.zeros(1)]],
        lambda v: (v[0].add_(1), v[1].append(0)),
        lambda v: (v[0].tolist(), len(v[1])),
    ),
    (
        "tuple",
        lambda: (torch.zeros(2), np.zeros(2)),
        lambda t: (t[0].add_(1), _add_one(t[1])),
        lambda t: (t[0].tolist(), t[1].tolist()),
    ),
    (
        "namedtuple",
        lambda: Pair(torch.zeros(2, 2), 3),
        lambda p: p.image.fill_(7),
        lambda p: (p.image.tolist(), p.label),
    ),
    (
        "object",
        Record,
        lambda r: (r.pixels.append(4), r.meta.update(seen=1)),
        lambda r: (list(r.pixels), dict(r.meta)),
    ),
    (
        "PIL image",
        lambda: Image.new("L", (4, 4), 0),
        lambda im: im.putpixel((1, 1), 255),
        lambda im: im.tobytes(),
    ),
    ("Counter", lambda: Counter({"a": 2}), lambda c: c.update("a"), lambda c: dict(c)),
    (
        "defaultdict",
        lambda: defaultdict(list, {"a": [1]}),
        lambda d: d["a"].append(2),
        lambda d: {k: list(v) for k, v in d.items()},
    ),
    ("list subclass", lambda: Tagged([[0]]), lambda v: v[0].append(1), lambda v: [list(v[0])]),
    ("bytearray", lambda: bytearray(b"ab"), lambda b: b.extend(b"c"), bytes),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("copy", [copy_item, copy_pinned])  # copy_pinned: as copy_item here
@pytest.mark.parametrize(("name", "make", "change", "snap"), CASES, ids=IDS)
def test_copy_item_shares_no_mutable_memory(name, make, change, snap, copy) -> None:
    item = make()
    before = snap(item)
    dup = copy(item)
    assert type(dup) is type(item)
    assert snap(dup) == before
    change(dup)
    assert snap(dup) != before, "the change must be visible on the changed copy"
    assert snap(item) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_a_pinned_batchs_echoed_copies_stay_pinned() -> None:
    batch = (torch.arange(12.0).pin_memory(), torch.zeros(3, dtype=torch.long).pin_memory())
    copies = list(Echo([batch], 3, seed=0, pinned=True))
    assert all(t.is_pinned() for c in copies for t in c)
    assert len({c[0].data_ptr() for c in copies} | {batch[0].data_ptr()}) == 4
    assert not any(t.is_pinned() for c in Echo([batch], 3, seed=0) for t in c)


@pytest.mark.parametrize("factor", [2, 3])
@pytest.mark.parametrize(("name", "make", "change", "snap"), CASES, ids=IDS)
def test_echoed_copies_are_independent(name, make, change, snap, factor: int) -> None:
    source = [make()]
    before = snap(source[0])
    copies = list(echo(source, factor, seed=0))
    assert len(copies) == factor
    assert len({id(c) for c in copies} | {id(source[0])}) == factor + 1
    for i in range(factor):
        change(copies[i])
        assert [snap(c) for c in copies[i + 1 :]] == [before] * (factor - i - 1)
    assert snap(source[0]) == before


@pytest.mark.parametrize(("name", "make", "change", "snap"), CASES[:3], ids=IDS[:3])
def test_copy_false_opt_out_aliases(name, make, change, snap) -> None:
    # The documented opt-out: no copies, every emitted copy *is* the source item.
    source = [make()]
    before = snap(source[0])
    copies = list(echo(source, 3, seed=0, copy=False))
    assert all(c is source[0] for c in copies)
    change(copies[0])
    assert snap(copies[2]) != before


def test_items_emitted_once_pass_through_uncopied() -> None:
    # Factor 1, and the single-copy items of a fractional factor, cost no copy.
    source = [torch.full((2,), float(i)) for i in range(30)]
    assert all(a is b for a, b in zip(echo(source, 1, seed=0), source, strict=True))
    out = list(echo(source, 1.5, seed=0))
    lengths = Counter()
    for x in source:
        copies = [y for y in out if torch.equal(x, y)]
        lengths[len(copies)] += 1
        # One copy: the source object itself. Two copies: both fresh objects.
        assert [y is x for y in copies] == ([True] if len(copies) == 1 else [False, False])
    assert lengths == {1: 15, 2: 15}  # exactly half of the items twice


def test_immutable_leaves_are_shared() -> None:
    big = "x" * 1000
    t = (1, big, None, np.float32(2.0))
    dup = copy_item(t)
    assert dup == t and dup[1] is big and dup[3] is t[3]


def test_saved_state_is_not_changed_by_later_in_place_work() -> None:
    # A consumer that changes every item it gets must not change a state saved before.
    def stream():
        return shuffle(echo([torch.full((2,), float(i)) for i in range(6)], 3, seed=1), 5, seed=2)

    clean = [x.clone() for x in stream()]
    node = stream()
    head = [next(node) for _ in range(4)]
    state = node.state_dict()
    for x in list(node) + head:
        x.mul_(-1)
    resumed = stream()
    resumed.reset(state)
    rest = list(resumed)
    assert all(torch.equal(a, b) for a, b in zip(rest, clean[4:], strict=True))
    assert len(rest) == len(clean) - 4


def test_echo_state_keeps_the_pending_item_pristine() -> None:
    source = [torch.zeros(3)]
    node = echo(source, 3, seed=0)
    first = next(node)
    state = node.state_dict()
    first.add_(1)
    for x in node:
        x.add_(1)
    resumed = echo([torch.zeros(3)], 3, seed=0)
    resumed.reset(state)
    assert [x.tolist() for x in resumed] == [[0.0] * 3] * 2


class RefilledBuffer:
    """A source that yields one preallocated tensor, refilled in place for every item.

    Fast readers do this to avoid allocations; an echo stage must not keep a reference to it
    in its state, or the state changes when the next item is read.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        buf = torch.empty(3)
        for i in range(self.n):
            buf.fill_(i)
            yield buf


def test_state_does_not_alias_a_refilled_source_buffer() -> None:
    # Every emitted item of factor 3 is a copy, so the stream itself is correct; the harness
    # holds each state while the original node reads on (refilling the buffer) and resumes it.
    rec = run_test_save_load_state(
        lambda: echo(RefilledBuffer(5), 3, seed=0), end_may_start_next_epoch=True
    )
    assert [x[0].item() for x in rec[0]] == [i for i in range(5) for _ in range(3)]
