"""``python -m experiments choi``: the quick run's outputs, the grid and the time model."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from experiments import choi
from experiments.choi import scaling
from experiments.choi.wall_time import time_rows
from experiments.common.trial_loop import Condition, run_trial
from experiments.common.workloads import cnn_workload


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("choi")
    summary = choi.run(out, quick=True, seed=0)
    assert summary == out / "README.md"
    return out


@pytest.mark.timeout(300)
def test_quick_run_writes_every_output(quick_run: Path) -> None:
    for name in ("README.md", "fresh_to_target.csv", "fresh_to_target.png", "time_model.csv",
                 "fixed_budget.csv", "results.json"):  # fmt: skip
        assert (quick_run / name).is_file(), name
    text = (quick_run / "README.md").read_text()
    assert "](fresh_to_target.png)" in text and "python -m experiments choi --quick" in text
    assert "## Claims" in text


@pytest.mark.timeout(300)
def test_quick_table_has_one_row_per_cell(quick_run: Path) -> None:
    plan = choi.make_plan(quick=True)
    rows = read_csv(quick_run / "fresh_to_target.csv")
    expected = sum(len(choi.cells(plan, wp)) for wp in plan.workloads)
    assert len(rows) == expected
    for r in rows:
        lo, mid, hi = float(r["fresh_min"]), float(r["fresh_median"]), float(r["fresh_max"])
        assert lo <= mid <= hi
        if int(r["reached"]) == int(r["searches"]):
            assert math.isfinite(hi) and lo > 0
        assert float(r["t_down"]) > 0
    assert {r["workload"] for r in rows} == {"cnn", "char-lm"}
    # The LM has no augmentation: never the before-augment insertion point.
    assert all(r["where"] != "before_augment" for r in rows if r["workload"] == "char-lm")
    for r in read_csv(quick_run / "time_model.csv"):
        for key in ("speedup_R2", "speedup_R4", "speedup_R6", "wall_s_R4"):
            assert math.isfinite(float(r[key])) and float(r[key]) > 0


def test_full_grid_covers_every_factor_and_insertion_point() -> None:
    plan = choi.make_plan(quick=False)
    for wp in plan.workloads:
        cs = choi.cells(plan, wp)
        assert {c.echo_factor for c, _ in cs} == {1.0, 1.5, 2.0, 4.0, 8.0}
        assert {c.where for c, _ in cs} == set(wp.wheres)
        assert {c.batch_size for c, _ in cs} == set(wp.batch_sizes)
        assert {c.shuffle_buffer > 0 for c, _ in cs if c.echo_factor > 1} == {True, False}
        assert len(cs) == len(set(c for c, _ in cs))  # no cell twice
        # Main cells are repeated searches (>= 3 seeds): the baseline and e = 2, 4.
        for c, n in cs:
            if c.echo_factor == 1 or (c.echo_factor in (2.0, 4.0) and c.shuffle_buffer
                                      and c.where == wp.wheres[0]):  # fmt: skip
                assert n >= 3
            if c.where == "batch" and c.shuffle_buffer:
                assert c.shuffle_buffer == plan.shuffle_batches * c.batch_size  # examples


def _row(e: float, fresh: float, where: str = "batch") -> dict:
    return {"workload": "cnn", "batch_size": 10, "echo_factor": e, "where": where,
            "shuffle_buffer": 0, "fresh_median": fresh, "t_down": 0.01}  # fmt: skip


def test_time_model_turns_fresh_examples_into_speedup() -> None:
    rows = [_row(1.0, 1000.0), _row(2.0, 500.0), _row(8.0, 500.0)]
    by_e = {r["e"]: r for r in time_rows(rows)}
    # Half the fresh data at e = 2 <= R: the extra steps are free, twice as fast.
    assert by_e[2.0]["speedup_R4"] == pytest.approx(2.0)
    # e = 2 at R = 2: still free; e = 8 > R = 4: the steps cost 8/4 = 2x per fresh batch.
    assert by_e[2.0]["speedup_R2"] == pytest.approx(2.0)
    assert by_e[8.0]["speedup_R4"] == pytest.approx(1.0)
    assert by_e[8.0]["speedup_R6"] == pytest.approx(2.0 * 6 / 8)
    # Wall = fresh batches x R x t_down for the baseline: 100 x 4 x 0.01 s.
    assert by_e[1.0]["wall_s_R4"] == pytest.approx(4.0)


@pytest.mark.timeout(120)
def test_trial_counts_fresh_examples_through_the_real_echo_stage() -> None:
    wl = cnn_workload(1000, 200, 0.99, 128, 256)  # unreachable target: runs to the budget
    t = run_trial(wl, Condition(2.0, "before_augment", 64, 32), {"lr": 0.05,
                  "one_minus_momentum": 0.1}, seed=0)  # fmt: skip
    assert t.fresh_to_target is None
    assert 256 <= t.info["fresh"] < 256 + 64 + 32  # stops at the budget (buffer prefill aside)
    # Every example trained twice: steps x batch = 2 x fresh examples consumed.
    assert t.info["realized_factor"] == pytest.approx(2.0, rel=0.15)
    pruned = run_trial(wl, Condition(1.0, "before_augment", 0, 32), {"lr": 0.05,
                       "one_minus_momentum": 0.1}, seed=0, limit=128)  # fmt: skip
    assert pruned.info["fresh"] == 128  # a trial that cannot win stops at the limit


def test_useful_e_from_the_medians() -> None:
    rows = [{"batch_size": 8, "echo_factor": e, "fresh_0.8": f}
            for e, f in ((1.0, 1000.0), (2.0, 600.0), (4.0, 450.0), (8.0, 500.0))]  # fmt: skip
    # 1000 -> 600 -> 450 are >= 20% cuts; 450 -> 500 is none: useful up to 4, best 4.
    assert scaling.useful(rows, 8, 0.8) == (4.0, 4.0)
    rows[2]["fresh_0.8"] = 500.0  # 600 -> 500 is a 17% cut: useful stops at 2; best is e=4/8
    assert scaling.useful(rows, 8, 0.8) == (4.0, 2.0)
    rows[0]["fresh_0.8"] = math.inf  # the baseline never reached it: any finite count is a cut
    assert scaling.useful(rows, 8, 0.8)[1] == 2.0


@pytest.mark.timeout(300)
def test_scaling_cells_read_every_target_from_one_run(tmp_path: Path) -> None:
    plan = scaling.ScalingPlan(batch_sizes=(16,), factors=(1.0, 2.0), targets=(0.3, 0.45),
                                     trials=2, seeds=1, budget=768, data=(1000, 200))  # fmt: skip
    rows = [scaling.search_cell(plan, 16, e, 0) for e in (1.0, 2.0)]
    for r in rows:
        # The lower target is reached no later than the higher one, in the same trials.
        assert r["fresh_0.3"] <= r["fresh_0.45"] and math.isfinite(r["fresh_0.3"])
        assert r["searches"] == 1 and r["range_0.3"] == f"{r['fresh_0.3']:g}-{r['fresh_0.3']:g}"
    lines = scaling.report(rows, plan, tmp_path)
    assert any(line.startswith("- target 0.45: bs 16: best e") for line in lines)
    assert len(read_csv(tmp_path / "scaling.csv")) == 2
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert choi.make_plan(quick=False).scaling is not None and choi.make_plan(True).scaling is None
