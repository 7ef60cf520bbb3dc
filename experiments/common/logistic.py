"""Logistic-regression problems: the loss, a CoverType-like synthetic set, Fashion-MNIST.

Weights may carry leading grid axes: binary ``w`` is ``(..., d)``, multinomial ``(..., d, C)``,
and :func:`logistic_loss` returns one loss per grid row (shape ``...``), so a learning-rate
sweep is one batched tensor computation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from dataecho import _validate

COVERTYPE_ROWS = 581_012
COVERTYPE_CONTINUOUS = 10  # elevation, aspect, slope, distances, hillshades
COVERTYPE_AREAS = 4  # wilderness areas (one-hot)
COVERTYPE_SOILS = 40  # soil types (one-hot)
MIN_PIXEL_STD = 0.01  # floor of a pixel's std (pixels / 255) when standardizing


def logistic_loss(
    w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_classes: int = 2, l2: float = 0.0
) -> torch.Tensor:
    """Mean logistic loss of ``w`` on ``(x, y)`` per grid row, plus ``l2/2 * ||w||^2``.

    ``x`` is ``(N, d)`` or ``(*lead, N, d)`` with ``y`` ``(N,)`` or ``(*lead, N)``; ``w`` is
    ``(*lead, *grid, d)`` (binary, labels in {0, 1}, loss ``softplus(z) - y*z``) or
    ``(*lead, *grid, d, C)`` (softmax cross-entropy); the result is ``(*lead, *grid)``.
    Each product is one (batched) matrix multiply: no broadcast copies of ``x``.
    """
    lead = x.shape[:-2]
    n, d = x.shape[-2:]
    if num_classes == 2:
        grid = w.shape[len(lead) : -1]
        z = (w.reshape(*lead, -1, d) @ x.mT).view(*lead, *grid, n)
        y = y.reshape(*lead, *[1] * len(grid), n)
        loss = (F.softplus(z) - y.to(z.dtype) * z).mean(-1)
        reg_dims: tuple[int, ...] = (-1,)
    else:
        grid = w.shape[len(lead) : -2]
        flat = w.movedim(-2, len(lead)).reshape(*lead, d, -1)  # (*lead, d, grid*C)
        z = (x @ flat).view(*lead, n, *grid, num_classes).movedim(len(lead), -2)
        y = y.reshape(*lead, *[1] * len(grid), n, 1).expand(*z.shape[:-1], 1)
        loss = (torch.logsumexp(z, -1) - z.gather(-1, y).squeeze(-1)).mean(-1)
        reg_dims = (-2, -1)
    if l2:
        loss = loss + 0.5 * l2 * w.pow(2).sum(reg_dims)
    return loss


@dataclasses.dataclass(frozen=True)
class LogisticProblem:
    """Features ``x`` (N, d), bias column included; labels ``y`` (N,) int64 in 0..C-1."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int = 2
    l2: float = 0.0

    @property
    def weight_shape(self) -> tuple[int, ...]:
        d = self.x.shape[1]
        return (d,) if self.num_classes == 2 else (d, self.num_classes)

    def loss(self, w: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
        """Loss per grid row on all examples, or on the rows ``idx`` (a minibatch)."""
        x, y = (self.x, self.y) if idx is None else (self.x[idx], self.y[idx])
        return logistic_loss(w, x.to(w.dtype), y, self.num_classes, self.l2)

    def to(self, dtype: torch.dtype) -> LogisticProblem:
        return dataclasses.replace(self, x=self.x.to(dtype))


def covertype_like(
    n: int = COVERTYPE_ROWS, *, label_noise: float = 0.1, signal: float = 1.0, seed: int = 0
) -> LogisticProblem:
    """A synthetic binary problem shaped like CoverType (LIBSVM ``covtype.binary``).

    54 features as in CoverType: 10 correlated continuous ones (standardised) and two one-hot
    groups (4 wilderness areas, 40 soil types, both with skewed frequencies), plus a bias
    column (d = 55). Labels are drawn from a logistic model with a random true weight
    (``signal`` scales its logits), then a fraction ``label_noise`` of them is flipped, so the
    optimum loss is bounded away from 0 and the problem is not separable. Seeded: the same
    arguments give the same tensors.
    """
    n = _validate.positive_int(n, name="n", hint="number of rows, e.g. 581012")
    if not 0.0 <= label_noise <= 0.5:
        raise ValueError(f"label_noise must be in [0, 0.5] (fraction flipped), got {label_noise}")
    g = torch.Generator().manual_seed(_validate.seed(seed) or 0)
    mix = torch.randn(COVERTYPE_CONTINUOUS, COVERTYPE_CONTINUOUS, generator=g)
    cont = torch.randn(n, COVERTYPE_CONTINUOUS, generator=g) @ mix
    cont = (cont - cont.mean(0)) / cont.std(0)

    def one_hot_group(size: int) -> torch.Tensor:
        # Cubed uniforms: a few common categories and many rare ones, as in CoverType.
        weights = torch.rand(size, generator=g).pow(3) + 1e-3
        codes = torch.multinomial(weights / weights.sum(), n, replacement=True, generator=g)
        return F.one_hot(codes, size).float()

    x = torch.cat(
        [cont, one_hot_group(COVERTYPE_AREAS), one_hot_group(COVERTYPE_SOILS), torch.ones(n, 1)],
        dim=1,
    )
    w_true = torch.randn(x.shape[1], generator=g) * signal
    p = torch.sigmoid(x @ w_true)
    y = (torch.rand(n, generator=g) < p).long()
    flip = torch.rand(n, generator=g) < label_noise
    y = torch.where(flip, 1 - y, y)
    return LogisticProblem(f"covertype-like(n={n}, noise={label_noise})", x, y)


def fashion_mnist(
    data_dir: str | Path | None = None,
    *,
    limit: int | None = None,
    pool: int = 1,
    l2: float = 0.0,
    standardize: bool = False,
) -> LogisticProblem:
    """Multinomial logistic regression on Fashion-MNIST train pixels / 255, plus a bias column.

    ``limit`` keeps the first ``limit`` images (quick runs); ``pool`` averages ``pool x pool``
    pixel blocks (2: 14x14 images, d = 197, four times cheaper); ``l2`` adds
    ``l2/2 * ||W||^2``. ``standardize`` z-scores every pixel over the kept images (its std
    floored at :data:`MIN_PIXEL_STD`), the usual preprocessing for a linear model: raw pixels
    share one large mean direction, which makes the loss far worse conditioned.
    """
    from dataecho.app.sources import fashion_mnist as fm

    images, labels = fm.load_split(data_dir or fm.DEFAULT_DATA_DIR, "train")
    if limit is not None:
        limit = _validate.positive_int(limit, name="limit", hint="or None for all 60,000")
        images, labels = images[:limit], labels[:limit]
    pool = _validate.positive_int(pool, name="pool", hint="1 keeps the 28x28 pixels")
    x = torch.from_numpy(images).float().unsqueeze(1) / 255.0
    x = F.avg_pool2d(x, pool).flatten(1) if pool > 1 else x.flatten(1)
    if standardize:
        # The floor keeps near-constant border pixels from being blown up into huge features.
        x = (x - x.mean(0)) / x.std(0).clamp_min(MIN_PIXEL_STD)
    x = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    std = ", standardized" if standardize else ""
    name = f"fashion-mnist(n={len(x)}, pool={pool}, l2={l2:g}{std})"
    return LogisticProblem(name, x, torch.from_numpy(labels), len(fm.CLASSES), l2)
