"""Where examples come from: dataset readers and the storage emulation that slows them down."""

from dataecho.app.sources.fashion_mnist import DataNotFoundError, FashionMNIST, read_idx
from dataecho.app.sources.throttled import Throttled

__all__ = ["DataNotFoundError", "FashionMNIST", "Throttled", "read_idx"]
