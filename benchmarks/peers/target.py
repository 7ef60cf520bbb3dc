"""Wall time to a target accuracy (section 6 of ``python -m benchmarks peers``).

The second target: "``auto`` reaches the best fixed e's wall time to target without
being told R". Every case trains a fresh SmallCNN (SGD, ``target_lr``, momentum 0.9) from the
same throttled upstream as section 2 (R x t_down per batch of 128) until a test accuracy of
``target_accuracy`` on a fixed subset of ``target_eval_examples`` test images, evaluated every
``target_eval_every`` fresh examples (distinct examples the step received); the evaluations
run in the training loop and their time counts. A case that has not reached the target after
``target_max_seconds`` (or by the end of one epoch) stops and counts as not reached. Cases:
no echo; MONAI ``repeats=e``; dataecho fixed e at ``where="batch"`` (shuffle of
``batch_shuffle`` batches) and ``before_augment`` (shuffle of ``example_shuffle`` examples,
batch augmentation); dataecho ``auto`` at both, with the same shuffles. Rounds interleave
every (R, case) once per round, each round with its own seed (model, order, augmentation).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from benchmarks import common
from benchmarks.peers.loaders import Case, build
from dataecho.app.sources.throttled import Throttled
from dataecho.app.workloads.cnn import evaluate


def cases(s: Any) -> list[Case]:
    """The loaders raced to the target (the same at every R)."""
    ex = dict(shuffle_buffer=s.example_shuffle, batch_augment=True)
    fixed = [(e, w) for w in ("batch", "before_augment") for e in s.target_factors]
    return [
        Case("dataloader"),
        *(Case("monai", e) for e in s.target_factors),
        *(
            Case("dataecho", e, "batch", s.batch_shuffle * s.batch_size)
            for e, w in fixed
            if w == "batch"
        ),
        *(Case("dataecho", e, "before_augment", **ex) for e, w in fixed if w != "batch"),
        Case("dataecho", "auto", "batch", s.batch_shuffle * s.batch_size),
        Case("dataecho", "auto", "before_augment", **ex),
    ]


def eval_subset(test: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random subset of ``n`` test images (uint8) and labels."""
    pick = torch.randperm(len(test.labels), generator=torch.Generator().manual_seed(12345))[:n]
    return test.images[pick], test.labels[pick]


def to_target(ctx: Any, case: Case, ratio: float, seed: int, subset: Any) -> dict:
    """Train ``case`` at R = ``ratio`` until the target; what it cost."""
    s = ctx.s
    data = Throttled(ctx.train, delay=ratio * ctx.t_down / s.batch_size)
    step = common.SyntheticStep(seed=seed, lr=s.target_lr)
    run = build(case, data, ctx.augment, batch_size=s.batch_size, seed=seed, shuffle=True,
                max_echo_factor=s.max_echo_factor)  # fmt: skip
    seen: set[int] = set()
    out = {"steps": 0, "evals": 0, "eval_s": 0.0, "wait_s": 0.0, "accuracy": math.nan,
           "reached": False}  # fmt: skip
    next_eval = s.target_eval_every
    start = time.perf_counter()  # the loader's workers are up; the first batch is not
    try:
        while time.perf_counter() - start < s.target_max_seconds:
            t = time.perf_counter()
            try:
                images, labels, index = next(run)
            except StopIteration:  # one epoch without reaching it
                break
            out["wait_s"] += time.perf_counter() - t
            seen.update(index.tolist())
            step(images, labels)
            out["steps"] += 1
            if len(seen) >= next_eval:
                t = time.perf_counter()
                out["accuracy"] = evaluate(step.model, subset).accuracy
                out["eval_s"] += time.perf_counter() - t
                out["evals"] += 1
                next_eval = len(seen) + s.target_eval_every
                if out["accuracy"] >= s.target_accuracy:
                    out["reached"] = True
                    break
    finally:
        seconds = time.perf_counter() - start
        run.close()
    return out | {"seconds": seconds, "fresh": len(seen), "seed": seed}


def run_all(ctx: Any, log=print) -> dict[tuple[float, Case], list[dict]]:
    """Every (R, case), interleaved over ``target_rounds`` rounds (round r: seed + r)."""
    s = ctx.s
    subset = eval_subset(ctx.test, s.target_eval_examples)
    keys = [(r, c) for r in s.target_ratios for c in cases(s)]
    results: dict[tuple[float, Case], list[dict]] = {k: [] for k in keys}
    for rnd in range(s.target_rounds):
        for i, (ratio, case) in enumerate(keys):
            log(f"[target round {rnd + 1}/{s.target_rounds}, case {i + 1}/{len(keys)}] "
                f"R={ratio:g} {case.name}")  # fmt: skip
            r = to_target(ctx, case, ratio, s.seed + rnd, subset)
            mark = "reached" if r["reached"] else "NOT reached"
            log(f"    {mark} in {r['seconds']:.1f} s, {r['fresh']:,} fresh, {r['steps']} steps")
            results[(ratio, case)].append(r)
    return results


def mean_seconds(runs: list[dict]) -> float:
    """Mean wall seconds to target; inf when any round did not reach it."""
    return (
        statistics.fmean(r["seconds"] for r in runs)
        if all(r["reached"] for r in runs)
        else math.inf
    )
