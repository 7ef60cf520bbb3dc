"""The stream stages: each a small resumable iterator (a ``torchdata.nodes.BaseNode``).

Each stage lives in a module named for what it is (``fixed_echo``, ``shuffle_buffer``,
``example_mix``, ``adaptive``, ``stochastic``), so that ``dataecho.stages.echo`` and ``dataecho.stages.shuffle``
name only the functions.
"""

import sys
import types
import warnings

from dataecho.stages import fixed_echo, shuffle_buffer
from dataecho.stages.adaptive import AdaptiveEcho, adaptive_echo
from dataecho.stages.base import Stage, as_node
from dataecho.stages.copying import copy_item
from dataecho.stages.example_mix import MixExamples, mix_examples
from dataecho.stages.fixed_echo import Echo, echo
from dataecho.stages.shuffle_buffer import Shuffle, shuffle
from dataecho.stages.stats import EchoStats
from dataecho.stages.stochastic import StochasticEcho, stochastic_echo


class _MovedModule(types.ModuleType):
    """The old module path of a stage: ``from dataecho.stages.echo import Echo`` keeps working
    for one release, with a DeprecationWarning that names the new module."""

    def __init__(self, old: str, new: types.ModuleType) -> None:
        super().__init__(old)
        self._new = new

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(
            f"{self.__name__} is now {self._new.__name__} ({self.__name__} is the function); "
            "the old module path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self._new, name)


# Only in sys.modules: as attributes of this package, ``echo`` and ``shuffle`` stay the functions.
for _old, _new in (("echo", fixed_echo), ("shuffle", shuffle_buffer)):
    sys.modules.setdefault(f"{__name__}.{_old}", _MovedModule(f"{__name__}.{_old}", _new))
del _old, _new

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
    "echo",
    "mix_examples",
    "shuffle",
    "stochastic_echo",
]
