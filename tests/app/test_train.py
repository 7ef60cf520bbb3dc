"""The training loop on real data, tiny budgets: accounting, stopping, time, checkpoints, resume.

A resume from shards (fast-forward) in a new process is tested in test_cli.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest
import torch
from test_checkpoint import file_size_limit
from test_reliability_resume import damage_png

from dataecho.app.checkpoint_file import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from dataecho.app.sources.austen import DEFAULT_PACKAGE_DIR
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset
from dataecho.app.train import TrainConfig, make_loader, measure_step_seconds, train
from dataecho.app.upstream import prepare

pytestmark = [
    pytest.mark.skipif(
        not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
        reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
    ),
    pytest.mark.timeout(120),
]
HISTORY_KEYS = ["fresh", "steps", "seconds", "accuracy", "train_loss", "realized_factor", "stall",
                "step_seconds", "eval_seconds", "screened", "skipped_records"]  # fmt: skip


def quiet(line: str) -> None:
    pass


# Real data, copied small once: loading the full 60k + 10k per run would dominate the tests.
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_subset(tmp_path_factory.mktemp("fmnist"), train=2048, test=400)


@pytest.fixture
def tiny(data_dir):
    """A config maker: 1,024 real examples, batches of 64, reads in the main process, trains
    on the CPU (also where there is a GPU: the exact-resume tests compare bit for bit)."""
    base = TrainConfig(data_dir=data_dir, train_examples=1024, budget=1024, batch_size=64,
                       eval_every=512, eval_examples=200, num_workers=0, device="cpu")  # fmt: skip
    return lambda **changes: dataclasses.replace(base, **changes)


def test_a_screen_skips_full_evaluations_far_from_the_target_and_never_decides_it(tiny):
    unreachable = tiny(eval_every=128, target_accuracy=0.99, screen_examples=50)
    far = train(unreachable, log=quiet).history
    assert [row["screened"] for row in far] == [1] * 8  # all far below 0.97: screens only
    near = tiny(eval_every=128, target_accuracy=0.3, screen_margin=0.3, screen_examples=50)
    rows = train(near, log=quiet).history
    # Within 0.3 of 0.3 is any accuracy: every evaluation is the full one, which decides.
    assert [row["screened"] for row in rows][:1] == [0]
    exact = train(tiny(eval_every=128, target_accuracy=0.3), log=quiet).history
    assert [r["accuracy"] for r in rows] == [r["accuracy"] for r in exact[: len(rows)]]


def test_plain_run_counts_fresh_steps_time_and_history(tiny):
    logs = []
    r = train(tiny(), log=logs.append)
    assert r.fresh_examples == 1024 and r.echoed_examples == 0 and r.realized_factor == 1.0
    assert r.steps == 16 and len(r.losses) == 16  # 1024 / 64, one step per fresh batch
    assert [list(row) for row in r.history] == [HISTORY_KEYS] * 2
    assert [(row["fresh"], row["steps"]) for row in r.history] == [(512, 8), (1024, 16)]
    assert logs[0].startswith("[e=1] upstream: in memory: Fashion-MNIST train (1,024 examples)")
    assert logs[0].endswith("; training on cpu")
    assert len(logs) == 3 and "fresh    1,024" in logs[-1] and "test acc" in logs[-1]
    assert 0.0 <= r.test_accuracy <= 1.0 and r.test_loss > 0 and r.val_loss is None
    # Evaluations count in the wall time: it holds the steps and the evaluations.
    assert r.wall_seconds >= r.step_seconds + r.eval_seconds > r.eval_seconds > 0
    assert r.history[-1]["seconds"] <= r.wall_seconds
    assert 0 <= r.stall_fraction <= 1 and r.reached_target is None and r.fresh_to_target is None


def test_echoing_takes_e_steps_per_fresh_batch_and_counts_copies_apart(tiny):
    r = train(tiny(echo_factor=3.0, shuffle_buffer=0), log=quiet)  # copies side by side
    assert r.fresh_examples == 1024 and r.echoed_examples == 2 * 1024
    assert r.steps == 3 * 1024 // 64 and r.realized_factor == 3.0
    assert [row["realized_factor"] for row in r.history] == [3.0, 3.0]


def test_with_a_shuffle_buffer_reads_still_buffered_count_as_fresh(tiny):
    """The budget counts reads; examples still in the buffer when it is spent are not trained."""
    r = train(tiny(echo_factor=3.0, shuffle_buffer=256), log=quiet)
    assert r.fresh_examples == 1024
    assert r.fresh_examples + r.echoed_examples == r.steps * 64  # every example out, trained
    assert 3 * (1024 - 256) // 64 <= r.steps < 3 * 1024 // 64


def test_stops_at_the_target_or_trains_on_and_records_when_it_was_reached(tiny):
    r = train(tiny(budget=2048, target_accuracy=0.05), log=quiet)
    assert r.reached_target is True and r.fresh_examples == 512 and len(r.history) == 1
    assert (r.fresh_to_target, r.steps_to_target) == (512, 8)
    assert r.seconds_to_target == r.history[0]["seconds"]
    on = train(tiny(budget=2048, target_accuracy=0.05, stop_at_target=False), log=quiet)
    assert on.reached_target is True and on.fresh_examples == 2048 and len(on.history) == 4
    assert (on.fresh_to_target, on.steps_to_target) == (512, 8)


def test_an_unreachable_target_runs_the_whole_budget_over_several_epochs(tiny):
    r = train(tiny(train_examples=512, target_accuracy=1.0), log=quiet)
    assert r.reached_target is False and r.fresh_examples == 1024  # two epochs of 512
    assert r.fresh_to_target is None and r.seconds_to_target is None


def test_max_steps_stops_mid_epoch_with_a_last_evaluation(tiny):
    r = train(tiny(max_steps=5), log=quiet)
    assert r.steps == 5 and r.fresh_examples == 320 and r.history[-1]["steps"] == 5


def test_same_seed_same_run_with_a_loader_worker_and_threads_restored(tiny):
    torch.set_num_threads(2)
    cfg = tiny(num_workers=1, budget=512, echo_factor=2.0, shuffle_buffer=128)
    a, b = train(cfg, log=quiet), train(cfg, log=quiet)
    assert torch.get_num_threads() == 2  # the caller's setting is back
    assert a.losses == b.losses and a.test_accuracy == b.test_accuracy and a.steps == b.steps


def test_the_loader_workers_cpu_is_counted_per_fresh_batch(tiny):
    r = train(tiny(num_workers=1, budget=512), log=quiet)
    assert 0 < r.worker_cpu_seconds < 2 * r.wall_seconds + 5  # one worker, start-up included
    assert r.worker_ms_per_fresh_batch == pytest.approx(
        1e3 * r.worker_cpu_seconds / (r.fresh_examples / 64)
    )


def test_learns_beyond_chance_quickly(tiny):
    r = train(tiny(train_examples=2048, budget=2048), log=quiet)
    assert r.test_accuracy > 0.5  # 10 classes: chance is 0.1


def test_a_training_set_smaller_than_a_batch_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="no batch of 64: the training set has 10 examples"):
        train(tiny(train_examples=10), log=quiet)


def test_progress_bar_and_log_lines(tiny, capsys):
    logs = []
    train(tiny(progress=True, name="bar"), log=logs.append)
    err = capsys.readouterr().err
    assert "bar:" in err and "fresh/s" in err and "stall" in err  # tqdm bar and its summary
    assert len(logs) == 3 and logs[1].startswith("[bar] step")


# --- checkpoints and resume ------------------------------------------------------------------


def resumed_equals_uninterrupted(cfg: TrainConfig, ckpt_dir, stop: int, every: int) -> None:
    """Train ``cfg`` straight through; then to step ``stop`` with checkpoints and resume from
    the latest: the resumed steps' losses, the counts and the final model must be identical."""
    whole = train(cfg, log=quiet)
    first = train(dataclasses.replace(cfg, max_steps=stop, checkpoint_dir=ckpt_dir,
                                      checkpoint_every=every), log=quiet)  # fmt: skip
    assert first.losses == whole.losses[:stop]
    logs = []
    rest = train(dataclasses.replace(cfg, checkpoint_dir=ckpt_dir, checkpoint_every=every,
                                     resume=True), log=logs.append)  # fmt: skip
    assert logs[0].startswith(f"[{cfg.name}] resumed from {ckpt_dir}/step-{stop:08d}.pt")
    assert len(rest.losses) == whole.steps and rest.losses == whole.losses  # bit for bit
    assert (rest.fresh_examples, rest.echoed_examples) == (whole.fresh_examples,
                                                           whole.echoed_examples)  # fmt: skip
    assert rest.test_accuracy == whole.test_accuracy and rest.test_loss == whole.test_loss
    assert rest.wall_seconds >= rest.history[-1]["seconds"] > first.history[-1]["seconds"]


