"""Choi et al. 2019 at small scale: fresh examples to a target against e, insertion point, shuffle.

Two workloads (:mod:`experiments._workloads`): a TinyCNN on Fashion-MNIST with random
shift + flip, and a 1-layer char Transformer on Jane Austen (no augmentation, so only example
echoing, ``where="after_augment"``, and batch echoing). Every cell of the grid gets its own
quasi-random search over the learning rate (and momentum, for SGD); the trial reaching the
target with the fewest fresh examples is selected (:mod:`experiments.tuning`).

The grid is cut to fit 2 shared CPU cores; :class:`Plan` says how and the README repeats it.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from experiments import _choi_report, _choi_scaling
from experiments._lean_train import Condition, Workload, run_trial
from experiments._workloads import CNN_SPACE, LM_SPACE, cnn_workload, lm_workload
from experiments.tuning import repeated_search, summarize

FACTORS = (1.0, 1.5, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class WorkloadPlan:
    """One workload's share of the grid and its settings."""

    name: str
    wheres: tuple[str, ...]
    batch_sizes: tuple[int, int]
    target: float
    eval_every: int
    budget: int  # most fresh examples one trial reads
    fixed_budget: int  # fresh examples of the final-quality runs
    args: tuple  # settings of the workload builder


@dataclass(frozen=True)
class Plan:
    """Which cells run, with how many searches (seeds) of how many trials."""

    workloads: tuple[WorkloadPlan, ...]
    factors: tuple[float, ...]
    trials: int
    main_seeds: int  # searches for the main cells
    other_seeds: int  # searches for the rest
    main_factors: tuple[float, ...]  # with the first insertion point and a large shuffle
    minor_factors: tuple[float, ...]  # run with the first insertion point only
    unshuffled_factors: tuple[float, ...]  # cells with no post-echo shuffle
    shuffle_batches: int  # "large" shuffle buffer, in batches' worth of items
    workers: int
    timed_check: bool
    deadline_s: float  # searches not started by then are skipped (listed in the README)
    scaling: _choi_scaling.ScalingPlan | None = None  # useful e vs batch size, higher target


def make_plan(quick: bool) -> Plan:
    """The full plan (~1 h on 2 shared cores) or the quick one (tests, < 40 s).

    The deadline is generous because the machine is shared: at load 6-8 the main grid took
    16.5 min, and a skipped cell costs more than the wait."""
    if quick:
        cnn = WorkloadPlan("cnn", ("before_augment", "after_augment", "batch"), (32,),
                           0.5, 256, 1024, 768, (2000, 300))  # fmt: skip
        lm = WorkloadPlan("char-lm", ("after_augment", "batch"), (16,),
                          3.0, 256, 1024, 768, (64,))  # fmt: skip
        return Plan((cnn, lm), (1.0, 2.0), trials=2, main_seeds=1, other_seeds=1,
                    main_factors=(2.0,), minor_factors=(), unshuffled_factors=(),
                    shuffle_batches=8, workers=1, timed_check=False, deadline_s=600)  # fmt: skip
    cnn = WorkloadPlan("cnn", ("before_augment", "after_augment", "batch"), (32, 128),
                       0.65, 512, 8192, 2048, (20_000, 1000))  # fmt: skip
    lm = WorkloadPlan("char-lm", ("after_augment", "batch"), (16, 64),
                      2.8, 512, 12_288, 2048, (256,))  # fmt: skip
    return Plan((cnn, lm), FACTORS, trials=3, main_seeds=3, other_seeds=1,
                main_factors=(2.0, 4.0), minor_factors=(1.5,), unshuffled_factors=(4.0,),
                shuffle_batches=8, workers=2, timed_check=True, deadline_s=45 * 60,
                scaling=_choi_scaling.ScalingPlan())  # fmt: skip


def build_workload(wp: WorkloadPlan) -> Workload:
    if wp.name == "cnn":
        return cnn_workload(*wp.args, wp.target, wp.eval_every, wp.budget)
    return lm_workload(*wp.args, wp.target, wp.eval_every, wp.budget)


def cells(plan: Plan, wp: WorkloadPlan) -> list[tuple[Condition, int]]:
    """(condition, number of searches) for every cell of ``wp`` that runs."""
    out = []
    for bs in wp.batch_sizes:
        out.append((Condition(1.0, wp.wheres[0], 0, bs), plan.main_seeds))
        for where in wp.wheres:
            per = 1 if where == "batch" else bs  # batch echoing shuffles whole batches
            for e in plan.factors[1:]:
                if e in plan.minor_factors and where != wp.wheres[0]:
                    continue
                main = where == wp.wheres[0] and e in plan.main_factors
                seeds = plan.main_seeds if main else plan.other_seeds
                out.append((Condition(e, where, plan.shuffle_batches * per, bs), seeds))
            for e in plan.unshuffled_factors:
                out.append((Condition(e, where, 0, bs), plan.other_seeds))
    return out


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


def eval_every(wp: WorkloadPlan, cond: Condition) -> int:
    """Fresh examples between evaluations: every 8 fresh batches, at most ``wp.eval_every``
    (fresh-to-target counts are resolved to this step; small batches reach targets sooner)."""
    return min(wp.eval_every, 8 * cond.batch_size)


def _rank(wp: WorkloadPlan, cond: Condition, searches: int) -> int:
    e = cond.echo_factor
    if e == 1:
        return 0
    if searches > 1:
        return 1 if e == 2 else 2
    if e in (2.0, 4.0):
        return 3 if cond.shuffle_buffer else 4
    return 5 if e > 2 else 6


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
        # Most informative first, so a deadline cuts the least important cells: baselines,
        # the repeated e = 2 and 4 searches, the other insertion points, no shuffle, e = 8,
        # then e = 1.5 (within a rank, the costlier first to balance the two workers).
        jobs.sort(key=lambda j: (_rank(j[0], j[1], len(j[2])), -j[1].echo_factor))
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
        timed = _choi_report.timed_check(seed) if plan.timed_check else None
        extra = _scaling(plan, out, seed) if plan.scaling else []
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - start
    return _choi_report.write(out, plan, rows, fixed, timed, wall, skipped, quick=quick, seed=seed,
                              extra=extra)  # fmt: skip


def _scaling(plan: Plan, out: Path, seed: int) -> list[str]:
    """The batch-size scaling cells (costliest first, to balance the workers) and their
    Markdown section."""
    sp = plan.scaling
    jobs = sorted(((sp, bs, e, seed) for bs in sp.batch_sizes for e in sp.factors),
                  key=lambda j: -j[2] / j[1])  # fmt: skip
    rows = _map(plan, _choi_scaling.search_cell, jobs)
    rows.sort(key=lambda r: (r["batch_size"], r["echo_factor"]))
    return _choi_scaling.report(rows, sp, out)
