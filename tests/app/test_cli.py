"""The ``dataecho`` command: prepare and train end to end on small real data, and error paths."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from dataecho._validate import MAX_WORKERS
from dataecho.app import demo
from dataecho.app.checkpoint_file import latest_checkpoint, load_checkpoint
from dataecho.app.cli import COMMANDS, build_parser, main
from dataecho.app.config import MAX_NPROC
from dataecho.app.config_file import flag, options
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset
from dataecho.app.sources.nginx import NginxServer, find_nginx, group_pids
from dataecho.app.train import TrainConfig, train

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def have_nginx() -> bool:
    try:
        find_nginx()
    except FileNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    if not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    return write_subset(tmp_path_factory.mktemp("fmnist"), train=1024, test=300)


@pytest.fixture(scope="module")
def shard_dir(small_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    assert main(["prepare", "--out", str(out), "--data-dir", str(small_dir), "--examples",
                 "512", "--examples-per-shard", "128"]) == 0  # fmt: skip
    return out


# Small runs: batches of 64, evaluations on 100 test examples.
TINY = ["--batch-size", "64", "--eval-examples", "100", "--eval-every", "256", "--no-progress"]


def run_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """``dataecho ARGS`` as a user runs it: a separate process; status, stdout, stderr."""
    return subprocess.run([sys.executable, "-m", "dataecho.app", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV)  # fmt: skip


@needs_data
def test_prepare_writes_once_then_finds_the_shards_intact(small_dir, shard_dir, capsys):
    again = ["prepare", "--out", str(shard_dir), "--data-dir", str(small_dir), "--examples",
             "512", "--examples-per-shard", "128"]  # fmt: skip
    assert main(again) == 0
    assert capsys.readouterr().out == (
        f"{shard_dir} already holds these shards (4 shards, 512 examples, 1.2 MB): nothing written\n"
    )


@needs_data
@pytest.mark.timeout(120)
def test_train_from_local_shards_logs_each_evaluation_and_a_summary(small_dir, shard_dir, capsys):
    code = main(["train", "--upstream", str(shard_dir), "--data-dir", str(small_dir),
                 "--budget", "512", "--echo-factor", "2", "--target-accuracy", "off", *TINY])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].startswith(f"[e=2] upstream: shards on local disk: {shard_dir} (4 shards")
    fresh = [int(line.split("|")[1].split()[1]) for line in out[1:3]]
    # An evaluation at the first step past each 256 fresh examples (the shuffle buffer spreads
    # first copies unevenly over steps); the budget's end exactly at 512.
    assert 256 <= fresh[0] < 512 and fresh[1] == 512
    assert out[3].startswith("[e=2] done: test accuracy ") and out[3].endswith("no target")
    assert out[4].startswith("[e=2] 512 fresh + 512 echoed examples (echo 2.00x), 16 steps")


@needs_data
@pytest.mark.timeout(120)
def test_train_reads_a_toml_config_and_flags_override_it(small_dir, tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(f'data-dir = "{small_dir}"\ntrain_examples = 256\nbudget = 256\n'
                      'name = "from-file"\necho-factor = 3\ntarget-accuracy = 0.05\n')  # fmt: skip
    assert main(["train", "--config", str(config), "--echo-factor", "2", *TINY]) == 0
    out = capsys.readouterr().out
    assert "[from-file] done:" in out and "echo 2.00x" in out
    assert "target 0.05 reached after 256 fresh examples, 8 steps" in out


@needs_data
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "counts"),
    # Batch echoing trains the last fresh batch's copy before it stops at the budget (a drain).
    [("before_augment", "256 echoed examples (echo 2.00x), 8 steps"),
     ("batch", "256 echoed examples (echo 2.00x), 8 steps")],
    ids=["before_augment", "batch"],
)  # fmt: skip
def test_train_on_the_device_given_at_a_host_insertion_point(small_dir, where, counts, capsys):
    code = main(["train", "--where", where, "--device", "cpu", "--data-dir", str(small_dir),
                 "--train-examples", "256", "--budget", "256", "--echo-factor", "2",
                 "--num-workers", "0", "--target-accuracy", "off", *TINY])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].endswith("; training on cpu")
    assert out[-1].startswith(f"[e=2] 256 fresh + {counts}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a missing GPU")
def test_a_device_this_machine_lacks_is_one_error_line_naming_the_fix(capsys):
    assert main(["train", "--where", "before_augment", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "dataecho train: error: device='cuda', but CUDA is not available here "
        "(torch.cuda.is_available() is False); train on the CPU with --device cpu "
        "(device='cpu'), or leave --device out to take a GPU only where there is one\n"
    )


@needs_data
@pytest.mark.timeout(120)
def test_profile_measures_an_input_bound_run_and_recommends_echoing(small_dir, capsys):
    # Reads of 1 ms per example: a batch of 32 takes ~32 ms, far longer than a CNN step.
    code = main(["profile", "--data-dir", str(small_dir), "--read-delay", "0.001",
                 "--batch-size", "32", "--seconds", "3", "--json"])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["t_up"] > report["t_down"] > 0
    assert report["ratio"] > 1.1 and report["input_bound"] is True
    assert report["recommended_echo_factor"] >= 2


def test_bad_config_key_or_value_is_one_error_line(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text("echo-factr = 2\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"dataecho train: error: {config}: unknown key 'echo-factr'; did you mean 'echo_factor'?\n"
    )
    assert main(["train", "--budget", "0"]) == 2
    assert "dataecho train: error: --budget: budget must be >= 1 or 'default', got 0" in (
        capsys.readouterr().err
    )
    assert main(["train", "--workload", "char-lm", "--target-accuracy", "0.9"]) == 2
    assert "target_accuracy=0.9 does not apply to workload='char-lm'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["train", "--where", "middle"])
    assert info.value.code == 2 and "invalid choice: 'middle'" in capsys.readouterr().err


def test_train_help_documents_every_option_with_its_range():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["train"]
    text = " ".join(sub.format_help().split())
    for f in options():
        assert flag(f.name) in text, f.name
    for fragment in ("--config FILE", "an integer in 1..9007199254740992",
                     "a number in (0, 1], default 0.85",
                     "default 1.8", "a number in [1, 1024], or 'auto'", "--no-resume",
                     "an integer in 0..18446744073709551615, default 0",
                     "a number in [0, 3600], default 0",
                     "--device DEVICE where the model and the training step run"):  # fmt: skip
        assert fragment in text, fragment


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "18446744073709551616"],
         "--seed: seed must be an integer in 0..18446744073709551615, got 18446744073709551616 "
         "(2**64 - 1: torch.manual_seed takes a 64-bit unsigned seed; pass the seed modulo "
         "2**64, e.g. seed % 18446744073709551616)"),
        (["--read-delay", "1.8e19"],
         "--read-delay: read_delay must be a number in [0, 3600], got 1.8e+19 (seconds each "
         "read sleeps: an hour per read is slower than any storage worth emulating; e.g. "
         "read_delay=0.0006 makes a cnn run input-bound)"),
        (["--echo-factor", "18446744073709551616"],
         "--echo-factor: echo_factor must be at most 1024, got 1.8446744073709552e+19: each "
         "fresh item is emitted that many times, so a larger factor only repeats the same "
         "data; use echo_factor=2 to 16 (the papers' range) or echo_factor='auto'"),
    ],
)  # fmt: skip
def test_values_past_their_limit_are_one_error_line_before_anything_runs(args, message, capsys):
    # Each of these once ended in a traceback (an overflow) or a loader that never answered.
    assert main(["train", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"dataecho train: error: {message}\n"


@pytest.mark.parametrize(
    ("args", "name", "ceiling"),
    [(["--num-workers", "18446744073709551616"], "num_workers", MAX_WORKERS),
     (["--nproc", "18446744073709551616"], "nproc", MAX_NPROC),
     (["--keep-checkpoints", "18446744073709551616"], "keep_checkpoints", 1000)],
)  # fmt: skip
def test_a_count_past_its_ceiling_exits_2_before_any_process_starts(args, name, ceiling, capsys):
    # These once spawned workers or ranks without end (memory growing, SIGTERM ignored), or
    # estimated an absurd checkpoint size.
    start = time.perf_counter()
    assert main(["train", *args]) == 2
    assert time.perf_counter() - start < 1.0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(
        f"dataecho train: error: {args[0]}: {name} must be an integer in "
        f"{0 if name == 'num_workers' else 1}..{ceiling}, got 18446744073709551616 ("
    )
    assert multiprocessing.active_children() == []


@needs_data
@pytest.mark.timeout(60)
def test_a_checkpoint_folder_that_cannot_be_written_fails_before_training(
    small_dir, tmp_path, capsys
):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder's parent should be")
    code = main(["train", "--data-dir", str(small_dir), "--checkpoint-dir", str(blocker / "ck"),
                 "--target-accuracy", "off", *TINY])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2 and out == ""  # no step, no evaluation line
    assert err == (
        f"dataecho train: error: checkpoint_dir={str(blocker / 'ck')!r} cannot be created: "
        "Not a directory (ENOTDIR); pick a folder you can write to (checkpoint_dir, "
        "--checkpoint-dir DIR)\n"
    )


def six_steps_checkpointed(small_dir: Path, tmp_path: Path) -> tuple[Path, list[str], dict, Path]:
    """A run of 6 steps checkpointed every 3: its folder, its command, the checkpoint of step
    3 and the path of step 6's (the newest)."""
    ck = tmp_path / "ck"
    run = ["train", "--data-dir", str(small_dir), "--checkpoint-dir", str(ck),
           "--checkpoint-every", "3", "--budget", "1024", "--target-accuracy", "off",
           "--num-workers", "0", *TINY]  # fmt: skip
    assert main([*run, "--max-steps", "6"]) == 0
    return ck, run, load_checkpoint(ck / "step-00000003.pt"), ck / "step-00000006.pt"