def test_resume_in_memory_with_a_worker_echo_and_shuffle_buffer_is_exact(tiny, tmp_path):
    cfg = tiny(num_workers=1, echo_factor=2.5, shuffle_buffer=192, budget=1536, max_steps=60)
    resumed_equals_uninterrupted(cfg, tmp_path / "ck", stop=23, every=10)


def test_device_echo_resumes_exactly_with_its_augmentation_draws(tiny, tmp_path):
    # The worker sends batches as read (uint8); each copy is shifted, flipped and normalised
    # in the training process, from a generator the checkpoint carries.
    cfg = tiny(num_workers=1, echo_factor=3, where="device", budget=1536, max_steps=48)
    resumed_equals_uninterrupted(cfg, tmp_path / "ck", stop=17, every=8)


def test_device_echo_trains_like_the_worker_side_augmentation(tiny):
    host = train(tiny(echo_factor=2, budget=2048), log=quiet)
    device = train(tiny(echo_factor=2, where="device", budget=2048), log=quiet)
    assert abs(device.steps - host.steps) <= 2  # copies per batch, not per example
    assert abs(device.fresh_examples - host.fresh_examples) <= 64
    assert device.losses[0] == pytest.approx(host.losses[0], rel=0.2)  # same normalisation
    assert device.test_accuracy > 0.5 and abs(device.test_accuracy - host.test_accuracy) < 0.1


