"""kill -9 a real ``dataecho train`` over shards, resume it: the run continues exactly.

Three real processes: an uninterrupted run, a run SIGKILLed at a random moment after its first
checkpoint, and ``--resume`` of that one. With a fixed seed and one loader worker the resumed
run's final checkpoint (every step's loss, fresh examples, weights) equals the uninterrupted
run's, every checkpoint file the killed run left loads (none is torn), and the killed run's
loader worker ended with it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import alive, wait_until
from test_reliability_resume import synthetic

from dataecho.app.checkpoint_file import latest_checkpoint, list_checkpoints, load_checkpoint
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, INSTALL_COMMAND
from dataecho.app.sources.shard_writer import write_image_shards

REPO = Path(__file__).resolve().parents[2]
EXAMPLES, BUDGET = 600, 1200  # two epochs: the kill may land in either
COUNTS = ("fresh_examples", "examples_out", "batches")


def train(shards: Path, ckpt: Path, *extra: str) -> subprocess.Popen:
    # Emulated storage paces the reads (~2 s an epoch), so a random kill lands mid-run.
    upstream = f"emulated:{shards}?bandwidth=1000000&latency=0"
    args = ["--upstream", upstream, "--data-dir", str(DEFAULT_DATA_DIR), "--budget",
            str(BUDGET), "--batch-size", "32", "--echo-factor", "2", "--shuffle-buffer", "64",
            "--eval-every", str(BUDGET), "--eval-examples", "100", "--num-workers", "1",
            "--threads", "1", "--seed", "7", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "5", "--keep-checkpoints", "3", *extra]  # fmt: skip
    # Output to a file, not a pipe: a killed run's loader worker may hold a pipe open.
    log = open(ckpt.parent / f"{ckpt.name}.log", "a")  # noqa: SIM115 (the child holds it)
    with log:
        return subprocess.Popen(
            [sys.executable, "-m", "dataecho.app", "train", *args],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (its DataLoader worker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def output(proc: subprocess.Popen) -> str:
    return Path(proc.args[proc.args.index("--checkpoint-dir") + 1] + ".log").read_text()


def finish(proc: subprocess.Popen) -> str:
    proc.wait(timeout=120)
    assert proc.returncode == 0, output(proc)
    return output(proc)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_9_then_resume_continues_the_uninterrupted_run_exactly(tmp_path):
    if not (DEFAULT_DATA_DIR / FILES["test"][0]).is_file():
        pytest.skip(f"Fashion-MNIST not installed ({INSTALL_COMMAND}); evaluation reads it")
    shards = tmp_path / "shards"
    write_image_shards(*synthetic(EXAMPLES, seed=2), shards, examples_per_shard=100)
    ref_dir, killed_dir = tmp_path / "ref", tmp_path / "killed"
    workers: list[int] = []
    reference = train(shards, ref_dir)  # runs alongside the one to kill: 2 cores
    victim = train(shards, killed_dir)
    try:
        deadline = time.monotonic() + 90
        while latest_checkpoint(killed_dir) is None:
            assert victim.poll() is None, output(victim)
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 1.0))
        assert victim.poll() is None, "the run ended before the kill: make it longer"
        # (none for a moment between two epochs' workers)
        assert wait_until(lambda: children(victim.pid)), "the run has no loader worker"
        workers = children(victim.pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        # Its loader worker ends with it, even one blocked on its full result pipe (torch
        # would join the queue's feeder thread at exit): dataecho.loader.lifetime.
        assert wait_until(lambda: not any(alive(p) for p in workers), timeout=5), workers
        finish(reference)
    finally:
        for proc in (victim, reference):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in workers:  # failed: leave nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # Under a checkpoint's name only whole files (each loads with weights_only=True); a killed
    # writer may leave a .tmp- file, which is never read.
    names = {p.name for p in killed_dir.iterdir() if not p.name.startswith(".tmp-")}
    assert names == {p.name for _, p in list_checkpoints(killed_dir)} and names
    for _, path in list_checkpoints(killed_dir):
        load_checkpoint(path)
    killed_at = load_checkpoint(latest_checkpoint(killed_dir))["run"]["steps"]

    out = finish(train(shards, killed_dir, "--resume"))
    assert f"resumed from {killed_dir}" in out, out
    want = load_checkpoint(latest_checkpoint(ref_dir))
    got = load_checkpoint(latest_checkpoint(killed_dir))
    assert 0 < killed_at < got["run"]["steps"]  # killed mid-run, resumed to the end
    for key in COUNTS:  # fresh examples, copies, batches (wait seconds are timing)
        assert got["loader"]["stats"][key] == want["loader"]["stats"][key], key
    assert want["loader"]["stats"]["fresh_examples"] >= BUDGET
    assert torch.equal(got["losses"], want["losses"])  # the whole loss curve, bit for bit
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), name
