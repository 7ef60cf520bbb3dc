"""The one walker over a batch's structure: leaves in order, tensors, types kept."""

from __future__ import annotations

import collections

import torch

from dataecho._structure import leaves, map_leaves, map_tensors, rebuild, tensors

Pair = collections.namedtuple("Pair", "x y")


def test_leaves_and_tensors_come_in_order_through_every_container():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    batch = {"p": Pair(a, "label"), "q": [b, (3, c)]}
    assert leaves(batch) == [a, "label", b, 3, c]
    assert tensors(batch) == [a, b, c]
    assert leaves(a) == [a] and tensors("text") == []


def test_map_tensors_keeps_named_tuples_and_leaves_other_leaves():
    out = map_tensors(Pair(torch.ones(2), "y"), lambda t: t * 2)
    assert isinstance(out, Pair) and out.y == "y" and out.x.tolist() == [2.0, 2.0]


def test_keep_types_keeps_subclasses_of_dict_and_list():
    counts = collections.defaultdict(list, {"a": [1]})
    plain = rebuild(counts, lambda v: v)
    kept = map_leaves(counts, lambda v: v + 1, keep_types=True)
    assert type(plain) is dict
    assert type(kept) is collections.defaultdict and kept.default_factory is list
    assert kept == {"a": [2]} and counts == {"a": [1]}