def test_resume_from_an_epochs_last_batch_in_memory_is_exact(tiny, tmp_path):
    # 1,024 examples in batches of 64: step 16 is epoch 0's last batch.
    cfg = tiny(budget=2560, max_steps=40)
    resumed_equals_uninterrupted(cfg, tmp_path / "ck", stop=16, every=16)


def test_resume_from_an_epochs_last_batch_of_shards_is_exact(data_dir, tmp_path):
    # 512 examples in shards, batches of 64: step 8 is epoch 0's last batch, which an iterable
    # dataset's state cannot know; the resumed run's loader continues that epoch (empty).
    folder = tmp_path / "shards"
    prepare(folder, data_dir=data_dir, examples=512, examples_per_shard=128)
    cfg = TrainConfig(upstream=str(folder), data_dir=data_dir, batch_size=64, budget=1024,
                      eval_every=512, eval_examples=100, num_workers=1, device="cpu",
                      max_steps=14)  # fmt: skip
    resumed_equals_uninterrupted(cfg, tmp_path / "ck", stop=8, every=8)


def test_checkpoints_hold_the_whole_run_and_rotate(tiny, tmp_path):
    cfg = tiny(checkpoint_dir=tmp_path, checkpoint_every=5, keep_checkpoints=2, max_steps=12)
    r = train(cfg, log=quiet)
    assert r.checkpoint_seconds > 0  # three writes, counted in the wall time
    assert r.wall_seconds >= r.step_seconds + r.eval_seconds + r.checkpoint_seconds
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 12]  # every 5, and at the end
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert set(state) >= {"config", "data", "model", "optimizer", "loader", "run", "history",
                          "losses", "rng"}  # fmt: skip
    assert state["run"]["steps"] == 12 and len(state["losses"]) == 12
    assert state["config"]["checkpoint_every"] == 5 and state["data"].startswith("memory:cnn:1024:")


def test_resume_refuses_other_settings_and_a_new_run_refuses_an_old_folder(tiny, tmp_path):
    cfg = tiny(checkpoint_dir=tmp_path, checkpoint_every=4, max_steps=4)
    train(cfg, log=quiet)
    with pytest.raises(CheckpointError, match="already holds checkpoints .*resume"):
        train(cfg, log=quiet)
    with pytest.raises(CheckpointError, match="echo_factor: checkpoint 1.0, now 2.0"):
        train(dataclasses.replace(cfg, resume=True, echo_factor=2.0), log=quiet)


