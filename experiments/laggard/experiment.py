"""Agarwal et al. 2020 ("laggard data pipelines"): echoed GD / prox-GD / Nesterov, B x K grid.

Two logistic-regression problems: a synthetic CoverType-like binary one and multinomial
Fashion-MNIST (the real images, pooled and standardized). For every (method, B, K) a whole
learning-rate grid runs at once for several seeds (:mod:`experiments.laggard.sweep`);
each seed keeps the rate (and, for Nesterov, the momentum) that reaches 1% of the L-BFGS optimum
with the fewest fresh batches T. Reported: fresh samples B*T, steps K*T, best rate, the theorem's
bound at the measured T, and the modelled wall time against the laggard's ratio R. On
CoverType, two extra runs fix the rate at the K=1 optimum for every K (is prox-GD free of K?).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

import torch

from experiments.common.logistic import covertype_like, fashion_mnist
from experiments.common.optimum import lbfgs_optimum
from experiments.laggard.claims import wall_speedups
from experiments.laggard.report import write_report
from experiments.laggard.sweep import Config, constants, fixed_rate, lr_grid, sweep

FM_POOL = 4  # 7x7 pooled pixels (d = 50): see the README for why

QUICK = {
    "covertype": Config(20_000, (256, 4096), (1, 2), 2, 0.25, 1024, 100, 4096, 2**0.25, 1),
    # Quick: l2 = 3e-2 (better conditioned, so it converges in the test's budget), no prox.
    "fashion_mnist": Config(5_000, (128, 1024), (1, 2), 2, 0.5, 1024, 200, 2048, 2**0.25, 2,
                            fixed_rate=False, methods=("gd", "nesterov"), l2=3e-2),
}  # fmt: skip
FULL = {
    "covertype": Config(581_012, (16, 128, 1024, 8192), (1, 2, 4, 8, 16, 32), 3, 0.25, 4096, 300,
                        8192, 2 ** (1 / 6), 4),
    "fashion_mnist": Config(60_000, (128, 1024, 4096), (1, 2, 4, 8, 16), 3, 1 / 3, 8192, 500,
                            2048, 2 ** (1 / 6), 4, fixed_rate=False, l2=1e-3),
}  # fmt: skip


def make_problem(name: str, cfg: Config, seed: int):
    if name == "covertype":
        return covertype_like(cfg.n, label_noise=0.1, seed=seed)
    return fashion_mnist(limit=cfg.n, pool=FM_POOL, l2=cfg.l2, standardize=True)


def run_problem(name: str, cfg: Config, seed: int) -> dict:
    """The grid on one problem: rows, fixed-rate rows, modelled wall time, the optimum."""
    problem = make_problem(name, cfg, seed)
    start = time.time()
    opt = lbfgs_optimum(problem, max_iter=cfg.lbfgs_iter)
    cst = constants(problem, opt)
    lrs = lr_grid(cfg.lr_step)
    rows = sweep(problem, opt, cfg, cfg.methods, seed=seed, cst=cst, lrs=lrs)
    fixed = fixed_rate(problem, opt, cfg, rows, seed=seed) if cfg.fixed_rate else []
    rows, fixed = _same_keys(rows), _same_keys(fixed)
    return {"name": name, "problem": problem.name, "cfg": cfg, "rows": rows, "fixed": fixed,
            "speedups": wall_speedups(rows, problem.name), "f_star": opt.loss,
            "grad_norm": opt.grad_norm, "lbfgs_iter": opt.iterations, "constants": cst,
            "lrs": len(lrs), "wall_s": time.time() - start}  # fmt: skip


def run(out: Path, *, quick: bool, seed: int) -> Path:
    """Run the experiment (``quick``: small problems and grids); return ``out/README.md``."""
    torch.set_num_threads(1)  # deliberate: 2 shared cores, and the grids are small tensors
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    configs = QUICK if quick else FULL
    results = []
    for name, cfg in configs.items():
        results.append(run_problem(name, cfg, seed))
        # Saved after each problem: a long run's finished part survives a later failure, and
        # the report can be re-rendered from it (write_report(out, load_results(out), info)).
        (out / "results.json").write_text(json.dumps(results, default=_jsonable, indent=1))
    info = {"quick": quick, "seed": seed, "wall_s": time.time() - start,
            "machine": f"{platform.machine()}, {platform.processor() or '?'}, "
            f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}"}  # fmt: skip
    return write_report(out, results, info)


def _jsonable(value):
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def load_results(out: Path) -> list[dict]:
    """The per-problem results saved by :func:`run` (``out/results.json``)."""
    results = json.loads((out / "results.json").read_text())
    for res in results:
        cfg = res["cfg"]
        res["cfg"] = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    return results


def _same_keys(rows: list[dict]) -> list[dict]:
    """Every row with every column (None where a cell did not converge), for the CSV."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]
