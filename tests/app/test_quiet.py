"""A busy machine is named: CPU time of other programs, a lived R off its aim, an unsettled
calibration (the demo's terminal and report.md: tests/app/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import BURN, needs_nginx, orphan_burners, wait_for

from dataecho.app.calibration import calibrate
from dataecho.app.quiet import (
    OTHERS_CORES_LIMIT,
    RATIO_TOLERANCE,
    CpuWatch,
    QuietCheck,
    machine_busy_seconds,
    own_seconds,
)
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES
from dataecho.app.upstream import prepare

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


@pytest.mark.skipif(machine_busy_seconds() is None, reason="no /proc/stat")
def test_another_programs_cpu_counts_as_others_and_a_waited_childs_as_own(tmp_path):
    before = own_seconds()
    subprocess.run([sys.executable, "-c", BURN, "0.5"], check=True)  # a child, waited for
    assert own_seconds() - before >= 0.5

    watch = CpuWatch.start()
    orphan_burners(1, 1.0, tmp_path / "done")
    wait_for([tmp_path / "done.0"])
    wall = time.monotonic() - watch.wall
    others = watch.others_cores()
    assert others is not None and others >= 1.0 / wall * 0.95, (others, wall)


def test_a_quiet_run_has_nothing_to_say_and_each_sign_is_named():
    assert QuietCheck(aim=4.0, lived_ratio=4.1, others_cores=0.02, load_per_core=0.1).quiet
    assert QuietCheck(aim=4.0, lived_ratio=4.0 * (1 + RATIO_TOLERANCE) - 0.01).quiet

    far = QuietCheck(aim=4.0, lived_ratio=7.2)
    (line,) = far.problems()
    assert "R lived 7.20 against an aim of 4.00 (+80%" in line
    assert "25% allowed" in line

    busy = QuietCheck(aim=4.0, lived_ratio=4.0, others_cores=OTHERS_CORES_LIMIT + 0.5,
                      load_per_core=1.5, calibration_settled=False)  # fmt: skip
    problems = busy.problems()
    assert len(problems) == 3
    assert "0.75 cores busy" in problems[0] and "1.50 per core" in problems[1]
    assert "did not settle" in problems[2]
    summary = busy.summary()
    assert summary[0].startswith("THE MACHINE WAS NOT QUIET")
    assert "rerun on an idle machine" in summary[-1] and "--bandwidth" in summary[-1]


@needs_data
@needs_nginx
@pytest.mark.timeout(120)
def test_a_calibration_that_cannot_reach_its_aim_retries_then_says_it_did_not_settle(tmp_path):
    # R = time per step over compute per step is never below 1: an aim of 0.5 is out of reach
    # however the cap moves, as an aim is on a machine whose load keeps moving R.
    manifest, _ = prepare(tmp_path / "shards", examples=1024, examples_per_shard=256)
    said: list[str] = []
    cal = calibrate(tmp_path / "shards", manifest, aim=0.5, data_dir=DEFAULT_DATA_DIR,
                    batch_size=64, profile_seconds=1.0, probe_examples=512,
                    say=said.append)  # fmt: skip
    probes = [n for n in cal.notes if n.startswith("probe through the training loop")]
    assert len(probes) == 4, cal.notes
    assert not cal.settled
    assert any("calibration did not settle: 4 probes" in n for n in cal.notes)
    assert any("did not settle" in line for line in said)
