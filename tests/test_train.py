"""The training loop on real Fashion-MNIST, tiny budgets: accounting, stopping, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from dataecho.sources.fashion_mnist import (
    DEFAULT_DATA_DIR,
    FILES,
    DataNotFoundError,
    write_subset,
)
from dataecho.train import TrainConfig, compare, format_results, measure_step_seconds, train

pytestmark = [
    pytest.mark.skipif(
        not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
        reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
    ),
    pytest.mark.timeout(120),
]


# Real data, copied small once: loading the full 60k + 10k per run would dominate the tests.
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_subset(tmp_path_factory.mktemp("fmnist"), train=4096, test=500)


@pytest.fixture
def tiny(data_dir):
    """A config maker: 1,024 real examples, batches of 64, reads in the main process."""
    base = TrainConfig(
        data_dir=data_dir,
        train_examples=1024,
        budget=1024,
        batch_size=64,
        eval_every=512,
        eval_examples=200,
        num_workers=0,
    )
    return lambda **changes: dataclasses.replace(base, **changes)


def test_plain_run_counts_fresh_steps_and_time(tiny):
    logs = []
    r = train(tiny(), log=logs.append)
    assert r.fresh_examples == 1024 and r.echoed_examples == 0
    assert r.steps == 16  # 1024 / 64, one step per fresh batch
    assert [row["fresh"] for row in r.history] == [512, 1024] and len(logs) == 2
    assert "fresh   1,024" in logs[-1] and "eval acc" in logs[-1]
    assert 0.0 <= r.test_accuracy <= 1.0 and r.test_loss > 0
    assert r.wall_seconds > 0 and r.step_seconds > 0 and r.eval_seconds > 0
    assert r.wall_seconds >= r.step_seconds  # evaluation is outside, steps inside
    assert r.reached_target is None


def test_echoing_takes_e_steps_per_fresh_batch_and_counts_copies_apart(tiny):
    r = train(tiny(echo_factor=3.0), log=lambda line: None)
    assert r.fresh_examples == 1024
    assert r.echoed_examples == 2 * 1024 and r.steps == 3 * 1024 // 64
    assert r.config.where == "before_augment"


def test_with_a_shuffle_buffer_reads_still_buffered_count_as_fresh(tiny):
    """The budget counts reads; examples still in the buffer when it is spent are not trained."""
    cfg = tiny(echo_factor=3.0, shuffle_buffer=256)
    r = train(cfg, log=lambda line: None)
    assert r.fresh_examples == 1024
    assert r.fresh_examples + r.echoed_examples == r.steps * 64  # every example out, trained
    assert 3 * (1024 - 256) // 64 <= r.steps < 3 * 1024 // 64


def test_stops_at_the_target_before_the_budget(tiny):
    cfg = tiny(budget=4096, target_accuracy=0.05)
    r = train(cfg, log=lambda line: None)
    assert r.reached_target is True
    assert r.fresh_examples == 512 and len(r.history) == 1  # the first evaluation stops it


def test_an_unreachable_target_runs_the_whole_budget_over_several_epochs(tiny):
    cfg = tiny(train_examples=512, target_accuracy=1.0)
    r = train(cfg, log=lambda line: None)
    assert r.reached_target is False and r.fresh_examples == 1024  # two epochs of 512


def test_same_seed_same_run_with_a_loader_worker(tiny):
    cfg = tiny(num_workers=1, budget=512, echo_factor=2.0)
    a, b = train(cfg, log=lambda line: None), train(cfg, log=lambda line: None)
    assert a.test_accuracy == b.test_accuracy and a.test_loss == b.test_loss
    assert a.steps == b.steps == 16


def test_learns_beyond_chance_quickly(tiny):
    cfg = tiny(train_examples=4096, budget=4096)
    r = train(cfg, log=lambda line: None)
    assert r.test_accuracy > 0.5  # 10 classes: chance is 0.1


def test_a_training_set_smaller_than_a_batch_is_a_clear_error(tiny):
    cfg = tiny(train_examples=10)
    with pytest.raises(ValueError, match="no batch of 64: the training set has 10 examples"):
        train(cfg, log=lambda line: None)


def test_compare_calibrates_the_delay_and_the_table_shows_every_run(tiny):
    logs = []
    cfg = tiny(budget=512, shuffle_buffer=0)
    results = compare(cfg, (1.0, 2.0), upstream_ratio=2.0, log=logs.append)
    assert logs[0].startswith("calibration: one step takes")
    delay = results[0].config.read_delay
    assert delay > 0 and results[1].config.read_delay == delay
    table = format_results(results).splitlines()
    assert table[0].split() == [
        "echo", "where", "target", "test", "acc", "fresh", "echoed", "steps", "wall", "s", "waited"
    ]  # fmt: skip
    assert table[2].split()[:3] == ["1", "-", "-"]
    assert table[3].split()[:2] == ["2", "before_augment"]
    assert table[3].split()[4:7] == ["512", "512", "16"]  # fresh, echoed, steps
    assert table[4].startswith("wall s: the training loop's wall-clock time, evaluations excluded")
    assert table[5].startswith("R = t_up/t_down ~ ")
    assert table[6].startswith("e=2 against e=1: 1.00x fewer fresh examples")


def test_compare_gives_the_run_without_echoing_no_shuffle_buffer(tiny):
    cfg = tiny(budget=256, shuffle_buffer=128)
    results = compare(cfg, (1.0, 2.0), upstream_ratio=None, log=lambda line: None)
    assert [r.config.shuffle_buffer for r in results] == [0, 128]
    assert [r.config.read_delay for r in results] == [0.0, 0.0]


def test_compare_fails_fast_on_a_missing_data_dir(tmp_path):
    with pytest.raises(DataNotFoundError, match="apt-get install dataset-fashion-mnist"):
        compare(TrainConfig(data_dir=tmp_path), log=lambda line: None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"budget": 0}, "budget must be >= 1, got 0"),
        ({"eval_every": -5}, "eval_every must be >= 0, got -5"),
        ({"threads": 1.5}, "threads must be an integer >= 0, got 1.5"),
        ({"target_accuracy": 1.2}, r"target_accuracy must be in \(0, 1\] or None"),
    ],
)
def test_config_rejects_values_the_loop_cannot_use(changes, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainConfig(**changes)


def test_measure_step_seconds_is_a_positive_duration():
    assert 0 < measure_step_seconds(batch_size=16, steps=3) < 5
