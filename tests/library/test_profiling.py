"""The stall profiler: time-model arithmetic, measurements on synthetic pipelines, errors."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dataecho.profiling import ProfileReport, format_report, profile, time_model
from dataecho.stages import echo


class SleepyBatches:
    """A re-iterable source whose every batch takes ``delay`` seconds (or a little more, as
    sleeps overshoot) to produce; ``spent`` records what each one really took."""

    def __init__(self, delay: float, n: int = 100_000) -> None:
        self.delay, self.n, self.spent = delay, n, []

    def __iter__(self):
        for i in range(self.n):
            self.spent.append(_timed_sleep(self.delay))
            yield torch.full((4,), float(i))


class SleepyStep:
    """A training step that sleeps ``delay`` seconds; ``spent`` as above."""

    def __init__(self, delay: float) -> None:
        self.delay, self.spent = delay, []

    def __call__(self, batch) -> None:
        self.spent.append(_timed_sleep(self.delay))


def _timed_sleep(delay: float) -> float:
    start = time.perf_counter()
    time.sleep(delay)
    return time.perf_counter() - start


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


class SleepyDataset(Dataset):
    def __init__(self, delay: float, n: int = 10_000) -> None:
        self.delay, self.n = delay, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((4,), float(i))


# --- time model -------------------------------------------------------------------------------


def test_time_model_overlapped_hand_arithmetic() -> None:
    # t_up = 20 ms, t_down = 5 ms, so R = 4.
    m = time_model(0.020, 0.005, 1)
    assert m.cycle_seconds == pytest.approx(0.020)
    assert m.steps_per_second == pytest.approx(50.0)
    assert m.speedup == pytest.approx(1.0)
    m = time_model(0.020, 0.005, 2)  # 2 steps = 10 ms hide under the 20 ms load: free
    assert m.cycle_seconds == pytest.approx(0.020)
    assert m.steps_per_second == pytest.approx(100.0)
    assert m.fresh_batches_per_second == pytest.approx(50.0)
    assert m.speedup == pytest.approx(2.0)
    m = time_model(0.020, 0.005, 8)  # 8 steps = 40 ms: the step is the bottleneck, speedup = R
    assert m.cycle_seconds == pytest.approx(0.040)
    assert m.steps_per_second == pytest.approx(200.0)
    assert m.fresh_batches_per_second == pytest.approx(25.0)
    assert m.speedup == pytest.approx(4.0)
    m = time_model(0.020, 0.005, 2.5)  # fractional factors are means: 12.5 ms per cycle
    assert m.speedup == pytest.approx(2.5)
    # Step-bound (t_up < t_down): echoing cannot raise step throughput.
    m = time_model(0.001, 0.004, 4)
    assert m.cycle_seconds == pytest.approx(0.016)
    assert m.steps_per_second == pytest.approx(250.0)
    assert m.speedup == pytest.approx(1.0)


def test_time_model_serial_hand_arithmetic() -> None:
    # No overlap: a cycle is t_up + e * t_down; the baseline step is t_up + t_down = 25 ms.
    m = time_model(0.020, 0.005, 4, overlap=False)
    assert m.cycle_seconds == pytest.approx(0.040)
    assert m.steps_per_second == pytest.approx(100.0)
    assert m.speedup == pytest.approx(4 * 0.025 / 0.040)  # 2.5
    assert time_model(0.020, 0.005, 1, overlap=False).speedup == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(
    t_up=st.floats(1e-6, 10.0),
    t_down=st.floats(1e-6, 10.0),
    e=st.floats(1.0, 64.0),
)
def test_time_model_speedup_is_min_of_e_and_r(t_up: float, t_down: float, e: float) -> None:
    r = t_up / t_down
    assert time_model(t_up, t_down, e).speedup == pytest.approx(max(1.0, min(e, r)))
    serial = time_model(t_up, t_down, e, overlap=False).speedup
    # Serial echoing amortises the load over e steps: at least 1, never reaching R + 1.
    assert 1.0 - 1e-9 <= serial < r + 1.0 + 1e-9
    assert time_model(t_up, t_down, e + 1.0, overlap=False).speedup >= serial - 1e-9


@pytest.mark.parametrize(
    ("args", "err", "needle"),
    [
        ((0.02, 0.005, 0.5), ValueError, "e must be >= 1"),
        ((-1.0, 0.005, 2), ValueError, "t_up must be a finite number of seconds >= 0, got -1.0"),
        ((0.02, math.nan, 2), ValueError, "t_down must be a finite"),
        ((0.0, 0.0, 2), ValueError, "both 0"),
        (("fast", 0.005, 2), TypeError, "t_up must be a number of seconds"),
    ],
)
def test_time_model_rejects_bad_arguments(args, err, needle) -> None:
    with pytest.raises(err, match=needle):
        time_model(*args)


# --- profile on synthetic pipelines -----------------------------------------------------------


@pytest.mark.timeout(60)
def test_profile_input_bound_pipeline_finds_r_about_4() -> None:
    source, step = SleepyBatches(0.040), SleepyStep(0.010)
    report = profile(source, step, seconds=1.5, warmup_batches=1)
    # The measured times match what the sleeps really took (they overshoot under load)...
    assert report.t_up == pytest.approx(mean(source.spent), rel=0.25)
    assert report.t_down == pytest.approx(mean(step.spent), rel=0.25)
    # ...and the nominal 40 ms / 10 ms ratio within wide bounds (overshoot shrinks R).
    assert 2.7 <= report.ratio <= 5.4, report
    assert report.recommended_echo_factor in {3, 4, 5}
    assert report.recommended_echo_factor == math.floor(report.ratio / 0.9)
    assert report.input_bound
    # Loading runs inside the loop here, so the pipeline is serial: ~50 ms, ~80% waiting.
    assert report.stall_fraction > 0.5
    assert report.t_overlapped >= 0.9 * (report.t_up + report.t_down)
    assert not report.overlapped
    assert report.predicted_speedup(1) == pytest.approx(1.0)
    assert report.predicted_speedup(2) == pytest.approx(2.0)
    assert report.predicted_speedup(16) == pytest.approx(report.ratio)
    assert report.predicted_speedup(2, overlap=False) < 2.0
    assert min(report.batches_up, report.steps_down, report.steps_overlapped) >= 4
    text = format_report(report)
    assert "INPUT-BOUND" in text
    assert f"e = {report.recommended_echo_factor} " in text
    assert "did not overlap" in text
    rows = [line.split() for line in text.splitlines() if line.split()[0].isdigit()]
    assert [int(row[0]) for row in rows] == sorted({1, 2, 4, 8, report.recommended_echo_factor})
    assert float(rows[1][1].rstrip("x")) == pytest.approx(2.0)  # e = 2, overlapped column


@pytest.mark.timeout(60)
def test_profile_step_bound_pipeline_is_not_input_bound() -> None:
    report = profile(range(1_000_000), SleepyStep(0.005), seconds=1.0)
    assert report.ratio < 0.5
    assert report.stall_fraction < 0.05
    assert not report.input_bound
    assert report.recommended_echo_factor == 1
    assert report.predicted_speedup(4) == pytest.approx(1.0)
    text = format_report(report)
    assert "not input-bound" in text and "e = 1 (no echoing)" in text


@pytest.mark.timeout(60)
def test_profile_dataloader_with_a_worker_overlaps() -> None:
    loader = DataLoader(SleepyDataset(0.020), batch_size=None, num_workers=1)
    report = profile(loader, SleepyStep(0.005), seconds=1.5, warmup_batches=2)
    # The worker loads while the step sleeps: ~max(20, 5) ms per step, not their sum.
    assert report.overlapped, report
    assert report.t_overlapped < 0.9 * (report.t_up + report.t_down)
    assert report.input_bound and report.recommended_echo_factor >= 2
    assert "did not overlap" not in format_report(report)


def test_profile_clamps_echo_factor_to_max() -> None:
    report = profile(SleepyBatches(0.010), lambda batch: None, seconds=0.4, max_echo_factor=3)
    assert report.ratio > 10 and report.input_bound
    assert report.recommended_echo_factor == 3
    assert "at most 3" in format_report(report)


def test_profile_plain_dataloader_and_real_training_step() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = torch.nn.Linear(8, 2)

    def step(batch):
        # Plain SGD by hand: importing torch.optim alone takes seconds on this machine.
        x, y = batch
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad

    before = model.weight.detach().clone()
    report = profile(DataLoader(data, batch_size=32), step, seconds=0.5, max_batches=20)
    assert isinstance(report, ProfileReport)
    assert report.t_up > 0 and report.t_down > 0 and report.t_overlapped > 0
    assert 1 <= report.batches_up <= 20 and 1 <= report.steps_overlapped <= 20
    assert report.source_echo_factor is None  # a DataLoader has no .stats
    assert not torch.equal(model.weight, before)  # the step really ran


def test_profile_short_list_of_batches_times_what_it_has() -> None:
    batches = [torch.ones(4) * i for i in range(6)]
    report = profile(batches, lambda batch: batch.sum(), seconds=0.5, warmup_batches=2)
    assert report.batches_up == 4 and report.steps_overlapped == 4
    # Fewer batches than warmup: the warmup batches are timed instead.
    report = profile(batches[:1], lambda batch: batch.sum(), seconds=0.5, warmup_batches=2)
    assert report.batches_up == 1 and report.steps_overlapped == 1


def test_profile_reads_dataecho_stats() -> None:
    stage = echo(list(range(10_000)), 2, seed=0)
    report = profile(stage, lambda item: None, seconds=0.2, max_batches=50)
    # An echo stage is a one-shot iterator: the phases continue one stream of 2x copies.
    assert report.source_echo_factor == pytest.approx(2.0)
    assert "already echoes 2.00x" in format_report(report)


def test_profile_one_shot_iterator_that_runs_out() -> None:
    with pytest.raises(ValueError, match=r"ran out after the upstream phase.*re-iterable"):
        profile(iter([1, 2, 3]), lambda batch: None, seconds=0.2, warmup_batches=1)


def test_report_is_frozen_and_json_ready() -> None:
    report = profile([torch.ones(2)] * 10, lambda batch: None, seconds=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.t_up = 1.0  # type: ignore[misc]
    data = json.loads(json.dumps(report.as_dict()))
    assert data["ratio"] == pytest.approx(report.ratio)
    assert {"t_up", "t_down", "stall_fraction", "recommended_echo_factor"} <= data.keys()


@pytest.mark.parametrize(
    ("kwargs", "err", "needle"),
    [
        ({"seconds": 0}, ValueError, r"seconds must be a finite number of seconds > 0, got 0\.0"),
        ({"seconds": -1.5}, ValueError, r"got -1\.5; pass e\.g\. seconds=10\.0"),
        ({"seconds": math.inf}, ValueError, "seconds must be a finite"),
        ({"seconds": "10"}, TypeError, "seconds must be a number of seconds > 0, got '10'"),
        ({"seconds": True}, TypeError, "seconds must be a number"),
        ({"warmup_batches": -1}, ValueError, "warmup_batches must be >= 0, got -1"),
        ({"max_echo_factor": 0}, ValueError, "max_echo_factor must be >= 1, got 0"),
        ({"max_batches": 2.5}, TypeError, "max_batches must be an integer"),
    ],
)
def test_profile_rejects_bad_options(kwargs, err, needle) -> None:
    with pytest.raises(err, match=needle):
        profile([torch.ones(2)] * 4, lambda batch: None, **kwargs)


def test_profile_rejects_bad_sources_and_steps() -> None:
    with pytest.raises(TypeError, match=r"step_fn must be a callable.*got None of type NoneType"):
        profile([1, 2, 3], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step_fn must be a callable.*got 3"):
        profile([1, 2, 3], 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"empty.*at least 3 batches"):
        profile([], lambda batch: None, seconds=0.1)
    with pytest.raises(TypeError, match="must be iterable.*got int"):
        profile(5, lambda batch: None)  # type: ignore[arg-type]


def report_for(ratio: float, e: int) -> ProfileReport:
    """A report of an input-bound pipeline (t_down 1 ms) that recommends ``e``."""
    return ProfileReport(t_up=ratio * 1e-3, t_down=1e-3, t_overlapped=ratio * 1e-3,
                         stall_fraction=0.99, overlap_fraction=1.0, input_bound=True,
                         recommended_echo_factor=e, max_echo_factor=16, batches_up=10,
                         steps_down=10, steps_overlapped=10)  # fmt: skip


def test_a_factor_past_the_papers_useful_range_says_what_it_risks_and_the_range() -> None:
    report = report_for(780.0, 16)  # R = 780: the largest e is recommended, 16
    text = format_report(report)
    note = report.echo_factor_note
    assert note is not None and text.endswith(note)
    assert note.startswith("note: e = 16 is past the papers' useful range of about 4-8 at common "
                           "batch sizes (docs/papers.md).")  # fmt: skip
    assert "an echoed example is worth less than a fresh one" in note
    assert "fresh examples saved per extra step shrink toward none" in note
    assert "Try e = 4 to 8" in note and "with R = 780 the step will still wait for data" in note
    assert json.loads(json.dumps(report.as_dict()))["echo_factor_note"] == note


@pytest.mark.parametrize("e", [1, 4, 8])
def test_a_factor_within_the_useful_range_gets_no_note(e: int) -> None:
    report = report_for(max(e, 1.05) / 0.9, e)
    assert report.echo_factor_note is None and "note: e =" not in format_report(report)
    assert report.as_dict()["echo_factor_note"] is None
