"""What a streaming library's adapter gives the loader: a reader per worker and epoch, whose
state is that worker's position in its share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from torchdata.nodes import BaseNode


def defined_in(dataset: Any, module: str, names: tuple[str, ...]) -> bool:
    """Whether a class of ``dataset``'s (itself or a base) is one of ``names`` from a module
    of the package ``module``: a user's subclass matches too, and nothing is imported."""
    for cls in type(dataset).__mro__:
        home = cls.__module__
        if cls.__name__ in names and (home == module or home.startswith(module + ".")):
            return True
    return False


class Stream:
    """One library's dataset as the loader's upstream; a subclass per library."""

    NAME: ClassVar[str] = ""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    @classmethod
    def matches(cls, dataset: Any) -> bool:
        """Whether ``dataset`` is this library's."""
        raise NotImplementedError

    def reader(
        self, dataset: Any, *, epoch: int, worker: int, num_workers: int, rank: int, world: int
    ) -> BaseNode[Any]:
        """The node a worker reads its share of ``epoch`` from (``dataset`` is the worker's
        copy); its ``share`` is the number of items in it, or None where unknown."""
        raise NotImplementedError

    def start_epoch(self, epoch: int) -> None:
        """In the training process, before ``epoch``'s workers start (nothing by default)."""


class PositionReader(BaseNode[Any]):
    """Reads ``fetch(key)`` for each of ``keys`` in order. State: the position alone, so a
    resume fetches nothing before it."""

    CHEAP_STATE = True  # a read-ahead may take it after every item (loader.read_ahead)

    def __init__(self, keys: Sequence[Any] | np.ndarray, fetch: Callable[[Any], Any]) -> None:
        super().__init__()
        self.keys = keys
        self.fetch = fetch
        self.share: int | None = len(keys)
        self._pos = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._pos = int(initial_state["pos"]) if initial_state else 0

    def next(self) -> Any:
        if self._pos >= len(self.keys):
            raise StopIteration
        item = self.fetch(self.keys[self._pos])
        self._pos += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"pos": self._pos}