@needs_data
@pytest.mark.timeout(60)
def test_resume_skips_a_damaged_checkpoint_for_the_one_before(small_dir, tmp_path, capsys):
    ck, run, before, newest = six_steps_checkpointed(small_dir, tmp_path)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = random.Random(6).randbytes(64)
    newest.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*run, "--max-steps", "8", "--resume"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"skipped damaged checkpoint step-00000006\.pt \(checksum sha256 [0-9a-f]{64}, "
                     r"expected [0-9a-f]{64}\); resuming from step-00000003\.pt", out + err)  # fmt: skip
    assert f"resumed from {ck}/step-00000003.pt: step 3" in out + err
    final = load_checkpoint(ck / "step-00000008.pt")  # continued the step-3 run: its losses
    assert final["run"]["steps"] == 8 and final["losses"][:3].tolist() == before["losses"].tolist()
    for path in ck.glob("step-*.pt"):  # none intact: one line, exit 2
        path.write_bytes(path.read_bytes()[:-10])
    assert main([*run, "--max-steps", "10", "--resume"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"dataecho train: error: no intact checkpoint in {ck} (step-00000008.pt: "
                          "truncated: ")  # fmt: skip
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_data_gives_the_install_hint_and_no_traceback(tmp_path, capsys):
    missing = tmp_path / "no-such-dir"
    assert main(["train", "--data-dir", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith(f"dataecho train: error: Fashion-MNIST file not found: {missing}/")
    assert "apt-get install dataset-fashion-mnist" in err and "--data-dir" in err


@needs_data
@pytest.mark.timeout(120)
def test_resume_in_a_new_process_continues_the_uninterrupted_run(small_dir, shard_dir, tmp_path):
    cfg = TrainConfig(upstream=str(shard_dir), data_dir=small_dir, batch_size=64,
                      eval_examples=100, eval_every=256, budget=1024, echo_factor=2,
                      shuffle_buffer=128, num_workers=1, max_steps=24)  # fmt: skip
    whole = train(cfg, log=lambda line: None)
    ck = tmp_path / "ck"
    train(TrainConfig(**{**cfg.to_dict(), "max_steps": 9, "checkpoint_dir": str(ck)}),
          log=lambda line: None)  # fmt: skip
    proc = run_cli("train", "--upstream", str(shard_dir), "--data-dir", str(small_dir),
                   "--budget", "1024", "--echo-factor", "2", "--shuffle-buffer", "128",
                   "--max-steps", "24", "--checkpoint-dir", str(ck), "--resume",
                   "--target-accuracy", "off", *TINY)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {ck}/step-00000009.pt: step 9" in proc.stdout
    final = load_checkpoint(latest_checkpoint(ck))
    assert final["run"]["steps"] == 24 and final["losses"].tolist() == whole.losses


@needs_data
@pytest.mark.skipif(not have_nginx(), reason="nginx not installed (apt-get install nginx-light)")
@pytest.mark.timeout(120)
def test_train_streams_every_shard_once_from_a_real_nginx(small_dir, shard_dir, capsys):
    with NginxServer(shard_dir, rate_limit_bytes_per_s=20_000_000) as server:
        url = server.url
        code = main(["train", "--upstream", url, "--data-dir", str(small_dir),
                     "--budget", "512", "--target-accuracy", "off", *TINY])  # fmt: skip
        traffic = server.traffic()
    out = capsys.readouterr().out
    assert code == 0 and f"shards over HTTP: {url} (4 shards, 512 examples" in out
    assert "512 fresh + 0 echoed examples" in out
    shards = sorted(shard_dir.glob("*.tar"))
    # The manifest, then each shard once: one epoch of fresh data, nothing read twice.
    assert traffic["requests"] == len(shards) + 1
    assert traffic["bytes"] == sum(p.stat().st_size for p in shard_dir.iterdir())


@needs_data
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("signum", "status", "message"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_ctrl_c_or_sigterm_stops_the_run_and_leaves_no_worker_behind(
    small_dir, signum, status, message
):
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataecho.app", "train", "--data-dir", str(small_dir),
         "--read-delay", "0.002", "--budget", "100000", "--target-accuracy", "off", *TINY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        start_new_session=True,  # its own process group, as a shell job has
    )  # fmt: skip
    try:
        while "step" not in (line := proc.stdout.readline()):  # training, worker running
            assert line, proc.stderr.read()
        assert len(group_pids(proc.pid)) >= 2  # the main process and its loader worker
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # what Ctrl-C in a terminal does: the whole group
        else:
            os.kill(proc.pid, signum)  # what a job scheduler does: the main process only
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status and f"dataecho train: {message}" in err
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_pids(proc.pid) == []


def test_demo_command_is_the_demo_modules():
    (cmd,) = [c for c in COMMANDS if c.name == "demo"]
    assert cmd.add_arguments is demo.add_demo_arguments and cmd.run is demo.run_demo
    with pytest.raises(SystemExit) as info:
        main(["demo", "--echo-factor", "0.5"])
    assert info.value.code == 2


def test_a_command_is_required_and_every_command_has_help(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    help_text = " ".join(build_parser().format_help().split())
    for cmd in COMMANDS:
        assert cmd.name in help_text and cmd.help in help_text


def test_console_script_points_at_main():
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "dataecho"]
    assert script.value == "dataecho.app:main"


# --- errors raised in a loader worker, and the HTTP timeout -----------------------------------


def error_lines(err: str) -> tuple[str, str]:
    """The ``dataecho train: error:`` paragraph and what follows it (the worker's traceback)."""
    head, _, rest = err.partition("\n\n")
    return head, rest


def damaged_copy(shard_dir, tmp_path):
    """A copy of the shards whose second shard has a corrupt PNG at record 6."""
    from test_reliability_resume import damage_png

    copy = tmp_path / "shards"
    copy.mkdir()
    for f in shard_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    damage_png(copy / "fashion-mnist-000001.tar", record=6)
    return copy


@needs_data
@pytest.mark.timeout(120)
def test_a_bad_record_read_in_a_worker_is_one_paragraph_with_its_traceback_below(
    small_dir, shard_dir, tmp_path, capsys
):
    copy = damaged_copy(shard_dir, tmp_path)
    code = main(["train", "--upstream", str(copy), "--data-dir", str(small_dir), "--budget",
                 "512", "--target-accuracy", "off", *TINY])  # fmt: skip
    head, below = error_lines(capsys.readouterr().err)
    assert code == 2
    # The headline is the reader's own message: the shard, the record, the fix; not torch's
    # "Caught BadRecordError in DataLoader worker process 0" wrapper.
    assert head.startswith(
        f"dataecho train: error: bad record in {copy}/fashion-mnist-000001.tar: record 6 "
        "(key '00000134'): UnidentifiedImageError"
    ), head
    assert "--on-bad-record skip" in head and "Caught" not in head and "\n" not in head
    assert head.endswith("(in DataLoader worker process 0; its traceback below)")
    assert below.startswith("DataLoader worker process 0: Traceback (most recent call last):")
    assert "in _decode_image" in below  # where it failed, for a bug report
    assert "dataecho.app.sources.retrying.BadRecordError: bad record in" in below


@needs_data
@pytest.mark.timeout(120)
def test_with_on_bad_record_skip_the_summary_counts_the_skipped_records(
    small_dir, shard_dir, tmp_path, capsys
):
    copy = damaged_copy(shard_dir, tmp_path)
    code = main(["train", "--upstream", str(copy), "--data-dir", str(small_dir), "--budget",
                 "448", "--target-accuracy", "off", "--on-bad-record", "skip", *TINY])  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert (
        out[-1]
        == "[e=1] 1 bad record(s) skipped (--on-bad-record skip; each is logged as a warning)"
    )
    assert out[-4].endswith(" | 1 bad record(s) skipped")  # the last evaluation's line


@needs_data
@pytest.mark.skipif(not have_nginx(), reason="nginx not installed (apt-get install nginx-light)")
@pytest.mark.timeout(120)
def test_a_stalled_server_fails_after_http_timeout_naming_the_shard(small_dir, shard_dir, capsys):
    # ~1.5 s per shard at this cap: the server is frozen while the run still reads.
    with NginxServer(shard_dir, rate_limit_bytes_per_s=200_000) as server:
        url = server.url
        freeze = threading.Timer(2.0, os.killpg, (server.pid, signal.SIGSTOP))
        freeze_started = time.monotonic()
        freeze.start()
        try:
            code = main(["train", "--upstream", server.url, "--data-dir", str(small_dir),
                         "--budget", "512", "--target-accuracy", "off", "--http-timeout", "0.3",
                         "--retry-seconds", "1", *TINY])  # fmt: skip
            stalled_for = time.monotonic() - 2.0 - freeze_started
        finally:
            freeze.cancel()
            os.killpg(server.pid, signal.SIGCONT)
    head, below = error_lines(capsys.readouterr().err)
    assert code == 2
    assert re.match(
        rf"dataecho train: error: cannot read {url}/fashion-mnist-00000\d\.tar at record "
        r"\d+ of 128 after retrying for 1\.\d s \(\d+ attempts; retry_seconds=1 sets how long\): "
        r"TimeoutError: .*check that the upstream is up", head), head  # fmt: skip
    assert head.endswith("(in DataLoader worker process 0; its traceback below)")
    assert "ShardReadError" in below
    # A stall counts after --http-timeout (0.3 s), not the default 30 s: the run gave up
    # within seconds of the freeze (0.3 s per try, retried for 1 s), never near 30 s.
    assert stalled_for < 20, stalled_for


def test_http_timeout_is_checked_and_documented(capsys):
    assert main(["train", "--http-timeout", "0"]) == 2
    assert ("dataecho train: error: --http-timeout: http_timeout must be a number in "
            "(0, 86400], got 0.0") in capsys.readouterr().err  # fmt: skip
    assert TrainConfig().http_timeout == 30.0
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    text = " ".join(sub.format_help().split())
    assert "--http-timeout X HTTP shard upstream: seconds without a byte" in text
    assert "[a number in (0, 86400], default 30]" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prepare", "--out", "x", "--examples", "0"],
         "argument --examples: examples must be >= 1, got 0"),
        (["prepare", "--out", "x", "--seq-len", "lots"],
         "argument --seq-len: must be an integer in 1..16384, got 'lots'"),
        (["profile", "--seconds", "0"],
         "argument --seconds: seconds must be a number in (0, 3600], got 0.0"),
        (["profile", "--seconds", "inf"],
         "argument --seconds: seconds must be a number in (0, 3600], got inf (the three phases "
         "take a few seconds each to settle; an hour of measuring tells no more, e.g. --seconds "
         "10)"),
    ],
)  # fmt: skip
def test_plain_flags_are_checked_by_the_shared_rules(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2 and capsys.readouterr().err.endswith(f"{message}\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "--seconds", "1e300"],
         "--seconds: seconds must be a number in (0, 3600], got 1e+300 (the three phases"),
        (["prepare", "--out", "OUT", "--examples", str(2**64)],
         "--examples: examples must be an integer in 1..9007199254740992, got "
         "18446744073709551616 (counts of examples"),
        (["prepare", "--out", "OUT", "--examples-per-shard", str(2**64)],
         "--examples-per-shard: examples_per_shard must be an integer in 1..1000000, got "
         "18446744073709551616 (a shard is one request"),
        (["prepare", "--out", "OUT", "--dataset", "austen", "--seq-len", str(2**64)],
         "--seq-len: seq_len must be an integer in 1..16384, got 18446744073709551616 "
         "(attention holds"),
        (["train", "--budget", str(2**64)],
         "--budget: budget must be an integer in 1..9007199254740992 or 'default', got "
         "18446744073709551616"),
    ],
)  # fmt: skip
def test_every_numeric_flag_of_the_other_commands_has_a_range(tmp_path, capsys, argv, message):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    assert code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists() and time.perf_counter() - start < 1.0


