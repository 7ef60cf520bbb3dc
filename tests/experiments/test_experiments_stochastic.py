"""``python -m experiments stochastic``: the quick run's outputs and the measurement pieces."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from experiments import stochastic
from experiments.stochastic.training import (
    Setting,
    batches_of,
    gradient_bias,
    load_data,
    train_stochastic,
)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stochastic")
    assert stochastic.run(out, quick=True, seed=0) == out / "README.md"
    return out


@pytest.mark.timeout(300)
def test_quick_run_writes_tables_and_plot(quick_run: Path) -> None:
    plan = stochastic.make_plan(quick=True)
    for name in ("README.md", "stochastic.png", "loads_to_target.csv", "speedup.csv",
                 "schedules.csv", "gradient_bias.csv"):  # fmt: skip
        assert (quick_run / name).is_file(), name
    assert "](stochastic.png)" in (quick_run / "README.md").read_text()
    loads = read_csv(quick_run / "loads_to_target.csv")
    # p = 1 never reuses, so it runs with one buffer size only.
    assert len(loads) == 1 + (len(plan.probs) - 1) * len(plan.buffers)
    for r in loads:
        assert float(r["loads_min"]) <= float(r["loads_median"]) <= float(r["loads_max"])
    speed = read_csv(quick_run / "speedup.csv")
    assert [float(r["speedup"]) for r in speed if float(r["p"]) == 1.0] == [1.0]
    sched = read_csv(quick_run / "schedules.csv")
    assert len(sched) == len(plan.sched_probs) * len(plan.buffers) * 3
    for r in sched:
        assert 0.0 <= float(r["acc_min"]) <= float(r["acc_median"]) <= float(r["acc_max"]) <= 1
    for r in read_csv(quick_run / "gradient_bias.csv"):
        assert -1 <= float(r["cos_reused"]) <= 1 and float(r["rel_err_fresh"]) > 0


def test_cosine_schedules_average_the_constant_probability() -> None:
    steps = 1000
    for p in (0.5, 0.25, 0.125):
        for name in ("cos_inc", "cos_dec"):
            sched = Setting(p, name, 8).load_prob(steps)
            mean = sum(sched(t) for t in range(steps)) / steps
            assert mean == pytest.approx(p, rel=0.01)
        inc = Setting(p, "cos_inc", 8).load_prob(steps)
        dec = Setting(p, "cos_dec", 8).load_prob(steps)
        assert inc(0) < inc(steps) and dec(0) > dec(steps)


@pytest.mark.timeout(120)
def test_fresh_batches_do_not_repeat_within_a_pass() -> None:
    data = load_data(640, 100)
    it = batches_of(data, 64, seed=0)
    rows = [next(it) for _ in range(10)]
    assert [bid for _, _, bid in rows] == list(range(10))
    drawn = torch.cat([x for x, _, _ in rows])
    # One pass: every training image exactly once (as many distinct rows as the data has).
    assert len(torch.unique(drawn, dim=0)) == len(torch.unique(data.train_x, dim=0))


@pytest.mark.timeout(120)
def test_reuse_lowers_loads_per_step_and_bias_rows_are_consistent() -> None:
    data = load_data(5_000, 300)
    once = train_stochastic(data, Setting(1.0, "constant", 1), 0.1, 0, batch_size=64,
                            target=1.1, max_loads=10**9, eval_every=40, steps=40)  # fmt: skip
    reused = train_stochastic(data, Setting(0.25, "constant", 8), 0.1, 0, batch_size=64,
                              target=1.1, max_loads=10**9, eval_every=40, steps=40)  # fmt: skip
    assert once.info["loads"] == 40 * 64 and once.info["steps"] == reused.info["steps"] == 40
    assert reused.info["loads"] < 20 * 64  # about 40 / 4 loads (at least the first)
    rows = gradient_bias(data, 0.25, 8, 0.1, 0, batch_size=64, steps=30, every=1,
                         ref_examples=500)  # fmt: skip
    assert len(rows) == 30
    for r in rows:
        # A batch is emitted fresh exactly once, when loaded (lag 0); reuses come later.
        assert (r["lag"] == 0) == (r["use"] == 1)
        assert math.isfinite(r["cos_batch"]) and r["rel_err_batch"] >= 0
