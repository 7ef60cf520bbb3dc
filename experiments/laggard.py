"""Agarwal et al. 2020 ("laggard data pipelines"): echoed GD / prox-GD / Nesterov, B x K grid.

Two logistic-regression problems: a synthetic CoverType-like binary one and multinomial
Fashion-MNIST (the real images, pooled and standardized). For every (method, B, K) a whole
learning-rate grid runs at once for several seeds (:mod:`experiments._laggard_sweep`);
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

from experiments._laggard_claims import verdicts, wall_speedups
from experiments._laggard_report import plot_grid, plot_wall, section
from experiments._laggard_sweep import Config, constants, fixed_rate, lr_grid, sweep
from experiments.logistic import covertype_like, fashion_mnist
from experiments.optimum import lbfgs_optimum
from experiments.outputs import write_csv

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


def _setup(res: dict) -> list[str]:
    cfg, cst = res["cfg"], res["constants"]
    return [
        f"- Problem: {res['problem']}; optimum loss F* = {res['f_star']:.6f} (L-BFGS float64, "
        f"{res['lbfgs_iter']} its, |grad| = {res['grad_norm']:.1e}); {res['wall_s'] / 60:.1f} min.",
        f"- Grid: B in {cfg.batch_sizes}, K in {cfg.ks}, {cfg.seeds} seeds, {res['lrs']} rates on "
        f"0.01..10 (log10 step {cfg.lr_step:.3g}; the paper's step is 1/20), zero init, batches "
        f"with replacement, float32. Budget {cfg.max_steps} optimizer steps per trial; a (method,"
        " B) sweep stops at its first K where a seed fails (shown as not converged).",
        "- Converged: mean relative suboptimality of the iterates after the last 10 fresh batches "
        f"<= 1%, measured on a fixed {cfg.eval_rows:,}-row subset with F_S(w*) as control "
        f"variate, at checkpoints a factor {cfg.checkpoint_ratio:.3f} apart (T known to within "
        "that factor). Per seed the fastest rate wins; tables show min/median/max over seeds.",
        "- Prox-GD: gamma = lr (inner step w = anchor - lr*grad f_B(w)). Nesterov: constant "
        f"momentum carried across batches, tuned: {cfg.momenta} Sobol points of 1 - momentum "
        "(log-uniform on 0.01..0.5) x the rate grid extended downward until the effective rate "
        "lr / (1 - momentum) is near 0.01; `mu_med` is the median selected momentum.",
        f"- Constants: beta = {cst['beta']:.3g}; rho = {cst['rho']:.3g} (worst-case Lipschitz; "
        f"the RMS per-example gradient at the optimum is {cst['rho_at_opt']:.3g}); D = |w*| = "
        f"{cst['D']:.3g} (zero init).",
    ]


def write_report(out: Path, results: list[dict], info: dict) -> Path:
    cmd = "dataecho reproduce laggard" + (" --quick" if info["quick"] else "")
    titles = {"covertype": "CoverType-like (binary, synthetic)",
              "fashion_mnist": "Fashion-MNIST (multinomial, real images)"}  # fmt: skip
    lines = [
        "# laggard: Agarwal et al. 2020, echoed optimizers on logistic regression", "",
        f"Command: `nice -n 19 {cmd} --out DIR --seed {info['seed']}`; machine: "
        f"{info['machine']}; wall time {info['wall_s'] / 60:.1f} min (shared, loaded 2-core box).",
        "", "## Setup", "",
    ]  # fmt: skip
    for res in results:
        lines += [f"{titles[res['name']]}:", "", *_setup(res), ""]
    speedups = [s for res in results for s in res["speedups"]]
    write_csv(speedups, out / "wall_time.csv")
    for res in results:
        name, rows, fixed = res["name"], res["rows"], res["fixed"]
        prefix = "" if name == "covertype" else "fmnist_"
        write_csv(rows, out / f"{name}.csv")
        if fixed:
            write_csv(fixed, out / "fixed_rate.csv")
        plots = plot_grid(rows, out, res["cfg"].methods, prefix)
        claims = verdicts(rows, fixed, res["speedups"])
        lines += section(titles[res["name"]], f"{name}.csv", rows, fixed, res["speedups"],
                         claims, plots)  # fmt: skip
    lines += ["## Wall time against the laggard's ratio", "", f"![{plot_wall(speedups, out)}]"
              "(wall_time.png)", ""]  # fmt: skip
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
