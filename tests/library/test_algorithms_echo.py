"""Echoed optimizers (dataecho.optim) on least squares, where the optimum is known."""

from __future__ import annotations

import pytest
import torch

from dataecho.optim import EchoedGD, EchoedNesterov, EchoedProxGD


def least_squares(n: int = 40, d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g, dtype=torch.float64)
    b = a @ torch.randn(d, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    w_star = torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1)
    smooth = float(torch.linalg.eigvalsh(a.T @ a / n)[-1])  # beta of mean 0.5*(a w - b)^2
    return a, b, w_star, smooth


def loss(w, a, b):
    return 0.5 * (a @ w - b).pow(2).mean()


@pytest.mark.parametrize(
    "make",
    [
        lambda p, lr: EchoedGD(p, lr, k=3),
        lambda p, lr: EchoedProxGD(p, lr, k=3),
        lambda p, lr: EchoedProxGD(p, lr, k=3, gamma=10 * lr),
        lambda p, lr: EchoedNesterov(p, lr, k=3),
        lambda p, lr: EchoedNesterov(p, lr, k=3, momentum=0.8),
    ],
    ids=["gd", "prox", "prox-gamma", "nesterov-schedule", "nesterov-0.8"],
)
def test_full_batch_echo_converges_to_least_squares_optimum(make) -> None:
    a, b, w_star, beta = least_squares()
    w = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = make([w], 0.5 / beta)
    for _ in range(300):
        opt.fresh_batch(lambda: loss(w, a, b))
    assert torch.allclose(w.detach(), w_star, atol=1e-6), (w, w_star)
    assert opt.steps == 900 and opt.fresh_batches == 300


def test_k1_echoed_gd_is_sgd_step_by_step() -> None:
    a, b, _, beta = least_squares(n=64)
    w1 = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    w2 = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    echo, sgd = EchoedGD([w1], 0.3 / beta, k=1), torch.optim.SGD([w2], lr=0.3 / beta)
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        idx = torch.randint(64, (8,), generator=g)
        losses = echo.fresh_batch(lambda idx=idx: loss(w1, a[idx], b[idx]))
        sgd.zero_grad()
        ref = loss(w2, a[idx], b[idx])
        ref.backward()
        sgd.step()
        assert losses.shape == (1,) and float(losses[0]) == pytest.approx(
            float(ref.detach()), rel=1e-12
        )
        assert torch.allclose(w1, w2, rtol=1e-12, atol=1e-14)


def test_prox_with_huge_gamma_is_echoed_gd() -> None:
    a, b, _, beta = least_squares()
    w1 = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    w2 = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    gd, prox = EchoedGD([w1], 0.5 / beta, k=4), EchoedProxGD([w2], 0.5 / beta, k=4, gamma=1e12)
    for t in range(20):
        idx = torch.arange(t % 4 * 10, t % 4 * 10 + 10)
        gd.fresh_batch(lambda idx=idx: loss(w1, a[idx], b[idx]))
        prox.fresh_batch(lambda idx=idx: loss(w2, a[idx], b[idx]))
    assert torch.allclose(w1, w2, rtol=1e-8, atol=1e-10)


def test_prox_with_many_steps_reaches_the_proximal_point() -> None:
    # K steps on batch_loss(w) + |w - anchor|^2/(2 gamma) -> its closed-form minimiser.
    a, b, _, beta = least_squares()
    gamma = 0.5 / beta
    w = torch.ones(5, dtype=torch.float64, requires_grad=True)
    anchor = w.detach().clone()
    EchoedProxGD([w], gamma, k=200).fresh_batch(lambda: loss(w, a, b))
    n = len(b)
    lhs = a.T @ a / n + torch.eye(5, dtype=torch.float64) / gamma
    prox_point = torch.linalg.solve(lhs, a.T @ b / n + anchor / gamma)
    assert torch.allclose(w.detach(), prox_point, atol=1e-9)
    # ... which is not the batch optimum: the anchor keeps the step short.
    assert not torch.allclose(prox_point, least_squares()[2], atol=1e-3)


def test_step_counts_are_k_times_fresh_batches() -> None:
    a, b, _, beta = least_squares()
    for k in (1, 2, 7):
        w = torch.zeros(5, dtype=torch.float64, requires_grad=True)
        opt = EchoedNesterov([w], 0.1 / beta, k=k)
        for _ in range(6):
            assert opt.fresh_batch(lambda w=w: loss(w, a, b)).shape == (k,)
        assert (opt.fresh_batches, opt.steps) == (6, 6 * k)


def test_a_grid_of_rates_equals_separate_runs() -> None:
    a, b, _, beta = least_squares()
    lrs = torch.tensor([0.1, 0.4, 0.9], dtype=torch.float64) / beta
    grid = torch.zeros(3, 5, dtype=torch.float64, requires_grad=True)
    opt = EchoedNesterov([grid], lrs.view(3, 1), k=2, momentum=0.5)
    for _ in range(10):
        opt.fresh_batch(lambda: sum(loss(grid[i], a, b) for i in range(3)))
    for i in range(3):
        w = torch.zeros(5, dtype=torch.float64, requires_grad=True)
        single = EchoedNesterov([w], float(lrs[i]), k=2, momentum=0.5)
        for _ in range(10):
            single.fresh_batch(lambda w=w: loss(w, a, b))
        assert torch.allclose(grid[i], w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls", [EchoedProxGD, EchoedNesterov])
def test_get_state_and_reset_resume_exactly(cls) -> None:
    a, b, _, beta = least_squares()

    def run(opt, w, batches):
        for t in batches:
            idx = torch.arange(t % 4 * 10, t % 4 * 10 + 10)
            opt.fresh_batch(lambda idx=idx: loss(w, a[idx], b[idx]))

    w = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = cls([w], 0.3 / beta, k=3)
    run(opt, w, range(5))
    state, saved_w = opt.get_state(), w.detach().clone()
    run(opt, w, range(5, 10))
    w2 = saved_w.clone().requires_grad_(True)
    opt2 = cls([w2], 0.3 / beta, k=3)
    opt2.reset(state)
    run(opt2, w2, range(5, 10))
    assert torch.equal(w, w2) and opt2.steps == opt.steps == 30
    opt2.reset()
    assert (opt2.steps, opt2.fresh_batches, opt2.state) == (0, 0, {})


def test_invalid_arguments_name_the_value_and_the_fix() -> None:
    w = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"lr must be finite and > 0.*-0\.1"):
        EchoedGD([w], -0.1, k=2)
    with pytest.raises(ValueError, match="every entry of lr"):
        EchoedGD([w], torch.tensor([0.1, 0.0]), k=2)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        EchoedGD([w], 0.1, k=0)
    with pytest.raises(TypeError, match="lr must be a float"):
        EchoedGD([w], "0.1", k=1)
    with pytest.raises(ValueError, match="requires_grad=True"):
        EchoedGD([torch.zeros(3)], 0.1, k=1)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\).*1\.5"):
        EchoedNesterov([w], 0.1, k=1, momentum=1.5)


def test_echo_is_the_stream_stage_and_the_optimizers_are_echoed() -> None:
    import dataecho
    import dataecho.optim
    from dataecho.stages import Echo as EchoStage

    assert issubclass(EchoedGD, dataecho.optim.EchoedOptimizer)
    # The package's own Echo is the stream stage; the optimizers' module has no Echo.
    assert dataecho.Echo is EchoStage
    assert not hasattr(dataecho.optim, "Echo")
    with pytest.raises(AttributeError, match="no attribute 'Echoed'"):
        _ = dataecho.optim.Echoed
