"""Bounded memory over a long run: does RSS stay flat once the stream is warm?

What is measured: the resident set (RSS, and PSS, which splits the pages the two share) of the
training process and of its loader worker, sampled from ``/proc`` every few seconds for the
whole run, and of nginx apart (the server, not ours). The report gives, per series, RSS after
the warm-up, at the end, the peak, and the least-squares slope in MiB per 10 minutes, over the
samples after the warm-up and over the run's second half; and the loader worker's peak per
epoch (a new worker each epoch, so its RSS saws: a leak shows as rising peaks).

How (:mod:`~benchmarks.memory.stream`): the stream is the one ``dataecho train
--checkpoint-dir`` builds (``make_loader``): Fashion-MNIST shards served by a real nginx on
loopback, one loader worker (download, PNG decode, echo before augmentation, a shuffle buffer,
batching, augmentation), epoch after epoch, with a checkpoint (model, optimizer, loader state
with the shuffle buffer) every ``checkpoint_every`` steps. The consumer is
:class:`benchmarks.common.SyntheticStep` on 1 torch thread. The upstream is rate limited
(nginx ``limit_rate``), so the loop mostly waits and the run uses a small share of one core:
it can run for half an hour beside other work. Summary, CSV and plot:
:mod:`~benchmarks.memory.summary`; command line: :mod:`~benchmarks.memory.cli`; results:
``benchmarks/memory/RESULTS.md``.
"""

from benchmarks.memory.cli import main, parse
from benchmarks.memory.stream import COLUMNS, Settings, run, sample
from benchmarks.memory.summary import SERIES, plot, read_csv, report, summarize, write_csv

__all__ = ["COLUMNS", "SERIES", "Settings", "main", "parse", "plot", "read_csv", "report",
           "run", "sample", "summarize", "write_csv"]  # fmt: skip
