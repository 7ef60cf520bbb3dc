"""The persistent-workers benchmark: a tiny real run, its table and its count of file opens."""

from __future__ import annotations

import math
import multiprocessing
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import persistent_workers as bench  # noqa: E402


@pytest.mark.timeout(120)
def test_each_case_runs_and_workers_kept_open_the_file_once(tmp_path, capsys):
    code = bench.main(["--rounds", "1", "--epochs", "2", "--examples", "256", "--file-images",
                       "512", "--workers", "1", "2", "--write", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    text = (tmp_path / "persistent_workers.md").read_text()
    assert text.split("\n", 2)[2] in capsys.readouterr().out
    body = [line for line in text.splitlines() if line.startswith("| ")][2:]  # minus the header
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in body]
    assert [(r[0], r[1]) for r in rows] == [(d, w) for d in bench.DATASETS for w in ("1", "2")]
    for row in rows:
        assert all(math.isfinite(float(row[i])) for i in (3, 4)), row
        assert float(row[5].split("x")[0]) > 0, row  # a ratio, with its range
        workers = int(row[1])
        # Workers started anew load the file in each of epochs 0..2; kept ones in epoch 0 only.
        want = f"{3 * workers} / {workers}" if row[0] == "opened per process" else "0 / 0"
        assert row[7] == want, row


def test_the_dataset_loads_its_file_once_per_process(tmp_path):
    path = bench.write_images(tmp_path / "images.npy.gz", 20, seed=0)
    opens = multiprocessing.Value("i", 0)
    data = bench.OpenedPerProcess(path, 50, opens)
    assert len(data) == 50
    image, label = data[23]
    assert tuple(image.shape) == (1, 28, 28) and label == 3
    assert image.equal(data[3][0])  # 20 images, read modulo
    assert opens.value == 1


def test_quick_settings_print_only():
    settings, args = bench.parse(["--quick"])
    assert settings.rounds == 1 and settings.file_images < bench.Settings().file_images
    assert args.write is False and bench.parse([])[1].write is True
