"""mosaicml-streaming for the tests, under the dev set-up's CPU torch.

``import streaming`` imports torchvision (for mosaic's vision datasets, which the tests do not
use), and PyPI's torchvision, built for the CUDA torch, cannot load beside the CPU torch the
set-up pins. Where it cannot, the import is given a stand-in for the two names it takes
(``torchvision.datasets.VisionDataset``, ``torchvision.transforms.functional.to_tensor``),
removed again once mosaic is imported: every part of mosaic the tests run (``MDSWriter``, the
dataset's partition, shuffle, downloads and decoding, ``StreamingDataLoader``) is its own.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

from torch.utils.data import Dataset


class VisionDataset(Dataset):
    """Stands in for torchvision's base class of mosaic's vision datasets (never built)."""


def to_tensor(image: Any) -> Any:
    raise NotImplementedError("torchvision is not installed: the stand-in has no to_tensor")


def import_streaming() -> types.ModuleType:
    """``streaming``, imported with torchvision where it loads, else with the stand-in."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        standins = {
            "torchvision": {},
            "torchvision.datasets": {"VisionDataset": VisionDataset},
            "torchvision.transforms": {},
            "torchvision.transforms.functional": {"to_tensor": to_tensor},
        }
        for name, attrs in standins.items():
            module = types.ModuleType(name)
            # A spec, so that a find_spec on the name (transformers asks) answers; with no
            # distribution installed, transformers still takes torchvision as missing.
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            module.__dict__.update(attrs)
            sys.modules[name] = module
        try:
            import streaming
        finally:
            for name in standins:
                sys.modules.pop(name, None)
        return streaming
    import streaming

    return streaming
