"""Per-example image augmentation: random pad-and-crop and horizontal flip, then normalisation.

Randomness comes from torch's *global* RNG on purpose: ``EchoingDataLoader`` scopes the global
RNGs per worker and seeds them from the loader's seed, so a seeded loader augments the same way
every run and a resumed one continues the same stream. (An RNG owned by the transform would be
hidden state the loader cannot checkpoint.)

How: every (flip, dy, dx) combination is one fixed index map over the pixels, with pixels
from outside the image reading a padding slot. The maps are precomputed once per image shape,
so an example costs one random draw and two numpy gathers (pick the pixels, then normalise
them through a 256-entry table), both with ``ndarray.take`` on a view of the map, which skips
the Python-level checks of numpy's general fancy indexing. It runs once per *emitted* example
when echoing before augmentation, so with echo factor e it costs e times as much per fresh
example.

A whole batch ``(B, C, H, W)`` is augmented in one call, each example with its own draw: one
``randint`` for the batch, then the library's batched shift and flip
(:class:`dataecho.augment.ShiftFlip`, which numbers the draws as the index maps here do) and one
normalisation of the whole batch, instead of a call from Python for each example. That is what
``EchoingDataLoader``'s ``batch_transform`` is for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataecho import _validate
from dataecho.augment import ShiftFlip
from dataecho.errors import DataechoValueError

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

    Call it on an image tensor ``(C, H, W)`` (uint8 0..255 or float 0..1), a batch of them
    ``(B, C, H, W)`` (each example drawn independently), or an example or batch
    ``(images, labels, ...)``, whose first element it augments and whose rest it passes
    through; it returns float32 normalised with ``mean``/``std``. The input is never changed
    in place.

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
        # uint8 pixel value -> normalised float, so normalising is one gather.
        self._lut = ((np.arange(256) / 255.0 - self.mean) / self.std).astype(np.float32)
        self._tables: dict[tuple[int, ...], np.ndarray] = {}  # image shape -> index maps
        self._shift_flip = ShiftFlip(self.pad, self.flip)

    def __call__(self, example: Any) -> Any:
        if isinstance(example, (tuple, list)):
            return (self.image(example[0]), *example[1:])
        return self.image(example)

    def image(self, image: torch.Tensor) -> torch.Tensor:
        """An augmented, normalised copy of ``image`` (C, H, W) or of each in (B, C, H, W)."""
        if image.dim() not in (3, 4):
            raise DataechoValueError(
                f"Augment expects an image (C, H, W) or a batch (B, C, H, W), got shape "
                f"{tuple(image.shape)}; add a channel axis with image.unsqueeze(-3)"
            )
        shape = tuple(image.shape[-3:])
        if self.pad >= min(shape[1:]):
            raise DataechoValueError(
                f"pad={self.pad} shifts the whole {shape[1:]} image out of view; "
                f"use a pad below {min(shape[1:])} (2-4 is usual for 28x28)"
            )
        if image.dim() == 4:  # a batch: one draw each, then batched torch ops
            draws = torch.randint(0, self._shift_flip.choices, (len(image),))
            return normalize(self._shift_flip.apply(image, draws), self.mean, self.std)
        table = self._tables.get(shape)
        if table is None:
            table = self._tables[shape] = _index_maps(shape, self.pad, self.flip)
        # One example: the cheapest path (see the module docstring).
        flat = image.contiguous().numpy().ravel()
        # One slot past the end holds a zero pixel: what every out-of-image read gets.
        padded = np.zeros(flat.size + 1, flat.dtype)
        padded[:-1] = flat
        picked = padded.take(table[int(torch.randint(0, len(table), ()))])
        if image.dtype == torch.uint8:
            out = self._lut.take(picked)
        else:
            out = (picked.astype(np.float32) - self.mean) / self.std
        return torch.from_numpy(out.reshape(image.shape))


def _index_maps(shape: tuple[int, ...], pad: int, flip: bool) -> np.ndarray:
    """Row k: for each output pixel, the flat input index it reads under draw k (or the pad slot).

    Draw k covers (flipped?, dy, dx); output pixel (c, i, j) reads input (c, i + dy, j + dx)
    of the (flipped) image, which is what cropping a ``pad``-padded image at (pad+dy, pad+dx)
    gives.
    """
    c, h, w = shape
    n = c * h * w
    ci, ii, jj = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    rows = []
    for flipped in (False, True) if flip else (False,):
        for dy in range(-pad, pad + 1):
            for dx in range(-pad, pad + 1):
                si, sj = ii + dy, jj + dx
                inside = (si >= 0) & (si < h) & (sj >= 0) & (sj < w)
                if flipped:
                    sj = w - 1 - sj
                rows.append(np.where(inside, (ci * h + si) * w + sj, n).reshape(-1))
    return np.stack(rows).astype(np.intp)
