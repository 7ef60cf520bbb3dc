"""`dataecho reproduce laggard --quick` (dataecho.reproduce.laggard): files and real properties."""

from __future__ import annotations

import csv
import math

import pytest

from dataecho.reproduce import laggard


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("laggard")
    return out, laggard.run(out, quick=True, seed=0)


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def cell(table, method, b, k, key):
    (row,) = [r for r in table if r["method"] == method and int(r["B"]) == b and int(r["K"]) == k]
    return float(row[key]) if row[key] else None


@pytest.mark.timeout(600)
def test_quick_writes_readme_csv_and_plots(quick) -> None:
    out, readme = quick
    assert readme == out / "README.md"
    text = readme.read_text()
    for needle in ("## Claims", "covertype.csv", "convergence.png", "dataecho reproduce laggard"):
        assert needle in text
    for png in ("convergence.png", "rate_and_bound.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    table = rows(out / "covertype.csv")
    cfg = laggard.QUICK
    assert len(table) == 3 * len(cfg.batch_sizes) * len(cfg.ks)
    assert {r["method"] for r in table} == {"gd", "prox", "nesterov"}
    # Every quick cell converges for every seed, and the medians are finite and consistent.
    for r in table:
        assert r["converged"] == f"{cfg.seeds}/{cfg.seeds}", r
        t = float(r["T_med"])
        assert math.isfinite(t) and float(r["fresh_med"]) == int(r["B"]) * t
        assert float(r["steps_med"]) == int(r["K"]) * t
        assert float(r["T_min"]) <= t <= float(r["T_max"])
        assert 0.01 <= float(r["lr_med"]) <= 10


@pytest.mark.timeout(600)
def test_quick_shows_the_two_regimes(quick) -> None:
    out, _ = quick
    table = rows(out / "covertype.csv")
    small, large = laggard.QUICK.batch_sizes[0], laggard.QUICK.batch_sizes[-1]
    # Large batch: echoing (K=2) cuts the fresh samples needed, by a clear margin.
    assert cell(table, "gd", large, 2, "fresh_med") < 0.8 * cell(table, "gd", large, 1, "fresh_med")
    # Small batch: far from a 2-fold cut, so the optimizer steps grow with K.
    assert cell(table, "gd", small, 2, "steps_med") > 1.3 * cell(table, "gd", small, 1, "steps_med")
    # The theorem's bound is an upper bound on what was measured, in every echoed-GD cell.
    for r in table:
        if r["method"] == "gd":
            assert float(r["bound"]) >= float(r["measured"]) > 0
