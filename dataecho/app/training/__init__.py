"""The parts of :func:`dataecho.app.train.train`'s loop, one concern a module: the workload's
model, loss and evaluation (``recipe``), the evaluation and checkpoint schedule and targets
(``schedule``), counters, history and result (``record``), the checkpoints of single-process
and data-parallel runs: what they hold, when and resuming (``save_resume``), the loader (``loader``) and the training device
(``device``). The loop itself,
readable top to bottom, stays in :mod:`dataecho.app.train`; what only ranks of a
data-parallel run do is in :mod:`dataecho.app.distributed`."""
