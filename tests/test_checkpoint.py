"""Checkpoints: safe round trip, rotation, atomic writes under kill -9, clear errors."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dataecho.app.checkpoint import (
    FORMAT,
    MIN_FREE_BYTES,
    CheckpointError,
    check_checkpoint_dir,
    check_same,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)


def state(step: int) -> dict:
    return {
        "model": {"w": torch.full((3, 4), float(step)), "b": torch.arange(4)},
        "run": {"steps": step, "seconds": 1.5, "to_target": None, "mark": [1, 2, 0.5]},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "history": [{"fresh": 10, "accuracy": 0.5}],
    }


def test_round_trip_is_exact_and_loads_with_weights_only(tmp_path):
    path = save_checkpoint(tmp_path, state(7), step=7)
    assert path == tmp_path / "step-00000007.pt"
    raw = torch.load(path, weights_only=True)  # the safe loader, straight from torch
    assert raw["format"] == FORMAT and raw["version"] == 1
    got = load_checkpoint(path)
    assert torch.equal(got["model"]["w"], torch.full((3, 4), 7.0))
    assert got["run"] == {"steps": 7, "seconds": 1.5, "to_target": None, "mark": [1, 2, 0.5]}
    random.setstate(got["rng"]["python"])  # restorable as saved: tuples stay tuples
    assert torch.equal(got["rng"]["torch"], torch.get_rng_state())
    assert got["history"] == [{"fresh": 10, "accuracy": 0.5}]


def test_keeps_the_newest_and_orders_steps_as_numbers(tmp_path):
    assert latest_checkpoint(tmp_path / "none") is None and list_checkpoints(tmp_path) == []
    for step in (5, 100_000_000, 40, 99_999_999):  # 9 digits must sort after 8
        save_checkpoint(tmp_path, state(step), step=step, keep=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [40, 99_999_999, 100_000_000]
    assert latest_checkpoint(tmp_path).name == "step-100000000.pt"
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert len(list_checkpoints(tmp_path)) == 3


def test_a_killed_writers_temp_file_is_never_read_and_is_cleaned_up(tmp_path):
    save_checkpoint(tmp_path, state(1), step=1)
    torn = tmp_path / ".tmp-step-00000002.pt.12345"
    torn.write_bytes(b"\x80\x02half a pickle")
    assert latest_checkpoint(tmp_path).name == "step-00000001.pt"
    save_checkpoint(tmp_path, state(3), step=3)
    assert not torn.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001.pt", "step-00000003.pt"]


_WRITER = """
import sys, torch
from dataecho.app.checkpoint import save_checkpoint
big = {"w": torch.randn(4_000_000)}  # 16 MB: each write takes a while
for step in range(1, 10_000):
    save_checkpoint(sys.argv[1], {"model": big, "step": step}, step=step, keep=3)
    print(step, flush=True)
