"""What every section of the device benchmark shares: images, pace, step, augmentation, loaders.

- :class:`PacedShapes`: random uint8 images of any shape, read at the pace of
  :class:`benchmarks.common.PacedImages` (its clock does the sleeping; the pixels come from a
  pool of this shape), so R = t_up / t_down is set by the benchmark.
- :class:`DeviceStep`: SGD updates of a small conv net on the training device, a fixed cost
  per step (on a GPU, several updates per step: :meth:`DeviceStep.calibrate`).
- :func:`augmentation`: the library's ``dataecho.augment.ShiftFlip``, the same op in every
  mode; :class:`Scale`, the deterministic device transform the correctness section compares
  across devices.
- :func:`build_loader`: the loader of one *mode* (host batch echo, host example echo, device
  echo) at one echo factor; :func:`to_device`, the training loop's host-to-device call.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.common import PacedImages
from dataecho import EchoingDataLoader
from dataecho.augment import ShiftFlip

MIX_BATCHES = 10  # device_mixed's pool, in batches' worth of examples
MODES = ("host", "host_example", "device", "device_mixed")
"""host: ``where="batch"``, augmented in the worker, each copy sent to the device again;
host_example: ``where="before_augment"``, each copy augmented in the worker; device:
``where="device"``, each copy augmented on the device; device_mixed: the same, the copies'
examples mixed across batches through a pool of ten batches' examples (the demo's setting)."""


class PacedShapes(Dataset):
    """``length`` examples ``(uint8 image of shape, int label)``, ``delay`` seconds per read.

    The pace is :class:`~benchmarks.common.PacedImages`' (a clock with one batch of slack):
    each read first reads one of its small images, which sleeps until due, and discards it.
    ``delay=0`` reads as fast as copying one image allows (the worker CPU section).
    """

    def __init__(
        self, length: int, shape: tuple[int, ...], delay: float, slack: float, pool: int = 64
    ) -> None:
        rng = np.random.default_rng(0)
        self.length, self.shape = int(length), tuple(shape)
        self._images = rng.integers(0, 256, size=(pool, *self.shape), dtype=np.uint8)
        self._labels = rng.integers(0, 10, size=pool).tolist()
        self._pace = PacedImages(1, delay=delay, slack=slack) if delay > 0 else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._pace is not None:
            self._pace[index]  # sleeps until this read is due
        j = index % len(self._labels)
        # A copy: the worker sends it to another process; a view would pin the whole pool.
        return torch.from_numpy(self._images[j].copy()), self._labels[j]


class TinyConvNet(nn.Module):
    """Two strided convolutions, global pooling and a linear layer: cost grows with H x W."""

    def __init__(self, channels: int, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 5, stride=2, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.head(x.mean(dim=(2, 3)))


class DeviceStep:
    """``passes`` SGD updates of :class:`TinyConvNet` on ``device`` per call: a step of fixed
    cost; a call returns the seconds it took.

    uint8 images are scaled to 0..1 first. On CUDA the step waits for its own (current)
    stream at the end, so its time is real and a side stream's copy may still run on.
    """

    def __init__(self, shape: tuple[int, ...], device: torch.device, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.device = device
        self.model = TinyConvNet(shape[0]).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.shape = tuple(shape)
        self.passes = 1

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        start = time.perf_counter()
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        for _ in range(self.passes):
            loss = F.cross_entropy(self.model(images), labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter() - start

    def measure(self, batch_size: int, steps: int = 20, warmup: int = 5) -> float:
        """t_down: median seconds per step on a batch already on the device."""
        x = torch.randint(0, 256, (batch_size, *self.shape), dtype=torch.uint8)
        y = torch.randint(0, 10, (batch_size,))
        x, y = x.to(self.device), y.to(self.device)
        times = [self(x, y) for _ in range(warmup + steps)]
        return statistics.median(times[warmup:])

    def calibrate(self, batch_size: int, seconds: float | None) -> float:
        """Set ``passes`` so a step takes about ``seconds`` (None: one pass); return t_down.

        A GPU runs one pass of this net in a millisecond or two: too fast for a loader to feed
        at any R, so there a step is several passes.
        """
        self.passes = 1
        t_down = self.measure(batch_size)
        if seconds is not None and t_down < seconds:
            self.passes = max(1, round(seconds / t_down))
            t_down = self.measure(batch_size)
        return t_down


def augmentation() -> tuple[Any, str]:
    """The shift-and-flip op every mode uses (in the worker or on the device), and its name."""
    op = ShiftFlip(pad=2, flip=True)
    return op, f"dataecho.augment.{op!r}"


class GpuTimed:
    """``op`` with its GPU time measured by CUDA events around each call, on the stream it runs
    on: timed on the host, an op on CUDA costs only its kernel launches, and its work lands in
    whatever waits for the stream next (the step). :meth:`take` syncs once and returns the
    seconds since the last take."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.op(batch, generator=generator)
        end.record()
        self._events.append((start, end))
        return out

    def take(self) -> float:
        events, self._events = self._events, []
        if events:
            events[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in events) / 1e3


class Scale:
    """Deterministic device transform: uint8 images to float 0..1, labels passed through."""

    def __call__(self, batch: Any, generator: torch.Generator | None = None) -> Any:
        images, *rest = batch
        return [images.float().div_(255), *rest]


def device_echo_available() -> bool:
    """True once ``EchoingDataLoader`` takes ``where="device"`` and its ``device_transform``."""
    from dataecho.loader import options

    takes = inspect.signature(EchoingDataLoader).parameters
    return "device" in options.WHERE_CHOICES and "device_transform" in takes


@dataclass(frozen=True)
class LoaderSpec:
    """Everything but the mode and factor that a loader of the benchmark is built from."""

    batch_size: int
    workers: int
    device: torch.device
    seed: int = 0
    shuffle: bool = False


def build_loader(spec: LoaderSpec, data: Any, mode: str, e: float, aug: Any) -> EchoingDataLoader:
    """The loader of ``mode`` (see :data:`MODES`) at echo factor ``e``, augmenting with ``aug``."""
    shared: dict[str, Any] = dict(
        batch_size=spec.batch_size,
        shuffle=spec.shuffle,
        num_workers=spec.workers,
        seed=spec.seed,
        echo_factor=e,
    )
    if mode == "host":
        return EchoingDataLoader(
            data,
            where="batch",
            batch_transform=aug,
            pin_memory=spec.device.type == "cuda",
            **shared,
        )
    if mode == "host_example":
        return EchoingDataLoader(data, where="before_augment", batch_transform=aug, **shared)
    if mode in ("device", "device_mixed"):
        mix = MIX_BATCHES * spec.batch_size if mode == "device_mixed" else 0
        return EchoingDataLoader(data, where="device", echo_device=spec.device, device_transform=aug,
                                 shuffle_buffer=mix, **shared)  # fmt: skip
    raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def to_device(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` on ``device``: a no-op for a batch already there."""
    images, labels = batch[0], batch[1]
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
