"""The control numbers: what each process adds to an exchange, and what every rank reads back.

    tally = Tally(signals, fresh_examples)        # the loader's total so far (a resume's)
    tally.step(fresh_examples)                    # after each optimizer step
    summed = <the exchange>(tally.control(target=run.stop_vote))   # a Control, reduced
    if summed.stopping: ...                       # the same answer on every rank
    tally.exchanged()

An exchange (:mod:`.strategy`) carries a :class:`Control` packed into a few floats inside the
all-reduce the ranks make anyway (a gradient bucket, a model average: :mod:`.sync`), so the
one collective is a sum. Each field says how it is reduced over the ranks: a *count* is summed
(fresh examples, steps), a *vote* is any rank's (sent as 0/1 and summed; a sum > 0 is the
votes' max). One process exchanges with itself: its control numbers are their own sum.

A new vote is one field here (``_vote()``), set where the process learns it (a
:class:`Tally` or :meth:`.signals.StopSignals.votes`) and read where the ranks act on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import torch

SUM, ANY = "sum", "any"  # the reductions over ranks a field can have (module docstring)


def _count() -> Any:
    return field(default=0, metadata={"reduce": SUM})


def _vote() -> Any:
    return field(default=False, metadata={"reduce": ANY})


@dataclass
class Control:
    """One process's control numbers for an exchange or, after it, those of all ranks."""

    fresh: int = _count()  # fresh examples read since the last exchange
    steps: int = _count()  # optimizer steps since the last exchange
    target: bool = _vote()  # rank 0 reached the target at the exchange before: stop
    sigterm: bool = _vote()  # a rank got SIGTERM (:mod:`.signals`): stop
    sigint: bool = _vote()  # a rank got SIGINT: stop
    void: bool = _vote()  # a rank joined without a step: nothing of this exchange is consistent

    @classmethod
    def width(cls) -> int:
        """How many floats :meth:`pack` gives."""
        return len(fields(cls))

    def pack(self) -> torch.Tensor:
        """The fields as float32 (votes as 0/1), in field order: the all-reduce's payload."""
        return torch.tensor([float(getattr(self, f.name)) for f in fields(self)],
                            dtype=torch.float32)  # fmt: skip

    @classmethod
    def unpack(cls, summed: torch.Tensor) -> Control:
        """The :class:`Control` of a payload summed over the ranks: counts rounded (floats
        carry them), votes true where any rank's was."""
        values = summed.tolist()
        if len(values) != cls.width():
            raise ValueError(f"{len(values)} control numbers; a Control packs {cls.width()}")
        return cls(**{f.name: round(v) if f.metadata["reduce"] == SUM else v > 0
                      for f, v in zip(fields(cls), values, strict=True)})  # fmt: skip

    @property
    def stopping(self) -> bool:
        """Some rank voted to stop on a signal (:mod:`.signals`)."""
        return self.sigterm or self.sigint


class Voter(Protocol):
    """What casts this process's signal votes (:class:`.signals.StopSignals`)."""

    def votes(self, void: bool = False) -> Control: ...


class Tally:
    """This process's part of the next exchange: its fresh examples and steps since the last
    one (counted from the loader's running total), with its votes."""

    def __init__(self, signals: Voter, fresh_examples: int) -> None:
        self.signals = signals
        self.seen = fresh_examples  # the loader's total at the last step counted
        self.since = Control()

    def step(self, fresh_examples: int) -> None:
        """One more step, after which the loader's total is ``fresh_examples``."""
        self.since.fresh += fresh_examples - self.seen
        self.since.steps += 1
        self.seen = fresh_examples

    def control(self, target: bool) -> Control:
        """The counts since the last exchange, the target's vote and the signals' votes."""
        return replace(self.signals.votes(), fresh=self.since.fresh, steps=self.since.steps,
                       target=target)  # fmt: skip

    def void(self) -> Control:
        """For an exchange this process joins without a step (:mod:`.signals`): no counts."""
        return self.signals.votes(void=True)

    def exchanged(self) -> None:
        """The counts went into an exchange: start again from zero."""
        self.since = Control()
