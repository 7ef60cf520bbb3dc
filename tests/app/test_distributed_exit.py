"""SIGINT/SIGTERM in a data-parallel run with ``--checkpoint-on-exit`` (dataecho.app.distributed.signals):
every rank stops after the same exchange, one final checkpoint, an exact resume, nothing left.

In this process: the handlers (a flag during a step, a wait cut short only past the grace,
forked workers ignore the signals, a late signal handed on). On 2 real ranks over gloo, forked
from this process (no torch import to wait for), the real loop with a signal sent by a rank to
itself at a chosen read: one rank signalled, the other not, both stop after the same exchange;
a rank blocked on its data past the grace joins the exchange void. End to end: ``dataecho train
--nproc 2`` (PyTorch's launcher, spawned ranks) stopped by SIGTERM to its process group, then
resumed: the losses and counts equal an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for_log
from test_distributed_sync import run_ranks as sync_run_ranks

from dataecho.app.checkpoint_file import list_checkpoints, load_checkpoint
from dataecho.app.config import TrainConfig
from dataecho.app.config_file import config_from
from dataecho.app.distributed.control import Control
from dataecho.app.distributed.launch import stopped_by
from dataecho.app.distributed.signals import StopSignals
from dataecho.app.shutdown import Terminated
from dataecho.app.sources.fashion_mnist import (
    DEFAULT_DATA_DIR,
    FILES,
    INSTALL_COMMAND,
    write_subset,
)
from dataecho.app.sources.nginx import group_pids

REPO = Path(__file__).resolve().parents[2]


# --- the handlers, in this process -----------------------------------------------------------


def _blocking(first: list[int]):
    """Yields ``first``, then waits for data that never comes."""
    yield from first
    time.sleep(600)
    yield -1


def test_a_signal_sets_a_flag_and_a_wait_within_the_grace_goes_on():
    with StopSignals(enabled=True, grace=60) as signals:
        batches = iter([1, 2, 3])
        assert signals.fetch(batches) == 1 and signals.votes() == Control()
        os.kill(os.getpid(), signal.SIGINT)  # during a "step": only the flag
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's copy: the first one counts
        assert signals.signum == signal.SIGINT
        assert signals.fetch(batches) == 2  # the data comes: no reason to cut the wait
        assert signals.votes() == Control(sigint=True) and signals.votes(void=True).void
        assert isinstance(signals.exception(Control(sigint=True)), KeyboardInterrupt)


@pytest.mark.timeout(30)
def test_past_the_grace_a_wait_for_data_is_cut_short():
    grace = 0.3
    with StopSignals(enabled=True, grace=grace) as signals:
        batches = _blocking([1])
        assert signals.fetch(batches) == 1
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.fetch(batches) is None  # not after 600 s: the timer cut the sleep
        assert time.monotonic() - t0 >= grace and signals.late
        assert signals.fetch(iter([2])) is None  # past the grace: no more waiting at all
        assert isinstance(signals.exception(Control(sigterm=True, void=True)), Terminated)


def test_votes_read_from_the_sums_and_a_peers_signal_stops_this_rank_too():
    assert not Control(fresh=64, steps=2).stopping
    assert Control(fresh=64, steps=2, sigterm=True).stopping
    both = Control(fresh=64, steps=2, sigint=True, void=True)
    assert both.stopping and both.void
    assert not Control(fresh=64, steps=2, target=True, sigterm=True).void
    with StopSignals(enabled=True) as signals:  # this rank got no signal
        assert isinstance(signals.exception(Control(sigterm=True, sigint=True)), Terminated)
        assert isinstance(signals.exception(Control(sigint=True)), KeyboardInterrupt)


def _sleep_then_exit() -> None:
    time.sleep(1.0)


def test_handlers_are_restored_forked_workers_ignore_signals_and_a_late_one_is_handed_on():
    def mine(signum, frame):
        pass

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored on purpose: stays ignored
        with StopSignals(enabled=True) as signals:
            assert signals.active and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            # A loader worker forked now blocks both signals: they leave it running.
            worker = mp.get_context("fork").Process(target=_sleep_then_exit)
            worker.start()
            time.sleep(0.2)
            os.kill(worker.pid, signal.SIGINT)
            worker.terminate()  # SIGTERM
            worker.join(timeout=20)
            assert worker.exitcode == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        with StopSignals(enabled=False) as off:  # checkpoint_on_exit=False: nothing changes
            assert not off.active and signal.getsignal(signal.SIGTERM) is mine
            assert off.fetch(iter([5])) == 5
        # A signal after the loop's last exchange: raised when the guard is left.
        with pytest.raises(Terminated), StopSignals(enabled=True):
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_the_launcher_reports_ranks_stopped_by_a_signal_as_that_signal():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failed(*codes: int) -> ChildFailedError:
        return ChildFailedError("train", {r: ProcessFailure(r, 100 + r, c, "")
                                          for r, c in enumerate(codes)})  # fmt: skip

    assert stopped_by(failed(143, 143)) == signal.SIGTERM
    assert stopped_by(failed(130, -signal.SIGTERM)) == signal.SIGTERM  # killed on the way out
    assert stopped_by(failed(130, 130)) == signal.SIGINT
    assert stopped_by(failed(1, 143)) is None  # a real failure stays a LaunchError
    assert stopped_by(failed(-signal.SIGTERM, -signal.SIGTERM)) is None  # killed, not stopped


def test_checkpoint_on_exit_is_accepted_for_data_parallel_runs(tmp_path):
    cfg = TrainConfig(checkpoint_on_exit=True, checkpoint_dir=tmp_path, nproc=2)
    assert cfg.checkpoint_on_exit and cfg.nproc == 2


# --- 2 real ranks, forked from this process --------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Fashion-MNIST with 1,024 training and 200 test images: data loads at once."""
    if not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND})")
    # The ranks forked from here inherit its imports: DDP's constructor and the first
    # optimizer step import torch._dynamo (~800 modules, 3-8 s in every rank), so once here.
    import torch._dynamo  # noqa: F401

    return write_subset(tmp_path_factory.mktemp("fmnist"), train=1024, test=200)


