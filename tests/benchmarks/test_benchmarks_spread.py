"""The spread benchmark: a quick real run tables each kind of copy, factor and buffer size; no
buffer leaves every batch with two copies, a buffer spreads them (they never meet but at the
epoch's end)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import spread  # noqa: E402


def test_quick_run_tables_each_case(tmp_path, capsys):
    assert spread.main(["--quick", "--batch-size", "32", "--out", str(tmp_path)]) == 0
    rows = [line.strip("|").split("|") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "where" not in line][1:]  # fmt: skip
    cells = [[c.strip() for c in row] for row in rows]
    assert len(cells) == len(spread.KINDS) * len(spread.FACTORS) * 3
    for _where, copies, _e, batches, together, doubled, span, _held, first in cells:
        examples, share = float(together.rstrip("%")), float(doubled.rstrip("%"))
        if batches == "0":  # copies side by side: every batch holds two, of every example
            assert share == 100.0 and examples == 100.0 and float(span) == 0
        else:  # apart: only the epoch's last batch or two may hold two
            assert share <= 20.0 and examples <= 5.0 and float(span) > 1, copies
        assert float(first) > 0
    assert (tmp_path / "spread.md").is_file()
