"""Mixing the examples of whole batches (dataecho.stages.example_mix), alone and after echo."""

from __future__ import annotations

import collections
import time
from typing import NamedTuple

import numpy as np
import pytest
import torch
from conftest import run_test_save_load_state
from hypothesis import given
from hypothesis import strategies as st

from dataecho import EchoingDataLoader
from dataecho.stages import echo, mix_examples, shuffle
from dataecho.stages.example_mix import draw_distinct


def batches(n: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` examples in batches of ``size`` (the last one short): images filled with the
    example's index, and the index as label."""
    out = []
    for start in range(0, n, size):
        ids = torch.arange(start, min(n, start + size))
        out.append((ids.view(-1, 1, 1).expand(-1, 2, 2).float().clone(), ids))
    return out


def ids(stream) -> list[int]:
    return [int(y) for _, ys in stream for y in ys]


@pytest.mark.parametrize("buffer_size", [0, 1, 3, 10, 100])
def test_every_example_leaves_once_in_batches_of_the_sizes_that_came_in(buffer_size):
    source = batches(23, 5)
    node = mix_examples(source, buffer_size, seed=0)
    out = list(node)
    assert [len(y) for _, y in out] == [5, 5, 5, 5, 3]
    assert sorted(ids(out)) == list(range(23))
    for x, y in out:  # the rows of every leaf move together
        assert torch.equal(x[:, 0, 0], y.float())
    assert node.stats.fresh_items == node.stats.items_out == 5


def test_copies_of_one_batch_spread_over_the_batches_that_follow():
    out = list(mix_examples(echo(batches(64, 8), 4, seed=0), 32, seed=1))
    assert collections.Counter(ids(out)) == {i: 4 for i in range(64)}
    # Without mixing each batch holds one source batch 4 times; mixed, most batches draw on
    # several source batches and hardly any repeats an example within itself.
    sources = [len({int(i) // 8 for i in y}) for _, y in out]
    assert sum(s > 1 for s in sources) > 0.8 * len(out)
    repeats = sum(len(y) - len(set(y.tolist())) for _, y in out)
    assert repeats < 0.25 * 4 * 64


def test_emitted_tensors_are_new_and_writing_them_changes_nothing_else():
    node = mix_examples(echo(batches(16, 4), 3, seed=0, copy=False), 8, seed=2)
    out = []
    for x, y in node:
        x.add_(1000)  # a consumer that augments in place
        out.append((x, y))
    for x, y in out:
        assert torch.equal(x[:, 0, 0], y.float() + 1000)
    pointers = [x.data_ptr() for x, _ in out]
    assert len(set(pointers)) == len(pointers)


class Pair(NamedTuple):
    image: torch.Tensor
    label: torch.Tensor


def test_structures_keep_their_types():
    dicts = [{"x": x, "y": y} for x, y in batches(10, 4)]
    out = list(mix_examples(dicts, 4, seed=0))
    assert all(set(b) == {"x", "y"} for b in out)
    pairs = [Pair(x, y) for x, y in batches(10, 4)]
    assert all(isinstance(b, Pair) for b in mix_examples(pairs, 4, seed=0))


def test_bad_batches_and_sizes_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="str leaf.*shuffle_buffer=0"):
        list(mix_examples([(torch.zeros(2), ["a", "b"])], 4, seed=0))
    with pytest.raises(ValueError, match=r"shapes \[\(2,\), \(3,\)\]"):
        list(mix_examples([(torch.zeros(2), torch.zeros(3))], 4, seed=0))
    with pytest.raises(ValueError, match=r"one dtype and shape; got \[\('torch.float32', \(3,\)\)"):
        list(mix_examples([torch.zeros(2, 2), torch.zeros(2, 3)], 4, seed=0))
    with pytest.raises(ValueError, match="buffer_size"):
        mix_examples(batches(4, 2), -1)


@pytest.mark.parametrize("factor", [1, 2.5])
def test_resume_at_every_position(factor):
    recorded = run_test_save_load_state(
        lambda: mix_examples(echo(batches(13, 3), factor, seed=4), 5, seed=7),
        summary=lambda node: (node.stats.fresh_items, node.stats.items_out),
        new_epoch=lambda node: None,  # each for loop's iter() starts the next epoch
        end_may_start_next_epoch=True,
    )
    assert all(len(epoch) >= 5 for epoch in recorded)
    assert ids(recorded[0]) != ids(recorded[1])  # each epoch mixes anew


def test_the_device_loader_mixes_copies_across_batches():
    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.full((1, 2, 2), float(i)), i

    loader = EchoingDataLoader(Images(), batch_size=8, echo_factor=4, where="device",
                               shuffle_buffer=32, seed=0)  # fmt: skip
    out = list(loader)
    assert len(out) == len(loader) == 32
    assert collections.Counter(ids(out)) == {i: 4 for i in range(64)}
    assert sum(len({int(i) // 8 for i in y}) > 1 for _, y in out) > 0.8 * len(out)
    assert loader.stats.fresh_examples == 64 and loader.stats.examples_out == 256


def test_rows_of_any_dtype_and_layout_move_whole():
    def batch(start: int, n: int):
        i = torch.arange(start, start + n)
        odd = torch.zeros(2 * n + 1, dtype=torch.uint8)[1:].view(n, 2)  # misaligned for int16
        odd[:, 0] = i.to(torch.uint8)
        return {"f": i.float().view(n, 1).expand(n, 3), "odd": odd, "flag": i % 2 == 0, "i": i}

    out = list(mix_examples([batch(0, 6), batch(6, 6), batch(12, 3)], 5, seed=0))
    assert sorted(int(i) for b in out for i in b["i"]) == list(range(15))
    for b in out:
        assert torch.equal(b["f"], b["i"].float().view(-1, 1).expand(-1, 3))
        assert torch.equal(b["odd"][:, 0].long(), b["i"]) and not b["odd"][:, 1].any()
        assert torch.equal(b["flag"], b["i"] % 2 == 0)
        assert b["f"].dtype == torch.float32 and b["flag"].dtype == torch.bool


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_pool_and_its_draws_stay_there_and_resume_exactly():
    source = [(x.cuda(), y.cuda()) for x, y in batches(40, 8)]
    out = list(mix_examples(source, 16, seed=0, device="cuda"))
    assert all(x.is_cuda and y.is_cuda for x, y in out)
    assert sorted(ids(out)) == list(range(40))
    run_test_save_load_state(
        lambda: mix_examples(echo(source, 2, seed=0), 16, seed=3, device="cuda"),
        new_epoch=lambda node: None,
        end_may_start_next_epoch=True,
    )


def test_mixing_time_is_work_and_the_sources_waits_are_not():
    def slow():
        for batch in batches(40, 8):
            time.sleep(0.02)
            yield batch

    node = mix_examples(slow(), 16, seed=0)
    list(node)
    assert node.stats.wait_seconds >= 5 * 0.02
    assert 0 < node.work_seconds < 0.02


def test_a_state_of_another_stage_is_refused_with_the_way_out():
    old = shuffle(batches(12, 4), 2, seed=0)  # where="device" shuffled whole batches so once
    next(old)
    with pytest.raises(ValueError, match="holds no example pool.*start the run anew"):
        mix_examples(batches(12, 4), 8, seed=0).reset(old.state_dict())


@given(n=st.integers(1, 400), k=st.integers(0, 400), seed=st.integers(0, 2**32 - 1))
def test_draw_distinct_gives_k_distinct_numbers_below_n_and_restores_its_scratch(n, k, seed):
    k = min(k, n)
    owner = np.full(n + 3, -1, dtype=np.int64)
    drawn = draw_distinct(np.random.default_rng(seed), n, k, owner)
    assert len(drawn) == k == len(set(drawn.tolist()))
    assert all(0 <= x < n for x in drawn.tolist())
    assert (owner == -1).all()


def test_draw_distinct_is_uniform_over_numbers_and_over_places():
    rng, owner = np.random.default_rng(0), np.full(200, -1, dtype=np.int64)
    draws = np.stack([draw_distinct(rng, 200, 20, owner) for _ in range(4000)])
    counts = np.bincount(draws.ravel(), minlength=200)  # 400 expected per number
    assert counts.min() > 300 and counts.max() < 500, (counts.min(), counts.max())
    first = np.bincount(draws[:, 0], minlength=200)  # 20 expected per number
    assert first.max() < 45, first.max()  # the first drawn is as random as the rest


def test_the_pool_cost_per_batch_does_not_grow_with_the_pool():
    """Counted, not timed: a pool of 64 batches makes no more Python-level calls per emitted
    batch than one of 2 (a small pool draws its repeats again more often); the time per batch
    at 10-100 batches is in benchmarks/pool."""
    import cProfile
    import pstats

    def calls(pool_batches: int) -> int:
        source = batches(96 * 8, 8)
        node = mix_examples(echo(source, 4, seed=0), pool_batches * 8, seed=0)
        for _ in range(pool_batches + 2):
            next(node)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(40):
            next(node)
        profile.disable()
        return sum(s[1] for s in pstats.Stats(profile).stats.values())  # primitive calls

    small, large = calls(2), calls(64)
    assert large <= small, (small, large)


def numbered_copies(n: int, size: int, factor: int):
    """Batches numbered from 1 as the loader numbers fresh batches, each echoed ``factor``
    times: what a numbered pool reads."""
    return echo(list(enumerate(batches(n, size), 1)), factor, seed=0)


def test_a_drain_emits_the_copies_due_of_delivered_examples_and_a_resume_the_rest():
    def make():
        return mix_examples(numbered_copies(64, 8, 4), 40, seed=1, numbered=True)

    node = make()
    head = [next(node) for _ in range(6)]
    delivered = set(ids(head))
    assert node.first_deliveries == len(delivered) < 64
    node.drain()
    tail = list(node)
    assert node.drained and tail
    # Every copy of each example delivered before the drain, and no other example.
    assert collections.Counter(ids(head + tail)) == {i: 4 for i in delivered}
    assert node.first_deliveries == len(delivered)
    assert [len(y) for _, y in tail[:-1]] == [8] * (len(tail) - 1)
    # The examples set aside are in the state: resumed, the epoch goes on with them.
    resumed = make()
    resumed.reset(node.state_dict())
    rest = list(resumed)
    assert collections.Counter(ids(head + tail + rest)) == {i: 4 for i in range(64)}
    assert resumed.first_deliveries == 64
    assert sum(len(y) for _, y in head + tail + rest) == 4 * 64


def test_a_drain_needs_the_numbers_that_tell_delivered_examples():
    node = mix_examples(echo(batches(16, 4), 2, seed=0), 8, seed=0)
    next(node)
    with pytest.raises(ValueError, match="numbered=True"):
        node.drain()
