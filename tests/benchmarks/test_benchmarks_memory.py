"""The bounded-memory benchmark: a few seconds of its stream, its CSV, plot and report.

No timing assertions: RSS and rates depend on the machine; only that every sample was taken
from the real processes (training process, loader worker, nginx), that the counters move,
that the summary's arithmetic is right and the outputs are written.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest
from conftest import needs_nginx

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import __main__ as dispatcher  # noqa: E402
from benchmarks import memory  # noqa: E402
from dataecho.app.checkpoint_file import latest_checkpoint, load_checkpoint  # noqa: E402
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES  # noqa: E402


@needs_nginx
@pytest.mark.timeout(120)
def test_a_short_stream_is_sampled_from_every_process_and_reported(tmp_path, capsys):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    code = memory.main(["--minutes", "0.05", "--warmup-minutes", "0.01", "--sample-seconds",
                        "0.4", "--examples", "512", "--examples-per-shard", "128",
                        "--shuffle-buffer", "256", "--checkpoint-every", "5", "--rate",
                        "2000000", "--out", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    with open(tmp_path / "memory.csv") as f:
        reader = csv.DictReader(f)
        rows = [{k: float(v) for k, v in row.items()} for row in reader]
        assert reader.fieldnames == list(memory.COLUMNS)
    assert len(rows) >= 3
    assert all(r["main_mib"] > 50 and r["nginx_mib"] > 0 for r in rows)  # torch alone is more
    assert any(r["workers"] == 1 and r["workers_mib"] > 0 for r in rows)  # the loader worker
    assert all(r["pss_mib"] <= r["total_mib"] + 1 for r in rows)  # PSS splits shared pages
    steps = [r["steps"] for r in rows]
    assert steps == sorted(steps) and steps[-1] > 0 and rows[-1]["fresh"] > 0
    png = (tmp_path / "memory.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) < 100_000
    assert load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["loader"]["stats"]
    for fragment in ("| training process ", "| loader worker ", "| both (PSS summed) ",
                     "slope, MiB per 10 min", "cores on average", "command: python -m "
                     "benchmarks memory --minutes 0.05"):  # fmt: skip
        assert fragment in out, fragment


def test_the_summary_skips_the_warm_up_and_fits_the_slope():
    # 1 MiB a minute after a warm-up that jumped by 100 MiB: +10 MiB per 10 minutes.
    # The worker: a new one each 6-minute epoch, growing 1 MiB a minute within it.
    rows = [{"seconds": 60.0 * m, "main_mib": 100.0 * (m >= 2) + m, "workers_mib": 5.0 + m % 6,
             "pss_mib": 50.0, "nginx_mib": 3.0, "cpu_seconds": 6.0 * m, "epoch": m // 6}
            for m in range(12)]  # fmt: skip
    for r in rows:
        r["total_mib"] = r["main_mib"] + r["workers_mib"]
    s = memory.summarize(rows, warmup_s=120)
    assert s["main_mib"]["after_warmup"] == 102 and s["main_mib"]["end"] == 111
    assert math.isclose(s["main_mib"]["slope_per_10min"], 10.0)
    assert math.isclose(s["main_mib"]["slope_late"], 10.0)  # minutes 6 to 11
    assert math.isclose(s["pss_mib"]["slope_per_10min"], 0.0, abs_tol=1e-9)
    assert s["main_mib"]["peak"] == 111 and math.isclose(s["cpu"]["cores"], 0.1)
    assert s["worker_peaks"] == {0: 10.0, 1: 10.0}  # no growth from one epoch to the next


def test_registered_and_its_settings_checked(capsys):
    assert "memory" in dispatcher.BENCHMARKS and "memory" in dispatcher.usage()
    assert memory.parse([])[0].minutes == 30
    with pytest.raises(SystemExit):
        memory.parse(["--minutes", "1", "--warmup-minutes", "2"])
    assert "need minutes > warmup-minutes" in capsys.readouterr().err
