"""L-BFGS optimum (experiments.common.optimum) against Newton's method on tiny problems."""

from __future__ import annotations

import pytest
import torch

from experiments.common.logistic import LogisticProblem, covertype_like, logistic_loss
from experiments.common.optimum import lbfgs_optimum


def newton(problem: LogisticProblem, iters: int = 30) -> torch.Tensor:
    """Reference: damped-free Newton on the flattened weights (tiny, strongly convex)."""
    x = problem.x.double()
    shape = problem.weight_shape

    def f(v):
        return logistic_loss(v.view(shape), x, problem.y, problem.num_classes, problem.l2)

    v = torch.zeros(torch.Size(shape).numel(), dtype=torch.float64)
    for _ in range(iters):
        g = torch.autograd.functional.jacobian(f, v)
        h = torch.autograd.functional.hessian(f, v)
        v = v - torch.linalg.solve(h, g)
    return v.view(shape)


def test_binary_optimum_matches_newton() -> None:
    p = covertype_like(400, label_noise=0.2, seed=1)
    # Drop the bias column: one-hot groups already sum to 1, so the Hessian is singular with it.
    p = LogisticProblem("tiny", p.x[:, :-1], p.y, l2=1e-3)
    opt = lbfgs_optimum(p)
    ref = newton(p)
    ref_loss = float(logistic_loss(ref, p.x.double(), p.y, 2, p.l2))
    assert opt.loss == pytest.approx(ref_loss, rel=1e-10)
    assert opt.grad_norm < 1e-6 and opt.w.dtype == torch.float64
    # l2-strong convexity: |w - w*| <= |grad(w)| / l2 (rare one-hot weights are flat).
    assert float((opt.w - ref).norm()) <= opt.grad_norm / p.l2 + 1e-9


def test_multinomial_optimum_matches_newton() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(300, 3, generator=g), torch.ones(300, 1)], 1)
    y = torch.randint(3, (300,), generator=g)
    p = LogisticProblem("tiny-multi", x, y, num_classes=3, l2=1e-2)
    opt = lbfgs_optimum(p)
    ref = newton(p)
    assert opt.w.shape == (4, 3)
    assert torch.allclose(opt.w, ref, atol=1e-6)
    assert opt.loss == pytest.approx(float(logistic_loss(ref, x.double(), y, 3, 1e-2)), rel=1e-12)
