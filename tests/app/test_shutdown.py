"""SIGINT/SIGTERM during training: a final checkpoint that matches the model, exact resume, and
nothing left running (dataecho.app.shutdown, ``dataecho train --checkpoint-on-exit``).

In this process: the real loader with signals sent to ourselves at chosen moments (while the
loop waits for a batch, during a step, twice). In real processes: ``dataecho train`` signalled
at a random moment (SIGTERM to the process as a scheduler sends it, SIGINT to its process
group as Ctrl-C does), then resumed; and a data-parallel launcher stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Numbers, assert_same_stream, torch_roundtrip, wait_for_log
from test_reliability_resume import synthetic

from dataecho import EchoingDataLoader
from dataecho.app.checkpoint_file import latest_checkpoint, list_checkpoints, load_checkpoint
from dataecho.app.cli import build_parser
from dataecho.app.config import TrainConfig
from dataecho.app.config_file import ConfigError, config_from
from dataecho.app.shutdown import ExitCheckpoint, Terminated
from dataecho.app.sources.fashion_mnist import (
    DEFAULT_DATA_DIR,
    FILES,
    INSTALL_COMMAND,
    write_subset,
)
from dataecho.app.sources.nginx import group_pids
from dataecho.app.sources.shard_writer import write_image_shards
from dataecho.app.train import train

REPO = Path(__file__).resolve().parents[2]


class SignalAt(Numbers):
    """``Numbers`` that sends ``signum`` to this process when example ``at`` is read (read in
    this process: the loader has no workers, so the signal lands while the loop waits)."""

    def __init__(self, n: int, at: int, signum: int) -> None:
        super().__init__(n)
        self.at, self.signum = at, signum

    def __getitem__(self, i: int):
        if i == self.at:
            os.kill(os.getpid(), self.signum)
        return super().__getitem__(i)


def make_loader(dataset) -> EchoingDataLoader:
    return EchoingDataLoader(dataset, batch_size=4, echo_factor=2, where="after_augment",
                             shuffle_buffer=8, seed=3, shuffle=True, num_workers=0)  # fmt: skip


class Saves:
    """The ``save`` of an ExitCheckpoint: keeps each loader state as a checkpoint would."""

    def __init__(self, tmp_path: Path) -> None:
        self.states: list = []
        self.path = tmp_path / "step-final.pt"

    def __call__(self, state):
        self.states.append(torch_roundtrip(state))
        return self.path


def resumed_batches(state) -> list:
    """The rest of the epoch from a loader ``state``, in a fresh loader."""
    loader = make_loader(Numbers(40))
    loader.load_state_dict(state)
    return list(loader)


@pytest.mark.timeout(30)
def test_a_signal_while_waiting_stops_at_once_and_resumes_with_the_batch_not_trained_on(tmp_path):
    whole = list(make_loader(Numbers(40)))  # 20 batches: 10 fresh, each twice
    for signum, raised in ((signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)):
        loader, saves, lines = make_loader(SignalAt(40, 17, signum)), Saves(tmp_path), []
        trained = []
        with pytest.raises(raised), ExitCheckpoint(loader, saves, log=lines.append, label="t") as g:
            for batch in g.batches(loader):
                trained.append(batch)
                g.after_step()
        # Reading example 17 is part of fetching a batch: no further batch came out.
        assert 0 < len(trained) < len(whole) and len(saves.states) == 1
        assert_same_stream(trained, whole[: len(trained)], "before the signal")
        # The state is from before that wait: the resume delivers that batch first.
        assert_same_stream(resumed_batches(saves.states[0]), whole[len(trained) :], "resumed")
        name = signal.Signals(signum).name
        assert lines == [f"[t] {name} while waiting for a batch: final checkpoint {saves.path}; "
                         "continue with --resume"]  # fmt: skip


class SignalParentAtRead(Numbers):
    """``Numbers`` that, read in a loader worker, sends ``signum`` to the training process at
    its ``at``-th read: a persistent worker's copy counts the reads of every epoch."""

    def __init__(self, n: int, at: int, signum: int) -> None:
        super().__init__(n)
        self.at, self.signum, self.reads = at, signum, 0

    def __getitem__(self, i: int):
        self.reads += 1
        if self.reads == self.at:
            os.kill(os.getppid(), self.signum)
        return super().__getitem__(i)


