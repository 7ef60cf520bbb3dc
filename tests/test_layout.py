"""The four places and their import rules, read off the source by ``scripts/layout.py``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

MODULES = layout.modules(ROOT)
GRAPH = layout.imports(MODULES)


def test_the_four_places_are_found_with_their_modules():
    places = {layout.place(name) for name in MODULES}
    assert places == {"library", "application", "experiments", "benchmarks"}
    assert layout.place("dataecho.loader.echoing_loader") == "library"
    assert layout.place("dataecho.app.train") == "application"


def test_the_library_imports_nothing_of_the_other_places():
    crossings = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if layout.place(a) == "library" and layout.place(b) != "library"
    )
    assert crossings == []


def test_the_installed_package_imports_neither_experiments_nor_benchmarks():
    crossings = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if a.startswith("dataecho") and not b.startswith("dataecho")
    )
    assert crossings == []


def test_no_import_cycle_anywhere():
    assert layout.cycles(GRAPH) == []


def test_cycles_are_found_where_there_are_some():
    # The detector itself: a two-module circle and a self-contained chain.
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": set()}
    assert layout.cycles(graph) == [["a", "b"]]


def test_relative_and_submodule_imports_resolve(tmp_path):
    pkg = tmp_path / "dataecho"
    (pkg / "stages").mkdir(parents=True)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (pkg / "__init__.py").write_text("from dataecho import stages\n")
    (pkg / "stages" / "__init__.py").write_text("from .echo import Echo\n")
    (pkg / "stages" / "echo.py").write_text("from .. import errors\nclass Echo: ...\n")
    (pkg / "errors.py").write_text("")
    graph = layout.imports(layout.modules(tmp_path))
    assert graph["dataecho"] == {"dataecho.stages"}
    assert graph["dataecho.stages"] == {"dataecho.stages.echo"}
    assert graph["dataecho.stages.echo"] == {"dataecho.errors"}


def test_the_script_prints_the_figures():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "layout.py")], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    assert "lines per place:" in out and "import cycles:" in out
    for where in ("library", "application", "experiments", "benchmarks"):
        assert where in out