def test_resume_refuses_other_data(data_dir, tmp_path):
    for n in (512, 640):
        prepare(tmp_path / str(n), data_dir=data_dir, examples=n, examples_per_shard=128)
    cfg = TrainConfig(upstream=str(tmp_path / "512"), data_dir=data_dir, batch_size=64,
                      eval_examples=100, num_workers=0, max_steps=2,
                      checkpoint_dir=tmp_path / "ck")  # fmt: skip
    train(cfg, log=quiet)
    moved = dataclasses.replace(cfg, upstream=str(tmp_path / "640"), resume=True)
    with pytest.raises(CheckpointError, match="was trained on other data .*point the upstream"):
        train(moved, log=quiet)


def test_resume_with_an_empty_folder_starts_afresh_and_a_finished_run_stays_finished(
    tiny, tmp_path
):
    logs = []
    cfg = tiny(checkpoint_dir=tmp_path / "new", resume=True, max_steps=4)
    r = train(cfg, log=logs.append)
    assert logs[0] == f"[e=1] no checkpoint in {tmp_path / 'new'} yet: starting from the beginning"
    assert r.steps == 4
    again = train(cfg, log=quiet)  # resumes at its limit: no further step
    assert again.steps == 4 and again.losses == r.losses


def test_a_folder_that_cannot_take_checkpoints_fails_before_any_step(tiny, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder's parent should be")
    logs = []
    with pytest.raises(CheckpointError, match=r"checkpoint_dir='.*file/ck' cannot be created: "
                       r"Not a directory \(ENOTDIR\)"):  # fmt: skip
        train(tiny(checkpoint_dir=blocker / "ck"), log=logs.append)
    assert logs == []  # refused before the run began: no step, no evaluation


def test_a_failed_checkpoint_write_stops_the_run_and_the_one_before_resumes(tiny, tmp_path):
    folder = tmp_path / "ck"
    cfg = tiny(checkpoint_dir=folder, checkpoint_every=4, eval_every=256)  # both every 4 steps
    with contextlib.ExitStack() as limits:

        def log(line: str) -> None:  # step 8's evaluation comes just before its checkpoint
            if "step      8 |" in line:
                limits.enter_context(file_size_limit(4096))  # a full disk, for this process

        with pytest.raises(CheckpointError) as caught:
            train(cfg, log=log)
    assert str(caught.value).startswith(
        f"cannot write checkpoint {folder / 'step-00000008.pt'}: File too large (EFBIG); the "
        f"previous checkpoint {folder / 'step-00000004.pt'} is kept and resume (--resume) "
        "continues from it"
    )
    assert [p.name for p in folder.iterdir()] == ["step-00000004.pt"]  # no temp file left
    assert load_checkpoint(folder / "step-00000004.pt")["run"]["steps"] == 4
    logs = []
    rest = train(dataclasses.replace(cfg, resume=True), log=logs.append)
    assert logs[0].startswith(f"[e=1] resumed from {folder / 'step-00000004.pt'}: step 4,")
    assert rest.steps == 16 and rest.fresh_examples == 1024


# --- bad records in a shard upstream ---------------------------------------------------------


@pytest.fixture
def damaged_shards(data_dir, tmp_path):
    """512 real examples in 4 shards of 128, the first record of each with a broken PNG."""
    folder = tmp_path / "shards"
    prepare(folder, data_dir=data_dir, examples=512, examples_per_shard=128)
    for shard in sorted(folder.glob("*.tar")):
        shard.chmod(0o644)
        damage_png(shard, record=0)
    return folder


def test_skipped_bad_records_reach_the_result_the_history_and_the_log(
    data_dir, damaged_shards, caplog
):
    # 448 fresh examples: 7 batches of 64, which need records from all 4 shards (127 good
    # ones each), so every skip has happened in the worker before the last batch arrives.
    cfg = TrainConfig(upstream=str(damaged_shards), data_dir=data_dir, on_bad_record="skip",
                      batch_size=64, budget=448, eval_every=192, eval_examples=100,
                      num_workers=1)  # fmt: skip
    logs = []
    with caplog.at_level(logging.ERROR, logger="dataecho.shards"):  # quiet: one per skip
        r = train(cfg, log=logs.append)
    assert r.skipped_records == 4
    assert [row["skipped_records"] for row in r.history][-1] == 4
    assert all(0 <= row["skipped_records"] <= 4 for row in r.history)
    assert logs[-1].endswith(" | 4 bad record(s) skipped")
    plain = train(dataclasses.replace(cfg, upstream=None, train_examples=512), log=quiet)
    assert plain.skipped_records == 0 and plain.history[-1]["skipped_records"] == 0


def test_a_resume_continues_the_count_of_skipped_records(
    data_dir, damaged_shards, tmp_path, caplog
):
    # Stopped at step 3 (mid-epoch: the worker's reader has skipped some, the rest after the
    # resume); the resumed run must count each of the 4 bad records once, none twice.
    cfg = TrainConfig(upstream=str(damaged_shards), data_dir=data_dir, on_bad_record="skip",
                      batch_size=64, budget=448, eval_every=192, eval_examples=100,
                      num_workers=1, checkpoint_dir=tmp_path / "ck", checkpoint_every=3)  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="dataecho.shards"):
        first = train(dataclasses.replace(cfg, max_steps=3), log=quiet)
        rest = train(dataclasses.replace(cfg, resume=True), log=quiet)
    assert 1 <= first.skipped_records <= 4
    assert rest.skipped_records == 4 and rest.steps == 7


