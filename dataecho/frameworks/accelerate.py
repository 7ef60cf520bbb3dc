"""``accelerate`` over an EchoingDataLoader: one call puts the loader into the checkpoints.

    from dataecho.frameworks.accelerate import register_loader

    model, optimizer = accelerator.prepare(model, optimizer)
    loader = register_loader(accelerator, EchoingDataLoader(dataset, ...))
    ...
    accelerator.save_state(folder)   # holds the loader's position
    accelerator.load_state(folder)   # in the resumed script, after the same calls

``Accelerator.prepare`` hands an EchoingDataLoader back as it is (it is no torch DataLoader), so
its position reaches ``save_state`` / ``load_state`` only through
``register_for_checkpointing``; without it a resume starts the epoch over and nothing says so.
The saving script and the resumed one must both call this, once per loader.
"""

from __future__ import annotations

from typing import Any

from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.frameworks import require
from dataecho.loader import EchoingDataLoader

GLUE = "dataecho.frameworks.accelerate.register_loader"


def register_loader(accelerator: Any, loader: EchoingDataLoader) -> EchoingDataLoader:
    """Register ``loader`` with ``accelerator`` for ``save_state`` / ``load_state`` and return
    it, as ``accelerator.prepare`` would (which hands it back unchanged). Call it once per
    loader, in the saving script and in the resumed one, so both register the same objects.

    Raises ``DataechoTypeError`` for an ``accelerator`` that is no ``accelerate.Accelerator``
    or a ``loader`` that is no EchoingDataLoader (a torch DataLoader goes through
    ``accelerator.prepare``), and ``DataechoValueError`` for a loader registered already.
    """
    accelerate = require("accelerate", GLUE)
    if not isinstance(accelerator, accelerate.Accelerator):
        swapped = isinstance(accelerator, EchoingDataLoader)
        raise DataechoTypeError(
            f"{GLUE}(accelerator, loader) takes an accelerate.Accelerator first, got "
            f"{type(accelerator).__name__}"
            + ("; the arguments are swapped" if swapped else "; pass the one you train with")
        )
    if not isinstance(loader, EchoingDataLoader):
        raise DataechoTypeError(
            f"{GLUE} registers an EchoingDataLoader, got {type(loader).__name__}: a torch "
            "DataLoader goes through accelerator.prepare(loader) instead (with "
            "DataLoaderConfiguration(use_stateful_dataloader=True) to resume it)"
        )
    if any(obj is loader for obj in accelerator._custom_objects):
        raise DataechoValueError(
            f"{GLUE}: this loader is registered with this Accelerator already; a second "
            "registration saves it twice, and load_state in a script that registers it once "
            "then fails: call it once per loader (and drop any register_for_checkpointing of it)"
        )
    accelerator.register_for_checkpointing(loader)
    return loader


__all__ = ["register_loader"]
