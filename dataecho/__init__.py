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
from dataecho.errors import (
    DataechoAttributeError,
    DataechoError,
    DataechoTypeError,
    DataechoValueError,
)
from dataecho.loader import EchoingDataLoader, LoaderOptions
from dataecho.loader.dataset_transform import IdenticalCopiesWarning
from dataecho.loader.streams.hf import ShuffleBufferLostWarning
from dataecho.loader.streams.webdataset import ReplayOnResumeWarning
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

__all__ = [
    "AdaptiveEcho",
    "DataechoError",
    "DataechoAttributeError",
    "DataechoTypeError",
    "DataechoValueError",
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
    "ReplayOnResumeWarning",
    "Shuffle",
    "ShuffleBufferLostWarning",
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
