"""The evaluation benchmark: a quick real run on the test images tables every chunk size, alone
and beside a running step, and finds the accuracy the same at each."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import evaluation  # noqa: E402


def test_quick_run_tables_every_chunk_alone_and_beside_the_step(capsys):
    assert evaluation.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "on 1,000 Fashion-MNIST test images" in out
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    chunks = [int(r.split("|")[1].split()[0].replace(",", "")) for r in rows]
    assert chunks == list(evaluation.CHUNKS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0, row
    assert rows[-1].rstrip("| ").endswith("1.00")  # the last chunk is the ratios' base
    assert "accuracy the same at every chunk size: yes" in out
    assert not [t for t in threading.enumerate() if t.name == "step-loop"]  # closed
