"""The device benchmark: its quick CPU run end to end, its checks, its paced upstream."""

from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

from benchmarks import device  # noqa: E402
from benchmarks.device import correctness, throughput, workload  # noqa: E402

needs_device_echo = pytest.mark.skipif(
    not workload.device_echo_available(),
    reason="this dataecho has no EchoingDataLoader(where='device') yet",
)


def tables(text: str) -> list[list[list[str]]]:
    """The report's Markdown tables, each as rows of cells, header and rule left out."""
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("| "):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            found.append(rows[2:])
            rows = []
    return found


@needs_device_echo
@pytest.mark.timeout(120)
def test_quick_cpu_run_passes_its_checks_and_reports_every_case(tmp_path, capsys):
    start = time.perf_counter()
    code = device.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    seconds = time.perf_counter() - start
    text = (tmp_path / "device.md").read_text()
    assert text in capsys.readouterr().out
    checks, steps, cpu = tables(text)
    assert [r[1] for r in checks] == ["pass"] * len(checks), checks
    assert {r[0] for r in checks} >= {
        "order and content",
        "counts",
        "fresh copies",
        "reproducible",
        "exact resume",
        "ranks' draws",
        "state per step",
    }
    state = next(r[2] for r in checks if r[0] == "state per step")
    assert re.fullmatch(r"measured: state_dict\(\) [\d.]+ ms, a batch [\d.]+ ms \([\d.]+x a batch\)",
                        state), state  # fmt: skip
    assert code == 0
    modes = ("host", "device", "device_mixed")
    assert [(r[0], r[1]) for r in steps] == [
        (m, e) for e in "1248" for m in modes if m != "device_mixed" or e != "1"
    ]
    for row in steps:
        rate, fresh, realized = float(row[2].split()[0]), float(row[6].replace(",", "")), row[7]
        assert rate > 0 and fresh > 0 and float(row[3]) > 0, row
        assert math.isfinite(float(row[8])) and float(row[9]) == pytest.approx(
            0.95 * min(int(row[1]), 4)
        ), row
        assert float(row[10]) == pytest.approx(float(row[8]) / float(row[9]), abs=0.02), row
        # A fixed factor; a short window cuts a group of copies at each end (exact counts:
        # the correctness section and the window test below).
        assert 0.5 * int(row[1]) <= float(realized) <= 1.5 * int(row[1]), row
    assert [r[1] for r in cpu] == ["1", "4", "4"]
    assert all(float(r[2].split()[0]) > 0 for r in cpu), cpu
    assert cpu[2][5] == "1.10" and math.isfinite(float(cpu[2][4]))
    assert seconds < 60, f"the quick run took {seconds:.0f} s"


@needs_device_echo
def test_fresh_copies_check_fails_for_an_op_that_draws_nothing():
    setup = correctness.Setup(
        workload.LoaderSpec(8, 0, torch.device("cpu")), (3, 8, 8), e=2, fresh_batches=2
    )
    [(name, ok, detail)] = correctness.fresh_copies(setup, lambda batch, generator=None: batch)
    assert name == "fresh copies" and not ok
    assert "identical" in detail


@needs_device_echo
def test_reproducible_check_fails_for_an_op_that_ignores_the_generator():
    def unseeded(batch, generator=None):  # draws from torch's global RNG, which nobody seeds
        images, labels = batch
        return [images + torch.randint(0, 2, images.shape, dtype=images.dtype), labels]

    setup = correctness.Setup(
        workload.LoaderSpec(8, 0, torch.device("cpu")), (3, 8, 8), e=2, fresh_batches=2
    )
    rows = dict((name, ok) for name, ok, _ in correctness.reproducible_and_resumed(setup, unseeded))
    assert rows == {"reproducible": False, "exact resume": False}


@needs_device_echo
def test_a_window_steps_on_every_copy_and_counts_fresh_batches_whole():
    spec = workload.LoaderSpec(8, 1, torch.device("cpu"))
    plan = throughput.Plan(spec, warmup=0.1, duration=0.5, rounds=1)
    data = workload.PacedShapes(10**4, (3, 8, 8), delay=0.002 / 8, slack=0.002)
    step = workload.DeviceStep((3, 8, 8), spec.device)
    w = throughput.window(plan, data, "device", 3, workload.augmentation()[0], step)
    assert w.out == w.steps * 8  # every emitted batch reached the step
    assert w.fresh % 8 == 0 and w.fresh > 0
    assert abs(w.out - 3 * w.fresh) <= 3 * 8  # whole groups of 3, but at the window's ends
    assert 0 < w.wait <= w.in_next <= w.wall and 0 < w.compute < w.wall


def test_paced_shapes_sleep_to_their_pace_and_hand_out_copies():
    data = workload.PacedShapes(10, (3, 5, 7), delay=0.01, slack=0.01)
    start = time.perf_counter()
    images = [data[i][0] for i in range(6)]
    assert time.perf_counter() - start >= 0.04  # the first read is due at once
    assert all(x.shape == (3, 5, 7) and x.dtype == torch.uint8 for x in images)
    images[0].fill_(0)
    assert not torch.equal(data[0][0], images[0])  # a copy, not a view of the pool
    assert len(data) == 10


def test_the_step_trains_on_uint8_images_and_costs_time():
    step = workload.DeviceStep((3, 16, 16), torch.device("cpu"))
    before = [p.detach().clone() for p in step.model.parameters()]
    assert step.measure(4, steps=2, warmup=1) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))


def test_unknown_device_and_bad_ratio_are_refused_with_the_fix(capsys):
    with pytest.raises(SystemExit):
        device.main(["--ratio", "0.5", "--device", "cpu"])
    assert "at least 1" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            device.main(["--device", "cuda"])
        assert "--device cpu" in capsys.readouterr().err
