"""The ``dataecho`` command: the demo end to end on a small real copy, and its error paths."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from dataecho.cli import COMMANDS, build_parser, main
from dataecho.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES, write_subset

needs_data = pytest.mark.skipif(
    not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return write_subset(tmp_path_factory.mktemp("fmnist"), train=1024, test=300)


TINY_FLAGS = [
    "--budget", "512", "--batch-size", "64", "--eval-every", "256", "--target", "off",
    "--workers", "0", "--echo-factor", "2", "--shuffle-buffer", "0",
]  # fmt: skip


@needs_data
@pytest.mark.timeout(120)
def test_demo_prints_both_runs_in_a_table(small_dir, capsys):
    code = main(["demo", "--data-dir", str(small_dir), "--upstream-ratio", "2", *TINY_FLAGS])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("calibration: one step takes")
    assert "e=1 step" in out and "e=2 step" in out  # the per-interval log lines
    table = out[out.index("echo  ") :].splitlines()
    assert table[0].split()[:3] == ["echo", "where", "target"]
    plain, echoed = table[2].split(), table[3].split()
    assert plain[:3] == ["1", "-", "-"] and echoed[:3] == ["2", "before_augment", "-"]
    # fresh, echoed, steps: the budget in fresh examples; echoing doubles the steps
    assert plain[4:7] == ["512", "0", "8"] and echoed[4:7] == ["512", "512", "16"]
    assert 0 <= float(plain[3]) <= 1 and float(echoed[7]) > 0
    assert "R = t_up/t_down ~ " in out and "e=2 against e=1: 1.00x fewer fresh examples" in out


@needs_data
@pytest.mark.timeout(120)
def test_demo_with_a_fixed_read_delay_and_a_target(small_dir, capsys):
    flags = ["--read-delay", "0", "--target", "0.05", "--where", "after_augment"]
    assert main(["demo", "--data-dir", str(small_dir), *TINY_FLAGS, *flags]) == 0
    out = capsys.readouterr().out
    assert "calibration" not in out
    rows = out[out.index("echo  ") :].splitlines()[2:4]
    assert [r.split()[2] for r in rows] == ["reached", "reached"]
    assert rows[1].split()[1] == "after_augment"


@pytest.mark.timeout(60)
def test_missing_data_gives_the_install_hint_and_no_traceback(tmp_path):
    """Run as a user would: a separate process, exit status and stderr only."""
    missing = tmp_path / "no-such-dir"
    proc = subprocess.run(
        [sys.executable, "-m", "dataecho.cli", "demo", "--data-dir", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert str(missing / FILES["train"][0]) in proc.stderr
    assert "apt-get install dataset-fashion-mnist" in proc.stderr
    assert "--data-dir" in proc.stderr
    assert proc.stderr.startswith("dataecho demo: error: ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--echo-factor", "0.5"], "--echo-factor: must be a finite number >= 1"),
        (["--target", "1.5"], "--target: must be an accuracy in (0, 1] or 'off'"),
        (["--budget", "0"], "--budget: must be an integer >= 1, got 0"),
        (["--where", "middle"], "--where: invalid choice: 'middle'"),
        (["--read-delay", "-1"], "--read-delay: must be a finite number >= 0"),
    ],
)
def test_bad_options_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_command_is_required_and_every_command_has_help(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    help_text = build_parser().format_help()
    for cmd in COMMANDS:
        assert cmd.name in help_text and cmd.help in help_text


def test_console_script_points_at_main():
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "dataecho"]
    assert script.value == "dataecho.cli:main"
