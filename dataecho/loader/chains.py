"""A chain of nodes, whoever built it (the insertion points: :mod:`dataecho.loader.points`):
where a drain starts, how every background part of it stops, and the main process's key among
the reader indices, under which its stages draw their seeds.
"""

from __future__ import annotations

from typing import Any

from dataecho.loader.device import DeviceTransform
from dataecho.loader.read_ahead import stop_read_ahead
from dataecho.stages.adaptive import AdaptiveEcho

# The main process's key among the reader indices: batch echoing draws its seeds there.
MAIN_PROCESS = 1 << 20


def drain_stage(root: Any) -> Any:
    """The stage where a drain of the main-process chain ``root`` starts
    (:meth:`~dataecho.loader.echoing_loader.EchoingDataLoader.drain`): its last stage that
    holds copies back (the device's pool, a shuffle buffer, an echo stage), if it can drain;
    else None (the copies wait in the workers, or "auto" reuses what it has)."""
    node = root.source if isinstance(root, DeviceTransform) else root
    return node if callable(getattr(node, "drain", None)) else None


def close_chain(node: Any) -> None:
    """Stop every background part of a chain of nodes, from the consumer's end down."""
    while node is not None:
        if isinstance(node, AdaptiveEcho):
            # Bounded: its reader thread may sit in a source call that only the next close unblocks.
            node.close(timeout=5.0)
        elif hasattr(node, "close"):
            node.close()
        stop_read_ahead(node)
        node = getattr(node, "source", None)
