"""``dataecho``'s public names: the curated API, and the names that moved, with their warning."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dataecho


def test_every_listed_name_is_there():
    for name in dataecho.__all__:
        assert getattr(dataecho, name) is not None, name


@pytest.mark.parametrize(
    ("name", "module", "attribute"),
    [
        ("train", "dataecho.app.train", "train"),
        ("TrainConfig", "dataecho.app.config", "TrainConfig"),
        ("TrainResult", "dataecho.app.train", "TrainResult"),
        ("distributed", "dataecho.app.distributed", None),
        ("algorithms", "dataecho.optim", None),
    ],
)
def test_a_moved_name_still_works_and_warns_with_its_new_place(name, module, attribute):
    import importlib

    with pytest.warns(DeprecationWarning, match=f"dataecho.{name} moved to {module}"):
        value = getattr(dataecho, name)
    target = importlib.import_module(module)
    assert value is (target if attribute is None else getattr(target, attribute))


def test_the_echoed_optimizers_are_reached_through_the_old_module_name():
    with pytest.warns(DeprecationWarning):
        algorithms = dataecho.algorithms
    assert algorithms.EchoedGD is dataecho.EchoedGD


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dataecho.nope  # noqa: B018


def test_importing_the_library_loads_no_application_module():
    code = "import sys, dataecho; print(sorted(m for m in sys.modules if m.startswith('dataecho.app')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
