"""``import streaming`` (mosaicml-streaming) where torchvision cannot load.

mosaic imports torchvision at ``import streaming``, only for its vision datasets, which this
benchmark does not use; it takes two names, ``torchvision.datasets.VisionDataset`` and
``torchvision.transforms.functional.to_tensor``. PyPI's torchvision is built for the CUDA torch
and cannot load beside the development set-up's CPU torch, so where ``import torchvision``
fails, :func:`import_streaming` puts a stand-in for those two names in ``sys.modules``, imports
mosaic, and takes the stand-in out again (nothing else then sees a torchvision: transformers,
which mosaic imports, is imported before the stand-in is put in). Every part of
mosaic the benchmark runs (``MDSWriter``, ``StreamingDataset``'s partition, shuffle, downloads
and decoding, ``StreamingDataLoader``) is mosaic's own. Where torchvision loads, it is used.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types
from typing import Any

from torch.utils.data import Dataset


class VisionDataset(Dataset):
    """Stands in for torchvision's base class of mosaic's vision datasets (never built here)."""


def to_tensor(image: Any) -> Any:
    raise NotImplementedError("torchvision is not installed: the stand-in has no to_tensor")


STANDINS: dict[str, dict[str, Any]] = {
    "torchvision": {},
    "torchvision.datasets": {"VisionDataset": VisionDataset},
    "torchvision.transforms": {},
    "torchvision.transforms.functional": {"to_tensor": to_tensor},
}


def import_streaming() -> types.ModuleType:
    """The ``streaming`` module: imported with torchvision where it loads, else with the
    stand-in in place for the import only."""
    if "streaming" in sys.modules:
        return sys.modules["streaming"]
    try:
        import torchvision  # noqa: F401
    except Exception:  # not installed, or built for another torch
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        # mosaic imports transformers (for BatchFeature), which caches what it finds installed:
        # imported before the stand-in is in place, it finds no torchvision, and a later
        # `from transformers import Trainer` does not reach for torchvision's transforms.
        with contextlib.suppress(ImportError):
            import transformers.feature_extraction_utils  # noqa: F401
        for name, attrs in STANDINS.items():
            module = types.ModuleType(name)
            # A spec, so that a find_spec on the name answers as for a real module.
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            module.__dict__.update(attrs)
            sys.modules[name] = module
        try:
            import streaming
        finally:
            for name in STANDINS:
                sys.modules.pop(name, None)
        return streaming
    import streaming

    return streaming
