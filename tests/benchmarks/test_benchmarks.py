"""The benchmark harness: a tiny run of the adaptive benchmark, its table, report and dispatcher.

No timing assertions: the figures depend on the machine's load; only their shape, finiteness
and the counts that cannot depend on timing are checked.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import pytest
import torch

# `python -m pytest` from the repository root puts it on sys.path; a bare `pytest` may not.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import __main__ as dispatcher  # noqa: E402
from benchmarks import adaptive, common  # noqa: E402

TINY = adaptive.Settings(
    ratios=(2,), factors=(2,), auto_wheres=("batch",), duration=0.6, warmup=0.2, rounds=2
)
NOT_APPLICABLE = {  # cells that are "-" by definition
    "upstream alone": {"R seen", "step ms", "step cpu ms", "efficiency", "eff. seen", "targets"},
    "no echo": {"efficiency", "eff. seen", "targets"},
}


@pytest.fixture(scope="module")
def result():
    return adaptive.run(TINY, log=lambda message: None)


@pytest.mark.timeout(180)
def test_every_case_ran_every_round(result):
    names = [c.name for c in TINY.configs()]
    assert names == ["upstream alone", "no echo", "e=2 (batch)", "auto (batch)"]
    assert [(r, c.name) for r, c in result["windows"]] == [(2, n) for n in names]
    for window in result["windows"].values():
        assert len(window.per_round) == TINY.rounds  # one steps/s figure per round
        assert window.steps > 0 and window.fresh > 0 and window.wall > 0


@pytest.mark.timeout(180)
def test_without_echo_every_example_is_fresh(result):
    # Counts, not timing: without an echo stage each batch handed out was read once.
    for config in (adaptive.Config(None), adaptive.Config(1.0)):
        window = result["windows"][(2, config)]
        assert window.out == window.fresh


@pytest.mark.timeout(180)
def test_table_shape_and_finite_figures(result):
    lines = adaptive.table(result).splitlines()
    columns = list(adaptive.COLUMNS)
    assert len(lines) == 2 + len(TINY.configs())
    assert [c.strip() for c in lines[0].strip("|").split("|")] == columns
    for line in lines[2:]:
        cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True))
        blank = NOT_APPLICABLE.get(cells["config"], set())
        for name, text in cells.items():
            if name == "config":
                continue
            if name in blank:
                assert text == "-", f"{cells['config']}: {name} = {text!r}"
            elif name == "targets":
                assert text == "ok" or text.startswith("MISS: "), text
            else:
                assert math.isfinite(float(text)), f"{cells['config']}: {name} = {text!r}"


@pytest.mark.timeout(180)
def test_report_is_written_to_its_results_folder_and_a_rerun_replaces_it(result, tmp_path):
    text = adaptive.report(result, "python -m benchmarks adaptive --tiny")
    assert "`python -m benchmarks adaptive --tiny`" in text
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)  # no dates in the output
    path = adaptive.write(text, tmp_path / "adaptive")
    assert path == tmp_path / "adaptive" / "adaptive.md"
    assert path.read_text().startswith("# Adaptive echoing\n") and "--tiny" in path.read_text()
    adaptive.write("second run", tmp_path / "adaptive")
    assert path.read_text() == "# Adaptive echoing\n\nsecond run"


def test_adaptive_writes_into_bench_results_by_default():
    _, args = adaptive.parse([])
    assert args.out == common.RESULTS / "adaptive" and common.RESULTS.name == "bench-results"
    assert adaptive.parse(["--out", "elsewhere"])[1].out == Path("elsewhere")


def test_synthetic_step_costs_the_same_work_every_call_and_updates_its_model():
    step = common.SyntheticStep(seed=0)
    before = [p.detach().clone() for p in step.model.parameters()]
    images, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    seconds = step(images, labels)
    assert seconds > 0
    assert any(not b.equal(p) for b, p in zip(before, step.model.parameters(), strict=True))
    assert step.measure(8, steps=3, warmup=1) > 0


def test_every_benchmark_is_a_package_with_a_results_page_linked_from_the_index():
    index = (common.REPO / "docs" / "benchmarks.md").read_text()
    for name, (module, _) in dispatcher.BENCHMARKS.items():
        package = importlib.import_module(module)
        assert callable(package.main), name
        page = Path(package.__file__).parent / "RESULTS.md"
        assert page.is_file(), page
        assert f"../benchmarks/{name}/RESULTS.md" in index, name
        text = page.read_text()
        assert f"python -m benchmarks {name}" in text, name
        for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):  # its plots are beside it
            assert (page.parent / image).is_file(), image


def test_markdown_table_aligns_columns():
    table = common.markdown_table(["name", "value"], [["a", 1.5], ["long name", 10]])
    assert table.splitlines() == [
        "| name      | value |",
        "| --------- | ----: |",
        "| a         |   1.5 |",
        "| long name |    10 |",
    ]


def test_quick_settings_and_overrides():
    settings, args = adaptive.parse(["--quick", "--ratios", "1", "3", "--max-echo-factor", "8"])
    assert settings.rounds == 1 and settings.duration < adaptive.Settings().duration
    assert settings.ratios == (1.0, 3.0) and settings.max_echo_factor == 8
    assert args.write is False  # quick runs never overwrite the recorded results
    assert adaptive.parse([])[1].write is True


def test_dispatcher_lists_and_rejects(capsys):
    assert dispatcher.main([]) == 0
    assert "adaptive" in capsys.readouterr().out
    assert dispatcher.main(["no-such-benchmark"]) == 2
    assert "unknown benchmark 'no-such-benchmark'" in capsys.readouterr().err
