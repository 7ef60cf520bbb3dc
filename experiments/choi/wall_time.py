"""The choi experiment's wall time: fresh examples through the time model, and one real check.

:func:`time_rows` turns each cell's fresh examples to target into modelled wall time for
pipelines :data:`RATIOS` times slower than a training step; :func:`timed_check` runs the
application's training loop for real with reads slowed to R = :data:`TIMED_R` and sets its
measured wall time beside the model's.
"""

from __future__ import annotations

import math
from typing import Any

from dataecho.profiling import time_model
from experiments.choi.plan import variant

RATIOS = (2.0, 4.0, 6.0)  # R = t_up / t_down of the modelled pipelines
TIMED_R = 4.0


def baselines(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """The e = 1 row of every (workload, batch size)."""
    return {(r["workload"], r["batch_size"]): r for r in rows if r["echo_factor"] == 1}


def time_rows(rows: list[dict]) -> list[dict]:
    """Fresh examples -> wall time with the time model, best variant per (workload, bs, e).

    Wall time of F fresh examples at batch B: F/B fresh batches, each cycle
    ``max(t_up, e * t_down)`` with ``t_up = R * t_down`` (``time_model``); t_down is the
    median step time measured in the e=1 searches of that batch size.
    """
    base = baselines(rows)
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["workload"], r["batch_size"], r["echo_factor"])
        if math.isfinite(r["fresh_median"]) and (
            key not in best or r["fresh_median"] < best[key]["fresh_median"]
        ):
            best[key] = r
    out = []
    for (wl, bs, e), r in sorted(best.items()):
        b = base.get((wl, bs))
        if b is None or not math.isfinite(b["fresh_median"]):
            continue
        t_down = b["t_down"]
        row = {"workload": wl, "batch_size": bs, "e": e, "variant": variant(r),
               "fresh_median": r["fresh_median"],
               "fresh_vs_baseline": r["fresh_median"] / b["fresh_median"]}  # fmt: skip
        for ratio in RATIOS:
            cyc = time_model(ratio * t_down, t_down, e).cycle_seconds
            base_cyc = time_model(ratio * t_down, t_down, 1.0).cycle_seconds
            wall = r["fresh_median"] / bs * cyc
            row[f"wall_s_R{ratio:g}"] = wall
            row[f"speedup_R{ratio:g}"] = b["fresh_median"] / bs * base_cyc / wall
        out.append(row)
    return out


def timed_check(seed: int) -> dict[str, Any]:
    """A real timed run against the time model: ``train()`` with reads slowed so R ~ 4.

    SmallCNN at batch 128 on 1 thread, 1 loader worker, batch echoing (cheap in the worker),
    3,840 fresh examples (30 fresh batches), e = 1 and e = 4, no target, one evaluation.
    """
    from dataecho.app.config import TrainConfig
    from dataecho.app.train import measure_step_seconds, train

    bs, fresh = 128, 3840
    t_down = measure_step_seconds(bs, threads=1)
    delay = TIMED_R * t_down / bs
    out: dict[str, Any] = {"t_down": t_down, "read_delay": delay, "R": TIMED_R, "runs": []}
    for e in (1.0, 4.0):
        cfg = TrainConfig(workload="cnn", read_delay=delay, echo_factor=e, where="batch",
                          batch_size=bs, budget=fresh, eval_every=fresh, eval_examples=500,
                          train_examples=8000, seed=seed, num_workers=1, threads=1)  # fmt: skip
        res = train(cfg, log=lambda _line: None)
        measured = res.wall_seconds - res.eval_seconds
        predicted = res.fresh_examples / bs * time_model(TIMED_R * t_down, t_down, e).cycle_seconds
        out["runs"].append({"e": e, "fresh": res.fresh_examples, "steps": res.steps,
                            "measured_s": measured, "predicted_s": predicted,
                            "measured_steps_per_s": res.steps / measured,
                            "predicted_steps_per_s": res.steps / predicted,
                            "step_ms_in_run": 1e3 * res.step_seconds / res.steps})  # fmt: skip
    return out
