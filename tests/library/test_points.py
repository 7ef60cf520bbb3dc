"""The insertion points' registry (dataecho.loader.points): the one place that decides by ``where``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torchdata.nodes import Mapper

from dataecho import EchoingDataLoader, LoaderOptions
from dataecho.errors import DataechoValueError
from dataecho.loader.points import POINTS, InsertionPoint, register
from dataecho.loader.points.batches import Batch
from dataecho.loader.points.common import MainChain, MainSide, Node, Seeds, echo_stage
from dataecho.stages.seeds import STAGE_ECHO

PACKAGE = Path(__file__).resolve().parents[2] / "dataecho"


def comparisons_to_a_point(source: str) -> list[str]:
    """Every comparison in ``source`` with a registered point's name (or a tuple of them)."""

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & set(POINTS)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(set(), *(names(e) for e in node.elts))
        return set()

    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(names(o) for o in (node.left, *node.comparators))
    ]


def test_no_module_outside_the_registry_compares_where_to_a_points_name():
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in PACKAGE.rglob("*.py")
        if "points" not in path.relative_to(PACKAGE).parts
        if (hits := comparisons_to_a_point(path.read_text()))
    }
    assert found == {}


def test_the_scan_finds_the_comparisons_it_forbids():
    source = 'if opts.where == "device" or where in ("batch", "x"): pass\nif w != "cpu": pass'
    assert comparisons_to_a_point(source) == [
        "opts.where == 'device'",
        "where in ('batch', 'x')",
    ]


class Reversed(Batch):
    """A toy point: whole batches echoed in the main process, the last copy of each with its
    examples in reverse order."""

    name = "toy_reversed"

    def main_stages(
        self, workers: Node, opts: LoaderOptions, seed: Seeds, side: MainSide
    ) -> MainChain:
        echo = echo_stage(workers, opts, seed(STAGE_ECHO), length=side.epoch_fresh_batches())
        flip = Mapper(echo, lambda b: b.flip(0) if echo.copies_due == 0 else b)
        return flip, None


@pytest.fixture
def toy():
    point = register(Reversed())
    try:
        yield point
    finally:
        del POINTS[point.name]


def test_a_new_insertion_point_is_one_class_registered(toy):
    data = torch.arange(12)
    loader = EchoingDataLoader(data, batch_size=4, where="toy_reversed", echo_factor=2, seed=0)
    assert loader.options.point is toy and len(loader) == 6
    batches = [b.tolist() for b in loader]
    assert batches == [
        [0, 1, 2, 3], [3, 2, 1, 0], [4, 5, 6, 7], [7, 6, 5, 4], [8, 9, 10, 11], [11, 10, 9, 8],
    ]  # fmt: skip
    assert (loader.stats.fresh_examples, loader.stats.items_out) == (12, 24)
    with pytest.raises(DataechoValueError, match="toy_reversed"):
        EchoingDataLoader(data, batch_size=4, where="toy_reversed", echo_device="cpu")


def test_an_unknown_point_is_refused_with_the_registered_ones():
    with pytest.raises(DataechoValueError) as caught:
        LoaderOptions(batch_size=4, where="nowhere")
    assert "'nowhere'" in str(caught.value)
    assert all(name in str(caught.value) for name in POINTS)


def test_a_name_is_registered_once():
    with pytest.raises(DataechoValueError, match="registered already"):
        register(Batch())


@pytest.mark.parametrize("name", sorted(POINTS))
def test_every_point_answers_every_question(name):
    point: InsertionPoint = POINTS[name]
    opts = LoaderOptions(batch_size=8, echo_factor=2, where=name)
    assert opts.point is point and point.name == name
    assert point.takes_loader == point.batch_level
    assert set(point.counting(opts)) == {"deferred", "counted_downstream"}
