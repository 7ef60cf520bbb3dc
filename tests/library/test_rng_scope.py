"""RngScope: per-batch seeding of the transform's RNGs, with the caller's state kept."""

from __future__ import annotations

import random

import torch

from dataecho.loader.rng_scope import RngScope


def draws(scope: RngScope, batches: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(batches):
        with scope:
            out.append((float(torch.rand(())), random.random()))
    return out


def test_same_seed_same_draws_and_resume_from_counter():
    full = draws(RngScope(5), 6)
    assert full == draws(RngScope(5), 6)
    assert full != draws(RngScope(6), 6)
    assert len(set(full)) == 6  # every batch gets its own stream
    scope = RngScope(5)
    draws(scope, 2)
    resumed = RngScope(5)
    resumed.load_state_dict(scope.state_dict())
    assert draws(resumed, 4) == full[2:]


def test_callers_state_is_restored_in_the_main_process():
    torch.manual_seed(1)
    random.seed(1)
    expected = (float(torch.rand(())), random.random())
    torch.manual_seed(1)
    random.seed(1)
    draws(RngScope(9), 3)
    assert (float(torch.rand(())), random.random()) == expected
