"""The laggard experiment's README: the setup, and per problem its claims, plots and tables.

:func:`write_report` renders the results of :func:`experiments.laggard.experiment.run` (or
those it saved, :func:`~experiments.laggard.experiment.load_results`) into ``out``: one CSV
per problem, ``wall_time.csv``, ``fixed_rate.csv``, the plots and ``README.md``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.tables import markdown_table, write_csv
from experiments.laggard.claims import verdicts
from experiments.laggard.plots import plot_grid, plot_wall

COLUMNS = ["method", "B", "K", "converged", "T_min", "T_med", "T_max", "fresh_med", "steps_med",
           "lr_med", "mu_med"]  # fmt: skip


def section(title: str, csv_name: str, rows, fixed, speedups, claims, plots) -> list[str]:
    """One problem's Markdown: claims, plots, the grid, the bound, fixed-rate and wall time."""
    lines = [f"## {title}", "", "### Claims", "", *[f"- {c}" for c in claims], ""]
    lines += [*[f"![{p}]({p})" for p in plots], ""]
    lines += [f"All (method, B, K) cells (`{csv_name}`):", "", markdown_table(rows, COLUMNS), ""]
    bound = [r for r in rows if r["method"] == "gd" and r.get("bound")]
    if bound:
        lines += ["Echoed GD bound at the measured T (`bound_curv` is its curvature part):", "",
                  markdown_table(bound, ["B", "K", "T_med", "measured", "bound", "bound_curv",
                                         "K_star"]), ""]  # fmt: skip
    if fixed:
        lines += ["Rate fixed at each B's K=1 optimum (`fixed_rate.csv`):", "",
                  markdown_table(fixed, COLUMNS), ""]  # fmt: skip
    gd = [r for r in speedups if r["method"] in ("gd", "nesterov")]
    lines += ["Modelled wall time, best K per laggard ratio R, against the same method at K=1 "
              "(`wall_time.csv`; GD and Nesterov, prox-GD in the CSV):", "",
              markdown_table(gd, ["method", "B", "R", "best_K", "speedup", "fresh_cut"]), ""]  # fmt: skip
    return lines


def _setup(res: dict) -> list[str]:
    """One problem's setup bullets: the problem, the grid, the criterion, the constants."""
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
    """Write the tables, plots and ``README.md`` of ``results`` into ``out``; return the README.

    ``info``: ``quick``, ``seed``, ``wall_s`` and ``machine`` of the run, for its header."""
    cmd = "python -m experiments laggard" + (" --quick" if info["quick"] else "")
    titles = {"covertype": "CoverType-like (binary, synthetic)",
              "fashion_mnist": "Fashion-MNIST (multinomial, real images)"}  # fmt: skip
    lines = [
        "# laggard: Agarwal et al. 2020, echoed optimizers on logistic regression", "",
        f"Command: `{cmd} --out {out} --seed {info['seed']}`; machine: "
        f"{info['machine']}; wall time {info['wall_s'] / 60:.1f} min.",
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
