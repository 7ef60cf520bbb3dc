"""The PyTorch echoing loader."""

from dataecho.loader.echoing_loader import EchoingDataLoader
from dataecho.loader.options import WHERE_CHOICES, LoaderOptions

__all__ = ["WHERE_CHOICES", "EchoingDataLoader", "LoaderOptions"]
