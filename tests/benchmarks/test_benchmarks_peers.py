"""The peers benchmark harness: a tiny run of every section, its tables and report.

No timing assertions: only the tables' shape, that every figure is finite, and counts that
cannot depend on timing (fresh examples and steps of the fixed-budget quality runs).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `python -m pytest` adds it; a bare `pytest` may not
    sys.path.insert(0, ROOT)

if importlib.util.find_spec("monai") is None:  # found without importing it (seconds)
    pytest.skip(
        "the peers benchmark compares against MONAI: pip install monai", allow_module_level=True
    )

from benchmarks import __main__ as dispatcher  # noqa: E402
from benchmarks import peers  # noqa: E402
from benchmarks.peers import markdown as peer_markdown  # noqa: E402
from benchmarks.peers import report as peer_report  # noqa: E402
from benchmarks.peers import snapshots as peer_snapshots  # noqa: E402
from benchmarks.peers import target as peer_target  # noqa: E402
from benchmarks.peers import target_report as peer_target_report  # noqa: E402
from benchmarks.peers import verdict as peer_verdict  # noqa: E402
from benchmarks.peers.loaders import AdjacentRepeat, Case  # noqa: E402

TINY = peers.Settings(
    ratios=(4,), duration=0.25, warmup=0.05, rounds=1, overhead_rounds=1, raw_seconds=0.05,
    quality_budget=512, quality_seeds=(0,), memory_batches=4, memory_factor=2,
    memory_kinds=("dataloader",), shuffle_sizes=(0, 4096), train_limit=12_000, test_limit=1000,
    snapshot_batches=6, snapshot_warmup=2, snapshot_rounds=1,
    target_ratios=(4,), target_factors=(2,), target_accuracy=0.3, target_eval_every=128,
    target_eval_examples=200, target_max_seconds=2.0, target_rounds=1,
)  # fmt: skip
# The target section runs each case for target_max_seconds of wall time: short, with an
# evaluation after every fresh batch, so the counts checked still include evaluations.


@pytest.fixture(scope="module")
def result():
    return peers.run(TINY, log=lambda message: None)


def cells(table: str) -> tuple[list[str], list[list[str]]]:
    """The header and the body rows of a Markdown table, cells stripped."""
    lines = table.splitlines()
    split = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    return split(lines[0]), [split(line) for line in lines[2:]]


def number(text: str) -> float:
    return float(text.replace(",", ""))


def assert_finite(rows: list[list[str]], numeric: range) -> None:
    for row in rows:
        for i in numeric:
            assert math.isfinite(number(row[i])), f"{row[0]}: column {i} = {row[i]!r}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_section_has_one_finite_row_per_case(result):
    ratio = TINY.ratios[0]
    overhead = peer_report.overhead_rows(result)
    assert [r[0] for r in overhead] == [c.name for c in result["overhead"]]
    assert len(overhead) == 4
    assert_finite(overhead, [1, 2, 4, 5, 6])
    for row in overhead:
        assert all(math.isfinite(float(x)) for x in row[3].split("-")), row[3]
    assert {r[7] for r in overhead} <= {"-", "ok", "MISS (< 0.98)"}

    raw = peer_report.raw_rows(result)
    assert len(raw) == 6 and {r[0] for r in raw} == {"example", "batch"}
    assert_finite(raw, range(3, 6))

    bound = peer_report.input_rows(result)
    assert [r[1] for r in bound] == [c.name for c in TINY.input_bound_cases(ratio)]
    assert all(len(r) == len(peer_report.INPUT_HEADERS) for r in bound)
    assert_finite(bound, [0, *range(2, 10)])
    targets = peer_report.target_rows(result)
    assert [r[1] for r in targets] == ["default", "off"]  # like for like: snapshots off
    assert all(r[5] for r in targets)
    verdicts = peer_verdict.rows(result)
    e = round(ratio)
    assert [r[1] for r in verdicts] == ["same work as MONAI", "same work as adjacent",
                                        "fastest vs fastest"]  # fmt: skip
    assert verdicts[0][2:4] == [f"dataecho e={e} (batch)", f"MONAI repeats={e}"]
    assert verdicts[1][2:4] == [f"dataecho e={e} (before_augment)", f"adjacent repeats={e}"]
    assert_finite(verdicts, [4])
    assert all(r[6] in ("yes", "no", "no (rounds disagree)") for r in verdicts)

    quality = peer_report.quality_rows(result)
    assert [r[0] for r in quality] == [c.name for c in TINY.quality_cases()]
    assert_finite(quality, range(1, 4))

    memory = peer_report.memory_rows(result)
    assert [r[0] for r in memory] == [c.name for c in TINY.memory_cases()]
    assert_finite(memory, range(1, 7))
    growth = peer_report.growth_rows(result)
    assert [r[0] for r in growth] == ["0", "4,096", "4,096"]
    assert growth[0][1] == "-" and growth[1][1].startswith("every ") and growth[2][1] == "off"
    assert_finite(growth[1:], range(2, 6))

    snapshots = peer_snapshots.rows(result)
    assert [r[0] for r in snapshots] == [c.name for c in peer_snapshots.cases(TINY)]
    assert_finite(snapshots, range(2, 5))
    intervals = {r[0]: r[1] for r in snapshots}
    assert intervals["dataecho e=4 (before_augment, shuffle 1024, snapshots every 8)"] == "8"
    assert intervals["dataecho e=4 (before_augment, shuffle 1024, no snapshots)"] == "-"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_target_section_counts_and_tables(result):
    s = TINY
    assert [c for _, c in result["target"]] == peer_target.cases(s)
    for (_, case), runs in result["target"].items():
        (run,) = runs
        # Counts that cannot depend on timing: distinct examples never exceed those stepped on,
        # and an evaluation comes only after each further eval_every fresh examples.
        assert run["fresh"] <= run["steps"] * s.batch_size, case.name
        assert run["fresh"] >= run["evals"] * s.target_eval_every, case.name
        if run["reached"]:
            assert run["accuracy"] >= s.target_accuracy and run["evals"] >= 1
    table = peer_target_report.rows(result)
    assert [r[1] for r in table] == [c.name for c in peer_target.cases(s)]
    for row in table:
        assert row[2] in ("0/1", "1/1") and math.isfinite(number(row[5]))
        assert row[3] == "not reached" or math.isfinite(number(row[3]))
    verdicts = peer_target_report.verdict_rows(result)
    assert [r[1] for r in verdicts] == ["batch", "before_augment"]
    assert all(r[-1] in ("met", "within 10% (about met)", "NOT met") for r in verdicts)
    peers_vs = peer_target_report.peer_rows(result)
    assert len(peers_vs) == 1 and peers_vs[0][6] in ("yes", "no")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quality_runs_use_exactly_the_fresh_budget(result):
    # Counts, not timing: every loader passes each budgeted example through once, and the
    # fixed-factor loaders take e steps per fresh batch.
    batches = TINY.quality_budget // TINY.batch_size
    for row in result["quality"]:
        assert row["fresh"] == TINY.quality_budget, row["case"].name
        e = 1 if row["case"].kind == "dataloader" else TINY.quality_factor
        assert row["steps"] == e * batches, row["case"].name


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_shuffle_buffer_grows_the_worker_by_at_least_its_payload(result):
    runs = {(r["case"].shuffle_buffer, r["case"].snapshots): r for r in result["memory"]
            if r["case"].where == "before_augment" and r["case"].echo == TINY.memory_factor}  # fmt: skip
    for snapshots in (True, False):
        growth_bytes = (runs[4096, snapshots]["worker_kb"] - runs[0, True]["worker_kb"]) * 1024
        assert growth_bytes >= 4096 * 28 * 28  # the buffered images alone


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_report_and_plot_are_written(result, tmp_path):
    path = peer_markdown.write(result, "python -m benchmarks peers --tiny", tmp_path)
    text = path.read_text()
    assert "`python -m benchmarks peers --tiny`" in text
    assert text.count("\n## ") == 6 and "nan" not in text.lower().replace("nanosecond", "")
    png = (tmp_path / "peers.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_adjacent_repeat_emits_copies_in_a_row():
    out = list(AdjacentRepeat(list(range(5)), 3, transform=lambda x: x * 10, order_seed=None))
    assert out == [v * 10 for v in range(5) for _ in range(3)]
    shuffled = list(AdjacentRepeat(list(range(50)), 2, order_seed=1))
    assert shuffled[::2] == shuffled[1::2] and sorted(shuffled[::2]) == list(range(50))
    with pytest.raises(ValueError, match="repeats must be a whole number >= 1, got 1.5"):
        AdjacentRepeat([1], 1.5)


def test_case_names_and_quick_settings():
    assert Case("monai", 4).name == "MONAI repeats=4"
    assert Case("dataecho", "auto", "batch").name == "dataecho e=auto (batch)"
    assert Case("dataecho", 2, "before_augment", 1024).name == (
        "dataecho e=2 (before_augment, shuffle 1024)"
    )
    quick, _ = peers.parse(["--quick", "--ratios", "2", "3"])
    assert quick.rounds == 1 and quick.duration < peers.Settings().duration
    assert quick.ratios == (2.0, 3.0) and quick.sections == peers.Settings().sections
    only, _ = peers.parse(["--only", "target", "--target-ratios", "4", "--target-rounds", "3",
                           "--target-accuracy", "0.7"])  # fmt: skip
    assert only.sections == ("target",) and only.target_ratios == (4.0,)
    assert only.target_accuracy == 0.7
    assert only.target_rounds == 3
    assert (
        Case("dataecho", 4, "batch", snapshots=8).name == "dataecho e=4 (batch, snapshots every 8)"
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_report_has_only_the_sections_that_ran(result, tmp_path):
    partial = {k: v for k, v in result.items() if k not in peers.Settings.sections[:-2]}
    path = peer_markdown.write(
        partial, "python -m benchmarks peers --only snapshots target", tmp_path
    )
    text = path.read_text()
    assert text.count("\n## ") == 2 and "## 5." in text and "## 6." in text
    assert (tmp_path / "peers.png").exists()
    del partial["target"]
    path = peer_markdown.write(
        partial, "python -m benchmarks peers --only snapshots", tmp_path / "s"
    )
    assert path.read_text().count("\n## ") == 1 and not (tmp_path / "s" / "peers.png").exists()


def test_dispatcher_lists_peers(capsys):
    assert dispatcher.main([]) == 0
    assert "peers" in capsys.readouterr().out


def test_verdict_reads_paired_rounds():
    assert peer_verdict.verdict([1.02, 0.97]) == "yes"  # mean 0.995 >= 0.98
    assert peer_verdict.verdict([0.99, 0.96]) == "no"  # mean 0.975, every round slower
    assert peer_verdict.verdict([0.85, 1.05]) == "no (rounds disagree)"
    assert peer_verdict.verdict([]) == "-"


def test_match_keeps_dataloader_and_the_named_loaders():
    settings, _ = peers.parse(["--match", "MONAI", "(batch)"])
    names = [c.name for c in settings.input_bound_cases(4)]
    assert names == ["DataLoader (no echo)", "MONAI repeats=4", "dataecho e=4 (batch)",
                     "dataecho e=auto (batch)"]  # fmt: skip
    assert len(peers.parse([])[0].input_bound_cases(4)) > len(names)
