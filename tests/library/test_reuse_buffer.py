"""ReuseBuffer: the same picks, random draws included, as the plain definition of each policy."""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataecho.stages.reuse_buffer import ReuseBuffer


class ScanBuffer:
    """The definitions, by a scan of the whole buffer on every pick (the reference)."""

    def __init__(self, size: int, limit: int, policy: str) -> None:
        self.buffer: collections.deque[list] = collections.deque(maxlen=size)
        self.limit, self.policy = limit, policy

    def add(self, item) -> None:
        self.buffer.append([item, 1])

    def pick(self, rng: random.Random):
        allowed = [entry for entry in self.buffer if entry[1] < self.limit]
        if not allowed:
            return None
        if self.policy == "fewest":
            fewest = min(entry[1] for entry in allowed)
            allowed = [entry for entry in allowed if entry[1] == fewest]
        chosen = allowed[-1] if self.policy == "latest" else rng.choice(allowed)
        chosen[1] += 1
        return chosen[0]

    @property
    def entries(self) -> list[tuple]:
        return [(item, count) for item, count in self.buffer]


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 6),
    limit=st.integers(1, 5),
    policy=st.sampled_from(["latest", "uniform", "fewest"]),
    ops=st.lists(st.booleans(), max_size=80),  # True: a fresh item arrives; False: a pick
    seed=st.integers(0, 2**32 - 1),
    resume_at=st.integers(0, 80),
)
def test_picks_match_the_definitions_and_resume_from_entries(
    size, limit, policy, ops, seed, resume_at
):
    buffer, reference = ReuseBuffer(size, limit, policy), ScanBuffer(size, limit, policy)
    rng, reference_rng = random.Random(seed), random.Random(seed)
    fresh = 0
    for i, arrives in enumerate(ops):
        if i == resume_at:  # a checkpoint: a new buffer from the entries, and the rng's state
            items, counts = zip(*buffer.entries, strict=True) if len(buffer) else ((), ())
            buffer = ReuseBuffer(size, limit, policy)
            buffer.load(items, counts)
            rng = random.Random()
            rng.setstate(reference_rng.getstate())
        if arrives:
            buffer.add(fresh)
            reference.add(fresh)
            fresh += 1
        else:
            assert buffer.pick(rng) == reference.pick(reference_rng)
        assert buffer.entries == reference.entries
        assert rng.getstate() == reference_rng.getstate()  # the same draws, no extra ones


def test_fewest_spreads_copies_and_limit_holds():
    buffer, rng = ReuseBuffer(3, 3, "fewest"), random.Random(0)
    for item in "abc":
        buffer.add(item)
    first, second = [buffer.pick(rng) for _ in range(3)], [buffer.pick(rng) for _ in range(3)]
    assert sorted(first) == sorted(second) == ["a", "b", "c"]  # a 2nd copy before any 3rd
    assert buffer.pick(rng) is None and buffer.entries == [("a", 3), ("b", 3), ("c", 3)]
    buffer.add("d")  # "a" leaves the full buffer; "d" may be emitted twice more
    assert [buffer.pick(rng), buffer.pick(rng), buffer.pick(rng)] == ["d", "d", None]


def test_load_rejects_mismatched_counts():
    with pytest.raises(ValueError, match="zip"):
        ReuseBuffer(2, 3, "latest").load(["a", "b"], [1])
