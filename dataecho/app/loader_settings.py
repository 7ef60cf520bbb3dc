"""The loader's settings as a run takes them: one :class:`~dataecho.loader.LoaderOptions`
(``TrainConfig.loader``), spelt flat only at the edge (keywords, flags, TOML keys).

:func:`run_loader` is that edge: it routes flat keywords into the nested options, once. Each
value is checked where it is defined: by ``LoaderOptions``' fields, except the three the run
limits further (:data:`RUN_LOADER_CHECKS`), which are checked here instead, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dataecho._validate import BATCH_WHY, MAX_BATCH, Check, EchoFactor, Int, Real, checked
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader import LoaderOptions
from dataecho.loader.points import POINTS

# The largest echo factor a run takes (fixed, or the most copies with "auto"). Each fresh item
# is emitted that many times, so a factor past this only repeats the same data: the papers'
# useful factors are 2 to 16. The library takes any factor; a training run refuses one no run
# needs.
MAX_ECHO_FACTOR = 1024.0

# A run's mixing pool on the device, in batches' worth, unless told otherwise: with the pool's
# cost flat in its size, 40 batches saved the most fresh examples of the sizes measured (10,
# 40, 100: benchmarks/augmentation, docs/demo.md) for a few MB of device memory.
DEVICE_POOL_BATCHES = 40
# The loader settings whose default the run derives (run_loader), and its words for the help.
RUN_DEFAULTS = {
    "shuffle_buffer": f"{DEVICE_POOL_BATCHES} batches' worth with where=device, else the "
    "loader's (10 batches' worth where examples are echoed, else 0)"
}

# The run's stricter checks of the loader's settings (LoaderOptions holds the rest): a
# per-workload default for the batch size, and the limit above.
RUN_LOADER_CHECKS: dict[str, Check] = {
    "batch_size": Int(1, none="default", high=MAX_BATCH, why=BATCH_WHY,
                      hint="pass the number of examples per batch, e.g. 128"),
    "echo_factor": EchoFactor(
        high=MAX_ECHO_FACTOR,
        why="each fresh item is emitted that many times, so a larger factor only repeats the "
        "same data; use echo_factor=2 to 16 (the papers' range) or echo_factor='auto'",
    ),
    "max_echo_factor": Real(
        1, MAX_ECHO_FACTOR, why="the most times one fresh item is emitted: past that, reuse "
        "only repeats the same data; use max_echo_factor=2 to 16 (the papers' range)",
    ),
}  # fmt: skip

# make_loader sets these loader fields from the workload's data, and the loader's echo_device (where
# where="device" echoes) from the run's training device; the others are run settings.
LOADER_FROM_DATA = ("transform", "batch_transform", "device_transform", "shuffle", "drop_last")
LOADER_FROM_RUN = ("echo_device",)
LOADER_FIELDS = {f.name: f for f in dataclasses.fields(LoaderOptions) if f.init}
LOADER_KEYS = tuple(
    name for name in LOADER_FIELDS if name not in LOADER_FROM_DATA + LOADER_FROM_RUN
)
LOADER_GROUPS = {"batch_size": "training", "read_ahead": "machine"}  # the rest: "echoing"


def run_loader(base: Any, flat: dict[str, Any], default_batch_size: int) -> LoaderOptions:
    """``base`` (a ``LoaderOptions`` or None: its defaults) with the flat settings applied.

    The run's limits hold for both; a batch size neither gives is ``default_batch_size``.
    """
    if base is not None and not isinstance(base, LoaderOptions):
        raise DataechoTypeError(
            f"loader must be a dataecho.loader.LoaderOptions or None, got {type(base).__name__}"
        )
    given = base.as_given() if base is not None else {}
    for name in (LOADER_FROM_DATA + LOADER_FROM_RUN) if given else ():
        if given[name] != LOADER_FIELDS[name].default:
            source = (
                "the run's device setting; pass device= (--device) instead"
                if name in LOADER_FROM_RUN
                else "the workload's data (make_loader); leave it at its default"
            )
            raise DataechoValueError(
                f"loader.{name}={given[name]!r}: a run's loader takes {name} from {source}"
            )
    changes = {name: given[name] for name in LOADER_KEYS if name in given}
    changes.update(flat)
    for name in (n for n in RUN_LOADER_CHECKS if n in changes):  # LoaderOptions: the rest
        changes[name] = checked(name, RUN_LOADER_CHECKS[name], changes[name])
    if changes.get("batch_size") is None:
        changes["batch_size"] = default_batch_size
    # An unknown where is left to LoaderOptions, which names the registered ones.
    point = POINTS.get(changes.get("where", LOADER_FIELDS["where"].default))
    if changes.get("shuffle_buffer") is None and point is not None and point.on_device:
        changes["shuffle_buffer"] = DEVICE_POOL_BATCHES * changes["batch_size"]
    return LoaderOptions(**changes)


def loader_check(name: str) -> Check:
    """The check of a loader setting in a run: the run's own, else ``LoaderOptions``'."""
    return RUN_LOADER_CHECKS.get(name) or LOADER_FIELDS[name].metadata["check"]
