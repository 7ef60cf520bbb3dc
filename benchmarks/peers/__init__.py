"""dataecho against its peers: side by side, interleaved, on one upstream and one step.

Upstream: Fashion-MNIST held in memory, read through ``dataecho.app.sources.Throttled``
(sleeping reads) at R x t_down per batch of 128, in one loader worker that also augments
(``Augment`` per example). Step: :class:`benchmarks.common.SyntheticStep` on 1 torch thread.
Loaders (:mod:`benchmarks.peers.loaders`): PyTorch's ``DataLoader`` (no echo), MONAI's
``ThreadDataLoader(repeats=e)``, the tf.data idiom of adjacent repeats, and dataecho at each
insertion point, fixed e and ``auto``. Every case of a section runs in one process, interleaved
round after round, so the figures compared are ratios measured side by side. Sections:

1. overhead at e = 1 on the unthrottled upstream, plus raw echo-stage throughput;
2. input-bound, e = R: steps/s, stall, fresh examples/s, efficiency; the verdict pairs round r
   of dataecho with round r of a peer (:mod:`benchmarks.peers.verdict`);
3. test accuracy after a fixed fresh-example budget at equal e;
4. peak RSS of each loader, and dataecho's growth with its shuffle buffer
   (:mod:`benchmarks.peers.memory`: one forked process per case);
5. what dataecho's worker state snapshots cost (:mod:`benchmarks.peers.snapshots`);
6. wall time to a target accuracy, auto against fixed e (:mod:`benchmarks.peers.target`).

Command line: :mod:`benchmarks.peers.cli`; the report: :mod:`benchmarks.peers.markdown`;
results: ``benchmarks/peers/RESULTS.md``.
"""

from benchmarks.peers.cli import main, parse
from benchmarks.peers.sections import Context, Window, run, train_window
from benchmarks.peers.settings import QUICK, Settings

__all__ = ["QUICK", "Context", "Settings", "Window", "main", "parse", "run", "train_window"]
