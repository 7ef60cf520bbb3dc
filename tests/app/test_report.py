"""The run report: table, CSV rows, Markdown, a real PNG; from synthetic and real results."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass, field

import pytest
from PIL import Image

from dataecho.app.ratios import (
    FRESH_RATE_DEFINITION,
    TIME_MODEL_DEFINITION,
    WALL_OVER_FRESH_DEFINITION,
)
from dataecho.app.report import (
    COLUMNS,
    LEADING_CSV,
    ReportMeta,
    format_ratios,
    format_table,
    summarize,
    write_report,
)


@dataclass(frozen=True)
class Cfg:
    name: str
    echo_factor: float | str
    where: str = "before_augment"
    max_echo_factor: float = 8.0
    target_accuracy: float | None = 0.85
    on_bad_record: str = "raise"


@dataclass
class Result:
    """The fields of dataecho.app.train.TrainResult that the report reads."""

    config: Cfg
    test_accuracy: float
    fresh_examples: int
    echoed_examples: int
    steps: int
    wall_seconds: float
    wait_seconds: float
    realized_factor: float
    reached_target: bool
    fresh_to_target: int | None
    seconds_to_target: float | None
    history: list[dict[str, float]] = field(default_factory=list)
    skipped_records: int = 0
    worker_ms_per_fresh_batch: float | None = None
    waiting_examples: int = 0

    @property
    def read_examples(self) -> int:
        return self.fresh_examples + self.waiting_examples


def curve(points, factor):
    """History rows from (fresh, seconds, accuracy) points."""
    return [
        {"fresh": f, "steps": round(f * factor / 128), "seconds": s, "accuracy": a,
         "train_loss": 1 - a, "realized_factor": factor, "stall": 0.5}
        for f, s, a in points
    ]  # fmt: skip


def results():
    base = Result(
        Cfg("no echo", 1.0),
        0.851,
        60_000,
        0,
        468,
        40.0,
        30.0,
        1.0,
        True,
        60_000,
        40.0,
        curve([(20_000, 13.0, 0.78), (40_000, 26.0, 0.83), (60_000, 40.0, 0.852)], 1.0),
    )
    fixed = Result(
        Cfg("e=4", 4.0),
        0.853,
        20_000,
        60_000,
        625,
        16.0,
        3.0,
        4.0,
        True,
        20_000,
        16.0,
        curve([(10_000, 8.0, 0.80), (20_000, 16.0, 0.855)], 4.0),
        worker_ms_per_fresh_batch=12.34,
    )
    missed = Result(
        Cfg("auto", "auto"),
        0.70,
        30_000,
        15_000,
        350,
        20.0,
        9.0,
        1.5,
        False,
        None,
        None,
        curve([(30_000, 20.0, 0.70)], 1.5),
    )
    return [base, fixed, missed]


META = ReportMeta(
    command="dataecho demo --quick",
    machine="2 cores",
    upstream="nginx at http://127.0.0.1:1",
    ratio=4.1,
    bandwidth_bytes_per_s=3.5e6,
    load="load average 1.0",
    notes=("calibration: one step 20 ms",),
)


def test_summary_takes_speedups_against_the_run_without_echo():
    base, fixed, missed = summarize(results())
    assert (base.speedup_wall, base.speedup_fresh) == (1.0, 1.0)
    assert fixed.speedup_wall == pytest.approx(40 / 16) and fixed.speedup_fresh == 3.0
    assert missed.speedup_wall is None and missed.speedup_fresh is None
    assert fixed.stall == pytest.approx(3 / 16) and missed.echo == "auto<=8"
    assert base.where == "-" and fixed.where == "before_augment"


def test_table_has_one_aligned_line_per_run():
    lines = format_table(results()).splitlines()
    assert len(lines) == 2 + 3 and set(lines[1]) <= {"-", " "}
    assert len({len(line) for line in lines}) == 1  # aligned
    assert lines[3].split()[:2] == ["e=4", "4"]
    assert lines[3].split()[-3:] == ["2.50x", "3.00x", "12.3"]  # worker ms per fresh batch
    assert lines[4].split()[3:5] == ["missed", "missed"] and lines[4].split()[-3:] == ["-"] * 3


def test_files_hold_every_evaluation_the_table_and_a_real_image(tmp_path):
    out = write_report(results(), tmp_path / "run", meta=META)
    assert out == tmp_path / "run"

    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[: len(LEADING_CSV)] == list(LEADING_CSV)
    assert {"fresh", "steps", "seconds", "accuracy", "train_loss", "stall"} <= set(rows[0])
    assert [r["run"] for r in rows] == ["no echo"] * 3 + ["e=4"] * 2 + ["auto"]
    assert [float(r["accuracy"]) for r in rows[3:5]] == [0.80, 0.855]

    md = (out / "report.md").read_text()
    assert "`dataecho demo --quick`" in md and "R = t_up / t_down = 4.10 (measured by" in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0] == "| " + " | ".join(COLUMNS) + " |"
    cells = [c.strip() for c in table[3].strip("|").split("|")]
    assert cells[0] == "e=4" and cells[3] == "16.0" and cells[4] == "20,000"
    assert cells[-3:] == ["2.50x", "3.00x", "12.3"]
    assert "worker ms/fresh batch: CPU time of the loader's worker processes" in md
    # At 20,000 fresh examples the baseline's evaluation said 0.78: echoing is not behind.
    assert "0.8550 against 0.7800" in md and "+7.50 points" in md
    assert "EMULATION" not in md and "bad records skipped" not in md  # none skipped any

    with Image.open(out / "curves.png") as img:
        img.verify()
    with Image.open(out / "curves.png") as img:
        assert img.format == "PNG" and img.size[0] > 500 and img.size[1] > 200


def test_emulated_numbers_are_labelled_and_empty_input_is_refused(tmp_path):
    emulated = ReportMeta(command="dataecho demo --emulate", emulated=True)
    md = (write_report(results()[:2], tmp_path, meta=emulated) / "report.md").read_text()
    assert md.splitlines()[0].startswith("# dataecho run report **(EMULATION")
    assert "EMULATION, not a real server" in md
    with pytest.raises(ValueError, match="no results"):
        write_report([], tmp_path, meta=emulated)


def test_skipped_bad_records_are_in_the_metrics_and_the_report(tmp_path):
    base, fixed, missed = results()
    # A run reading shards with on_bad_record="skip": each evaluation row says how many so far.
    skipping = dataclasses.replace(
        fixed, config=dataclasses.replace(fixed.config, on_bad_record="skip"), skipped_records=3,
        history=[{**row, "skipped_records": n} for row, n in zip(fixed.history, (1, 3), strict=True)],
    )  # fmt: skip
    out = write_report([base, skipping, missed], tmp_path, meta=META)
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["skipped_records"] for r in rows] == ["", "", "", "1", "3", ""]
    md = (out / "report.md").read_text()
    assert "- bad records skipped (on_bad_record=skip; never trained on): e=4 3\n" in md


def test_figures_of_merit_have_their_values_targets_and_definitions(tmp_path):
    base, fixed, _ = results()  # base: 60,000 fresh in 40 s (1,500/s) to the target
    # auto: 18,000 fresh in 12.5 s, all of it to the target: 1,440/s, 0.96 of the baseline's.
    auto = Result(Cfg("auto", "auto"), 0.852, 18_000, 40_000, 450, 12.5, 1.0, 3.2, True,
                  18_000, 12.5, curve([(18_000, 12.5, 0.852)], 3.2))  # fmt: skip
    # e=8 beyond R = 4.1: fresh gain 4, wall gain 2; the model allows 4 x 4.1/8 = 2.05.
    over = Result(Cfg("e=8", 8.0), 0.851, 15_000, 105_000, 940, 20.0, 0.5, 8.0, True,
                  15_000, 20.0, curve([(15_000, 20.0, 0.851)], 8.0))  # fmt: skip
    lines = format_ratios([base, fixed, auto, over], ratio=4.1).splitlines()
    assert lines == [
        # e=4 at R = 4.1: wall gain 2.5 over fresh gain 3 (the model: 3 x min(1, 4.1/4) = 3)
        f"e=4: wall gain / fresh gain = 0.833 (target >= 0.95, MISSED): {WALL_OVER_FRESH_DEFINITION}",
        f"e=4: wall gain / time model = 0.833 (target >= 0.95, MISSED): "
        f"{TIME_MODEL_DEFINITION.format(r=4.1)}",
        f"auto: fresh-example rate / no echo's = 0.960 (target >= 0.97, MISSED): "
        f"{FRESH_RATE_DEFINITION}",
        # auto's wall gain 40 / 12.5 = 3.2 over fresh gain 60,000 / 18,000 = 3.33
        f"auto: wall gain / fresh gain = 0.960 (target >= 0.95, met): {WALL_OVER_FRESH_DEFINITION}",
        f"e=8: wall gain / fresh gain = 0.500 (target >= 0.95, MISSED): {WALL_OVER_FRESH_DEFINITION}",
        f"e=8: wall gain / time model = 0.976 (target >= 0.95, met): "
        f"{TIME_MODEL_DEFINITION.format(r=4.1)}",
    ]  # fmt: skip
    assert "R = 4.10 as the no-echo run lived it" in lines[1]
    md = (write_report([base, fixed, auto, over], tmp_path, meta=META) / "report.md").read_text()
    section = md[md.index("## Figures of merit") : md.index("## Reading")]
    assert section.splitlines()[2:-1] == [f"- {line}" for line in lines]


def test_figures_of_merit_skip_what_cannot_be_computed():
    base, fixed, missed = results()
    # auto missed the target: only its fresh-example rate (30,000 in 20 s, as the baseline's).
    # Without R there is no time model.
    assert format_ratios([base, fixed, missed], ratio=None).splitlines() == [
        f"e=4: wall gain / fresh gain = 0.833 (target >= 0.95, MISSED): {WALL_OVER_FRESH_DEFINITION}",
        f"auto: fresh-example rate / no echo's = 1.000 (target >= 0.97, met): {FRESH_RATE_DEFINITION}",
    ]  # fmt: skip
    assert format_ratios([fixed, missed], ratio=4.0) == ""  # no baseline: nothing to compare
