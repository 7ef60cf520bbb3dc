"""Side-by-side benchmarks of dataecho; run ``python -m benchmarks`` to list them.

Results are recorded in ``docs/benchmarks.md``, one section per benchmark.
"""
