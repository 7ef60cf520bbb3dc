"""mosaicml-streaming for the tests, under the dev set-up's CPU torch: the benchmarks' import
(``benchmarks/streaming/mosaic_import.py``), which gives mosaic a stand-in for the two
torchvision names it imports where PyPI's torchvision cannot load beside the CPU torch."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:  # a torchrun script or a bare `pytest` may not have the checkout
    sys.path.insert(0, ROOT)

from benchmarks.streaming.mosaic_import import import_streaming  # noqa: E402

__all__ = ["import_streaming"]
