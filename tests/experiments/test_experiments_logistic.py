"""Logistic-regression problems and loss (experiments.common.logistic)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dataecho.app.sources import fashion_mnist as fm
from experiments.common.logistic import MIN_PIXEL_STD, covertype_like, fashion_mnist, logistic_loss


def test_binary_loss_per_grid_row_matches_torch() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g, dtype=torch.float64)
    y = torch.randint(2, (7,), generator=g)
    w = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    got = logistic_loss(w, x, y)
    assert got.shape == (2, 4)
    for i in range(2):
        for j in range(4):
            ref = F.binary_cross_entropy_with_logits(x @ w[i, j], y.double())
            assert got[i, j] == pytest.approx(float(ref), rel=1e-12)


def test_multinomial_loss_with_leading_axes_and_l2_matches_torch() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 4, generator=g, dtype=torch.float64)  # (seeds, N, d)
    y = torch.randint(3, (2, 9), generator=g)
    w = torch.randn(2, 5, 4, 3, generator=g, dtype=torch.float64)  # (seeds, grid, d, C)
    got = logistic_loss(w, x, y, num_classes=3, l2=0.1)
    assert got.shape == (2, 5)
    for s in range(2):
        for j in range(5):
            ref = F.cross_entropy(x[s] @ w[s, j], y[s]) + 0.05 * w[s, j].pow(2).sum()
            assert got[s, j] == pytest.approx(float(ref), rel=1e-12)


def test_covertype_like_shape_groups_and_seed() -> None:
    p = covertype_like(5000, label_noise=0.1, seed=3)
    assert p.x.shape == (5000, 55) and p.y.shape == (5000,) and p.weight_shape == (55,)
    cont, areas, soils, bias = p.x[:, :10], p.x[:, 10:14], p.x[:, 14:54], p.x[:, 54]
    assert torch.allclose(cont.mean(0), torch.zeros(10), atol=1e-5)
    assert torch.equal(areas.sum(1), torch.ones(5000)) and torch.equal(
        soils.sum(1), torch.ones(5000)
    )
    assert torch.equal(bias, torch.ones(5000)) and set(p.y.tolist()) == {0, 1}
    q = covertype_like(5000, label_noise=0.1, seed=3)
    assert torch.equal(p.x, q.x) and torch.equal(p.y, q.y)
    assert not torch.equal(p.y, covertype_like(5000, label_noise=0.1, seed=4).y)


def test_covertype_like_label_noise_flips_that_fraction() -> None:
    clean = covertype_like(20_000, label_noise=0.0, seed=0)
    noisy = covertype_like(20_000, label_noise=0.3, seed=0)
    assert torch.equal(clean.x, noisy.x)
    assert (clean.y != noisy.y).float().mean() == pytest.approx(0.3, abs=0.02)
    with pytest.raises(ValueError, match=r"label_noise must be in \[0, 0.5\].*0.7"):
        covertype_like(100, label_noise=0.7)


@pytest.mark.skipif(not (fm.DEFAULT_DATA_DIR / fm.FILES["train"][0]).is_file(), reason="no data")
def test_fashion_mnist_problem_shapes_pool_and_scale() -> None:
    p = fashion_mnist(limit=300, pool=2, l2=1e-4)
    assert p.x.shape == (300, 14 * 14 + 1) and p.weight_shape == (197, 10)
    assert float(p.x[:, :-1].min()) >= 0 and float(p.x[:, :-1].max()) <= 1
    assert p.num_classes == 10 and p.l2 == 1e-4 and int(p.y.max()) <= 9
    full = fashion_mnist(limit=300)
    assert full.x.shape == (300, 785)
    # Pooling averages 2x2 blocks: the first pooled pixel is the mean of the 2x2 corner.
    corner = full.x[:, [0, 1, 28, 29]].mean(1)
    assert torch.allclose(p.x[:, 0], corner, atol=1e-6)


@pytest.mark.skipif(not (fm.DEFAULT_DATA_DIR / fm.FILES["train"][0]).is_file(), reason="no data")
def test_fashion_mnist_standardize_zscores_pixels_and_keeps_the_bias() -> None:
    raw = fashion_mnist(limit=2000, pool=4)
    p = fashion_mnist(limit=2000, pool=4, standardize=True)
    assert "standardized" in p.name and torch.equal(p.y, raw.y)
    pix, raw_pix = p.x[:, :-1], raw.x[:, :-1]
    assert torch.allclose(pix.mean(0), torch.zeros(49), atol=1e-5)
    # Unit std where the pixel varies enough; the floor (not a blow-up) where it barely varies.
    sd = raw_pix.std(0)
    varied = sd >= MIN_PIXEL_STD
    assert torch.allclose(pix.std(0)[varied], torch.ones(int(varied.sum())), atol=1e-4)
    expected = (raw_pix - raw_pix.mean(0)) / sd.clamp_min(MIN_PIXEL_STD)
    assert torch.allclose(pix, expected, atol=1e-5) and torch.equal(p.x[:, -1], torch.ones(2000))
