"""Evaluation in a background thread, on a copy of the weights, while training goes on.

Why: an input-bound run that evaluates inside its training loop hides the evaluation behind the
upstream only where the step has slack. Without echoing it has plenty (the loop waits on data
anyway, and the upstream keeps reading during the evaluation); an echoing run at e = R has none,
so each second of evaluation is a second more of wall time, and the comparison is skewed against
echoing by the evaluation schedule rather than by the method. A copy evaluated by a second
thread uses the CPU that the waits leave idle (torch ops release the GIL).

Honest accounting: a result belongs to the copy's fresh examples and steps, but the run only
*knows* it when the evaluation has finished, so a time to target is the finishing time. One
evaluation runs at a time: submitting while one is still running waits for it first (that wait
is the training loop's evaluation time), so a schedule denser than evaluations can run slows
training rather than queueing copies without bound.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch
from torch import nn

T = TypeVar("T")


class BackgroundEvaluator(Generic[T]):
    """Runs ``evaluate(weights)`` in one background thread; results come back in order.

    Use as a context manager (``close`` on the way out: the thread never outlives the run).
    ``tag`` is anything the caller wants back with the result (e.g. the history row).
    """

    def __init__(self, model: nn.Module, evaluate: Callable[[nn.Module], T]) -> None:
        self._weights = copy.deepcopy(model)  # one copy, refilled per evaluation
        self._evaluate = evaluate
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataecho-eval")
        self._pending: tuple[Any, Future[T]] | None = None

    def submit(self, model: nn.Module, tag: Any) -> list[tuple[Any, T]]:
        """Evaluate ``model``'s weights as they are now; returns what finished before this.

        Waits for a previous evaluation that is still running (one copy at a time).
        """
        finished = self.wait()
        with torch.no_grad():  # copies into the copy's own tensors: never shared with model
            self._weights.load_state_dict(model.state_dict())
        self._pending = (tag, self._executor.submit(self._run))
        return finished

    def poll(self) -> list[tuple[Any, T]]:
        """The finished evaluation's ``(tag, result)``, if one finished; never blocks.

        An exception raised by the evaluation is raised here, with its traceback.
        """
        if self._pending is None or not self._pending[1].done():
            return []
        return self.wait()

    def wait(self) -> list[tuple[Any, T]]:
        """Block until the running evaluation (if any) is done; its ``(tag, result)``."""
        if self._pending is None:
            return []
        tag, future = self._pending
        self._pending = None
        return [(tag, future.result())]

    @property
    def weights(self) -> nn.Module:
        """The weights of the last submitted evaluation (a copy: training does not touch it);
        take its result first (``wait``), as the next ``submit`` overwrites them."""
        return self._weights

    @property
    def busy(self) -> bool:
        """Whether an evaluation is submitted and its result not yet taken."""
        return self._pending is not None

    def close(self) -> None:
        """Stop the thread; an evaluation still running is finished first (it cannot be cut)."""
        self._pending = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BackgroundEvaluator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> T:
        # Grad mode is per thread: the evaluation thread starts with it on; evaluation
        # functions turn it off themselves, this only keeps stray autograd graphs out.
        with torch.no_grad():
            return self._evaluate(self._weights)
