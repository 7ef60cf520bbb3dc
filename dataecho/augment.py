"""Batched image augmentation with per-sample random parameters, on any device.

Each op is a callable ``op(batch, generator=None) -> batch``. ``batch`` is a tensor
``[N, C, H, W]`` (float or uint8; the dtype is kept) or an ``(inputs, targets, ...)`` tuple or
list whose first element is such a tensor: the op augments the inputs only and returns the same
kind of sequence. Every sample of the batch gets its own random parameters, drawn from
``generator`` (a ``torch.Generator`` on the batch's device; ``None``: torch's default generator
for that device), so a seeded generator gives the same output every run and restoring its state
(``generator.set_state``) replays the same draws. The ops run as a few batched torch calls, with
no Python loop over the samples, and never change or return their input: the output is new
memory, so two augmented copies of one batch never alias.

- :class:`ShiftFlip`: shift by up to ``pad`` pixels (zero fill, as pad-then-crop) and flip
  left-right; the demo's per-example augmentation, without its normalisation.
- :class:`RandomResizedCrop`: the ImageNet-style crop of random area and aspect ratio,
  resized bilinearly to ``size``.
- :class:`Compose`: ops in sequence, sharing one generator.

kornia's augmentations are not used because they draw their parameters from torch's global
generators (they accept no ``torch.Generator``), which a loader cannot own and checkpoint.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dataecho.errors import DataechoError

Op = Callable[..., Any]


class AugmentError(DataechoError, ValueError):
    """An augmentation argument or input batch with a value or shape the op cannot use."""


class AugmentTypeError(DataechoError, TypeError):
    """An augmentation argument or input batch of the wrong type."""


class ShiftFlip:
    """Shift each image by up to ``pad`` pixels per axis and flip it left-right at random.

    Output pixel ``(i, j)`` of a sample is pixel ``(i + dy, j + dx)`` of the (flipped) input, 0
    where that falls outside, with ``dy, dx`` uniform in ``-pad..pad`` and a flip with
    probability 1/2 (when ``flip``). The ``(flipped, dy, dx)`` combinations are numbered as in
    :class:`dataecho.app.workloads.image_augment.Augment`: draw ``k`` in ``0..choices-1`` means
    ``flipped, dy, dx = k // s**2, k // s % s - pad, k % s - pad`` with ``s = 2 * pad + 1``. One
    draw per sample comes from ``torch.randint(0, choices, (N,))``, so a generator seeded like
    that transform's global RNG picks the same shifts and flips. ``sample`` and ``apply`` are
    the two halves of a call, for drawing the parameters once and applying them elsewhere.
    """

    def __init__(self, pad: int = 2, flip: bool = True) -> None:
        # int (float) first in these checks: type checkers take numbers.Integral (numbers.Real)
        # as unrelated to int (float), and would skip the rest of the method as unreachable.
        if isinstance(pad, bool) or not isinstance(pad, (int, numbers.Integral)):
            raise AugmentTypeError(f"pad must be an int >= 0, got {pad!r}; use e.g. pad=2")
        if pad < 0:
            raise AugmentError(f"pad must be >= 0 pixels, got {pad}; use pad=0 for no shift")
        if not isinstance(flip, bool):
            raise AugmentTypeError(f"flip must be True or False, got {flip!r}")
        self.pad, self.flip = int(pad), flip
        self.choices = (2 if flip else 1) * (2 * self.pad + 1) ** 2

    def __repr__(self) -> str:
        return f"ShiftFlip(pad={self.pad}, flip={self.flip})"

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        return _on_inputs(batch, lambda images: self._augment(images, generator), self, generator)

    def sample(
        self,
        n: int,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``n`` draws in ``0..choices-1``, one per sample: the parameters :meth:`apply` takes."""
        return torch.randint(0, self.choices, (n,), generator=generator, device=device)

    def apply(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """``images`` shifted and flipped as ``draws`` (one per sample, from :meth:`sample`) say."""
        n, c, h, w = images.shape
        p, side, draws = self.pad, 2 * self.pad + 1, draws.to(images.device)
        flipped, dy, dx = draws // (side * side), draws // side % side - p, draws % side - p
        rows = torch.arange(h, device=images.device) + (dy + p)[:, None]  # rows of the padded image
        cols = torch.arange(w, device=images.device) + dx[:, None]
        # Reading column j + dx of the flipped image is reading column w-1-(j + dx) of the input.
        cols = torch.where(flipped[:, None].bool(), w - 1 - cols, cols) + p
        index = rows[:, :, None] * (w + 2 * p) + cols[:, None, :]  # [N, H, W] into padded pixels
        padded = F.pad(images, (p, p, p, p)).reshape(n, c, (h + 2 * p) * (w + 2 * p))
        return padded.gather(2, index.reshape(n, 1, h * w).expand(n, c, h * w)).reshape(n, c, h, w)

    def _augment(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.pad >= min(images.shape[-2:]):
            raise AugmentError(
                f"pad={self.pad} shifts a whole {tuple(images.shape[-2:])} image out of view; "
                f"use a pad below {min(images.shape[-2:])} (2-4 is usual for 28x28 images)"
            )
        return self.apply(
            images, self.sample(len(images), device=images.device, generator=generator)
        )


class RandomResizedCrop:
    """Crop a random box of each image and resize it bilinearly to ``size``.

    As torchvision's ``RandomResizedCrop``: a box covers a fraction of the image area uniform in
    ``scale`` and has an aspect ratio (width / height) log-uniform in ``ratio``; of ``attempts``
    candidates per sample the first that fits in the image is used, and a sample with none gets
    the largest central box whose ratio is clamped into ``ratio``. The box is resized without
    antialiasing, each output pixel a bilinear blend of pixels inside the box (edges repeated),
    as ``F.interpolate(box, size, mode="bilinear", align_corners=False)`` gives.

    Args:
        size: output ``(height, width)``, or one int for a square.
        scale: range of the box's share of the image area, within (0, 1].
        ratio: range of the box's width / height, positive.
        attempts: candidate boxes drawn per sample before the central fallback.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        attempts: int = 10,
    ) -> None:
        self.size = _pair_of_sizes(size)
        self.scale = _range("scale", scale, upper=1.0, fix="e.g. scale=(0.08, 1.0)")
        self.ratio = _range("ratio", ratio, upper=math.inf, fix="e.g. ratio=(3/4, 4/3)")
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, (int, numbers.Integral))
            or attempts < 1
        ):
            raise AugmentError(f"attempts must be an int >= 1, got {attempts!r}; the usual is 10")
        self.attempts = int(attempts)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        def augment(images: torch.Tensor) -> torch.Tensor:
            n, _, h, w = images.shape
            return self.apply(
                images, self.sample(n, h, w, device=images.device, generator=generator)
            )

        return _on_inputs(batch, augment, self, generator)

    def sample(
        self,
        n: int,
        height: int,
        width: int,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``n`` boxes ``(top, left, height, width)`` in a ``height x width`` image, as int64."""
        u = torch.rand((n, self.attempts, 2), generator=generator, device=device)
        area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[..., 0])
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(low + (high - low) * u[..., 1])
        box_w, box_h = torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()
        fits = (box_w >= 1) & (box_w <= width) & (box_h >= 1) & (box_h <= height)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first candidate that fits
        fallback_h, fallback_w = self._central_box(height, width)
        found = fits.any(dim=1)
        box_h = torch.where(found, box_h.gather(1, first)[:, 0], float(fallback_h))
        box_w = torch.where(found, box_w.gather(1, first)[:, 0], float(fallback_w))
        # A found box sits anywhere it fits; the fallback sits in the centre.
        spare_h, spare_w = height - box_h, width - box_w
        where = torch.rand((n, 2), generator=generator, device=device)
        top = torch.where(
            found, (where[:, 0] * (spare_h + 1)).floor().minimum(spare_h), spare_h // 2
        )
        left = torch.where(
            found, (where[:, 1] * (spare_w + 1)).floor().minimum(spare_w), spare_w // 2
        )
        return torch.stack((top, left, box_h, box_w), dim=1).to(torch.int64)

    def apply(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """``images`` cropped to ``boxes`` (from :meth:`sample`) and resized to ``size``."""
        n, _, h, w = images.shape
        out_h, out_w = self.size
        compute = images.dtype if images.dtype in (torch.float32, torch.float64) else torch.float32
        top, left, box_h, box_w = boxes.to(images.device, compute).unbind(1)
        ys = _source_coordinates(top, box_h, out_h)
        xs = _source_coordinates(left, box_w, out_w)
        # grid_sample's coordinates (align_corners=False): -1 and 1 are the outer pixel edges.
        grid_y = ((ys + 0.5) * (2 / h) - 1)[:, :, None].expand(n, out_h, out_w)
        grid_x = ((xs + 0.5) * (2 / w) - 1)[:, None, :].expand(n, out_h, out_w)
        grid = torch.stack((grid_x, grid_y), dim=-1)
        out = F.grid_sample(images.to(compute), grid, mode="bilinear", align_corners=False)
        if images.dtype == torch.uint8:
            return out.round_().clamp_(0, 255).to(torch.uint8)
        return out.to(images.dtype)

    def _central_box(self, height: int, width: int) -> tuple[int, int]:
        image_ratio = width / height
        if image_ratio < self.ratio[0]:
            return min(height, max(1, round(width / self.ratio[0]))), width
        if image_ratio > self.ratio[1]:
            return height, min(width, max(1, round(height * self.ratio[1])))
        return height, width


class Normalize:
    """``(x - mean) / std`` as float32, reading uint8 as 0..255 and floats as already 0..1.

    ``mean`` and ``std`` are one number for every channel, or one per channel, as torchvision's
    ``Normalize`` takes them: a sequence (list, tuple) or a 1-D tensor, e.g.
    ``Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``. Every ``std`` must be finite and
    > 0 and every ``mean`` finite (checked here); per-channel values must match the batch's
    channel count ``C`` (checked at each call, since the op does not know ``C`` before).

    No randomness: ``generator`` is accepted for the common interface and not used. Put it
    after the shifts and crops, so that their zero padding is black before normalising, as the
    host-side augmentation does.
    """

    def __init__(
        self,
        mean: float | Sequence[float] | torch.Tensor,
        std: float | Sequence[float] | torch.Tensor,
    ) -> None:
        self.std = _channel_values(std, "std", positive=True, example="std=0.35 or std=(0.229, "
                                   "0.224, 0.225)")  # fmt: skip
        self.mean = _channel_values(mean, "mean", positive=False, example="mean=0.29 or "
                                    "mean=(0.485, 0.456, 0.406)")  # fmt: skip
        if isinstance(self.mean, tuple) and isinstance(self.std, tuple):
            if len(self.mean) != len(self.std):
                raise AugmentError(
                    f"mean and std give different channel counts ({len(self.mean)} and "
                    f"{len(self.std)}); give one value per channel for both, or one number"
                )
        self._cache: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __repr__(self) -> str:
        def text(v: float | tuple[float, ...]) -> str:
            return f"{v:g}" if isinstance(v, float) else f"({', '.join(f'{x:g}' for x in v)})"

        return f"Normalize(mean={text(self.mean)}, std={text(self.std)})"

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        return _on_inputs(batch, self._normalize, self, generator)

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        unit = 255.0 if images.dtype == torch.uint8 else 1.0
        if isinstance(self.mean, float) and isinstance(self.std, float):
            scale = 1.0 / self.std / unit
            return images.to(torch.float32).mul(scale).sub_(self.mean / self.std)
        scales, shifts = self._per_channel(images, unit)
        return images.to(torch.float32).mul(scales).sub_(shifts)

    def _per_channel(self, images: torch.Tensor, unit: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``1 / (std * unit)`` and ``mean / std`` as ``[1, C, 1, 1]`` float32 tensors on the
        images' device, once per device and unit; the channel count checked against ``C``."""
        channels = images.shape[1]
        given = next(len(v) for v in (self.mean, self.std) if isinstance(v, tuple))
        if given != channels:
            raise AugmentError(
                f"{self!r} has {given} values per channel, but the batch has {channels} "
                f"channel(s) (shape {tuple(images.shape)}, [N, C, H, W]); give {channels} "
                "values, or one number for every channel"
            )
        key = (images.device, int(unit))
        if key not in self._cache:
            mean = torch.tensor(self.mean, dtype=torch.float64).expand(channels)
            std = torch.tensor(self.std, dtype=torch.float64).expand(channels)
            self._cache[key] = (
                (1.0 / std / unit).to(torch.float32).view(1, -1, 1, 1).to(images.device),
                (mean / std).to(torch.float32).view(1, -1, 1, 1).to(images.device),
            )
        return self._cache[key]


def _channel_values(
    value: Any, name: str, *, positive: bool, example: str
) -> float | tuple[float, ...]:
    """``value`` as one float or a tuple of floats, one per channel; refused (naming the value,
    the range and ``example``) unless each is finite, and > 0 where ``positive``."""
    rule = "a finite number > 0" if positive else "a finite number"
    shown = value  # as the caller gave it, for the messages
    if isinstance(value, torch.Tensor):
        if value.dim() > 1:
            raise AugmentError(
                f"{name} must be a number or one per channel (a 1-D tensor), got a tensor of "
                f"shape {tuple(value.shape)}; e.g. {example}"
            )
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, numbers.Real)):
        raise AugmentTypeError(
            f"{name} must be {rule} or a sequence of them (one per channel), got {value!r} of "
            f"type {type(value).__name__}; e.g. {example}"
        )
    items = [value] if isinstance(value, numbers.Real) else list(value)
    if not items:
        raise AugmentError(f"{name} must give at least one value, got {value!r}; e.g. {example}")
    for i, item in enumerate(items):
        where = "" if isinstance(value, numbers.Real) else f" (channel {i} of {shown!r})"
        if isinstance(item, bool) or not isinstance(item, (float, numbers.Real)):
            raise AugmentTypeError(
                f"{name} must be {rule} per channel, got {item!r}{where} of type "
                f"{type(item).__name__}; e.g. {example}"
            )
        number = float(item)
        ok = math.isfinite(number) and (number > 0 or not positive)
        if not ok:
            raise AugmentError(f"{name} must be {rule}, got {item!r}{where}; e.g. {example}")
    return float(items[0]) if isinstance(value, numbers.Real) else tuple(float(x) for x in items)


class Compose:
    """``ops`` applied in order to a batch, each drawing from the same generator."""

    def __init__(self, ops: Sequence[Op]) -> None:
        # A str is a Sequence (of str, not of ops: the annotation says it cannot come).
        if not isinstance(ops, Sequence) or isinstance(ops, str):  # type: ignore[unreachable]
            raise AugmentTypeError(
                f"Compose takes a list of ops, got {type(ops).__name__}; "
                "write Compose([ShiftFlip(2), ...])"
            )
        if not ops:
            raise AugmentError(
                "Compose needs at least one op, got []; for no augmentation pass no transform"
            )
        for position, op in enumerate(ops):
            if not callable(op):
                raise AugmentTypeError(
                    f"Compose op {position} is {op!r}, not a callable op(batch, generator=None)"
                )
        self.ops = list(ops)

    def __repr__(self) -> str:
        return f"Compose({self.ops!r})"

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        for op in self.ops:
            batch = op(batch, generator=generator)
        return batch


def _source_coordinates(start: torch.Tensor, length: torch.Tensor, out: int) -> torch.Tensor:
    """Per sample, where each of ``out`` output pixels reads in the input, kept inside the box."""
    centres = torch.arange(out, device=start.device, dtype=start.dtype) + 0.5
    coords = start[:, None] + centres * (length / out)[:, None] - 0.5
    return torch.minimum(torch.maximum(coords, start[:, None]), (start + length - 1)[:, None])


def _on_inputs(
    batch: Any,
    augment: Callable[[torch.Tensor], torch.Tensor],
    op: object,
    generator: torch.Generator | None,
) -> Any:
    """``augment`` applied to ``batch``'s images, or to its first element if it is a sequence."""
    if isinstance(batch, (tuple, list)) and batch:
        inputs = augment(_checked_images(batch[0], op, generator))
        if isinstance(batch, list):
            return [inputs, *batch[1:]]
        if hasattr(batch, "_fields"):  # a named tuple keeps its type and field names
            return type(batch)(inputs, *batch[1:])
        return (inputs, *batch[1:])
    return augment(_checked_images(batch, op, generator))


def _checked_images(images: Any, op: object, generator: torch.Generator | None) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise AugmentTypeError(
            f"{op!r} takes a tensor batch [N, C, H, W] or an (inputs, targets) pair, got "
            f"{type(images).__name__}; collate the batch into a tensor first"
        )
    if images.dim() != 4:
        raise AugmentError(
            f"{op!r} takes images [N, C, H, W], got shape {tuple(images.shape)}; add the "
            "missing axes, e.g. images.unsqueeze(1) for a channel or .unsqueeze(0) for a batch"
        )
    if not (images.is_floating_point() or images.dtype == torch.uint8):
        raise AugmentError(
            f"{op!r} takes float or uint8 images, got {images.dtype}; convert with .float()"
        )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise AugmentTypeError(
                f"generator must be a torch.Generator or None, got {type(generator).__name__}"
            )
        if generator.device.type != images.device.type:
            raise AugmentError(
                f"generator is on {generator.device} but the batch is on {images.device}; "
                f"draw from torch.Generator(device={str(images.device)!r})"
            )
    return images


def _pair_of_sizes(size: object) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, numbers.Integral) else size
    if (
        not isinstance(pair, Sequence)
        or len(pair) != 2
        or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in pair)
    ):
        raise AugmentTypeError(f"size must be an int or (height, width) ints, got {size!r}")
    if min(pair) < 1:
        raise AugmentError(f"size must be positive pixels, got {size!r}; e.g. size=224")
    return int(pair[0]), int(pair[1])


def _range(name: str, value: object, *, upper: float, fix: str) -> tuple[float, float]:
    if (
        not isinstance(value, Sequence)
        or len(value) != 2
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
    ):
        raise AugmentTypeError(
            f"{name} must be a (low, high) pair of numbers, got {value!r}; {fix}"
        )
    low, high = float(value[0]), float(value[1])
    if not (0 < low <= high <= upper) or math.isinf(high):
        bound = "" if math.isinf(upper) else f" <= {upper:g}"
        raise AugmentError(f"{name} must have 0 < low <= high{bound}, got {value!r}; {fix}")
    return low, high


__all__ = [
    "AugmentError",
    "AugmentTypeError",
    "Compose",
    "Normalize",
    "RandomResizedCrop",
    "ShiftFlip",
]