def _without_loader(ckpt: dict) -> dict:
    return {k: v for k, v in ckpt.items() if k != "loader"}


def _wrong_model(ckpt: dict) -> dict:
    return {**ckpt, "model": {k: torch.zeros(1) for k in ckpt["model"]}}


def _bad_loader(ckpt: dict) -> dict:
    return {**ckpt, "loader": {"epoch": 0}}


@needs_data
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("torch.load fails", r"cannot be read as a checkpoint: torch\.load failed with "
         r"UnpicklingError: "),
        (_without_loader, r"missing loader \(keys: config, data, format, history, losses, model"),
        (_wrong_model, r"its model cannot be loaded: RuntimeError: Error\(s\) in loading state_dict "
         r"for \w+:"),
        (_bad_loader, r"its optimizer and loader states cannot be loaded: key 'seed' missing"),
    ],
    ids=["unpicklable", "missing-key", "wrong-model", "bad-loader-state"],
)  # fmt: skip
def test_resume_falls_back_past_an_intact_checkpoint_whose_contents_do_not_load(
    small_dir, tmp_path, capsys, damage, why
):
    from dataecho.app.checkpoint_file import frame

    ck, run, before, newest = six_steps_checkpointed(small_dir, tmp_path)
    if callable(damage):  # a valid, checksummed file of another structure
        buf = io.BytesIO()
        torch.save(damage(load_checkpoint(newest)), buf)
        newest.write_bytes(frame(buf.getvalue()))
    else:
        newest.write_bytes(frame(b"checksummed bytes that torch.load cannot read"))
    capsys.readouterr()
    assert main([*run, "--max-steps", "8", "--resume"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"warning: skipped checkpoint whose contents do not load step-00000006\.pt "
                     rf"\({why}.*\); resuming from step-00000003\.pt", out + err), out + err  # fmt: skip
    assert f"resumed from {ck}/step-00000003.pt: step 3" in out + err
    final = load_checkpoint(ck / "step-00000008.pt")  # continued the step-3 run: its losses
    assert final["run"]["steps"] == 8 and final["losses"][:3].tolist() == before["losses"].tolist()
