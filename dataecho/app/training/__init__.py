"""The parts of :func:`dataecho.app.train.train`'s loop, one concern a module: the workload's
model, loss and evaluation (``recipe``), the evaluation schedule and targets (``schedule``),
counters, history and result (``record``), and checkpoints (``checkpoints``). The loop itself,
readable top to bottom, stays in :mod:`dataecho.app.train`."""
