"""The stream stages: each a small resumable iterator (a ``torchdata.nodes.BaseNode``).

Each stage lives in a module named for what it is (``fixed_echo``, ``shuffle_buffer``,
``example_mix``, ``adaptive``, ``stochastic``), so that ``dataecho.stages.echo`` and ``dataecho.stages.shuffle``
name only the functions.
"""

from dataecho.stages.adaptive import AdaptiveEcho, adaptive_echo
from dataecho.stages.base import Stage, as_node
from dataecho.stages.copying import copy_item, copy_pinned
from dataecho.stages.example_mix import MixExamples, mix_examples
from dataecho.stages.fixed_echo import Echo, echo
from dataecho.stages.shuffle_buffer import Shuffle, shuffle
from dataecho.stages.stats import EchoStats
from dataecho.stages.stochastic import StochasticEcho, stochastic_echo

__all__ = [
    "AdaptiveEcho",
    "Echo",
    "EchoStats",
    "MixExamples",
    "Shuffle",
    "Stage",
    "StochasticEcho",
    "adaptive_echo",
    "as_node",
    "copy_item",
    "copy_pinned",
    "echo",
    "mix_examples",
    "shuffle",
    "stochastic_echo",
]
