"""The choi grid: which cells run, with how many tuned searches, under which settings.

:func:`make_plan` gives the full plan or the quick one (``--quick``, for the tests);
:func:`cells` lists a workload's cells and their number of searches; :func:`job_rank` orders
them so that a deadline cuts the least informative cells first. The full plan is cut to fit
a small shared CPU machine; the results page says how (docs/results/choi/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.choi.scaling import ScalingPlan
from experiments.common.trial_loop import Condition, TrialWorkload
from experiments.common.workloads import cnn_workload, lm_workload

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
    scaling: ScalingPlan | None = None  # useful e vs batch size, higher target


def make_plan(quick: bool) -> Plan:
    """The full plan (about an hour on 2 shared cores) or the quick one (``--quick``: the
    tests, well under 2 minutes).

    The full plan's deadline is generous because the machine it runs on is shared: a skipped
    cell costs more than the wait (the results page gives the wall times)."""
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
                scaling=ScalingPlan())  # fmt: skip


def build_workload(wp: WorkloadPlan) -> TrialWorkload:
    """The (cached) workload of ``wp``, its target, evaluation cadence and trial budget."""
    if wp.name == "cnn":
        return cnn_workload(*wp.args, wp.target, wp.eval_every, wp.budget)
    return lm_workload(*wp.args, wp.target, wp.eval_every, wp.budget)


def cells(plan: Plan, wp: WorkloadPlan) -> list[tuple[Condition, int]]:
    """(condition, number of searches) for every cell of ``wp`` that runs."""
    out = []
    for bs in wp.batch_sizes:
        out.append((Condition(1.0, wp.wheres[0], 0, bs), plan.main_seeds))
        for where in wp.wheres:
            for e in plan.factors[1:]:
                if e in plan.minor_factors and where != wp.wheres[0]:
                    continue
                main = where == wp.wheres[0] and e in plan.main_factors
                seeds = plan.main_seeds if main else plan.other_seeds
                out.append((Condition(e, where, plan.shuffle_batches * bs, bs), seeds))
            for e in plan.unshuffled_factors:
                out.append((Condition(e, where, 0, bs), plan.other_seeds))
    return out


def eval_every(wp: WorkloadPlan, cond: Condition) -> int:
    """Fresh examples between evaluations: every 8 fresh batches, at most ``wp.eval_every``
    (fresh-to-target counts are resolved to this step; small batches reach targets sooner)."""
    return min(wp.eval_every, 8 * cond.batch_size)


def job_rank(cond: Condition, searches: int) -> int:
    """A cell's place in the run order, most informative first, so that a deadline cuts the
    least important cells: baselines, the repeated e = 2 and 4 searches, the other insertion
    points, no shuffle, e = 8, then e = 1.5."""
    e = cond.echo_factor
    if e == 1:
        return 0
    if searches > 1:
        return 1 if e == 2 else 2
    if e in (2.0, 4.0):
        return 3 if cond.shuffle_buffer else 4
    return 5 if e > 2 else 6


def variant(row: dict) -> str:
    """Short name of a cell's echoing variant, e.g. ``before_augment+shuf``."""
    if row["echo_factor"] == 1:
        return "baseline"
    return row["where"] + ("+shuf" if row["shuffle_buffer"] > 0 else "")
