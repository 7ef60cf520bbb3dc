"""The tests' S3 endpoint on 127.0.0.1: the benchmark's (moto's S3 server, the emulation
mosaic streaming's own tests use, in a process of its own, its requests counted from its log,
stopped when the test is done or this process dies)."""

import sys
from pathlib import Path

# A bare `pytest` (as `make compat` runs it) puts tests/ first on the path, where benchmarks/
# names the benchmarks' tests: the checkout's own package comes first.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path[:1]:
    sys.path.insert(0, ROOT)

from benchmarks.streaming.servers import S3Server  # noqa: E402

__all__ = ["S3Server"]