"""


@pytest.mark.timeout(60)
def test_kill_9_during_writes_never_leaves_a_torn_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "1"  # one complete write first
        time.sleep(random.uniform(0.05, 0.3))  # then kill at some point of a later write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    found = list_checkpoints(tmp_path)
    assert found
    for step, path in found:  # every file under a checkpoint's name is whole
        assert load_checkpoint(path)["step"] == step


def test_refuses_what_weights_only_could_not_load_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match=r"state\['run'\]\['where'\] is a PosixPath"):
        save_checkpoint(tmp_path, {"run": {"where": Path("x")}}, step=1)
    with pytest.raises(TypeError, match=r"state\['a'\]\[1\] is a ndarray"):
        save_checkpoint(tmp_path, {"a": [1, np.zeros(2)]}, step=1)
    assert list(tmp_path.iterdir()) == []


def test_load_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "step-00000001.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint.*delete it"):
        load_checkpoint(garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="not a dataecho training checkpoint"):
        load_checkpoint(other)
    future = tmp_path / "future.pt"
    torch.save({"format": FORMAT, "version": 99}, future)
    with pytest.raises(
        CheckpointError, match="checkpoint version 99, this dataecho reads version 1"
    ):
        load_checkpoint(future)


def test_check_same_lists_every_difference():
    check_same({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, ["a", "b"], "ck.pt")
    with pytest.raises(CheckpointError, match=r"a: checkpoint 1, now 2; b: checkpoint 'x', now"):
        check_same({"a": 1, "b": "x"}, {"a": 2, "b": "y"}, ["a", "b"], "ck.pt")


# --- a folder that cannot take checkpoints, and a write that fails ----------------------------


def test_a_checkpoint_folder_is_created_and_probed_without_a_trace(tmp_path):
    folder = tmp_path / "a" / "b"
    assert check_checkpoint_dir(folder) == folder
    assert folder.is_dir() and list(folder.iterdir()) == []  # the probe file is gone


def test_a_folder_that_cannot_be_created_is_refused_with_the_reason(tmp_path):
    # A regular file where a parent folder should be: fails for root too.
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError) as caught:
        check_checkpoint_dir(blocker / "ck")
    assert str(caught.value) == (
        f"checkpoint_dir={str(blocker / 'ck')!r} cannot be created: Not a directory (ENOTDIR); "
        "pick a folder you can write to (checkpoint_dir, --checkpoint-dir DIR)"
    )
    with pytest.raises(CheckpointError, match=r"checkpoint_dir='.*file' is a file, not a folder"):
        check_checkpoint_dir(blocker)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_where_no_file_can_be_created_is_refused():
    # /proc/self is a folder that refuses new files, to root too.
    with pytest.raises(CheckpointError, match=r"checkpoint_dir='/proc/self' is not writable: "
                       r"creating a file in it failed: .* \(E[A-Z]+\); pick a folder"):  # fmt: skip
        check_checkpoint_dir("/proc/self")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    try:
        with pytest.raises(CheckpointError, match=r"is not writable: .*Permission denied"):
            check_checkpoint_dir(folder)
    finally:
        folder.chmod(0o755)


def test_a_folder_without_room_says_what_it_has_and_what_is_needed(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(CheckpointError) as caught:
        check_checkpoint_dir(tmp_path, need_bytes=free + (1 << 40))
    message = str(caught.value)
    assert message.startswith(f"checkpoint_dir={str(tmp_path)!r} has ")
    assert (
        f"MiB free, but its checkpoints need about {(free + (1 << 40)) / (1 << 20):,.1f} MiB"
        in (message)
    )
    assert message.endswith("free some space on that disk or pick a folder on another one")
    assert MIN_FREE_BYTES == 16 << 20  # the least it asks for, whatever the estimate
    check_checkpoint_dir(tmp_path, need_bytes=1)


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past ``nbytes`` fail with EFBIG in this process, as on a full disk (root too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


def test_a_write_that_fails_names_the_file_keeps_the_last_checkpoint_and_no_temp_file(tmp_path):
    first = save_checkpoint(tmp_path, state(1), step=1)
    big = {**state(2), "model": {"w": torch.zeros(1 << 18)}}  # 1 MiB: past the limit below
    with file_size_limit(64 << 10), pytest.raises(CheckpointError) as caught:
        save_checkpoint(tmp_path, big, step=2)
    assert str(caught.value) == (
        f"cannot write checkpoint {tmp_path / 'step-00000002.pt'}: File too large (EFBIG); "
        f"the previous checkpoint {first} is kept and resume (--resume) continues from it; "
        f"free space on that disk or fix {tmp_path}, or set another checkpoint_dir"
    )
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # temp file removed
    assert latest_checkpoint(tmp_path) == first
    assert torch.equal(load_checkpoint(first)["model"]["w"], torch.full((3, 4), 1.0))
    save_checkpoint(tmp_path, big, step=2)  # with room again, the same write goes through


def test_a_rename_that_fails_is_reported_and_cleaned_up_too(tmp_path):
    first = save_checkpoint(tmp_path, state(1), step=1)
    taken = tmp_path / "step-00000002.pt"  # a folder holds the name the rename needs
    taken.mkdir()
    (taken / "x").write_text("in the way")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*step-00000002.pt: "
                       r"Is a directory \(EISDIR\); the previous checkpoint .*step-00000001.pt "
                       "is kept"):  # fmt: skip
        save_checkpoint(tmp_path, state(2), step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, taken.name]
    assert load_checkpoint(first)["run"]["steps"] == 1
