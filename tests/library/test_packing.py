"""pack/unpack: checkpoint-safe, alias-free round trips of buffered items."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from conftest import assert_same_stream, torch_roundtrip

from dataecho.stages.packing import pack, unpack

Point = collections.namedtuple("Point", "x y")

CASES = {
    "image-label tuples": [
        (torch.randint(0, 255, (1, 4, 4), dtype=torch.uint8), i) for i in range(5)
    ],
    "dicts with arrays and strings": [
        {"x": np.arange(3, dtype=np.float32) * i, "meta": [i, "s"]} for i in range(4)
    ],
    "plain numbers": [1, 2.5, 3],
    "ragged tensors": [torch.zeros(i + 1) for i in range(3)],
    "mixed structures": [(torch.zeros(2), 1), {"a": 1}],
    "namedtuples": [Point(torch.ones(2), i) for i in range(3)],
    "tuples beside leaves": [(1, 2), 3, (4, 5)],
    "int-keyed dicts": [{1: "a"}, {2: "b"}],
    "nested": [((torch.full((1,), i), [np.zeros(2, np.float32)]), {"k": i}) for i in range(3)],
    "empty": [],
}


@pytest.mark.parametrize("name", CASES)
def test_round_trip_is_exact_and_weights_only_safe(name):
    items = CASES[name]
    packed = pack(items)
    assert_same_stream(unpack(packed), items, name)
    if name != "namedtuples":  # arbitrary classes fall back to copies torch will not load safely
        assert_same_stream(unpack(torch_roundtrip(packed)), items, f"{name} via torch.load")


def test_uniform_items_are_stacked_into_columns():
    items = CASES["image-label tuples"]
    packed = pack(items)
    assert packed["format"] == "columns"
    assert packed["columns"][0]["data"].shape == (5, 1, 4, 4)
    assert packed["columns"][1]["data"] == [0, 1, 2, 3, 4]
    assert pack(CASES["ragged tensors"])["format"] == "list"
    nested = pack(CASES["nested"])
    assert nested["format"] == "columns"
    assert nested["structure"] == ["tuple", [["tuple", ["leaf", ["list", ["leaf"]]]],
                                             ["dict", ["k"], ["leaf"]]]]  # fmt: skip
    assert [c["kind"] for c in nested["columns"]] == ["tensor", "ndarray", "plain"]
    for name in ("tuples beside leaves", "int-keyed dicts", "mixed structures"):
        assert pack(CASES[name])["format"] == "list", name


def test_packed_and_unpacked_items_share_no_memory():
    items = [(torch.zeros(3), i) for i in range(4)]
    packed = pack(items)
    for x, _ in items:
        x.add_(1)  # the buffer's items change after the checkpoint was taken
    restored = unpack(packed)
    assert all(torch.equal(x, torch.zeros(3)) for x, _ in restored)
    restored[0][0].add_(5)  # one restored item changes: no other one does
    assert all(torch.equal(x, torch.zeros(3)) for x, _ in restored[1:])
    assert all(torch.equal(x, torch.zeros(3)) for x, _ in unpack(packed))
