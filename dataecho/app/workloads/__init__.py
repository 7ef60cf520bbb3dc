"""The training tasks of ``dataecho train``, by name: one :class:`Workload` each.

    workload = get(cfg.workload)        # a ValueError naming the valid names otherwise

A new task is one module defining a :class:`~dataecho.app.workloads.base.Workload` and one
line in :data:`REGISTRY`.
"""

from __future__ import annotations

from dataecho.app.workloads.base import Workload
from dataecho.app.workloads.char_lm import CHAR_LM
from dataecho.app.workloads.cnn import CNN
from dataecho.errors import DataechoValueError

REGISTRY: dict[str, Workload] = {
    CNN.name: CNN,  # SmallCNN on Fashion-MNIST
    CHAR_LM.name: CHAR_LM,  # CharTransformer on Jane Austen's novels
}


def get(name: str) -> Workload:
    """The workload called ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise DataechoValueError(
            f"workload must be one of {', '.join(map(repr, REGISTRY))}, got {name!r}"
        ) from None


__all__ = ["REGISTRY", "Workload", "get"]
