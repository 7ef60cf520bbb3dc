"""The live training view: counts, echo factor from stats, stall share, output, overhead."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dataecho.progress import ProgressReading, TrainingProgress, _batch_len
from dataecho.stages import echo


def sleepy(n: int, delay: float, size: int = 4):
    for i in range(n):
        time.sleep(delay)
        yield torch.full((size,), float(i))


def test_summary_counts_an_echoed_run_from_stats() -> None:
    batches = [torch.zeros(8, 3) for _ in range(40)]
    stage = echo(batches, 2, seed=0)  # batch echoing: the stage counts batches, the bar examples
    out = io.StringIO()
    with TrainingProgress(stage, total_steps=80, file=out) as bar:
        for batch in bar.wrap(stage):
            batch.add_(1.0)  # the step
    snap = bar.reading()
    assert (snap.steps, snap.examples) == (80, 640)
    assert snap.fresh_examples == pytest.approx(320)
    assert snap.realized_factor == pytest.approx(2.0)
    assert snap.wait_seconds is not None and snap.wait_seconds <= snap.wall_seconds
    summary = bar.summary()
    assert summary.startswith("train: 80 steps, 640 examples (320 fresh, echo 2.00x)")
    assert out.getvalue().count("train: 80 steps, 640 examples") == 1  # printed once, on close


def test_plain_dataloader_counts_every_example_fresh() -> None:
    data = TensorDataset(torch.randn(64, 5), torch.arange(64))
    loader = DataLoader(data, batch_size=8)
    with TrainingProgress(loader, desc="plain", file=io.StringIO()) as bar:
        for _ in range(2):  # two epochs through one bar
            for x, _y in bar.wrap(loader):
                x.sum()
    snap = bar.reading()
    assert (snap.steps, snap.examples, snap.fresh_examples) == (16, 128, 128)
    assert snap.realized_factor == pytest.approx(1.0)
    assert "plain: 16 steps, 128 examples (128 fresh, echo 1.00x)" in bar.summary()


@pytest.mark.timeout(30)
def test_stall_share_high_for_slow_data_low_for_slow_step() -> None:
    with TrainingProgress(file=io.StringIO()) as slow_data:
        for _ in slow_data.wrap(sleepy(20, 0.010)):
            pass  # instant step: all the time goes to waiting
    with TrainingProgress(file=io.StringIO()) as slow_step:
        for _ in slow_step.wrap([torch.zeros(4)] * 20):
            time.sleep(0.010)  # instant data: almost no waiting
    assert slow_data.reading().stall_fraction > 0.7
    assert slow_step.reading().stall_fraction < 0.2
    assert slow_data.reading().steps_per_second < 110  # <= 1 / 10 ms, generous
    assert f"stall {slow_data.reading().stall_fraction:.1%}," in slow_data.summary()


def test_manual_updates_with_fresh_and_wait() -> None:
    bar = TrainingProgress(file=io.StringIO(), batch_size=32)
    for _ in range(10):
        bar.update(fresh=16, wait_seconds=0.01)
    bar.update(batch_size=8)  # fresh unknown for this step: counted as fresh
    snap = bar.reading()
    assert (snap.steps, snap.examples) == (11, 328)
    assert snap.fresh_examples == pytest.approx(168)
    assert snap.wait_seconds == pytest.approx(0.1)
    bar.close()
    # Without any wait information the stall share is unknown, not zero.
    bar = TrainingProgress(file=io.StringIO(), batch_size=4)
    bar.update()
    assert bar.reading().stall_fraction is None
    assert "stall n/a" in bar.summary()
    bar.close()


def test_manual_updates_read_stats_of_the_given_loader() -> None:
    stage = echo([torch.zeros(4) for _ in range(30)], 3, seed=1)
    with TrainingProgress(stage, file=io.StringIO()) as bar:
        for _ in stage:
            bar.update(batch_size=4)
    snap = bar.reading()
    assert snap.steps == 90 and snap.examples == 360
    assert snap.realized_factor == pytest.approx(3.0)
    assert snap.wait_seconds == pytest.approx(stage.stats.wait_seconds)


@pytest.mark.timeout(30)
def test_postfix_and_summary_go_to_the_given_file() -> None:
    out = io.StringIO()
    with TrainingProgress(total_steps=30, file=out, refresh_seconds=0.01) as bar:
        for _ in bar.wrap(sleepy(30, 0.002, size=16)):
            pass
    text = out.getvalue()
    for key in ("steps/s=", "fresh/s=", "echo=1.00x", "stall="):
        assert key in text
    assert "30/30" in text
    last = text.rstrip("\n").splitlines()[-1]
    assert last.startswith("train: 30 steps, 480 examples (480 fresh, echo 1.00x)")
    bar.close()  # a second close prints nothing more
    assert out.getvalue() == text
    with pytest.raises(RuntimeError, match="'train' is closed"):
        bar.update()


def test_disable_writes_nothing_unless_asked() -> None:
    out = io.StringIO()
    with TrainingProgress(file=out, disable=True, batch_size=2) as bar:
        for _ in bar.wrap(range(5)):
            pass
    assert out.getvalue() == ""
    assert bar.reading().steps == 5  # still counts
    out = io.StringIO()
    with TrainingProgress(file=out, disable=True, print_summary=True) as bar:
        for _ in bar.wrap(range(5)):
            pass
    assert out.getvalue().startswith("train: 5 steps, 5 examples")


@pytest.mark.timeout(60)
def test_per_step_overhead_is_small() -> None:
    n = 20_000
    items = list(range(n))
    start = time.perf_counter()
    for _ in items:
        pass
    tight = time.perf_counter() - start
    bar = TrainingProgress(file=io.StringIO(), batch_size=1)
    start = time.perf_counter()
    for _ in bar.wrap(items):
        pass
    wrapped = time.perf_counter() - start
    start = time.perf_counter()
    for _ in items:
        bar.update()
    updated = time.perf_counter() - start
    bar.close()
    assert bar.reading().steps == 2 * n
    # Typically ~10 us (wrap) and ~3 us (update) per step; 50 us is the generous bound.
    assert (wrapped - tight) / n < 50e-6
    assert (updated - tight) / n < 50e-6


def test_reading_window_and_derived_figures() -> None:
    a = ProgressReading(10, 100, 50.0, 1.0, 2.0)
    b = ProgressReading(30, 300, 100.0, 1.5, 4.0)
    w = b.minus(a)
    assert (w.steps, w.examples, w.fresh_examples, w.wait_seconds, w.wall_seconds) == (
        20,
        200,
        50.0,
        0.5,
        2.0,
    )
    assert w.steps_per_second == 10.0 and w.fresh_per_second == 25.0
    assert w.realized_factor == 4.0 and w.stall_fraction == 0.25
    empty = ProgressReading(0, 0, 0.0, None, 0.0)
    assert empty.realized_factor == 0.0 and empty.stall_fraction is None
    assert empty.steps_per_second == 0.0


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (torch.zeros(7, 3), 7),
        (np.zeros((5, 2)), 5),
        (torch.tensor(1.0), 1),
        ((torch.zeros(6, 2), torch.zeros(6)), 6),
        ([torch.zeros(9, 2), torch.zeros(9)], 9),  # what default_collate returns for (x, y)
        ({"x": torch.zeros(4, 2), "y": torch.zeros(4)}, 4),
        ([1, 2, 3], 3),  # a list of examples
        ([(1, 2), (3, 4)], 2),
        ([], 0),
        ("text", 1),
    ],
)
def test_batch_len_inference(batch, size) -> None:
    assert _batch_len(batch) == size


def test_batch_size_overrides_inference() -> None:
    with TrainingProgress(file=io.StringIO(), batch_size=10) as bar:
        for _ in bar.wrap([torch.zeros(3)] * 4):
            pass
    assert bar.reading().examples == 40


@pytest.mark.parametrize(
    ("kwargs", "err", "needle"),
    [
        ({"total_steps": 0}, ValueError, "total_steps must be >= 1, got 0"),
        ({"batch_size": -2}, ValueError, r"batch_size must be >= \d, got -2"),
        ({"batch_size": 1.5}, TypeError, "batch_size must be an integer"),
        ({"refresh_seconds": 0}, ValueError, "refresh_seconds must be a number > 0, got 0"),
    ],
)
def test_rejects_bad_options(kwargs, err, needle) -> None:
    with pytest.raises(err, match=needle):
        TrainingProgress(file=io.StringIO(), **kwargs)


def test_a_log_file_gets_a_redraw_per_interval_not_per_refresh() -> None:
    out = io.StringIO()  # not a terminal: what CI logs and `... > log` see
    with TrainingProgress(total_steps=200, file=out, refresh_seconds=0.001) as bar:
        for _ in bar.wrap(sleepy(200, 0.001, size=8)):
            pass
    redraws = out.getvalue().count("\r")
    assert redraws <= 4, f"{redraws} redraws of the bar in a 0.2 s run"  # start and end
    assert "steps/s=" in out.getvalue() and "200/200" in out.getvalue()
    forced = io.StringIO()
    with TrainingProgress(total_steps=200, file=forced, refresh_seconds=0.001,
                          mininterval=0) as bar:  # fmt: skip
        for _ in bar.wrap(sleepy(200, 0.001, size=8)):
            pass
    assert forced.getvalue().count("\r") > 50  # a caller's own mininterval wins


class SizedSlow:
    """A re-iterable of ``n`` batches that take ``delay`` s each to come, with a ``len()``."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return sleepy(self.n, self.delay)


