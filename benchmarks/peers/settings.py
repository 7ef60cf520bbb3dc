"""Settings of ``python -m benchmarks peers`` (see :mod:`benchmarks.peers`): one frozen
dataclass with every section's knobs and the cases each section runs, and ``--quick``'s."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.peers.loaders import Case


@dataclass(frozen=True)
class Settings:
    ratios: tuple[float, ...] = (2, 4, 8)
    batch_size: int = 128
    duration: float = 4.0  # measured seconds per case and round (sections 1 and 2)
    warmup: float = 1.0  # seconds (and >= 2 steps) before measuring
    rounds: int = 2
    overhead_rounds: int = 3
    raw_seconds: float = 1.0  # per raw echo-stage measurement
    raw_factor: int = 4
    example_shuffle: int = 1024  # dataecho's example-level shuffle buffer, in examples
    batch_shuffle: int = 8  # dataecho's batch-level shuffle buffer, in batches' worth
    auto_wheres: tuple[str, ...] = ("batch", "before_augment")
    max_echo_factor: float = 16
    quality_factor: int = 4
    quality_budget: int = 12_800  # fresh examples per quality run
    quality_seeds: tuple[int, ...] = (0, 1)
    memory_factor: int = 4
    memory_batches: int = 100
    memory_kinds: tuple[str, ...] = ("dataloader", "monai", "adjacent", "dataecho")
    memory_growth: bool = True  # dataecho's worker peak by shuffle buffer size
    shuffle_sizes: tuple[int, ...] = (0, 2048, 8192, 32768)
    snapshot_factor: int = 4
    snapshot_batches: int = 320  # per case: an e = 4 default interval, within an "auto" epoch
    snapshot_warmup: int = 20
    snapshot_rounds: int = 2
    target_ratios: tuple[float, ...] = (2, 4, 8)
    target_factors: tuple[int, ...] = (2, 4, 8)
    # Late enough that start-up and the evaluation grid do not decide the race (at 0.75 they do).
    target_accuracy: float = 0.80
    target_lr: float = 0.05  # dataecho train's default for this CNN
    target_eval_every: int = 1280  # fresh examples between evaluations
    target_eval_examples: int = 2000  # the fixed test subset each evaluation scores
    target_max_seconds: float = 150.0  # a case still short of the target then stops
    target_rounds: int = 2
    sections: tuple[str, ...] = ("overhead", "raw", "input_bound", "quality", "memory",
                                 "snapshots", "target")  # fmt: skip
    # Section 2 only runs the loaders whose names contain one of these (DataLoader always: it
    # is the efficiency's base); empty = every loader.
    input_bound_match: tuple[str, ...] = ()
    train_limit: int | None = None  # examples of the training split held (None: all 60,000)
    test_limit: int | None = None  # test examples evaluated (None: all 10,000)
    threads: int = 1
    seed: int = 0

    def input_bound_cases(self, ratio: float) -> list[Case]:
        """Section 2's loaders at R = ``ratio``, all echoing e = R (rounded)."""
        cases = self._all_input_bound_cases(ratio)
        if not self.input_bound_match:
            return cases
        return [c for c in cases if c.kind == "dataloader"
                or any(m in c.name for m in self.input_bound_match)]  # fmt: skip

    def _all_input_bound_cases(self, ratio: float) -> list[Case]:
        e = max(1, round(ratio))
        return [
            Case("dataloader"),
            Case("monai", e),
            Case("adjacent", e),
            # Without a shuffle buffer first: what the peers do (copies adjacent), then with.
            Case("dataecho", e, "before_augment"),
            Case("dataecho", e, "before_augment", read_ahead=0),  # what the read-ahead buys
            Case("dataecho", e, "before_augment", self.example_shuffle),
            Case("dataecho", e, "after_augment", self.example_shuffle),
            Case("dataecho", e, "batch"),
            Case("dataecho", e, "batch", self.batch_shuffle * self.batch_size),
            Case("dataecho", e, "before_augment", self.example_shuffle, batch_augment=True),
            *(Case("dataecho", "auto", w) for w in self.auto_wheres),
            # Like for like with the peers, which cannot checkpoint: no worker state snapshots.
            Case("dataecho", e, "before_augment", snapshots=False),
            Case("dataecho", e, "before_augment", self.example_shuffle, snapshots=False),
            Case("dataecho", e, "batch", self.batch_shuffle * self.batch_size, snapshots=False),
            Case(
                "dataecho",
                e,
                "before_augment",
                self.example_shuffle,
                batch_augment=True,
                snapshots=False,
            ),
        ]

    def quality_cases(self) -> list[Case]:
        e = self.quality_factor
        return [
            Case("dataloader"),
            Case("monai", e),
            Case("adjacent", e),
            Case("dataecho", e, "batch", self.batch_shuffle * self.batch_size),
            Case("dataecho", e, "before_augment", self.example_shuffle),
        ]

    def memory_cases(self) -> list[Case]:
        e = self.memory_factor
        peers = [Case("dataloader"), Case("monai", e), Case("adjacent", e)]
        ours = [
            Case("dataecho", e, "before_augment"),
            Case("dataecho", e, "after_augment"),
            Case("dataecho", e, "batch"),
            Case("dataecho", "auto", "batch"),
        ]
        growth = [Case("dataecho", e, "before_augment")] + [
            Case("dataecho", e, "before_augment", n, snapshots=snap)
            for snap in (True, False)
            for n in self.shuffle_sizes
            if n > 1
        ]
        cases = [c for c in peers + ours if c.kind in self.memory_kinds]
        return list(dict.fromkeys(cases + (growth if self.memory_growth else [])))


QUICK = dict(
    duration=1.5, warmup=0.5, rounds=1, overhead_rounds=1, raw_seconds=0.3,
    quality_budget=2560, quality_seeds=(0,), memory_batches=40, shuffle_sizes=(0, 8192),
    snapshot_batches=80, snapshot_warmup=10, snapshot_rounds=1,
    target_ratios=(4,), target_factors=(4,), target_accuracy=0.75, target_rounds=1,
    target_eval_examples=1000, target_max_seconds=60.0,
)  # fmt: skip
