"""The read-ahead benchmark: a tiny real run, its table and its pairing of on with off."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import read_ahead  # noqa: E402
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES  # noqa: E402


@pytest.mark.timeout(120)
def test_every_case_runs_on_both_upstreams_and_on_is_paired_with_off(tmp_path, capsys):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    code = read_ahead.main(["--ratios", "2", "--rounds", "1", "--duration", "0.2",
                            "--train-limit", "4096", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    text = (tmp_path / "read_ahead.md").read_text()
    assert text in capsys.readouterr().out
    body = [line for line in text.splitlines() if line.startswith("| ")][2:]  # minus the header
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in body]
    names = [c.name for c in read_ahead.cases(2)]
    assert [(r[0], r[2]) for r in rows] == [(u, n) for u in ("latency", "paced") for n in names]
    for row in rows:
        assert all(math.isfinite(float(row[i].replace(",", ""))) for i in (3, 4, 5)), row
        on = "read-ahead" not in row[2]
        assert (row[6] != "-") == on, row  # each "on" row carries its ratio to "off"
        if on:
            assert float(row[6].split()[0]) > 0


def test_latency_reads_sleep_before_every_read():
    reads = read_ahead.LatencyReads(list(range(5)), delay=0.01)
    assert len(reads) == 5
    start = time.perf_counter()
    assert [reads[i] for i in range(5)] == list(range(5))
    assert time.perf_counter() - start >= 0.05  # sleeps never end early
