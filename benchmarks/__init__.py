"""Side-by-side benchmarks of dataecho; run ``python -m benchmarks`` to list them.

One package per benchmark (``benchmarks/NAME/``), each with a ``RESULTS.md``: its setup, its
headline table and the command that produced it. ``docs/benchmarks.md`` is the index. A run
writes its generated report into ``bench-results/NAME/``; shared pieces are in :mod:`.common`.
"""
