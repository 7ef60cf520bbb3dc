"""The laggard B x K grid: one (method, B, K) cell at a time, every rate of the grid at once.

Each cell runs :func:`~experiments.common.convergence.fresh_batches_to_converge` for several
seeds; each seed keeps the rate reaching 1% of the optimum with the fewest fresh batches T.
Echoed Nesterov also tunes its momentum: a quasi-random search
(:mod:`experiments.common.tuning`, Sobol points of 1 - momentum) on top of the rate grid,
extended to small rates for high momenta.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

import torch
import torch.nn.functional as F

from experiments.common.convergence import METHODS, ConvergenceTrial, fresh_batches_to_converge
from experiments.common.tuning import LogUniform, quasi_random_points

# 1 - momentum, log-uniform: momentum 0.5 .. 0.99.
LOG = logging.getLogger(__name__)
MOMENTUM_SPACE = {"one_minus_momentum": LogUniform(0.01, 0.5)}


@dataclasses.dataclass(frozen=True)
class Config:
    """One problem's grid (the paper: 61 rates with lr_step 1/20, 20 seeds)."""

    n: int  # rows of the problem (CoverType-like) or images kept (Fashion-MNIST)
    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    seeds: int
    lr_step: float  # log10 spacing of the rate grid on 0.01..10
    max_steps: int  # optimizer steps per trial before it counts as not converged
    lbfgs_iter: int = 300
    eval_rows: int = 16_384  # rows the loss is measured on
    checkpoint_ratio: float = 2 ** (1 / 8)
    momenta: int = 3  # Sobol points of the Nesterov momentum per seed
    fixed_rate: bool = True  # also run GD / prox-GD with the K=1 rate kept for every K
    methods: tuple[str, ...] = METHODS
    l2: float = 0.0  # the problem's l2 penalty (Fashion-MNIST)


def lr_grid(step: float) -> torch.Tensor:
    """0.01 .. 10 with log10 spacing ``step`` (1/20 in the paper)."""
    return 10 ** torch.arange(-2.0, 1.0 + 1e-9, step, dtype=torch.float64)


def constants(problem, opt) -> dict[str, float]:
    """beta, rho, D of the theorem (logistic loss with l2; see the README for why).

    The Hessian of the mean loss is at most ``c * X'X/N + l2`` with c = 1/4 (binary) or 1/2
    (softmax: the largest eigenvalue of diag(p) - pp' is <= 1/2). A per-example gradient is
    ``x_i r_i' + l2 w`` with |r_i| <= 1 (binary) or sqrt(2) (softmax), so on the ball |w| <= D
    rho = max|x_i| * that + l2 * D. ``rho_at_opt`` is the root-mean-square gradient at w*.
    """
    x, w, l2 = problem.x.double(), opt.w, problem.l2
    binary = problem.num_classes == 2
    c, r_max = (0.25, 1.0) if binary else (0.5, math.sqrt(2))
    d = float(w.norm())
    beta = c * float(torch.linalg.eigvalsh(x.T @ x / len(x))[-1]) + l2
    z = x @ w
    if binary:
        r = torch.sigmoid(z) - problem.y
        r2, cross = r**2, z * r
    else:
        r = torch.softmax(z, -1) - F.one_hot(problem.y, problem.num_classes)
        r2, cross = r.pow(2).sum(-1), (z * r).sum(-1)
    g2 = x.pow(2).sum(1) * r2 + 2 * l2 * cross + l2**2 * d**2  # |x_i r_i' + l2 w*|^2
    rho = float(x.norm(dim=1).max()) * r_max + l2 * d
    return {"beta": beta, "rho": rho, "rho_at_opt": float(g2.mean().sqrt()), "D": d}


def summarise(trials, problem: str, cst: dict | None, f_star: float, momenta=None) -> dict:
    """One table row: converged seeds, T min/median/max, fresh = B*T, steps = K*T, best rate;
    with ``cst`` also echoed GD's bound at the measured T; ``momenta``: each seed's momentum."""
    t0 = trials[0]
    ts = [t.fresh_batches for t in trials if t.converged]
    row = {"problem": problem, "method": t0.method, "B": t0.batch_size, "K": t0.k,
           "converged": f"{len(ts)}/{len(trials)}"}  # fmt: skip
    if not ts:
        return row | {"T_med": None, "fresh_med": None, "steps_med": None}
    med = statistics.median(ts)
    row |= {"T_min": min(ts), "T_med": med, "T_max": max(ts), "fresh_med": t0.batch_size * med,
            "steps_med": t0.k * med,
            "lr_med": statistics.median(t.lr for t in trials if t.converged)}  # fmt: skip
    if momenta is not None:
        row["mu_med"] = statistics.median(
            m for m, t in zip(momenta, trials, strict=True) if t.converged
        )
    if cst:  # echoed-GD bound at the measured T, against the measured excess loss
        b, k, d = t0.batch_size, t0.k, cst["D"]
        curv, stat = cst["beta"] * d**2 / (2 * k * med), 2 * cst["rho"] * d / math.sqrt(b * med)
        subopt = statistics.median(t.suboptimality for t in trials if t.converged)
        row |= {
            "bound": curv + stat,
            "bound_curv": curv,
            "measured": subopt * f_star,
            "K_star": cst["beta"] * d * math.sqrt(b) / (4 * cst["rho"] * math.sqrt(med)),
        }
    return row


