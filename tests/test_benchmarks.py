"""The benchmark harness: a tiny run of the adaptive benchmark, its table, docs and dispatcher.

No timing assertions: the figures depend on the machine's load; only their shape, finiteness
and the counts that cannot depend on timing are checked.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

# `python -m pytest` from the repository root puts it on sys.path; a bare `pytest` may not.
ROOT = str(Path(__file__).resolve().parents[1])
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
def test_docs_block_is_replaced_not_appended(result, tmp_path):
    path = tmp_path / "benchmarks.md"
    text = adaptive.report(result, "python -m benchmarks adaptive --tiny")
    assert "`python -m benchmarks adaptive --tiny`" in text
    common.replace_block(path, adaptive.HEADING, "adaptive", text, adaptive.PREAMBLE)
    path.write_text(path.read_text() + "\nNotes written by hand.\n")
    common.replace_block(path, adaptive.HEADING, "adaptive", "second run", adaptive.PREAMBLE)
    doc = path.read_text()
    assert doc.startswith("# Benchmarks")
    assert doc.count(f"## {adaptive.HEADING}") == 1
    assert doc.count("adaptive:begin") == 1 and "second run" in doc
    assert "--tiny" not in doc and "Notes written by hand." in doc


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
