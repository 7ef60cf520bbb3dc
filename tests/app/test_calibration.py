"""The demo's calibration: R measured through the real training loop over the real nginx."""

from __future__ import annotations

import math

import pytest
from conftest import needs_nginx

from dataecho.app.calibration import bytes_per_example, probe, serve
from dataecho.app.sources.fashion_mnist import DEFAULT_DATA_DIR, FILES
from dataecho.app.upstream import prepare


@pytest.mark.timeout(180)
@needs_nginx
@pytest.mark.skipif(not (DEFAULT_DATA_DIR / FILES["train"][0]).is_file(),
                    reason="apt-get install dataset-fashion-mnist")  # fmt: skip
def test_a_tighter_cap_gives_a_proportionally_larger_probed_ratio(tmp_path):
    manifest, _ = prepare(tmp_path / "shards", examples=1024, examples_per_shard=128)
    batch_bytes = bytes_per_example(manifest) * 64
    ratios = []
    for batches_per_second in (40, 8):  # a loose cap, then one 5x tighter
        with serve(tmp_path / "shards", int(batch_bytes * batches_per_second)) as up:
            ratios.append(probe(up.url, DEFAULT_DATA_DIR, 64, seed=0, examples=1024))
    loose, tight = ratios
    assert all(math.isfinite(r) and r >= 1 for r in ratios)
    # 1/8 s per batch against a step of a few ms: input-bound; 5x less bandwidth, much more so.
    assert tight > 3 and tight > 2 * loose