def make_persistent(dataset) -> EchoingDataLoader:
    return EchoingDataLoader(dataset, batch_size=4, echo_factor=2, where="after_augment",
                             shuffle_buffer=8, seed=3, shuffle=True, num_workers=1,
                             persistent_workers=True)  # fmt: skip


@pytest.mark.timeout(60)
def test_a_signal_in_persistent_workers_later_epoch_resumes_exactly_and_leaves_none(tmp_path):
    with make_persistent(Numbers(40)) as reference:
        whole = [list(reference) for _ in range(2)]
    # Read 60 is epoch 1's 20th: only a worker kept from epoch 0 gets that far.
    loader = make_persistent(SignalParentAtRead(40, 60, signal.SIGTERM))
    saves, lines = Saves(tmp_path), []
    trained: list[list] = [[], []]
    with pytest.raises(Terminated), loader, ExitCheckpoint(loader, saves, log=lines.append) as g:
        for epoch in range(2):
            for batch in g.batches(loader):
                trained[epoch].append(batch)
                g.after_step()
    assert len(saves.states) == 1 and "SIGTERM" in lines[0]
    assert_same_stream(trained[0], whole[0], "epoch 0")
    resumed = make_persistent(Numbers(40))
    resumed.load_state_dict(saves.states[0])
    with resumed:
        assert_same_stream(trained[1] + list(resumed), whole[1], "epoch 1, resumed")
    deadline = time.monotonic() + 5  # closed on the way out: no worker left
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(30)
def test_a_signal_during_a_step_lets_it_finish_then_checkpoints_and_stops(tmp_path):
    whole = list(make_loader(Numbers(40)))
    loader, saves, lines = make_loader(Numbers(40)), Saves(tmp_path), []
    finished = []
    with pytest.raises(Terminated), ExitCheckpoint(loader, saves, log=lines.append) as guard:
        for i, _ in enumerate(guard.batches(loader)):
            if i == 5:
                os.kill(os.getpid(), signal.SIGTERM)  # handled at once: only a flag is set
            time.sleep(0.01)  # the rest of the step
            finished.append(i)
            guard.after_step()
    assert finished == list(range(6)) and len(saves.states) == 1
    assert_same_stream(resumed_batches(saves.states[0]), whole[6:], "resumed after step 5")
    assert "SIGTERM during a step (stopped after it)" in lines[0]


@pytest.mark.timeout(30)
def test_a_second_signal_interrupts_at_once_without_another_checkpoint(tmp_path):
    loader, saves = make_loader(Numbers(40)), Saves(tmp_path)
    reached = []
    with pytest.raises(KeyboardInterrupt), ExitCheckpoint(loader, saves, log=print) as guard:
        for _ in guard.batches(loader):
            os.kill(os.getpid(), signal.SIGTERM)  # the first: the step goes on
            reached.append("after the first")
            os.kill(os.getpid(), signal.SIGINT)  # the user insists: stop now
            reached.append("after the second")
    assert reached == ["after the first"] and saves.states == []


def test_handlers_are_restored_an_ignored_signal_stays_ignored_and_off_is_a_no_op(tmp_path):
    def mine(signum, frame):
        pass

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. a background job under nohup
        loader = make_loader(Numbers(8))
        with ExitCheckpoint(loader, Saves(tmp_path)) as guard:
            assert guard.active and signal.getsignal(signal.SIGTERM) == guard._handle
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert len(list(guard.batches(loader))) == 4
        assert signal.getsignal(signal.SIGTERM) is mine
        with ExitCheckpoint(loader, None) as off:  # checkpoint_on_exit=False
            assert not off.active and signal.getsignal(signal.SIGTERM) is mine
            batches = off.batches(loader)
            assert len(list(batches)) == 4
            off.after_step()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_signal_after_the_last_step_goes_to_the_usual_handler(tmp_path):
    """After the last ``after_step`` nothing would look at the flag: the signal is handed on."""
    loader, saves = make_loader(Numbers(8)), Saves(tmp_path)
    with pytest.raises(KeyboardInterrupt), ExitCheckpoint(loader, saves) as guard:
        for _ in guard.batches(loader):
            guard.after_step()
        os.kill(os.getpid(), signal.SIGINT)  # the loop is over; the guard is still on
    assert saves.states == []  # the run ended normally: its last checkpoint is the final one


