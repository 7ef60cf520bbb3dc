"""Checkpoints: safe round trip, rotation, atomic writes under kill -9, clear errors."""

from __future__ import annotations

import contextlib
import hashlib
import io
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

from dataecho.app.checkpoint_file import (
    FORMAT,
    MIN_FREE_BYTES,
    CheckpointError,
    DamagedCheckpointError,
    UnusableCheckpointError,
    check_checkpoint_dir,
    check_same,
    frame,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resume_from,
    save_checkpoint,
    verified_payload,
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
    # The payload behind the checksum header loads with the safe loader, straight from torch.
    raw = torch.load(io.BytesIO(verified_payload(path)), weights_only=True)
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
from dataecho.app.checkpoint_file import save_checkpoint
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


def saved_payload(path: Path, value) -> None:
    """``value`` written as a checkpoint file would be, bypassing save_checkpoint's checks."""
    buf = io.BytesIO()
    torch.save(value, buf)
    path.write_bytes(frame(buf.getvalue()))


def test_load_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "step-00000001.pt"
    garbage.write_bytes(b"not a torch file, and long enough to hold a checksum header" * 3)
    with pytest.raises(DamagedCheckpointError, match="no valid checksum header .*delete it"):
        load_checkpoint(garbage)
    unpicklable = tmp_path / "bytes.pt"
    unpicklable.write_bytes(frame(b"checksummed, but not torch.save's"))
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint"):
        load_checkpoint(unpicklable)
    other = tmp_path / "other.pt"
    saved_payload(other, {"weights": torch.zeros(2)})
    with pytest.raises(CheckpointError, match="not a dataecho training checkpoint"):
        load_checkpoint(other)
    future = tmp_path / "future.pt"
    saved_payload(future, {"format": FORMAT, "version": 99})
    with pytest.raises(
        CheckpointError, match="checkpoint version 99, this dataecho reads version 1"
    ):
        load_checkpoint(future)


# --- damaged files: refused before anything is unpickled --------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> bytes:
    """The bytes of one checkpoint file (a model, an optimizer's momentum, RNG states)."""
    model = torch.nn.Linear(16, 8).state_dict()
    # An SGD state dict's shape, written out (torch.optim's first import alone takes seconds).
    momentum = {"state": {i: {"momentum_buffer": torch.randn_like(t)}
                          for i, t in enumerate(model.values())},
                "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0, 1]}]}  # fmt: skip
    folder = tmp_path_factory.mktemp("written")
    path = save_checkpoint(folder, {**state(60), "model": model, "optimizer": momentum}, step=60)
    return path.read_bytes()


def refused(path: Path, damaged: bytes) -> str:
    path.write_bytes(damaged)
    with pytest.raises(DamagedCheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: damaged checkpoint, ") and "delete it" in message
    return caught.value.reason


FRACTIONS = [0.0, 0.001, 0.05, 0.25, 0.5, 0.75, 0.95, 0.999, 1.0]  # of the file, first to last


@pytest.mark.parametrize("where", FRACTIONS)
def test_64_random_bytes_anywhere_are_refused(written, tmp_path, where):
    rng = random.Random(where)
    at = int(where * (len(written) - 64))
    noise = bytes(rng.randrange(256) for _ in range(64))
    if noise == written[at : at + 64]:  # cannot happen in practice; keep the test honest
        noise = bytes(b ^ 0xFF for b in noise)
    reason = refused(tmp_path / "step-00000060.pt", written[:at] + noise + written[at + 64 :])
    assert "checksum" in reason or "header" in reason


@pytest.mark.parametrize("where", [*FRACTIONS, 40, 100])  # 40, 100: in the header's digits
def test_one_flipped_bit_is_refused(written, tmp_path, where):
    at = where if isinstance(where, int) else int(where * (len(written) - 1))
    flipped = bytearray(written)
    flipped[at] ^= 1 << (at % 8)
    reason = refused(tmp_path / "step-00000060.pt", bytes(flipped))
    header = written.index(b"\n") + 1
    if at >= header:  # past the header: the payload's checksum names both
        expected = written[27:91].decode()  # after "dataecho-checkpoint sha256 "
        found = hashlib.sha256(bytes(flipped[header:])).hexdigest()
        assert reason == f"checksum sha256 {found}, expected {expected}"


def test_a_truncated_or_extended_file_is_refused(written, tmp_path):
    path = tmp_path / "step-00000060.pt"
    size = len(written) - (written.index(b"\n") + 1)  # the payload's
    assert refused(path, written[:-1]) == f"truncated: {size - 1:,} of {size:,} bytes"
    assert refused(path, written[: len(written) // 2]).startswith("truncated: ")
    assert refused(path, written[:50]).startswith("truncated: 50 bytes")
    assert refused(path, b"").startswith("truncated: 0 bytes")
    assert refused(path, written + b"\0") == "1 bytes past its end"


def test_resume_takes_the_newest_intact_checkpoint_and_says_which_it_skipped(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, state(step), step=step, keep=3)
    newest = tmp_path / "step-00000030.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x10
    newest.write_bytes(bytes(data))
    lines = []
    path, got = resume_from(tmp_path, lines.append)
    assert path == tmp_path / "step-00000020.pt" and got["run"]["steps"] == 20
    assert len(lines) == 1 and lines[0].startswith(
        "warning: skipped damaged checkpoint step-00000030.pt (checksum sha256 "
    )
    assert lines[0].endswith("; resuming from step-00000020.pt")
    (tmp_path / "step-00000020.pt").write_bytes(b"")
    (tmp_path / "step-00000010.pt").unlink()
    with pytest.raises(CheckpointError) as caught:
        resume_from(tmp_path, lines.append)
    assert str(caught.value).startswith(
        f"no intact checkpoint in {tmp_path} (step-00000030.pt: checksum sha256 "
    )
    assert "step-00000020.pt: truncated: 0 bytes" in str(caught.value)
    assert resume_from(tmp_path / "none", lines.append) is None


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


# --- intact files whose contents do not load: skipped for the one before, with a warning ------


def test_an_intact_file_that_torch_cannot_load_or_of_another_structure_is_unusable(tmp_path):
    path = tmp_path / "step-00000001.pt"
    path.write_bytes(frame(b"checksummed, but not torch.save's"))
    with pytest.raises(UnusableCheckpointError) as caught:
        load_checkpoint(path)
    assert caught.value.path == path and caught.value.reason.startswith(
        "cannot be read as a checkpoint: torch.load failed with UnpicklingError: "
    )
    saved_payload(path, [1, 2, 3])
    with pytest.raises(UnusableCheckpointError, match=r"not a dataecho training checkpoint: a "
                       r"list\); move it out of the checkpoint folder"):  # fmt: skip
        load_checkpoint(path)


def test_resume_falls_back_past_unusable_checkpoints_naming_each_and_why(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, state(step), step=step, keep=3)
    saved_payload(tmp_path / "step-00000030.pt", {"weights": torch.zeros(2)})  # intact, foreign

    def use(path: Path, ckpt: dict) -> None:  # what a run does: load, or say why it cannot
        if ckpt["run"]["steps"] == 20:
            raise UnusableCheckpointError(path, "missing loader (keys: history, model)")

    lines: list[str] = []
    path, got = resume_from(tmp_path, lines.append, use)
    assert path == tmp_path / "step-00000010.pt" and got["run"]["steps"] == 10
    assert lines == [
        "warning: skipped checkpoint whose contents do not load step-00000030.pt (not a dataecho "
        "training checkpoint: a dict without format 'dataecho-train-checkpoint'); resuming from "
        "step-00000010.pt",
        "warning: skipped checkpoint whose contents do not load step-00000020.pt (missing "
        "loader (keys: history, model)); resuming from step-00000010.pt",
    ]
    (tmp_path / "step-00000010.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as caught:
        resume_from(tmp_path, lines.append, use)
    assert str(caught.value).startswith(f"no usable checkpoint in {tmp_path} (step-00000030.pt: ")
    assert "step-00000010.pt: truncated: 0 bytes" in str(caught.value)


def test_an_error_of_another_kind_from_use_stops_the_resume(tmp_path):
    save_checkpoint(tmp_path, state(10), step=10)
    save_checkpoint(tmp_path, state(20), step=20)

    def use(path: Path, ckpt: dict) -> None:
        raise CheckpointError(f"{path} was written by a run with other settings")

    with pytest.raises(CheckpointError, match="step-00000020.pt was written by a run with other"):
        resume_from(tmp_path, [].append, use)
