"""Choi et al. 2019 at small scale: fresh examples to a target against e, insertion point, shuffle.

Two workloads (:mod:`experiments.common.workloads`): a TinyCNN on Fashion-MNIST with random
shift + flip, and a 1-layer char Transformer on Jane Austen (no augmentation, so only example
echoing, ``where="after_augment"``, and batch echoing). Every cell of the grid
(:mod:`experiments.choi.plan`) gets its own quasi-random search over the learning rate (and
momentum, for SGD); the trial reaching the target with the fewest fresh examples is selected
(:mod:`experiments.common.tuning`). Then: the time model, final quality at a fixed fresh
budget, a timed run of the application against the time model, and the batch-size scaling
study (:mod:`experiments.choi.scaling`); :mod:`experiments.choi.report` writes it all.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from experiments.choi import report, scaling
from experiments.choi.plan import (
    Plan,
    WorkloadPlan,
    build_workload,
    cells,
    eval_every,
    job_rank,
    make_plan,
)
from experiments.choi.wall_time import timed_check
from experiments.common.trial_loop import Condition, run_trial
from experiments.common.tuning import repeated_search, summarize
from experiments.common.workloads import CNN_SPACE, LM_SPACE


def _search_cell(
    wp: WorkloadPlan, cond: Condition, seeds: list[int], trials: int, deadline: float
) -> dict | None:
    """One cell: its repeated search, summarised (runs in a worker process in the full plan).

    None if the wall-clock ``deadline`` (``time.time()``) passed before it started.
    """
    if time.time() > deadline:
        return None
    torch.set_num_threads(1)  # 2 cores: one per worker process
    wl = build_workload(wp)
    space = CNN_SPACE if wp.name == "cnn" else LM_SPACE
    start = time.perf_counter()
    results = repeated_search(
        lambda p, s, lim: run_trial(wl, cond, p, s, lim, eval_every=eval_every(wp, cond)),
        space,
        trials=trials,
        seeds=seeds,
    )
    stats = summarize([r.best_fresh for r in results])
    best = min(results, key=lambda r: r.best_fresh)
    t_downs = [t.info["t_down"] for r in results for t in r.trials]
    return {
        "workload": wp.name, **asdict(cond), "searches": len(seeds), "trials": trials,
        "fresh_min": stats["min"], "fresh_median": stats["median"], "fresh_max": stats["max"],
        "reached": stats["reached"], "best_params": best.best.params if best.best else None,
        "t_down": sorted(t_downs)[len(t_downs) // 2], "seconds": time.perf_counter() - start,
        "curves": [[t.info["history"] for t in r.trials] for r in results],
    }  # fmt: skip


def _fixed_budget(wp: WorkloadPlan, cond: Condition, params: dict, seed: int) -> dict:
    """Final quality after ``wp.fixed_budget`` fresh examples with a cell's selected params."""
    torch.set_num_threads(1)
    trial = run_trial(build_workload(wp), cond, params, seed, stop_at_target=False,
                      budget=wp.fixed_budget)  # fmt: skip
    return {"workload": wp.name, **asdict(cond), "fresh": trial.info["fresh"],
            "final_metric": trial.info["metric"], "steps": trial.info["steps"]}  # fmt: skip


def _map(plan: Plan, fn: Any, jobs: list[tuple]) -> list[Any]:
    """Run ``fn(*job)`` for every job: in ``plan.workers`` spawned processes, or inline."""
    if plan.workers <= 1:
        return [fn(*job) for job in jobs]
    ctx = multiprocessing.get_context("spawn")  # no fork after torch started its threads
    with cf.ProcessPoolExecutor(plan.workers, mp_context=ctx) as pool:
        return list(pool.map(fn, *zip(*jobs, strict=True)))


def run(out: Path, *, quick: bool, seed: int) -> Path:
    """Run the grid, the time model, the fixed-budget runs and the timed check; write ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = make_plan(quick)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        deadline = time.time() + plan.deadline_s
        jobs = [(wp, c, [seed + i for i in range(n)], plan.trials, deadline)
                for wp in plan.workloads for c, n in cells(plan, wp)]  # fmt: skip
        # Within a rank, the costlier first to balance the two workers.
        jobs.sort(key=lambda j: (job_rank(j[1], len(j[2])), -j[1].echo_factor))
        results = _map(plan, _search_cell, jobs)
        rows = [r for r in results if r is not None]
        skipped = [asdict(j[1]) | {"workload": j[0].name}
                   for j, r in zip(jobs, results, strict=True) if r is None]  # fmt: skip
        fixed_jobs = []
        for row in rows:
            wp = next(w for w in plan.workloads if w.name == row["workload"])
            cond = Condition(row["echo_factor"], row["where"], row["shuffle_buffer"],
                             row["batch_size"])  # fmt: skip
            # Final quality: the first insertion point with a large shuffle, and the baseline.
            if (
                cond.batch_size == wp.batch_sizes[0]
                and cond.where == wp.wheres[0]
                and (cond.echo_factor in (1.0, 2.0, 4.0, 8.0))
                and (cond.echo_factor == 1 or cond.shuffle_buffer > 0)
                and row["best_params"]
            ):
                fixed_jobs.append((wp, cond, row["best_params"], seed + 7))
        fixed = _map(plan, _fixed_budget, fixed_jobs)
        timed = timed_check(seed) if plan.timed_check else None
        extra = _scaling(plan, out, seed) if plan.scaling else []
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - start
    return report.write(out, plan, rows, fixed, timed, wall, skipped, quick=quick, seed=seed,
                              extra=extra)  # fmt: skip


def _scaling(plan: Plan, out: Path, seed: int) -> list[str]:
    """The batch-size scaling cells (costliest first, to balance the workers) and their
    Markdown section."""
    sp = plan.scaling
    jobs = sorted(((sp, bs, e, seed) for bs in sp.batch_sizes for e in sp.factors),
                  key=lambda j: -j[2] / j[1])  # fmt: skip
    rows = _map(plan, scaling.search_cell, jobs)
    rows.sort(key=lambda r: (r["batch_size"], r["echo_factor"]))
    return scaling.report(rows, sp, out)