def test_checkpoint_on_exit_needs_a_checkpoint_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint_on_exit=True needs checkpoint_dir.*"
                       r"--checkpoint-dir DIR"):  # fmt: skip
        config_from(None, {"checkpoint_on_exit": "true"})
    assert TrainConfig(checkpoint_on_exit=True, checkpoint_dir=tmp_path, nproc=2).nproc == 2
    assert config_from(None, {"checkpoint_on_exit": "true", "checkpoint_dir": str(tmp_path)})
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    text = " ".join(sub.format_help().split())
    assert "--checkpoint-on-exit, --no-checkpoint-on-exit on SIGINT (Ctrl-C) or SIGTERM" in text


# --- real processes ---------------------------------------------------------------------------

RUN = ["--batch-size", "32", "--echo-factor", "2", "--shuffle-buffer", "64", "--eval-every",
       "64", "--eval-examples", "100", "--num-workers", "1", "--threads", "1", "--seed", "7",
       "--target-accuracy", "off", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A Fashion-MNIST copy with 200 test images: evaluations (and loading) take no time."""
    if not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND}); evaluation reads it")
    return write_subset(tmp_path_factory.mktemp("fmnist"), train=1024, test=200)


def start(upstream: str, ckpt: Path, data_dir: Path) -> subprocess.Popen:
    """``dataecho train`` with --checkpoint-on-exit and no periodic checkpoint, until stopped;
    in its own process group (a shell job); output to a file (a pipe could fill up)."""
    log = open(f"{ckpt}.log", "w")  # noqa: SIM115 (the child holds it)
    with log:
        return subprocess.Popen(
            [sys.executable, "-m", "dataecho.app", "train", "--upstream", upstream, *RUN,
             "--data-dir", str(data_dir), "--budget", "1000000", "--checkpoint-dir", str(ckpt), "--checkpoint-every",
             "100000", "--checkpoint-on-exit"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


def log_of(proc: subprocess.Popen) -> str:
    return Path(proc.args[proc.args.index("--checkpoint-dir") + 1] + ".log").read_text()


def wait_for_processes(pgid: int, n: int) -> None:
    """Until ``pgid`` has ``n`` live processes (loader workers restart at each epoch's end)."""
    deadline = time.monotonic() + 30
    while len(group_pids(pgid)) < n:
        assert time.monotonic() < deadline, f"{group_pids(pgid)}: fewer than {n} processes"
        time.sleep(0.01)


def wait_for_training(proc: subprocess.Popen, deadline: float) -> None:
    # The first evaluation: well into training.
    wait_for_log(proc, lambda: log_of(proc), "| test acc", deadline)


def config(shards: Path, data_dir: Path, **extra) -> TrainConfig:
    """The config of ``RUN`` (the same stream and model as the signalled runs)."""
    given = {k[2:].replace("-", "_"): v for k, v in zip(RUN[:-1:2], RUN[1::2], strict=True)}
    return config_from(None, {"upstream": str(shards), "data_dir": str(data_dir), **given,
                              **extra}, defaults={"progress": False})  # fmt: skip


@pytest.mark.timeout(180)
def test_sigterm_or_ctrl_c_writes_a_final_checkpoint_that_resumes_exactly(small, tmp_path):
    shards = tmp_path / "shards"
    write_image_shards(*synthetic(600, seed=2), shards, examples_per_shard=100)
    # SIGTERM: local shards, steps take most of the time (the signal mostly lands in a step).
    # Ctrl-C: emulated slow storage, the loop mostly waits (the signal mostly lands in a wait).
    emulated = f"emulated:{shards}?bandwidth=1000000&latency=0"
    runs = {signal.SIGTERM: start(str(shards), tmp_path / "term", small),
            signal.SIGINT: start(emulated, tmp_path / "int", small)}  # fmt: skip
    stopped_at = {}
    try:
        deadline = time.monotonic() + 90
        for signum, proc in runs.items():
            wait_for_training(proc, deadline)
            time.sleep(random.uniform(0.0, 0.5))
            wait_for_processes(proc.pid, 2)  # the run and its loader worker
            if signum == signal.SIGINT:
                os.killpg(proc.pid, signum)  # Ctrl-C: the whole group, the worker included
            else:
                os.kill(proc.pid, signum)  # a scheduler: the main process only
        for signum, proc in runs.items():
            proc.wait(timeout=60)
            out = log_of(proc)
            assert proc.returncode == 128 + signum, out
            word = "interrupted" if signum == signal.SIGINT else "terminated"
            assert f"dataecho train: {word}" in out and "Traceback" not in out, out
            found = re.search(rf"{signal.Signals(signum).name} (while waiting for a batch|"
                              r"during a step \(stopped after it\)): final checkpoint (\S+);", out)  # fmt: skip
            assert found, out
            ckpt = Path(proc.args[proc.args.index("--checkpoint-dir") + 1])
            assert [str(p) for _, p in list_checkpoints(ckpt)] == [found[2]]
            stopped_at[signum] = load_checkpoint(found[2])["run"]["steps"]
            assert stopped_at[signum] > 0
            deadline = time.monotonic() + 10  # the worker: gone with the run
            while group_pids(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert group_pids(proc.pid) == [], f"left behind: {group_pids(proc.pid)}"
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    # One uninterrupted run to a few steps past both stops; each resume must equal it.
    steps = max(stopped_at.values()) + 12
    want = train(config(shards, small, max_steps=steps), log=lambda line: None)
    for signum, proc in runs.items():
        ckpt = proc.args[proc.args.index("--checkpoint-dir") + 1]
        lines = []
        got = train(config(shards, small, max_steps=steps, checkpoint_dir=ckpt, resume=True),
                    log=lines.append)  # fmt: skip
        assert f"resumed from {ckpt}/step-{stopped_at[signum]:08d}.pt" in lines[0]
        assert got.losses == want.losses, signum  # every step's loss, bit for bit
        assert (got.fresh_examples, got.echoed_examples) == (want.fresh_examples,
                                                             want.echoed_examples)  # fmt: skip
        final = load_checkpoint(latest_checkpoint(ckpt))
        assert final["run"]["steps"] == steps


@pytest.mark.timeout(120)
def test_sigterm_to_a_data_parallel_launcher_stops_every_rank_and_exits_143(small, tmp_path):
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataecho.app", "train", "--nproc", "2", "--data-dir",
             str(small), "--read-delay", "0.002", "--batch-size", "32", "--num-workers", "1",
             "--eval-every", "128", "--eval-examples", "100", "--budget", "1000000",
             "--target-accuracy", "off", "--no-progress"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        # Rank 0 trains: both ranks are up.
        wait_for_log(proc, log.read_text, "| test acc", time.monotonic() + 90)
        # The launcher, its 2 ranks and their loader workers (and the spawn resource tracker).
        wait_for_processes(proc.pid, 5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 143, text
    assert "dataecho train: terminated" in text and "Traceback" not in text, text
    deadline = time.monotonic() + 10
    while group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_pids(proc.pid) == [], f"left behind: {group_pids(proc.pid)}"


# SIGTERM sent from inside the fork of the loader worker of the run's second epoch: the signal
# lands while the loop waits for that epoch's first batch, after the first epoch's last one.
TERM_AT_SECOND_EPOCH = """
import os, signal, sys
from dataecho.app import main
forks = []
def count():
    forks.append(1)
    if len(forks) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
os.register_at_fork(before=count)
sys.argv[0] = "dataecho"
sys.exit(main())
"""


@pytest.mark.timeout(180)
def test_sigterm_between_epochs_checkpoints_a_position_that_resumes_exactly(small, tmp_path):
    shards, ckpt = tmp_path / "shards", tmp_path / "term"
    write_image_shards(*synthetic(300, seed=3), shards, examples_per_shard=50)
    args = ["train", "--upstream", str(shards), *RUN, "--data-dir", str(small), "--budget",
            "1000000", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "100000",
            "--checkpoint-on-exit"]  # fmt: skip
    run = subprocess.run([sys.executable, "-c", TERM_AT_SECOND_EPOCH, *args], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 143, out
    found = re.search(r"SIGTERM while waiting for a batch: final checkpoint (\S+);", out)
    assert found, out
    stopped_at = load_checkpoint(found[1])["run"]["steps"]

    steps = stopped_at + 12
    want = train(config(shards, small, max_steps=steps), log=lambda line: None)
    got = train(config(shards, small, max_steps=steps, checkpoint_dir=ckpt, resume=True),
                log=lambda line: None)  # fmt: skip
    assert got.losses == want.losses  # every step's loss, bit for bit
    assert (got.fresh_examples, got.echoed_examples) == (want.fresh_examples,
                                                         want.echoed_examples)  # fmt: skip


def start_short_epochs(data_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    """``dataecho train`` in memory on 256 examples: an epoch (8 steps, workers started anew)
    every few tens of ms, until stopped; in its own process group; output to ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dataecho.app", "train", "--data-dir", str(data_dir),
             "--train-examples", "256", "--batch-size", "32", "--eval-every", "256",
             "--eval-examples", "100", "--num-workers", "1", "--target-accuracy", "off",
             "--budget", "100000000", "--no-progress", *extra],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


@pytest.mark.timeout(120)
def test_ctrl_c_pressed_again_and_again_still_exits_130_with_the_one_line(small, tmp_path):
    """SIGINT every 3 ms from the first evaluation on (epochs start every few tens of ms): the
    repeats land in the first one's cleanup, in the command's handler and in the interpreter's
    exit. Each must still end in 130 and ``dataecho train: interrupted``, with no traceback
    (it was -2, a KeyboardInterrupt traceback, "Exception ignored in atexit callback")."""
    runs = {  # to the process (as kill does), and to the group with a final checkpoint (Ctrl-C)
        os.kill: start_short_epochs(small, tmp_path / "plain.log"),
        os.killpg: start_short_epochs(small, tmp_path / "ckpt.log", "--checkpoint-dir",
                                      str(tmp_path / "ck"), "--checkpoint-on-exit"),
    }  # fmt: skip
    logs = {os.kill: tmp_path / "plain.log", os.killpg: tmp_path / "ckpt.log"}
    try:
        deadline = time.monotonic() + 60
        for send, proc in runs.items():
            wait_for_log(proc, logs[send].read_text, "| test acc", deadline)
        end = time.monotonic() + 20
        while any(p.poll() is None for p in runs.values()) and time.monotonic() < end:
            for send, proc in runs.items():
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        send(proc.pid, signal.SIGINT)
            time.sleep(0.003)
        for send, proc in runs.items():
            proc.wait(timeout=30)
            out = logs[send].read_text()
            assert proc.returncode == 130, out
            assert out.rstrip().endswith("dataecho train: interrupted"), out
            assert "Traceback" not in out and "Exception ignored" not in out, out
        # Whether the final checkpoint was written depends on where the first signal landed:
        # a repeat during a step stops at once, without one (the second-signal test above).
        # Written or not, nothing in the folder is torn.
        out, ck = logs[os.killpg].read_text(), tmp_path / "ck"
        written = re.search(r"SIGINT (while waiting for a batch|during a step \(stopped after "
                            r"it\)): final checkpoint (\S+);", out)  # fmt: skip
        assert written is None or Path(written[2]).is_file(), out
        for _, path in list_checkpoints(ck):
            load_checkpoint(path)
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
