"""The two sides of the worker boundary, as the insertion point builds them
(:mod:`dataecho.loader.points`): :func:`example_batches` (in :mod:`dataecho.loader.pipeline`)
and :func:`batch_stages` (in :mod:`dataecho.loader.echoing_loader`). Here too: the main
process's seed key, closing and draining a chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdata.nodes import BaseNode

from dataecho.loader.device import DeviceTransform
from dataecho.loader.read_ahead import stop_read_ahead
from dataecho.stages.adaptive import AdaptiveEcho

if TYPE_CHECKING:
    from dataecho.loader.options import LoaderOptions
    from dataecho.loader.points.common import Seeds

# The main process's key among the reader indices: batch echoing draws its seeds there.
MAIN_PROCESS = 1 << 20


def example_batches(
    node: BaseNode[Any],
    opts: LoaderOptions,
    seed: Seeds,
    *,
    per_example: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any],
    length: int | None,
    copies: int | None = None,
) -> BaseNode[list[Any]]:
    """A worker's batches of tagged copies over its tagged reads ``node``, as the insertion
    point builds them (:meth:`~dataecho.loader.points.base.InsertionPoint.worker_batches`).

    ``per_example``: the transform run on each item (the user's or the dataset's), or None.
    ``length``: the items the worker reads this epoch, ``copies``: its part of the epoch's
    copies where the loader shares them out (see :func:`echo_stage`).
    """
    return opts.point.worker_batches(node, opts, seed, per_example=per_example,
                                     collate_fn=collate_fn, length=length, copies=copies)  # fmt: skip


def batch_stages(
    workers: BaseNode[Any],
    opts: LoaderOptions,
    seed: Seeds,
    *,
    device: Any = None,
    epoch_fresh_batches: Callable[[], int | None] = lambda: None,
    pinned: bool = False,
) -> tuple[BaseNode[Any], BaseNode[Any] | None]:
    """The main process's chain over the workers' batches, and its counting stage: the stage
    whose fresh batches count once it hands them on, or whose first deliveries of examples
    count (:meth:`~dataecho.loader.points.base.InsertionPoint.counting`), else None.

    ``device``: the ``torch.device`` of a point on the device. ``epoch_fresh_batches``: the batches
    the workers deliver this epoch, so that a fractional factor gives a fixed number of them an
    extra copy (and the epoch the ``len`` says). ``pinned``: the workers' batches come pinned
    (``pin_memory``), and so must the host's copies of them, for the training loop's
    ``non_blocking`` copy to the GPU.
    """
    return opts.point.main_stages(workers, opts, seed, device=device,
                                  epoch_fresh_batches=epoch_fresh_batches, pinned=pinned)  # fmt: skip


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
