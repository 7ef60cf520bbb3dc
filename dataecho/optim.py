"""Echo(A, K) of Agarwal et al. 2020: K steps of a base method A on each fresh batch's loss.

    opt = EchoedGD([w], lr=0.1, k=4)
    for xb, yb in batches:                      # one fresh batch from the (slow) pipeline
        opt.fresh_batch(lambda: loss(w, xb, yb))  # K steps on that batch, from the current state

``lr`` (and ``gamma``, ``momentum``) may be a float or a tensor that broadcasts against every
parameter: a column of step sizes over a leading "grid" axis runs a whole learning-rate sweep in
one tensor computation (the closure then returns the *sum* of the rows' losses, so each row gets
its own gradient). Fresh batches and steps are counted separately because they are separate
resources: fresh samples = ``batch_size * fresh_batches``, compute = ``steps = k * fresh_batches``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch

from dataecho import _validate
from dataecho.errors import DataechoTypeError, DataechoValueError

Closure = Callable[[], torch.Tensor]
Scalar = float | torch.Tensor


def _positive(value: object, *, name: str) -> Scalar:
    """A float > 0 or a tensor of them (a grid of values); a clear error otherwise."""
    if isinstance(value, torch.Tensor):
        if not (torch.isfinite(value).all() and (value > 0).all()):
            raise DataechoValueError(f"every entry of {name} must be finite and > 0, got {value}")
        return value.detach()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(f"{name} must be a float > 0 or a tensor of them, got {value!r}")
    if not (math.isfinite(value) and float(value) > 0):  # the float is what is used
        raise DataechoValueError(f"{name} must be finite and > 0 (e.g. 0.1), got {value!r}")
    return float(value)


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p.grad`` in an update: the step's ``backward()`` set it (the loss depends on ``p``)."""
    return cast(torch.Tensor, p.grad)


class EchoedOptimizer:
    """Base of the echoed optimizers: the K-step loop and the accounting.

    Subclasses define :meth:`_start` (called when a fresh batch arrives) and :meth:`_update`
    (one step of A, given ``p.grad``), and keep any state in ``self.state`` (a dict of lists of
    tensors, one per parameter) so :meth:`get_state` / :meth:`reset` capture all of it.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: Scalar, k: int) -> None:
        self.params = list(params)
        if not self.params or not all(p.requires_grad for p in self.params):
            raise DataechoValueError(
                "params must be a non-empty list of tensors with requires_grad=True, got "
                f"{len(self.params)} tensor(s); create them with torch.zeros(..., requires_grad"
                "=True) or pass model.parameters()"
            )
        self.lr = _positive(lr, name="lr")
        self.k = _validate.positive_int(k, name="k", hint="k = optimizer steps per fresh batch")
        self.steps = 0
        self.fresh_batches = 0
        self.state: dict[str, list[torch.Tensor]] = {}

    def fresh_batch(self, closure: Closure) -> torch.Tensor:
        """Take ``k`` steps on the loss ``closure()`` of one fresh batch; return the k losses.

        ``closure`` computes the batch loss (a scalar tensor) from the current parameters; it
        is called once per step, before that step's update.
        """
        self._start()
        losses = []
        for _ in range(self.k):
            for p in self.params:
                p.grad = None
            with torch.enable_grad():
                loss = closure()
            loss.backward()
            with torch.no_grad():
                self._update()
            self.steps += 1
            losses.append(loss.detach())
        self.fresh_batches += 1
        return torch.stack(losses)

    def _start(self) -> None:
        pass

    def _update(self) -> None:
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """Counters and buffers (copies): pass to :meth:`reset` to resume exactly."""
        return {
            "steps": self.steps,
            "fresh_batches": self.fresh_batches,
            "state": {key: [t.clone() for t in ts] for key, ts in self.state.items()},
        }

    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Zero the counters and buffers (``state=None``) or restore a :meth:`get_state`.

        The parameters themselves are the caller's: they are not touched.
        """
        state = state or {"steps": 0, "fresh_batches": 0, "state": {}}
        self.steps = int(state["steps"])
        self.fresh_batches = int(state["fresh_batches"])
        self.state = {key: [t.clone() for t in ts] for key, ts in state["state"].items()}


class EchoedGD(EchoedOptimizer):
    """Echo(GD, K): echoed minibatch SGD. Each step: ``w -= lr * grad batch_loss(w)``.

    The theory's step size shrinks with K once the statistical term dominates
    (eta = min(1/beta, D*sqrt(B)/(2*rho*K*sqrt(T)))), so tune ``lr`` for each K.
    """

    def _update(self) -> None:
        for p in self.params:
            p.sub_(self.lr * _grad(p))


class EchoedProxGD(EchoedOptimizer):
    """Echo(proximal GD, K): K GD steps on ``batch_loss(w) + ||w - anchor||^2 / (2*gamma)``.

    ``anchor`` is the iterate where the fresh batch arrived. The K steps approach the proximal
    point ``prox_{gamma * batch_loss}(anchor)``, which is a stable step for any K, so ``gamma``
    (the step size of the method) need not shrink as K grows. ``gamma=None`` means
    ``gamma = lr``: then every inner step is ``w = anchor - lr * grad batch_loss(w)``, a
    fixed-point iteration for that proximal point (it contracts while ``lr * beta < 1``). With
    ``k=1``, or ``gamma`` huge, it is plain (echoed) GD.
    """

    def __init__(
        self, params: Iterable[torch.Tensor], lr: Scalar, k: int, gamma: Scalar | None = None
    ) -> None:
        super().__init__(params, lr, k)
        self.gamma = self.lr if gamma is None else _positive(gamma, name="gamma")

    def _start(self) -> None:
        self.state["anchor"] = [p.detach().clone() for p in self.params]

    def _update(self) -> None:
        for p, anchor in zip(self.params, self.state["anchor"], strict=True):
            p.sub_(self.lr * (_grad(p) + (p - anchor) / self.gamma))


class EchoedNesterov(EchoedOptimizer):
    """Echo(Nesterov AGD, K): accelerated GD on each batch loss; the momentum carries over.

    Parameters hold the look-ahead point ``x`` where gradients are taken::

        y_next = x - lr * grad;  x = y_next + mu_t * (y_next - y);  y = y_next

    ``momentum=None`` uses the accelerated schedule ``mu_t = t / (t + 3)`` over all steps t
    (the O(1/(K*T)^2) curvature rate of the paper's quadratic analysis); a float (or a grid
    tensor) is a constant momentum, steadier under gradient noise.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: Scalar,
        k: int,
        momentum: Scalar | None = None,
    ) -> None:
        super().__init__(params, lr, k)
        if momentum is not None:
            mu = momentum if isinstance(momentum, torch.Tensor) else torch.tensor(momentum)
            if not ((mu >= 0).all() and (mu < 1).all()):
                raise DataechoValueError(f"momentum must be in [0, 1) (e.g. 0.9), got {momentum!r}")
        self.momentum = momentum

    def _update(self) -> None:
        if "y" not in self.state:
            self.state["y"] = [p.detach().clone() for p in self.params]
        t = self.steps
        mu = t / (t + 3) if self.momentum is None else self.momentum
        for p, y in zip(self.params, self.state["y"], strict=True):
            y_next = p - self.lr * _grad(p)
            p.copy_(y_next + mu * (y_next - y))
            y.copy_(y_next)


__all__ = ["EchoedGD", "EchoedNesterov", "EchoedOptimizer", "EchoedProxGD"]
