"""A loader the user already has as the upstream of batch and device echo.

``EchoingDataLoader(users_loader, where="batch" | "device", echo_factor=...)`` echoes the
batches of a loader dataecho cannot look inside (torchdata's ``StatefulDataLoader``, mosaic's
or litdata's ``StreamingDataLoader``, any ``torch.utils.data.DataLoader``): the user's loader
keeps its dataset, workers, sampler and resume protocol, and :class:`LoaderUpstream` takes the
place of dataecho's own workers. The echo's state holds the user loader's ``state_dict()``,
taken with each batch read, so one ``state_dict()`` resumes both exactly; a loader without one
cannot be resumed, and saying so is :meth:`LoaderUpstream.get_state`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader
from torchdata.nodes import BaseNode

from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader.fresh_count import FreshCount
from dataecho.loader.reading import is_stateful
from dataecho.stages.stats import batch_length

if TYPE_CHECKING:
    from dataecho.loader.options import LoaderOptions


def is_loader(obj: Any) -> bool:
    """Whether ``obj`` is a loader of batches (a ``DataLoader`` or a subclass) rather than a
    dataset."""
    return isinstance(obj, DataLoader)


class LoaderUpstream(BaseNode[Any]):
    """The user's loader as a node: yields its batches, every example of them fresh to
    ``count``."""

    def __init__(
        self,
        loader: Any,  # a DataLoader, with its state_dict / load_state_dict where it has them
        count: FreshCount,
    ) -> None:
        super().__init__()
        self.loader = loader
        self.batch_size = loader.batch_size  # its items are batches (stats.unit)
        self.count = count
        self._it: Iterator[Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.count.reset()
        if initial_state is not None:
            self.loader.load_state_dict(initial_state["loader"])
        self._it = iter(self.loader)

    def next(self) -> Any:
        if self._it is None:
            raise StopIteration
        batch = next(self._it)
        self.count.read(batch_length(batch))
        return batch

    def get_state(self) -> dict[str, Any]:
        if not is_stateful(self.loader):
            raise DataechoTypeError(
                f"the upstream {type(self.loader).__name__} keeps no state, so a checkpoint "
                "could not resume it: use torchdata's StatefulDataLoader (the same arguments), "
                "or mosaic's or litdata's StreamingDataLoader"
            )
        return {"loader": self.loader.state_dict()}

    def close(self) -> None:
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)  # the user's loader's workers
        if shutdown is not None:
            shutdown()


def check_loader_upstream(loader: DataLoader, opts: LoaderOptions, num_workers: int) -> None:
    """Refuse what a loader upstream cannot do, before anything starts."""
    name = type(loader).__name__
    if not opts.point.takes_loader:
        raise DataechoValueError(
            f"where={opts.where!r} over a {name}: a loader hands over whole batches, which only "
            'batch echoing can repeat; pass where="batch" (or "device"), or pass the loader\'s '
            "dataset instead to echo examples"
        )
    if num_workers:
        raise DataechoValueError(
            f"num_workers={num_workers} over a {name}: its own workers read the data; leave "
            "num_workers at 0 (set the workers on your loader)"
        )
    if loader.batch_size is None:
        raise DataechoValueError(
            f"a {name} with batch_size=None (a batch_sampler of its own): the echo counts "
            "examples per batch; give the loader a batch_size"
        )
