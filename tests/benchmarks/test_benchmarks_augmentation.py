"""The augmentation benchmark: real runs on real shards, a few hundred examples each.

No figure is asserted beyond what the runs' own records say: the table must hold each run's
fresh-examples-to-target as it was logged, and the savings must be their ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import augmentation  # noqa: E402
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset  # noqa: E402


@pytest.mark.timeout(240)
def test_each_shift_and_seed_is_run_with_and_without_echo_and_tabled(tmp_path, capsys):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    data = write_subset(tmp_path / "fm", train=1024, test=200)
    code = augmentation.main(["--pads", "0,2", "--seeds", "0", "--target", "0.3",
                              "--eval-every", "256", "--eval-examples", "200", "--budget", "1024",
                              "--batch-size", "64", "--shuffle-batches", "2", "--data-dir",
                              str(data), "--shards", str(tmp_path / "shards"), "--out",
                              str(tmp_path / "out")])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [(r["pad"], r["seed"]) for r in rows] == [(0, 0), (2, 0)]
    for row in rows:  # a 30% target is within reach of 1,024 examples, echoed or not
        assert 0 < row["echoed"] <= 1024 and 0 < row["e1"] <= 1024
        saving = f"{row['e1'] / row['echoed']:.2f}x"
        label = "flip only" if row["pad"] == 0 else f"pad {row['pad']} + flip"
        line = next(x for x in out.splitlines() if x.startswith(f"| {label} "))
        assert f"{row['e1']:,}" in line and saving in line
    assert "command: python -m benchmarks augmentation --pads 0,2" in out


def test_a_run_that_misses_the_target_is_shown_as_not_reached():
    rows = [{"pad": 1, "seed": 0, "e1": None, "echoed": 500},
            {"pad": 1, "seed": 1, "e1": 1000, "echoed": 250}]  # fmt: skip
    [row] = augmentation.summarize(rows)
    assert row == ["pad 1 + flip", "not reached / 1,000", "500 / 250", "- / 4.00x", "-"]


def test_the_shuffle_buffer_is_counted_in_examples_at_every_insertion_point():
    def buffer(where: str) -> int:
        return augmentation.shuffle_buffer(augmentation.parse_args(["--where", where]))

    # The demo's default for each insertion point.
    assert buffer("before_augment") == 10 * 128  # examples
    assert buffer("device") == 40 * 128  # examples, the device's mixing pool
    assert buffer("batch") == 10 * 128  # examples, shuffled in whole batches
