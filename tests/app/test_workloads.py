"""The workload registry: one Workload per task, looked up by name."""

import pytest

from dataecho.app import workloads
from dataecho.app.config import TrainConfig
from dataecho.app.workloads.base import DEFAULTED


def test_get_names_the_valid_workloads():
    assert workloads.get("cnn") is workloads.REGISTRY["cnn"]
    with pytest.raises(ValueError, match="workload must be one of 'cnn', 'char-lm', got 'rnn'"):
        workloads.get("rnn")


@pytest.mark.parametrize("name", list(workloads.REGISTRY))
def test_each_workload_gives_every_default_and_a_target_field(name):
    workload = workloads.get(name)
    assert workload.name == name and set(workload.defaults) == set(DEFAULTED)
    cfg = TrainConfig(workload=name, **{workload.target_key: workload.cli_target})
    assert cfg.target == workload.cli_target
    assert workload.better(cfg.target, cfg.target)
    assert workload.better(workload.near(cfg.target, -1.0), cfg.target)
    assert not workload.better(workload.near(cfg.target, 1.0), cfg.target)
