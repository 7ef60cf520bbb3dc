"""``python -m experiments NAME`` and ``experiments.run``: choosing an experiment, bad input."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import experiments
from experiments.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_every_experiment_is_a_package_with_a_run() -> None:
    assert set(experiments.EXPERIMENTS) == {"choi", "laggard", "stochastic"}
    for name in experiments.EXPERIMENTS:
        module = importlib.import_module(f"experiments.{name}")
        assert Path(module.__file__).name == "__init__.py" and callable(module.run)


def test_run_names_the_choices_and_the_seed_it_rejects(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"experiment must be one of 'choi', .*got 'choy'"):
        experiments.run("choy", tmp_path)
    with pytest.raises(ValueError, match=r"seed must be >= 0, got -1"):
        experiments.run("choi", tmp_path, seed=-1)
    with pytest.raises(TypeError, match=r"seed must be an integer >= 0, got None"):
        experiments.run("choi", tmp_path, seed=None)
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_command_line_rejects_an_unknown_experiment_and_a_bad_seed(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["choy"])
    assert exit_.value.code == 2 and "invalid choice: 'choy'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["choi", "--seed", "-3"])
    assert exit_.value.code == 2 and "must be an integer >= 0, got '-3'" in capsys.readouterr().err


def test_module_runs_from_the_checkout() -> None:
    done = subprocess.run([sys.executable, "-m", "experiments", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "choi" in done.stdout and "--quick" in done.stdout and "--seed" in done.stdout
