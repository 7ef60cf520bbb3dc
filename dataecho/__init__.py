"""dataecho: data echoing for PyTorch.

Reuse data the slow upstream stages (reads, decoding, augmentation) already produced, so the
training step keeps working while fresh data arrives (Choi et al. 2019; Agarwal et al. 2020;
stochastic and communication-efficient echoing, ICLR 2025 submission).

    import dataecho
    loader = dataecho.EchoingDataLoader(dataset, batch_size=128, echo_factor=2,
                                        where="before_augment", shuffle_buffer=1024,
                                        transform=augment, num_workers=1, seed=0)

Stages for your own pipelines: :func:`echo`, :func:`shuffle`, :func:`mix_examples` (examples
of whole batches), :func:`adaptive_echo`, :func:`stochastic_echo` (each a resumable ``torchdata.nodes.BaseNode`` with ``.stats``).
Before you change anything, :func:`profile` tells whether echoing will help at all.

Echoed optimizers (K steps per fresh batch; Agarwal et al. 2020): :class:`EchoedGD`,
:class:`EchoedProxGD`, :class:`EchoedNesterov` (in :mod:`dataecho.optim`).

The ``dataecho`` command, its demo and training runs are the application,
:mod:`dataecho.app` (``pip install 'dataecho[app]'``); this package never imports it.
"""

from dataecho import augment, schedules, transforms
from dataecho.loader import EchoingDataLoader, LoaderOptions
from dataecho.loader.dataset_transform import IdenticalCopiesWarning
from dataecho.optim import EchoedGD, EchoedNesterov, EchoedOptimizer, EchoedProxGD
from dataecho.profiling import ProfileReport, format_report, profile, time_model
from dataecho.progress import TrainingProgress
from dataecho.stages import (
    AdaptiveEcho,
    Echo,
    EchoStats,
    MixExamples,
    Shuffle,
    StochasticEcho,
    adaptive_echo,
    copy_item,
    echo,
    mix_examples,
    shuffle,
    stochastic_echo,
)
from dataecho.transforms import on_input

__version__ = "0.1.0"

# Names that moved to the application (dataecho[app]) or to the optimizers' module. They keep
# working for one release, with a DeprecationWarning that names the new place.
_MOVED = {
    "train": ("dataecho.app.train", "train"),
    "TrainConfig": ("dataecho.app.config", "TrainConfig"),
    "TrainResult": ("dataecho.app.train", "TrainResult"),
    "distributed": ("dataecho.app.distributed", None),
    "algorithms": ("dataecho.optim", None),
}


def __getattr__(name: str) -> object:
    import importlib
    import warnings

    if name not in _MOVED:
        raise AttributeError(f"module 'dataecho' has no attribute {name!r}")
    module, attribute = _MOVED[name]
    new = module if attribute is None else f"{module}.{attribute}"
    warnings.warn(f"dataecho.{name} moved to {new}; the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)  # fmt: skip
    target = importlib.import_module(module)
    return target if attribute is None else getattr(target, attribute)


__all__ = [
    "AdaptiveEcho",
    "Echo",
    "EchoStats",
    "EchoedGD",
    "EchoedNesterov",
    "EchoedOptimizer",
    "EchoedProxGD",
    "EchoingDataLoader",
    "IdenticalCopiesWarning",
    "LoaderOptions",
    "MixExamples",
    "ProfileReport",
    "Shuffle",
    "StochasticEcho",
    "TrainingProgress",
    "__version__",
    "adaptive_echo",
    "augment",
    "copy_item",
    "echo",
    "format_report",
    "mix_examples",
    "on_input",
    "profile",
    "schedules",
    "shuffle",
    "stochastic_echo",
    "time_model",
    "transforms",
]
