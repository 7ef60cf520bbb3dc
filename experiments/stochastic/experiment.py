"""Stochastic data echoing (ICLR 2025 submission) at small scale.

Three measurements on an MLP / Fashion-MNIST with batch-level :class:`dataecho.StochasticEcho`
(:mod:`experiments.stochastic.training`):

1. data loads (fresh examples) to a target test accuracy against the load probability ``p``
   (mean reuse count ~ 1/p) and the echo buffer ``M``; learning rate tuned per cell with the
   fairness harness (:mod:`experiments.common.tuning`). Speedup = loads(p=1) / loads(p),
   against the claimed linear speedup 1/p.
2. constant vs the two cosine schedules of ``p_t`` at a fixed load budget: final test accuracy
   (learning rate chosen per cell and seed by final accuracy).
3. gradient bias against reuse lag: the reused batch's gradient against a large-sample gradient
   at the same weights, next to an independent fresh batch's gradient.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.common.tuning import LogUniform, quasi_random_points, repeated_search, summarize
from experiments.stochastic import report
from experiments.stochastic.training import (
    Setting,
    gradient_bias,
    load_data,
    train_stochastic,
)

SPACE = {"lr": LogUniform(0.02, 1.0)}


@dataclass(frozen=True)
class Plan:
    """The three measurements' settings: the (p, M) grid, searches, target and budgets."""

    probs: tuple[float, ...]
    buffers: tuple[int, ...]
    sched_probs: tuple[float, ...]
    trials: int
    seeds: int
    batch_size: int
    target: float
    max_loads: int
    eval_every: int  # steps
    sched_loads: int  # fixed load budget of the schedule runs
    bias_settings: tuple[tuple[float, int], ...]  # (p, M)
    bias_steps: int
    bias_every: int
    data: tuple[int, int]  # train, test examples


def make_plan(quick: bool) -> Plan:
    """The full plan or the quick one (``--quick``: the tests, well under 2 minutes)."""
    if quick:
        return Plan((1.0, 0.5, 0.25), (1, 8), (0.5,), trials=2, seeds=1, batch_size=64,
                    target=0.75, max_loads=8192, eval_every=4, sched_loads=1024,
                    bias_settings=((0.25, 8),), bias_steps=60, bias_every=3,
                    data=(20_000, 1000))  # fmt: skip
    return Plan((1.0, 0.5, 0.25, 0.125, 1 / 16), (1, 8, 64), (0.5, 0.25, 0.125),
                trials=4, seeds=3, batch_size=64, target=0.82, max_loads=32_768, eval_every=4,
                sched_loads=4096, bias_settings=((0.25, 8), (0.125, 64)), bias_steps=900,
                bias_every=3, data=(50_000, 1000))  # fmt: skip


def run(out: Path, *, quick: bool, seed: int) -> Path:
    """Run the three measurements; write tables, plots and ``README.md`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(quick)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: one for this run
    start = time.perf_counter()
    try:
        data = load_data(*plan.data)
        seeds = [seed + i for i in range(plan.seeds)]
        loads, best_lr = [], {}
        for p in plan.probs:
            for m in plan.buffers if p < 1 else plan.buffers[:1]:  # p = 1 never reuses
                setting = Setting(p, "constant", m)

                def objective(params, s, limit, setting=setting):  # noqa: ANN001, ANN202
                    return train_stochastic(data, setting, params["lr"], s, limit=limit,
                                            batch_size=plan.batch_size, target=plan.target,
                                            max_loads=plan.max_loads, eval_every=plan.eval_every)  # fmt: skip

                res = repeated_search(objective, SPACE, trials=plan.trials, seeds=seeds)
                stats = summarize([r.best_fresh for r in res])
                steps = [r.best.info["steps"] for r in res if r.best is not None]
                best = min(res, key=lambda r: r.best_fresh).best
                best_lr[(p, m)] = best.params["lr"] if best else None
                loads.append({"p": p, "reuses": 1 / p, "buffer": m, "searches": len(res),
                              "reached": stats["reached"], "loads_min": stats["min"],
                              "loads_median": stats["median"], "loads_max": stats["max"],
                              "steps_median": statistics.median(steps) if steps else None,
                              "best_lr": best_lr[(p, m)]})  # fmt: skip
        sched = _schedules(plan, data, seeds)
        bias = []
        for p, m in plan.bias_settings:
            lr = best_lr.get((p, m)) or 0.1
            for row in gradient_bias(data, p, m, lr, seed, batch_size=plan.batch_size,
                                     steps=plan.bias_steps, every=plan.bias_every,
                                     ref_examples=2000):  # fmt: skip
                bias.append({"p": p, "buffer": m, **row})
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - start
    return report.write(out, plan, loads, sched, bias, wall, quick=quick, seed=seed)


def _schedules(plan: Plan, data, seeds: list[int]) -> list[dict]:  # noqa: ANN001
    """Final accuracy after ``sched_loads`` fresh examples, per (p, M, schedule); per seed the
    learning rate of the quasi-random points with the best final accuracy."""
    rows = []
    for p in plan.sched_probs:
        steps = round(plan.sched_loads / plan.batch_size / p)
        for m in plan.buffers:
            for sched in ("constant", "cos_inc", "cos_dec"):
                setting, accs, used = Setting(p, sched, m), [], []
                for s in seeds:
                    trials = [train_stochastic(data, setting, pt["lr"], s * 1000 + i,
                                               batch_size=plan.batch_size, target=plan.target,
                                               max_loads=plan.max_loads, steps=steps,
                                               eval_every=plan.eval_every)
                              for i, pt in enumerate(quasi_random_points(SPACE, plan.trials, s))]  # fmt: skip
                    best = max(trials, key=lambda t: t.info["metric"])
                    accs.append(best.info["metric"])
                    used.append(best.info["loads"])
                rows.append({"p": p, "buffer": m, "schedule": sched, "steps": steps,
                             "loads_median": statistics.median(used), "acc_min": min(accs),
                             "acc_median": statistics.median(accs), "acc_max": max(accs)})  # fmt: skip
    return rows
