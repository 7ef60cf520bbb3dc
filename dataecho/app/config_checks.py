"""The application's own kinds of value: an upstream spec, the training device.

The checks themselves are the library's (:mod:`dataecho._validate`: ``check(name, value)``,
``parse(text)``, ``describe()``); import them from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dataecho._validate import Check
from dataecho.errors import DataechoTypeError, DataechoValueError
from dataecho.loader.options import DeviceName


class UpstreamSpec(Check):
    """None (in memory), ``http(s)://...``, ``emulated:/DIR?...`` or a local folder."""

    metavar = "SPEC"

    def check(self, name: str, value: Any) -> str | None:
        if value is None or value == "memory":
            return None
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise DataechoTypeError(f"{name} must be a URL or a folder path, got {value!r}")
        scheme = urlsplit(value).scheme if "://" in value or value.startswith("emulated:") else ""
        if scheme not in ("", "http", "https", "emulated") or (
            scheme.startswith("http") and not urlsplit(value).hostname
        ):
            raise DataechoValueError(
                f"{name} must be 'memory', http://HOST:PORT[/PATH], a folder, or "
                f"emulated:/DIR?bandwidth=B&latency=L, got {value!r}"
            )
        return value

    def parse(self, text: str) -> str | None:
        return None if text.lower() in ("memory", "none") else text


class TrainingDevice(DeviceName):
    """Where a run trains: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (a ``torch.device`` too), or
    None (CUDA where it is available, else the CPU). Whether this machine has it is checked
    when the run starts (:func:`dataecho.app.training.device.training_device`)."""

    def describe(self) -> str:
        return "'cpu', 'cuda' or 'cuda:N'"

    def check(self, name: str, value: Any) -> str | None:
        device = super().check(name, value)
        if device is not None and device.split(":")[0] not in ("cpu", "cuda"):
            raise DataechoValueError(
                f"{name} must be {self.describe()}, got {device!r}: a run trains on the CPU or "
                f"a CUDA GPU; pass e.g. {name}='cuda' or {name}='cpu'"
            )
        return device


__all__ = ["TrainingDevice", "UpstreamSpec"]
