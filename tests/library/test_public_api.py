"""``dataecho``'s public names: the curated API; the library never loads the application."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dataecho


def test_every_listed_name_is_there():
    for name in dataecho.__all__:
        assert getattr(dataecho, name) is not None, name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dataecho.nope  # noqa: B018


def test_importing_the_library_loads_no_application_module():
    code = "import sys, dataecho; print(sorted(m for m in sys.modules if m.startswith('dataecho.app')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
