"""The stream stages: each a small resumable iterator (a ``torchdata.nodes.BaseNode``)."""

from dataecho.stages.adaptive import AdaptiveEcho, adaptive_echo
from dataecho.stages.base import Stage, as_node
from dataecho.stages.copying import copy_item
from dataecho.stages.echo import Echo, echo
from dataecho.stages.shuffle import Shuffle, shuffle
from dataecho.stages.stats import EchoStats
from dataecho.stages.stochastic import StochasticEcho, stochastic_echo

__all__ = [
    "AdaptiveEcho",
    "Echo",
    "EchoStats",
    "Shuffle",
    "Stage",
    "StochasticEcho",
    "adaptive_echo",
    "as_node",
    "copy_item",
    "echo",
    "shuffle",
    "stochastic_echo",
]
