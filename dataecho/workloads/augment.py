"""Per-example image augmentation: random pad-and-crop and horizontal flip, then normalisation.

Randomness comes from torch's *global* RNG on purpose: ``EchoingDataLoader`` scopes the global
RNGs per worker and seeds them from the loader's seed, so a seeded loader augments the same way
every run and a resumed one continues the same stream. (An RNG owned by the transform would be
hidden state the loader cannot checkpoint.)

Cost: a handful of small tensor ops, about 10-20 us per 28x28 example on one core.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataecho import _validate

# Pixel mean and standard deviation of the Fashion-MNIST training images, on a 0..1 scale.
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


def normalize(
    images: torch.Tensor, mean: float = FASHION_MNIST_MEAN, std: float = FASHION_MNIST_STD
) -> torch.Tensor:
    """Float32 ``(x - mean) / std``, reading uint8 as 0..255 and floats as already 0..1."""
    scale = 1.0 / std
    if images.dtype == torch.uint8:
        scale /= 255.0
    return images.to(torch.float32).mul_(scale).sub_(mean / std)


class Augment:
    """Random shift by up to ``pad`` pixels (zero-padded, as pad-then-crop) and left-right flip.

    Call it on an image tensor ``(C, H, W)`` (uint8 0..255 or float 0..1) or on an example
    ``(image, label, ...)``, whose first element it augments and whose rest it passes through;
    it returns float32 normalised with ``mean``/``std``. The input is never changed in place.

    Args:
        pad: maximum shift in pixels per axis (0: no shift).
        flip: flip left-right with probability 1/2.
        mean, std: normalisation, on the 0..1 pixel scale (defaults: Fashion-MNIST's).
    """

    def __init__(
        self,
        pad: int = 2,
        flip: bool = True,
        mean: float = FASHION_MNIST_MEAN,
        std: float = FASHION_MNIST_STD,
    ) -> None:
        self.pad = _validate.non_negative_int(pad, name="pad", hint="use 0 for no shift")
        self.flip = bool(flip)
        self.mean, self.std = float(mean), float(std)
        self._lut = ((np.arange(256) / 255.0 - self.mean) / self.std).astype(np.float32)

    def __call__(self, example: Any) -> Any:
        if isinstance(example, (tuple, list)):
            return (self.image(example[0]), *example[1:])
        return self.image(example)

    def image(self, image: torch.Tensor) -> torch.Tensor:
        """One augmented, normalised copy of ``image`` (C, H, W)."""
        if image.dim() != 3:
            raise ValueError(
                f"Augment expects one image of shape (C, H, W), got shape {tuple(image.shape)}; "
                f"augment examples one at a time (batches are not supported)"
            )
        if self.pad >= min(image.shape[1:]):
            raise ValueError(
                f"pad={self.pad} shifts the whole {tuple(image.shape[1:])} image out of view; "
                f"use a pad below {min(image.shape[1:])} (2-4 is usual for 28x28)"
            )
        # One RNG call for all draws, then numpy: per-op overhead is ~1 us in numpy against
        # ~4 us in torch, and this runs once per emitted example (echoed copies included).
        side = 2 * self.pad + 1
        draw = int(torch.randint(0, 2 * side * side, ()).item())
        flip, dy, dx = (
            draw // (side * side),
            (draw // side) % side - self.pad,
            draw % side - self.pad,
        )
        src = image.numpy()
        if image.dtype == torch.uint8:
            src = self._lut[src]  # normalised through a 256-entry table: one gather
        else:
            src = (src.astype(np.float32) - self.mean) / self.std
        if self.flip and flip:
            src = src[..., ::-1]
        if dy == 0 and dx == 0:
            return torch.from_numpy(np.ascontiguousarray(src))
        # Pad-then-crop at offset (pad+dy, pad+dx): output pixel (i, j) is input (i+dy, j+dx);
        # pixels from outside the image are padding, a zero pixel normalised.
        _, h, w = src.shape
        out = np.full(src.shape, -self.mean / self.std, dtype=np.float32)
        out[:, max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)] = src[
            :, max(dy, 0) : h - max(-dy, 0), max(dx, 0) : w - max(-dx, 0)
        ]
        return torch.from_numpy(out)
