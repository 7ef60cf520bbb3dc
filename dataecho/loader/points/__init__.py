"""The insertion points: where in the pipeline the echo stage runs (``where``), name -> point.

Each point is a small object (:class:`~dataecho.loader.points.base.InsertionPoint`) that owns
what differs between them: its chain in the workers and in the main process, how its fresh
examples are counted, its defaults and limits, the unit of its shuffle buffer, whether a
``DataLoader`` may be its upstream. Every other module asks the point
(``LoaderOptions.point``); none compares ``where`` to a name. A new point is a subclass added
with :func:`register` (docs/architecture.md). The chains of the points registered here:

=================  =========================================  ==================================
``where``          in each worker, between read and batcher   in the main process, after them
=================  =========================================  ==================================
before_augment     echo -> shuffle -> transform (one node at  (the workers' batches)
                   a fixed factor: loader/example_batches)
after_augment      transform -> echo -> shuffle (the same     (the workers' batches)
                   node after the transform)
batch              transform                                  echo -> shuffle
device             transform                                  to the device -> echo -> example
                                                              mixing -> ``device_transform``
=================  =========================================  ==================================
"""

from __future__ import annotations

from dataecho.errors import DataechoValueError
from dataecho.loader.points.base import InsertionPoint
from dataecho.loader.points.batches import Batch, Device
from dataecho.loader.points.examples import AfterAugment, BeforeAugment

POINTS: dict[str, InsertionPoint] = {}


def register(point: InsertionPoint) -> InsertionPoint:
    """Add ``point`` under its ``name`` (a name taken already is refused); returns it."""
    if point.name in POINTS:
        raise DataechoValueError(
            f"an insertion point named {point.name!r} is registered already ({', '.join(POINTS)}"
            "); give the new one a name of its own"
        )
    POINTS[point.name] = point
    return point


for _point in (BeforeAugment(), AfterAugment(), Batch(), Device()):
    register(_point)


def point_named(where: str) -> InsertionPoint:
    """The insertion point named ``where`` (one of :data:`POINTS`, checked by the options)."""
    return POINTS[where]


__all__ = ["POINTS", "InsertionPoint", "point_named", "register"]
