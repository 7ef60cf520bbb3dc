"""The host_echo benchmark: a quick real run tables each transform with finite figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

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
    assert [r.split("|")[1].strip() for r in rows][:3] == ["identity", "augment", "batch"]
    for row in rows[:3]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(math.isfinite(float(c.split()[0])) for c in cells[1:]), row
    verdict = "met" if "target for echoing's own <= 0.5 ms: met" in out else "MISSED"
    assert code == (0 if verdict == "met" else 1)
    plain = [r for r in rows if r.startswith("| a plain loader's batch: ready examples collated,")]
    assert len(plain) == 1 and ", sent" not in plain[0]  # in-process: collated, not sent
    assert (tmp_path / "host_echo.md").read_text().strip() in out


def test_a_worker_run_prices_the_snapshots_and_a_plain_loaders_batch_per_copy(capsys, tmp_path):
    host_echo.main(["--quick", "--duration", "0.3", "--image", "16", "--channels", "1",
                    "--workers", "1", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert "1 loader worker(s)" in out
    rows = {r.split("|")[1].strip(): r for r in out.splitlines() if r.startswith("| ")}
    without = [c.strip() for c in rows["identity without state snapshots"].strip("|").split("|")]
    assert all(math.isfinite(float(c.split()[0])) and float(c.split()[0]) > 0 for c in without[1:3])
    share = rows["the snapshots' share of an extra copy (identity)"].strip("|").split("|")[-1]
    assert math.isfinite(float(share))

    def last(label: str) -> float:  # a row's last column, without the rounds' spread
        return float(rows[label].strip("|").split("|")[-1].split()[0])

    plain = last("a plain loader's batch: ready examples collated, sent, per batch")
    assert 0 < plain < 100  # ms per batch: a real worker collated and sent real batches
    for name in ("identity", "batch"):
        assert last(f"{name}, less a plain loader's batch") == pytest.approx(
            last(name) - plain, abs=0.011
        )
    own = last("identity, less a plain loader's batch")
    assert f"echoing's own (less a plain loader's batch) {own:.2f} ms" in out
    assert "Without a per-example transform (batch): " in out
