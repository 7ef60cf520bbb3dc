"""dataecho: data echoing for PyTorch.

Reuse data the slow upstream stages (reads, decoding, augmentation) already produced, so the
training step keeps working while fresh data arrives (Choi et al. 2019; Agarwal et al. 2020;
stochastic and communication-efficient echoing, ICLR 2025 submission).

    import dataecho
    loader = dataecho.EchoingDataLoader(dataset, batch_size=128, echo_factor=2,
                                        where="before_augment", shuffle_buffer=1024,
                                        transform=augment, num_workers=1, seed=0)

Stages for your own pipelines: :func:`echo`, :func:`shuffle`, :func:`adaptive_echo`,
:func:`stochastic_echo` (each a resumable ``torchdata.nodes.BaseNode`` with ``.stats``).
Before you change anything, :func:`profile` tells whether echoing will help at all.

Echoed optimizers (K steps per fresh batch; Agarwal et al. 2020): :class:`EchoedGD`,
:class:`EchoedProxGD`, :class:`EchoedNesterov` (more in :mod:`dataecho.algorithms`).
Training runs: :func:`train` with a :class:`TrainConfig` (single process or data parallel).
"""

from dataecho import schedules, transforms
from dataecho.loader import EchoingDataLoader, LoaderOptions
from dataecho.profiling import ProfileReport, format_report, profile, time_model
from dataecho.progress import TrainingProgress
from dataecho.stages import (
    AdaptiveEcho,
    Echo,
    EchoStats,
    Shuffle,
    StochasticEcho,
    adaptive_echo,
    copy_item,
    echo,
    shuffle,
    stochastic_echo,
)
from dataecho.transforms import on_input

__version__ = "0.1.0"

# The training machinery (models, optimizers, data sources) loads only when asked for.
_LAZY = {
    "train": "dataecho.train",
    "TrainConfig": "dataecho.config",
    "TrainResult": "dataecho.train",
    "EchoedGD": "dataecho.algorithms",
    "EchoedProxGD": "dataecho.algorithms",
    "EchoedNesterov": "dataecho.algorithms",
}
_LAZY_MODULES = ("algorithms", "reproduce", "distributed")


def __getattr__(name: str):  # noqa: ANN202
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"dataecho.{name}")
    raise AttributeError(f"module 'dataecho' has no attribute {name!r}")


__all__ = [
    "AdaptiveEcho",
    "Echo",
    "EchoStats",
    "EchoedGD",
    "EchoedNesterov",
    "EchoedProxGD",
    "EchoingDataLoader",
    "LoaderOptions",
    "ProfileReport",
    "Shuffle",
    "StochasticEcho",
    "TrainConfig",
    "TrainResult",
    "TrainingProgress",
    "__version__",
    "adaptive_echo",
    "copy_item",
    "echo",
    "format_report",
    "on_input",
    "profile",
    "schedules",
    "shuffle",
    "stochastic_echo",
    "time_model",
    "train",
    "transforms",
]
