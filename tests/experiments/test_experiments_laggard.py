"""`python -m experiments laggard --quick` (experiments.laggard: sweep, claims, report)."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from dataecho.app.sources import fashion_mnist as fm
from experiments import laggard
from experiments.common.convergence import fresh_batches_to_converge
from experiments.common.logistic import LogisticProblem, covertype_like, logistic_loss
from experiments.common.optimum import lbfgs_optimum
from experiments.common.tuning import quasi_random_points
from experiments.laggard.claims import useful_k, wall_speedups
from experiments.laggard.sweep import (
    MOMENTUM_SPACE,
    Config,
    constants,
    lr_grid,
    nesterov_rates,
    tuned_nesterov,
)

HAVE_FMNIST = (fm.DEFAULT_DATA_DIR / fm.FILES["train"][0]).is_file()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if not HAVE_FMNIST:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    out = tmp_path_factory.mktemp("laggard")
    return out, laggard.run(out, quick=True, seed=0)


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def cell(table, method, b, k, key):
    (row,) = [r for r in table if r["method"] == method and int(r["B"]) == b and int(r["K"]) == k]
    return float(row[key]) if row[key] else None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_writes_readme_csv_and_plots(quick) -> None:
    out, readme = quick
    assert readme == out / "README.md"
    text = readme.read_text()
    for needle in ("### Claims", "covertype.csv", "fashion_mnist.csv", "wall_time.png",
                   "python -m experiments laggard", "Fashion-MNIST (multinomial"):  # fmt: skip
        assert needle in text
    for png in ("convergence.png", "rate_and_bound.png", "fmnist_convergence.png",
                "fmnist_rate_and_bound.png", "wall_time.png"):  # fmt: skip
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    for name, cfg in laggard.QUICK.items():
        table = rows(out / f"{name}.csv")
        assert len(table) == len(cfg.methods) * len(cfg.batch_sizes) * len(cfg.ks)
        assert {r["method"] for r in table} == set(cfg.methods)
        # Every quick cell converges for every seed, and the medians are finite and consistent.
        for r in table:
            assert r["converged"] == f"{cfg.seeds}/{cfg.seeds}", r
            t = float(r["T_med"])
            assert math.isfinite(t) and float(r["fresh_med"]) == int(r["B"]) * t
            assert float(r["steps_med"]) == int(r["K"]) * t
            assert float(r["T_min"]) <= t <= float(r["T_max"])
            # Nesterov's grid reaches down to an effective rate lr / (1 - mu) of 0.01.
            mu = float(r["mu_med"]) if r["method"] == "nesterov" else 0.0
            assert 0.5 <= mu < 0.99 or r["method"] != "nesterov"
            assert 0.01 * (1 - mu) - 1e-9 <= float(r["lr_med"]) <= 10


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["covertype", "fashion_mnist"])
def test_quick_shows_the_two_regimes(quick, name) -> None:
    out, _ = quick
    table = rows(out / f"{name}.csv")
    small, large = laggard.QUICK[name].batch_sizes[0], laggard.QUICK[name].batch_sizes[-1]
    # Large batch: echoing (K=2) cuts the fresh samples needed, by a clear margin.
    assert cell(table, "gd", large, 2, "fresh_med") < 0.8 * cell(table, "gd", large, 1, "fresh_med")
    # Small batch: far from a 2-fold cut, so the optimizer steps grow with K.
    assert cell(table, "gd", small, 2, "steps_med") > 1.3 * cell(table, "gd", small, 1, "steps_med")
    # The theorem's bound is an upper bound on what was measured, in every echoed-GD cell.
    for r in table:
        if r["method"] == "gd":
            assert float(r["bound"]) >= float(r["measured"]) > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_wall_time_is_between_one_and_the_fresh_cut(quick) -> None:
    out, _ = quick
    table = rows(out / "wall_time.csv")
    assert {r["problem"][:5] for r in table} == {"cover", "fashi"}
    for r in table:
        # K=1 is a candidate (speedup 1); the speedup is the fresh cut less the steps beyond R.
        s, cut, k, ratio = (float(r[c]) for c in ("speedup", "fresh_cut", "best_K", "R"))
        assert 1.0 <= s <= cut + 1e-9
        assert s == pytest.approx(cut * ratio / max(ratio, k))


def test_wall_speedups_pick_the_fastest_k_for_each_ratio() -> None:
    table = [{"method": "gd", "B": 8, "K": k, "T_med": t, "converged": "2/2"}
             for k, t in ((1, 100), (2, 50), (4, 40), (8, 5))]  # fmt: skip
    table[-1]["converged"] = "1/2"  # a lucky seed alone: not a candidate
    got = {r["R"]: (r["best_K"], r["speedup"]) for r in wall_speedups(table, "p")}
    # R=1: each extra step costs a full step-time -> K=1. R=2: K=2 halves T at no cost.
    # R=4: K=4 (40 * 4 = 160) beats K=2 (50 * 4 = 200); R=16: still K=4, x2.5 = the fresh cut.
    assert got[1] == (1, 1.0) and got[2] == (2, 2.0) and got[4] == (4, 2.5) and got[16][0] == 4
    assert useful_k({1: 1.0, 2: 1.9, 4: 3.5, 8: 3.6}) == 4 and useful_k({1: 1.0, 2: 1.1}) == 1


def test_constants_bound_the_hessian_and_gradients_multinomial() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200, 3, generator=g), torch.ones(200, 1)], 1)
    p = LogisticProblem("tiny", x, torch.randint(4, (200,), generator=g), num_classes=4, l2=0.05)
    opt = lbfgs_optimum(p)
    cst = constants(p, opt)
    for w in (torch.zeros(4, 4, dtype=torch.float64), opt.w):
        h = torch.autograd.functional.hessian(
            lambda v: logistic_loss(v.view(4, 4), x.double(), p.y, 4, 0.05), w.flatten()
        )
        assert float(torch.linalg.eigvalsh(h)[-1]) <= cst["beta"] * (1 + 1e-9)
    # Per-example gradients at w* (|w*| = D) are within rho; their RMS is rho_at_opt.
    per = [torch.func.grad(lambda v, i=i: logistic_loss(v, x[i : i + 1].double(), p.y[i : i + 1],
                                                        4, 0.05))(opt.w).norm() for i in range(200)]  # fmt: skip
    norms = torch.stack(per)
    assert float(norms.max()) <= cst["rho"] and cst["D"] == pytest.approx(float(opt.w.norm()))
    assert cst["rho_at_opt"] == pytest.approx(float(norms.pow(2).mean().sqrt()), rel=1e-9)


@pytest.mark.timeout(120)
def test_nesterov_tuning_prunes_without_changing_the_selection() -> None:
    torch.set_num_threads(1)
    p = covertype_like(4000, label_noise=0.1, seed=0)
    opt = lbfgs_optimum(p, max_iter=100)
    cfg = Config(4000, (1024,), (1,), 2, 0.5, 300, eval_rows=4000, momenta=3)
    lrs = lr_grid(0.5)
    best, mus = tuned_nesterov(p, opt, cfg, b=1024, k=1, seeds=[0, 1], lrs=lrs, eval_rows=4000)
    assert all(t.converged for t in best) and all(0.5 <= m < 0.99 for m in mus)
    # Reference: every momentum point with the full budget; per seed the fewest fresh batches
    # (the earlier point on ties).
    ref: dict[int, tuple] = {}
    for point in quasi_random_points(MOMENTUM_SPACE, 3, 0):
        mu = 1 - point["one_minus_momentum"]
        trials = fresh_batches_to_converge(
            p, opt, method="nesterov", batch_size=1024, k=1, lrs=nesterov_rates(lrs, mu), seeds=[0, 1],
            max_steps=300, momentum=mu, eval_rows=4000,
        )  # fmt: skip
        for i, t in enumerate(trials):
            if t.converged and (i not in ref or t.fresh_batches < ref[i][0].fresh_batches):
                ref[i] = (t, mu)
    assert [(t.fresh_batches, t.lr) for t in best] == [(ref[i][0].fresh_batches, ref[i][0].lr)
                                                       for i in range(2)]  # fmt: skip
    assert mus == [ref[i][1] for i in range(2)]


def test_nesterov_rates_extend_the_grid_down_to_an_effective_001() -> None:
    lrs = lr_grid(0.25)
    for mu in (0.5, 0.9, 0.99):
        got = nesterov_rates(lrs, mu)
        assert torch.equal(got[-len(lrs) :], lrs) and float(got[-1]) == pytest.approx(10)
        steps = torch.log10(got[1:] / got[:-1])
        assert torch.allclose(steps, torch.full_like(steps, 0.25))
        # The lowest effective rate lr / (1 - mu) is within one grid step above 0.01.
        assert 0.01 * (1 - 1e-9) <= float(got[0]) / (1 - mu) < 0.01 * 10**0.25
