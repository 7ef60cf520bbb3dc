"""The transport benchmark: a quick real run prices both ways at each size through a worker."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import transport  # noqa: E402
from dataecho.loader.transport import from_wire  # noqa: E402


def test_quick_run_prices_the_pipe_and_shared_memory_at_each_size(capsys, tmp_path):
    code = transport.main(["--quick", "--duration", "0.2", "--sizes", "64", "1024",
                           "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["64 (piped)", "1024"]  # dataecho pipes 64 KiB, not 1 MiB
    for c in cells:
        figures = [float(x) for x in c[1:]]
        assert all(math.isfinite(x) and x > 0 for x in figures), c  # real batches crossed
        # The ratio of the unrounded medians: within the rounding of the two shown.
        pipe, shared, half = figures[1], figures[3], 0.005
        assert (pipe - half) / (shared + half) - half <= figures[4]
        assert figures[4] <= (pipe + half) / (shared - half) + half
    assert (tmp_path / "transport.md").read_text().strip() in out


def test_the_pipe_way_sends_bytes_and_the_shared_way_a_tensor_for_torch_to_share():
    piped = next(iter(transport.Batches(4096, "pipe")))
    assert not isinstance(piped, torch.Tensor)  # pickled bytes, whatever the size
    assert from_wire(piped).shape == (transport.ROWS, 4096 // transport.ROWS)
    shared = next(iter(transport.Batches(4096, "shared memory")))
    assert isinstance(shared, torch.Tensor) and shared.shape == (transport.ROWS, 32)
