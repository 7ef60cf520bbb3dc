"""``dataecho train --nproc 2`` end to end (PyTorch's launcher, 2 real ranks, gloo), its
checkpoints, and a resume of them with another number of ranks (1, in this process)."""

from __future__ import annotations

import shutil
import signal
import socket

import pytest

from dataecho.app import cli
from dataecho.app.checkpoint_file import CheckpointError, list_checkpoints, load_checkpoint
from dataecho.app.config import TrainConfig
from dataecho.app.config_file import ConfigError, config_from
from dataecho.app.train import train

TINY = ["--train-examples", "1024", "--batch-size", "64", "--num-workers", "0",
        "--eval-examples", "200", "--eval-every", "512", "--target-accuracy", "off",
        "--seed", "3"]  # fmt: skip


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """One launched run: local-echo, e=2 with batch echoing, 1,024 fresh examples."""
    folder = tmp_path_factory.mktemp("ckpt")
    capture = pytest.MonkeyPatch()
    argv = ["train", "--nproc", "2", "--sync", "local-echo", "--echo-factor", "2", "--where",
            "batch", "--budget", "1024", "--checkpoint-dir", str(folder),
            "--checkpoint-every", "6", *TINY]  # fmt: skip
    lines: list[str] = []
    capture.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(s) for s in signals]
    try:
        status = cli.main(argv)
    finally:
        capture.undo()
    after = [signal.getsignal(s) for s in signals]
    shutil.copytree(folder, as_written(folder))  # the later tests' resumes add checkpoints
    return status, "\n".join(lines), folder, (before, after)


def as_written(folder):
    """A copy of the launched run's checkpoint folder as that run left it."""
    return folder.with_name(folder.name + "-as-written")


def world_of_one(monkeypatch) -> None:
    """torchrun's environment for a world of one: this process is rank 0 of 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():  # fmt: skip
        monkeypatch.setenv(key, value)


@pytest.mark.timeout(240)
def test_nproc_2_trains_and_reports_counters_per_rank(two_rank_run):
    status, out, *_ = two_rank_run
    assert status == 0, out
    assert "1,024 fresh" in out  # the budget counts both ranks' fresh examples
    for rank in (0, 1):
        # 512 fresh examples per rank = 8 fresh batches of 64: one all-reduce each, e=2 steps
        # each but the last (the run stops at the step that reaches the budget).
        assert (f"rank {rank} (local-echo): 8 all-reduces (1.00 per fresh batch)") in out, out
        assert "512 fresh examples, 15 steps" in out  # stops at the last fresh step


@pytest.mark.timeout(240)
def test_rank_0_writes_checkpoints_with_every_ranks_loader(two_rank_run):
    _, _, folder, _ = two_rank_run
    found = list_checkpoints(folder)
    assert found, "no checkpoint written"
    last = load_checkpoint(found[-1][1])
    assert last["world_size"] == 2 and len(last["loaders"]) == 2
    assert last["run"]["fresh"] == 1024 and last["run"]["global_steps"] == 30


@pytest.mark.timeout(240)
def test_resume_with_another_number_of_ranks_continues_the_count(two_rank_run, monkeypatch):
    _, _, folder, _ = two_rank_run
    world_of_one(monkeypatch)
    cfg = config_from(None, {"sync": "local-echo", "echo_factor": "2", "where": "batch",
                             "budget": "1536", "checkpoint_dir": str(folder), "resume": "true",
                             "train_examples": "1024", "batch_size": "64", "num_workers": "0",
                             "eval_examples": "200", "eval_every": "512", "seed": "3"})  # fmt: skip
    lines: list[str] = []
    r = train(cfg, log=lines.append)
    assert any("resumed from" in line and "(2 ranks then, 1 now)" in line for line in lines)
    assert r.fresh_examples == 1536  # 1,024 before, 512 more on the one rank now
    assert r.ranks[0]["fresh_examples"] == 512 and r.ranks[0]["allreduce_calls"] == 8
    assert r.test_accuracy is not None and r.history[-1]["fresh"] == 1536


@pytest.mark.timeout(240)
def test_a_data_parallel_resume_skips_a_damaged_checkpoint(two_rank_run, monkeypatch, tmp_path):
    # The ranks' resume path (every rank picks the same file, rank 0 reports), in this process.
    folder = shutil.copytree(as_written(two_rank_run[2]), tmp_path / "ck")
    (_, previous), (_, newest) = list_checkpoints(folder)
    newest.write_bytes(newest.read_bytes()[:-64])
    world_of_one(monkeypatch)
    cfg = config_from(None, {"sync": "local-echo", "echo_factor": "2", "where": "batch",
                             "budget": "1152", "checkpoint_dir": str(folder), "resume": "true",
                             "train_examples": "1024", "batch_size": "64", "num_workers": "0",
                             "eval_examples": "200", "eval_every": "512", "seed": "3"})  # fmt: skip
    lines: list[str] = []
    train(cfg, log=lines.append)
    assert any(f"skipped damaged checkpoint {newest.name} (truncated: " in line
               and line.endswith(f"; resuming from {previous.name}") for line in lines), lines  # fmt: skip
    assert any(f"resumed from {previous} (2 ranks then, 1 now)" in line for line in lines), lines


@pytest.mark.timeout(240)
def test_a_single_process_refuses_to_resume_a_data_parallel_checkpoint(two_rank_run):
    _, _, folder, _ = two_rank_run
    before = list_checkpoints(folder)
    cfg = config_from(None, {"sync": "local-echo", "echo_factor": "2", "where": "batch",
                             "budget": "2048", "checkpoint_dir": str(folder), "resume": "true",
                             "train_examples": "1024", "batch_size": "64", "num_workers": "0",
                             "eval_examples": "200", "eval_every": "512", "seed": "3"})  # fmt: skip
    with pytest.raises(CheckpointError, match=r"written by a data-parallel run of [12] ranks; "
                       "resume it with --nproc N or under torchrun"):  # fmt: skip
        train(cfg, log=lambda line: None)
    assert list_checkpoints(folder) == before  # nothing written


@pytest.mark.timeout(240)
def test_the_launcher_leaves_this_processs_signal_handlers_as_they_were(two_rank_run):
    # torchelastic installs its own (SignalException) for SIGINT, SIGTERM, SIGHUP, SIGQUIT
    # and leaves them: a later Ctrl-C in this process would not be a KeyboardInterrupt.
    before, after = two_rank_run[3]
    assert after == before and signal.default_int_handler in before


def test_avg_prob_needs_local_echo():
    with pytest.raises(ValueError, match="avg_prob=0.5 applies to sync='local-echo' only"):
        TrainConfig(avg_prob=0.5)
    with pytest.raises(ConfigError, match="--avg-prob: avg_prob must be a number in"):
        config_from(None, {"avg_prob": "0"})
    assert TrainConfig(sync="local-echo", avg_prob=0.5).avg_prob == 0.5
