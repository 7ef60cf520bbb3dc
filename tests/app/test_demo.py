"""``dataecho demo --quick`` end to end: shards, the real nginx on loopback, three runs, report."""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import needs_nginx, orphan_burners
from PIL import Image

from dataecho.app.cli import main
from dataecho.app.demo import DEFAULT_WHERE, QUICK, _configs, add_demo_arguments, shuffle_batches
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
RUNS = ["no echo", "e=4", "auto"]


def child_nginx() -> list[int]:
    """nginx processes this test process started and that are still alive."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if b"nginx" in cmd and stat[0] != "Z" and int(stat[1]) == os.getpid():
            pids.append(int(entry.name))
    return pids


def run_quick(tmp_path: Path, capsys, *flags: str) -> tuple[str, Path]:
    argv = ["demo", "--quick", "--work-dir", str(tmp_path / "work"),
            "--runs-dir", str(tmp_path / "runs"), *flags]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    (folder,) = (tmp_path / "runs").iterdir()
    assert {p.name for p in folder.iterdir()} >= {"report.md", "metrics.csv", "curves.png"}
    assert f"report: {folder / 'report.md'}" in out
    return out, folder


def check_table_and_files(out: str, folder: Path) -> None:
    table = out[out.index("    run  ") :].splitlines()
    assert table[0].split()[:3] == ["run", "echo", "factor"]
    assert [line.strip().split("  ")[0] for line in table[2:5]] == RUNS
    assert table[2].split()[-3:-1] == ["1.00x", "1.00x"] or "missed" in table[2]
    # Every run read through one loader worker: its CPU per fresh batch is counted.
    assert all(float(line.split()[-1]) > 0 for line in table[2:5]), table
    with (folder / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == RUNS  # --quick: one evaluation per run
    assert all(int(r["fresh"]) >= 2_048 for r in rows)
    with Image.open(folder / "curves.png") as img:
        assert img.format == "PNG" and img.size[0] > 0
    md = (folder / "report.md").read_text()
    for name in RUNS:
        assert f"| {name} |" in md


@needs_data
@needs_nginx
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_quick_demo_streams_from_nginx_and_writes_the_report(tmp_path, capsys):
    out, folder = run_quick(tmp_path, capsys)
    assert "nginx at http://127.0.0.1:" in out
    assert "R = t_up / t_down = " in out
    check_table_and_files(out, folder)
    md = (folder / "report.md").read_text()
    assert "EMULATION" not in md and "nginx at http://127.0.0.1:" in md
    assert "R = t_up / t_down = " in md and "while the loader runs" in md
    assert child_nginx() == []  # stopped after the runs


@needs_data
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_emulated_demo_on_a_busy_machine_says_both_everywhere(tmp_path, capsys):
    # A burner on one of the two cores for longer than the quick demo (stopped after it): about
    # a core of another program's CPU time, four times the limit, sharing the suite's cores.
    orphan_burners(1, 60.0, tmp_path / "burner")
    try:
        out, folder = run_quick(tmp_path, capsys, "--emulate")
    finally:
        subprocess.run(["pkill", "-f", str(tmp_path / "burner")], check=False)
    assert "EMULATED storage" in out and "nginx at" not in out
    check_table_and_files(out, folder)
    md = (folder / "report.md").read_text()
    assert md.startswith("# dataecho run report **(EMULATION")
    assert "EMULATED storage (local files, no network)" in md
    # The busy machine is named in the terminal and at the head of report.md, with the fix.
    assert "THE MACHINE WAS NOT QUIET" in out
    assert "other programs kept" in out and "rerun on an idle machine" in out
    head = md[: md.index("## Results")]
    assert "## The machine was not quiet" in head
    assert "other programs kept" in head and "rerun on an idle machine" in head


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target", "1.5"], "--target must be a number in (0, 1], got 1.5"),
        (["--echo-factor", "0.5"], "--echo-factor must be a number in [1, 1024], got 0.5"),
        (["--bandwidth", "-3"], "--bandwidth must be a number in [10000, 1e+12], got -3.0"),
        (["--budget", "0"], "--budget must be >= 1, got 0"),
        (["--seed", "x"], "must be an integer in 0..18446744073709551615, got 'x'"),
    ],
)
def test_bad_options_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (nginx, its workers, loader workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_data
@needs_nginx
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_during_a_run_leaves_no_nginx_or_worker(tmp_path):
    """As a user would: a separate process, SIGINT once the first run is training."""
    # A target never reached and a large budget: the first run is still training at the
    # signal (--quick's own target is reached at its first evaluation, within a second).
    argv = [sys.executable, "-m", "dataecho.app", "demo", "--quick", "--budget", "40000",
            "--target", "1.0",
            "--work-dir", str(tmp_path / "work"), "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A shell that starts jobs in the background ignores SIGINT; a user's terminal does not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith("[no echo] upstream:"):  # nginx is up, the loader is streaming
                break
        time.sleep(1.0)
        kids = descendants(proc.pid)
        assert any(b"nginx" in Path(f"/proc/{k}/cmdline").read_bytes() for k in kids)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "dataecho demo: interrupted" in err
    deadline = time.monotonic() + 10
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [k for k in kids if alive(k)] == []
    assert not (tmp_path / "runs").exists()  # no half report


@pytest.mark.parametrize(
    "flags", [[], ["--where", "batch"], ["--where", "after_augment"], ["--where", "before_augment"]]
)
def test_where_flag_reaches_the_echoed_runs(flags):
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    args = parser.parse_args(flags)
    configs = _configs("http://127.0.0.1:1", QUICK, args, target=0.3)
    where = flags[1] if flags else DEFAULT_WHERE
    assert [c.name for c in configs] == RUNS
    assert [c.where for c in configs[1:]] == [where, where]  # the no-echo run has no echo stage
    assert configs[1].echo_factor == 4.0 and configs[2].echo_factor == "auto"
    # The device's pool holds a run's 40 batches' worth, a buffer in the loader worker 10: whole
    # batches for where=batch, else examples (the device mixes the copies' examples).
    batches = 40 if where == "device" else 10
    assert shuffle_batches(where) == batches
    per_batch = QUICK.batch_size  # examples at every insertion point
    assert [c.shuffle_buffer for c in configs] == [0, batches * per_batch, batches * per_batch]


def test_bad_where_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--where", "gpu"])
    assert exc.value.code == 2
    assert "--where: invalid choice: 'gpu'" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["device", "batch"])
def test_shuffle_batches_sizes_the_echoed_runs_buffer_in_batches_worth(where):
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    args = parser.parse_args(["--where", where, "--shuffle-batches", "25"])
    configs = _configs("http://127.0.0.1:1", QUICK, args, target=0.3)
    per_batch = QUICK.batch_size  # examples at every insertion point
    assert [c.shuffle_buffer for c in configs] == [0, 25 * per_batch, 25 * per_batch]


def test_a_negative_shuffle_batches_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--shuffle-batches", "-1"])
    assert exc.value.code == 2
    assert "--shuffle-batches" in capsys.readouterr().err


# Every numeric flag of the demo, with a value past its range: refused by argparse, before the
# shards are written or the bandwidth calibrated (2**64 went through to those steps, or to nginx).
BIG = str(2**64)
DEMO_RANGES = [
    ("--augment-pad", BIG, "--augment-pad must be an integer in 0..28, got 18446744073709551616 "
     "(Fashion-MNIST images are 28 pixels wide"),
    ("--shuffle-batches", BIG, "--shuffle-batches must be an integer in 0..131072, got "
     "18446744073709551616 (the buffer holds that many batches of 128 examples in memory"),
    ("--bandwidth", BIG, "--bandwidth must be a number in [10000, 1e+12], got "
     "1.8446744073709552e+19 (1 TB/s is no cap at all on loopback; leave --bandwidth out"),
    ("--bandwidth", "0.5", "--bandwidth must be a number in [10000, 1e+12], got 0.5"),
    ("--upstream-ratio", BIG, "--upstream-ratio must be a number in [0.1, 100], got "
     "1.8446744073709552e+19 (R = t_up / t_down"),
    ("--upstream-ratio", "1e-300", "--upstream-ratio must be a number in [0.1, 100], got 1e-300"),
    ("--budget", BIG, "--budget must be an integer in 1..9007199254740992, got "
     "18446744073709551616 (counts of examples and steps"),
    ("--seed", BIG, "--seed must be an integer in 0..18446744073709551615, got 18446744073709551616"),
    ("--echo-factor", BIG, "--echo-factor must be a number in [1, 1024], got 1.8446744073709552e+19"),
    ("--max-echo-factor", BIG, "--max-echo-factor must be a number in [1, 1024]"),
    ("--target", BIG, "--target must be a number in (0, 1], got 1.8446744073709552e+19"),
]  # fmt: skip


@pytest.mark.parametrize(("flag", "value", "message"), DEMO_RANGES)
def test_every_numeric_demo_flag_is_checked_before_any_work(tmp_path, capsys, flag, value,
                                                            message):  # fmt: skip
    work, runs = tmp_path / "work", tmp_path / "runs"
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--work-dir", str(work), "--runs-dir", str(runs), flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: {message}" in " ".join(capsys.readouterr().err.split())
    assert not work.exists() and not runs.exists()  # no shards written, nothing calibrated
    assert time.perf_counter() - start < 1.0


def test_the_demo_checks_every_runs_settings_before_writing_shards(tmp_path, capsys):
    """What only the runs' config refuses (a setting combination) stops the demo before its
    first step too, with the config's message."""
    work = tmp_path / "work"
    with pytest.raises(SystemExit):  # at the flag's own limit: argparse takes it
        main(["demo", "--work-dir", str(work), "--shuffle-batches", "131073"])
    args = argparse.Namespace(where="batch", shuffle_batches=2**19, seed=0, augment_pad=2,
                              data_dir=DEFAULT_DATA_DIR, echo_factor=4.0, max_echo_factor=8.0,
                              quick=True, budget=None, target=None, work_dir=work,
                              runs_dir=tmp_path / "runs", upstream_ratio=4.0, bandwidth=None,
                              emulate=True, command="demo")  # fmt: skip
    from dataecho.app.demo import run_demo

    with pytest.raises(ValueError, match=r"shuffle_buffer must be an integer in 0\.\.16777216"
                       r".*, got 33554432"):  # fmt: skip
        run_demo(args)
    assert not work.exists()