class SignalAt:
    """The training set, but rank 1 sends ``signum`` to itself at its ``at``-th read (in the
    wait for a batch: no loader workers), then waits ``block`` seconds for the data."""

    def __init__(self, inner: Any, at: int, signum: int, block: float) -> None:
        self.inner, self.at, self.signum, self.block, self.reads = inner, at, signum, block, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        if self.reads == self.at and os.environ["RANK"] == "1":
            os.kill(os.getpid(), self.signum)
            time.sleep(self.block)
        return self.inner[i]


def run_ranks(fn: Any, *args: Any, timeout: float = 100) -> list[Any]:
    """``fn(rank, *args)`` on 2 ranks forked from here (test_distributed_sync's harness), not
    daemonic: a rank's loader may start workers; their results by rank."""
    return sync_run_ranks(fn, *args, timeout=timeout, daemon=False)


def _rank(rank: int, settings: dict, fault: tuple | None) -> dict[str, Any]:
    """One rank of a run; with ``fault``, rank 1 signals itself (:class:`SignalAt`)."""
    import dataecho.app.train as training

    os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "3"  # a grace of 1 s
    if fault is not None:
        build = training.build_data

        def signalled(cfg: TrainConfig) -> Any:
            data = build(cfg)
            return dataclasses.replace(data, train=SignalAt(data.train, *fault))

        training.build_data = signalled  # in this forked rank only
    lines: list[str] = []
    cfg = config_from(None, settings, defaults={"progress": False})
    try:
        r = training.train(cfg, log=lines.append)
    except (KeyboardInterrupt, Terminated) as stop:
        return {"stopped": type(stop).__name__, "lines": lines}
    return {"stopped": None, "lines": lines, "losses": r.losses, "fresh": r.fresh_examples,
            "echoed": r.echoed_examples}  # fmt: skip


def _settings(data_dir: Path, **extra: Any) -> dict[str, str]:
    base = {"data_dir": data_dir, "batch_size": 32, "echo_factor": 2, "num_workers": 0,
            "eval_every": 256, "eval_examples": 100, "target_accuracy": "off", "seed": 5,
            "threads": 1, "checkpoint_every": 100000}  # fmt: skip
    return {k: str(v) for k, v in {**base, **extra}.items()}


def assert_resumes_exactly(settings: dict[str, str], folder: Path, steps: int) -> None:
    """Resumed from ``folder`` to ``steps`` (per rank), the run equals an uninterrupted one."""
    want = run_ranks(_rank, {**settings, "max_steps": str(steps)}, None)[0]
    got = run_ranks(_rank, {**settings, "max_steps": str(steps), "checkpoint_dir": str(folder),
                            "resume": "true"}, None)[0]  # fmt: skip
    assert got["stopped"] is None and any("resumed from" in x for x in got["lines"]), got
    assert len(got["losses"]) == len(want["losses"]) > 0
    assert got["losses"] == want["losses"]  # rank 0's every loss, bit for bit
    assert (got["fresh"], got["echoed"]) == (want["fresh"], want["echoed"])