def test_a_known_length_gives_each_epoch_a_total_and_the_time_left() -> None:
    out = io.StringIO()
    data = SizedSlow(8, 0.01)
    bar = TrainingProgress(data, desc="run", file=out, mininterval=0, refresh_seconds=0.001)
    seen = []
    with bar:
        for _epoch in range(2):
            for i, _ in enumerate(bar.wrap(data)):
                if i == 3:  # the 4th batch, counted as it came
                    seen.append(out.getvalue().rsplit("\r", 1)[-1])
    assert seen[0].startswith("run epoch 1:  50%") and "| 4/8 [00:00<00:00, " in seen[0], seen
    assert seen[1].startswith("run epoch 2:  50%") and "| 4/8 [" in seen[1], seen
    assert "echo=1.00x" in seen[1] and "stall=" in seen[1]  # the postfix stays
    assert "run: 16 steps, 64 examples (64 fresh, echo 1.00x)" in out.getvalue()  # the run's


def test_a_run_total_wins_and_an_unsized_iterable_shows_no_total() -> None:
    out = io.StringIO()
    with TrainingProgress(total_steps=20, file=out, mininterval=0) as bar:
        for _ in bar.wrap(SizedSlow(8, 0.0)):
            pass
    assert "8/20 [" in out.getvalue() and "epoch" not in out.getvalue()
    out = io.StringIO()
    with TrainingProgress(file=out, mininterval=0) as bar:
        for _ in bar.wrap(sleepy(5, 0.0)):
            pass
    assert "5step [" in out.getvalue() and "/" not in out.getvalue().split("[")[0]
