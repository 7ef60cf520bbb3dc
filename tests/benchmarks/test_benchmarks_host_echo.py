"""The host_echo benchmark: a quick real run tables both transforms with finite figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import host_echo  # noqa: E402


def test_quick_run_tables_each_transform_and_the_verdict(capsys, tmp_path):
    code = host_echo.main(["--quick", "--duration", "0.3", "--image", "16", "--channels", "1",
                           "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert "images 1x16x16 uint8" in out
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    assert [r.split("|")[1].strip() for r in rows][:2] == ["identity", "augment"]
    for row in rows[:2]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(math.isfinite(float(c.split()[0])) for c in cells[1:]), row
    verdict = "met" if "target <= 0.5 ms: met" in out else "MISSED"
    assert code == (0 if verdict == "met" else 1)
    assert (tmp_path / "host_echo.md").read_text().strip() in out


def test_a_worker_run_prices_the_snapshots_share_of_a_copy(capsys, tmp_path):
    host_echo.main(["--quick", "--duration", "0.3", "--image", "16", "--channels", "1",
                    "--workers", "1", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert "1 loader worker(s)" in out
    rows = {r.split("|")[1].strip(): r for r in out.splitlines() if r.startswith("| ")}
    without = [c.strip() for c in rows["identity without state snapshots"].strip("|").split("|")]
    assert all(math.isfinite(float(c.split()[0])) and float(c.split()[0]) > 0 for c in without[1:3])
    share = rows["the snapshots' share of an extra copy (identity)"].strip("|").split("|")[-1]
    assert math.isfinite(float(share))
