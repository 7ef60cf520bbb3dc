"""The stream stages: each a small resumable iterator (a ``torchdata.nodes.BaseNode``)."""

from dataecho.stages.base import Stage, as_node
from dataecho.stages.copying import copy_item
from dataecho.stages.echo import Echo, echo
from dataecho.stages.shuffle import Shuffle, shuffle
from dataecho.stages.stats import EchoStats

__all__ = ["Echo", "EchoStats", "Shuffle", "Stage", "as_node", "copy_item", "echo", "shuffle"]