@pytest.mark.timeout(120)
def test_local_echo_a_signal_to_one_rank_stops_both_after_one_exchange_and_resumes(small, tmp_path):
    folder = tmp_path / "ckpt"
    settings = _settings(small, sync="local-echo")
    stop = {**settings, "checkpoint_dir": str(folder), "checkpoint_on_exit": "true"}
    ranks = run_ranks(_rank, stop, (70, signal.SIGINT, 0.0))
    # Rank 1 got SIGINT and stops with it; rank 0 got nothing and stops as SIGINT'd too.
    assert [r["stopped"] for r in ranks] == ["KeyboardInterrupt"] * 2
    [(step, path)] = list_checkpoints(folder)
    assert "SIGINT" not in ranks[0]["lines"][-1]  # rank 0 was not signalled itself
    assert f"final checkpoint {path}; continue with --resume" in ranks[0]["lines"][-1]
    ckpt = load_checkpoint(path)
    assert ckpt["run"]["global_steps"] == step > 0 and len(ckpt["loaders"]) == 2
    # Each rank's own momentum (local-echo keeps it local) went into its loader entry.
    assert all("optimizer" in entry for entry in ckpt["loaders"])
    assert_resumes_exactly(settings, folder, step // 2 + 8)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", ["ddp", "local-echo"])
def test_a_rank_blocked_on_its_data_joins_the_exchange_void_and_no_checkpoint_is_written(
    small, tmp_path, sync
):
    folder = tmp_path / "ckpt"
    # echo_factor 1: the read (and its 600 s wait) happens in the rank's own wait for a batch.
    # Echoing at a fixed factor would read ahead on a thread, and the rank would train on what
    # was read ahead and stop after a step, with a checkpoint, before it ever waited.
    stop = {**_settings(small, sync=sync, echo_factor=1), "checkpoint_dir": str(folder),
            "checkpoint_on_exit": "true"}  # fmt: skip
    t0 = time.monotonic()
    ranks = run_ranks(_rank, stop, (70, signal.SIGTERM, 600.0), timeout=100)
    assert time.monotonic() - t0 < 100  # the 600 s wait was cut short (grace: 1 s)
    assert [r["stopped"] for r in ranks] == ["Terminated"] * 2
    assert list_checkpoints(folder) == []  # no consistent state: none is written
    assert "stopped without a final checkpoint" in ranks[0]["lines"][-1]


# --- end to end: the launcher ----------------------------------------------------------------


@pytest.mark.timeout(180)
def test_sigterm_to_a_launched_run_checkpoints_every_rank_at_one_step_and_resumes(small, tmp_path):
    folder, log = tmp_path / "ckpt", tmp_path / "launcher.log"
    # Emulated slow storage (2 ms a read): the signal lands in a wait for data or in a step.
    settings = _settings(small, num_workers=1, read_delay=0.002)
    flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", v)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataecho.app", "train", "--nproc", "2", *flags,
             "--budget", "1000000", "--checkpoint-dir", str(folder), "--checkpoint-on-exit",
             "--no-progress"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        # Rank 0 trains: both ranks are up.
        wait_for_log(proc, log.read_text, "| test acc", time.monotonic() + 120)
        time.sleep(random.uniform(0.0, 0.5))
        # The whole group, as a shell's kill %1: the launcher (which forwards it to each rank
        # again), the ranks and their loader workers (which must not die mid-batch).
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 143, text
    assert "dataecho train: terminated" in text and "Traceback" not in text, text
    found = re.search(r"SIGTERM: the 2 ranks stopped after (\S+) steps in all: final checkpoint "
                      r"(\S+); continue with --resume", text)  # fmt: skip
    assert found, text
    assert [str(p) for _, p in list_checkpoints(folder)] == [found[2]]
    deadline = time.monotonic() + 10
    while group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_pids(proc.pid) == [], f"left behind: {group_pids(proc.pid)}"
    steps = load_checkpoint(found[2])["run"]["global_steps"]
    assert steps == int(found[1].replace(",", "")) > 0
    assert_resumes_exactly(settings, folder, steps // 2 + 6)
