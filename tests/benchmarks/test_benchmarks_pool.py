"""The pool benchmark: a quick real run prints one row per pool size with finite figures."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import pool  # noqa: E402


def test_quick_run_tables_every_pool_size_beside_the_step(capsys):
    code = pool.main(["--quick"])
    out = capsys.readouterr().out
    assert "CNN step on a batch of 128" in out
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    assert [r.split("|")[1].split()[0] for r in rows] == [str(p) for p in pool.POOLS]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1].split()[0]) > 0 and float(cells[3].split()[0]) > 0, row
        assert cells[5] in ("met", "MISSED")
        assert code == (0 if all("met" == r.strip("|").split("|")[5].strip() for r in rows)
                        else 1)  # fmt: skip