def _better(new: ConvergenceTrial, old: ConvergenceTrial | None) -> bool:
    if old is None or (new.converged and not old.converged):
        return True
    if new.converged and old.converged:
        return new.fresh_batches < old.fresh_batches  # equals: the earlier point stays
    return not old.converged and new.suboptimality < old.suboptimality


def nesterov_rates(lrs: torch.Tensor, mu: float) -> torch.Tensor:
    """The rate grid ``lrs`` extended downward, same log spacing, as far as the *effective*
    rate lr / (1 - mu) stays >= ``lrs[0]`` (so the smallest is within one step of it).

    With momentum mu a raw rate lr acts like lr / (1 - mu) on noisy gradients: at mu = 0.99 the
    grid's 0.01 is already an effective 1, too large for small batches; the top of the grid
    stays, since accelerated steps want large raw rates where curvature dominates.
    """
    step = float(torch.log10(lrs[1] / lrs[0]))
    extra = math.floor(math.log10(1 / (1 - mu)) / step + 1e-9)
    below = lrs[0] * 10 ** (-step * torch.arange(extra, 0, -1, dtype=lrs.dtype))
    return torch.cat([below, lrs])


def tuned_nesterov(problem, opt, cfg: Config, *, b: int, k: int, seeds, lrs, **kw):
    """Echoed Nesterov: ``cfg.momenta`` Sobol points of the momentum x the rate grid
    (:func:`nesterov_rates`: ``lrs`` extended down to an effective rate near ``lrs[0]``).

    The points come from :func:`quasi_random_points` seeded with the first seed, the same for
    every seed (so the seeds run in one tensor computation and repeat the search on fresh
    batch draws). Each later point stops once it has spent the most fresh batches any seed's
    best needed so far: a trial beyond that cannot be selected, and the checkpoints are a
    prefix of the full run's, so pruning changes no selection. Returns the per-seed best
    trials and their momenta.
    """
    points = quasi_random_points(MOMENTUM_SPACE, cfg.momenta, seeds[0])
    best: list[ConvergenceTrial | None] = [None] * len(seeds)
    best_mu = [math.nan] * len(seeds)
    for point in points:
        mu = 1 - point["one_minus_momentum"]
        done = all(t is not None and t.converged for t in best)
        budget = min(k * max(t.fresh_batches for t in best), cfg.max_steps) if done else None
        trials = fresh_batches_to_converge(
            problem, opt, method="nesterov", batch_size=b, k=k, lrs=nesterov_rates(lrs, mu), seeds=seeds,
            max_steps=budget or cfg.max_steps, momentum=mu, **kw,
        )  # fmt: skip
        for i, t in enumerate(trials):
            if _better(t, best[i]):
                best[i], best_mu[i] = t, mu
    return best, best_mu


def sweep(problem, opt, cfg: Config, methods, *, seed, cst, lrs, batch_sizes=None, ks=None):
    """Rows of every (method, B, K) cell; a (method, B) sweep stops at its first K where a
    seed fails (a larger K needs at least as many steps). Prox-GD at K=1 is GD: reused."""
    rows = []
    seeds = [seed + i for i in range(cfg.seeds)]
    kw = dict(eval_rows=cfg.eval_rows, checkpoint_ratio=cfg.checkpoint_ratio)
    for method in methods:
        for b in batch_sizes or cfg.batch_sizes:
            for k in ks or cfg.ks:
                gd_row = [r for r in rows if (r["method"], r["B"], r["K"]) == ("gd", b, 1)]
                if method == "prox" and k == 1 and gd_row:
                    rows.append(gd_row[0] | {"method": "prox"})
                    continue
                momenta = None
                if method == "nesterov":
                    trials, momenta = tuned_nesterov(problem, opt, cfg, b=b, k=k, seeds=seeds,
                                                     lrs=lrs, **kw)  # fmt: skip
                else:
                    trials = fresh_batches_to_converge(
                        problem, opt, method=method, batch_size=b, k=k, lrs=lrs, seeds=seeds,
                        max_steps=cfg.max_steps, **kw,
                    )  # fmt: skip
                rows.append(summarise(trials, problem.name, cst, opt.loss, momenta))
                LOG.info("%s B=%d K=%d: T=%s", method, b, k, [t.fresh_batches for t in trials])
                if not all(t.converged for t in trials):
                    break
    return rows


def fixed_rate(problem, opt, cfg: Config, rows, *, seed) -> list[dict]:
    """GD and prox-GD with each B's tuned K=1 rate kept for every K (is prox free of K?)."""
    fixed = []
    for method in ("gd", "prox"):
        for b in cfg.batch_sizes:
            k1 = next(r for r in rows if r["method"] == "gd" and r["B"] == b and r["K"] == 1)
            if k1.get("lr_med") is None:
                continue
            lr0 = torch.tensor([k1["lr_med"]], dtype=torch.float64)
            fixed.append(k1 | {"method": method + " (K=1 rate)"})  # K=1: the same run
            for r in sweep(problem, opt, cfg, [method], seed=seed, cst=None, lrs=lr0,
                           batch_sizes=(b,), ks=cfg.ks[1:]):  # fmt: skip
                fixed.append(r | {"method": method + " (K=1 rate)", "lr_med": float(lr0)})
    return fixed
