"""Glue for training frameworks, one module each, each importing its framework only when used:

- :mod:`dataecho.frameworks.hf_trainer`: ``LoaderStateCallback``, which keeps an
  EchoingDataLoader's position in HF ``Trainer``'s checkpoints and resumes it exactly;
- :mod:`dataecho.frameworks.accelerate`: ``register_loader(accelerator, loader)``, which puts
  the loader's position into ``save_state`` / ``load_state``.

Importing them needs neither framework; using them needs the one they glue to.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dataecho.errors import DataechoError


class FrameworkMissingError(DataechoError, ModuleNotFoundError):
    """A framework module of dataecho was used without its framework installed: the message
    names the package to install."""


def require(module: str, glue: str) -> ModuleType:
    """Import ``module`` for the glue named ``glue``; ``FrameworkMissingError`` without it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name not in (None, module):  # the framework is there, one of its own is not
            raise
        raise FrameworkMissingError(
            f"{glue} needs {module}, which is not installed: pip install {module}",
            name=module,
        ) from error


__all__ = ["FrameworkMissingError", "require"]