# --- the language model ----------------------------------------------------------------------


@pytest.mark.skipif(not (DEFAULT_PACKAGE_DIR / "data" / "Rdata.rdx").is_file(),
                    reason="janeaustenr not installed (apt-get install r-cran-janeaustenr)")  # fmt: skip
def test_char_lm_learns_and_reaches_a_loss_target():
    cfg = TrainConfig(workload="char-lm", seq_len=16, batch_size=16, budget=960, eval_every=320,
                      eval_examples=64, echo_factor=2, num_workers=0, target_loss=3.3)  # fmt: skip
    r = train(cfg, log=quiet)
    assert [list(row)[3] for row in r.history] == ["val_loss"] * len(r.history)
    assert r.reached_target is True and r.history[-1]["val_loss"] <= 3.3
    assert r.test_accuracy is None and r.val_loss == r.test_loss < 4.4  # below ln(82)
    assert r.losses[-1] < r.losses[0]


def test_measure_step_seconds_is_a_positive_duration_and_restores_threads():
    torch.set_num_threads(2)
    assert 0 < measure_step_seconds(batch_size=16, steps=3) < 5
    assert 0 < measure_step_seconds(batch_size=4, steps=2, workload="char-lm", seq_len=16) < 5
    assert torch.get_num_threads() == 2


def test_the_training_device_is_one_setting_for_every_insertion_point(tiny, data_dir):
    from dataecho.app.training.device import training_device
    from dataecho.app.upstream import build_data

    assert training_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert training_device("cpu") == torch.device("cpu")
    data = build_data(tiny())
    for where in ("before_augment", "batch", "device"):
        loader = make_loader(tiny(where=where, device="cpu"), data, device=torch.device("cpu"))
        # The loader echoes on the training device only where it echoes on a device at all.
        assert loader.options.echo_device == ("cpu" if where == "device" else None), where
        assert loader.pin_memory is False  # pinned host memory only for copies to CUDA


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a missing GPU")
@pytest.mark.parametrize("where", ["before_augment", "device"])
def test_a_missing_cuda_device_is_refused_before_anything_runs_naming_the_fix(tiny, where):
    logs = []
    with pytest.raises(ValueError, match=r"device='cuda', but CUDA is not available here .*"
                       r"train on the CPU with --device cpu \(device='cpu'\)"):  # fmt: skip
        train(tiny(where=where, device="cuda"), log=logs.append)
    assert logs == []
    with pytest.raises(ValueError, match="CUDA is not available here"):  # before any rank starts
        train(tiny(device="cuda:1", nproc=2), log=logs.append)


@pytest.mark.parametrize("where", ["device", "batch"])
def test_a_run_stopped_at_its_budget_trains_every_counted_example_e_times(tiny, where):
    # The pool (8 batches' worth; on the host, 8 whole batches) holds copies of examples
    # already counted when the budget is spent: they are trained on before the run stops, and
    # nothing fresh is read for that.
    cfg = tiny(echo_factor=4, where=where, budget=640, shuffle_buffer=512)
    result = train(cfg, log=quiet)
    assert 640 <= result.fresh_examples < 640 + 64
    assert result.echoed_examples == 3 * result.fresh_examples
    assert result.realized_factor == 4.0
    # Read, in whole batches of 64: those counted and those a pool still holds, untrained.
    assert result.read_examples % 64 == 0
    assert (result.waiting_examples > 0) == (where == "device")
