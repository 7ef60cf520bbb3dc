"""The checks behind :class:`~dataecho.app.config.TrainConfig`'s fields: one per kind of value.

Each ``check(name, value)`` returns the value normalised or raises an error that names the key,
the value seen and the valid range; ``parse(text)`` reads the same value from a flag or a TOML
string, and ``describe()`` gives the valid values for ``--help``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dataecho import _validate

# The largest echo factor a run takes (fixed, or the most copies with "auto"). Each fresh item
# is emitted that many times and the loader keeps about 2 x e emitted batches queued per
# worker, so a factor past this only repeats the same data and fills memory with copies: the
# papers' useful factors are 2 to 16.
MAX_ECHO_FACTOR = 1024.0


class Check:
    """``check(name, value)`` returns the value normalised or raises; ``parse`` reads text."""

    none = ""  # the word that stands for None: "off" (nothing) or "default" (the workload's)
    metavar = "VALUE"

    def describe(self) -> str:
        """The valid values, for ``--help``."""
        return ""

    def check(self, name: str, value: Any) -> Any:
        return value

    def parse(self, text: str) -> Any:
        if self.none and text.lower() in (self.none, "none"):
            return None
        return self.from_text(text)

    def from_text(self, text: str) -> Any:
        return text


@dataclass(frozen=True)
class Int(Check):
    """An integer >= ``low`` (and <= ``high`` when given; ``why``: the reason for that limit and
    the fix, said when a value is above it)."""

    low: int
    none: str = ""
    high: int | None = None
    why: str = ""
    metavar = "N"

    def check(self, name: str, value: Any) -> int | None:
        if value is None and self.none:
            return None
        off = f" or '{self.none}'" if self.none else ""
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be {self.describe()}{off}, got {value!r}")
        if value < self.low:
            raise ValueError(f"{name} must be >= {self.low}{off}, got {value!r}")
        if self.high is not None and value > self.high:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"{name} must be {self.describe()}{off}, got {value!r}{why}")
        return int(value)

    def describe(self) -> str:
        if self.high is None:
            return f"an integer >= {self.low}"
        return f"an integer in {self.low}..{self.high}"

    def from_text(self, text: str) -> int:
        try:
            return int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise ValueError(f"must be {self.describe()}, got {text!r}") from None


@dataclass(frozen=True)
class Real(Check):
    """A finite number in the range the bounds give (``why``: the reason for a finite ``high``
    and the fix, said when a value is above it)."""

    low: float
    high: float = float("inf")
    low_open: bool = False
    high_open: bool = False
    none: str = ""
    why: str = ""
    metavar = "X"

    def describe(self) -> str:
        return self.range()

    def range(self) -> str:
        if self.high == float("inf"):
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"a number in {left}{self.low:g}, {self.high:g}{right}"

    def check(self, name: str, value: Any) -> float | None:
        if value is None and self.none:
            return None
        off = f" or '{self.none}'" if self.none else ""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be {self.range()}{off}, got {value!r}")
        v = float(value)
        inside = (v > self.low if self.low_open else v >= self.low) and (
            v < self.high if self.high_open else v <= self.high
        )
        if not inside or v == float("inf"):
            above = self.why and v > self.high
            why = f" ({self.why})" if above else ""
            raise ValueError(f"{name} must be {self.range()}{off}, got {value!r}{why}")
        return v

    def from_text(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"must be {self.range()}, got {text!r}") from None


@dataclass(frozen=True)
class Choice(Check):
    choices: tuple[str, ...]
    none: str = ""  # non-empty: None is allowed too (the default picks)

    @property
    def metavar(self) -> str:
        return "{" + ",".join(self.choices) + "}"

    def check(self, name: str, value: Any) -> str | None:
        if value is None and self.none:
            return None
        return _validate.one_of(value, self.choices, name=name)


class EchoFactor(Check):
    metavar = "E"

    def describe(self) -> str:
        return f"a number in [1, {MAX_ECHO_FACTOR:g}], or 'auto'"

    def check(self, name: str, value: Any) -> float | str:
        if value == "auto":
            return value
        factor = _validate.echo_factor(value, name=name, auto_ok=True)
        if factor > MAX_ECHO_FACTOR:
            raise ValueError(
                f"{name} must be at most {MAX_ECHO_FACTOR:g}, got {value!r}: each fresh item is "
                "emitted that many times, and the loader queues about twice that many batches "
                "per worker, so a larger factor only repeats the same data; use "
                f"{name}=2 to 16 (the papers' range) or {name}='auto'"
            )
        return factor

    def from_text(self, text: str) -> float | str:
        if text == "auto":
            return text
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"must be a number >= 1 or 'auto', got {text!r}") from None


class Bool(Check):
    _TEXT = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}  # fmt: skip

    def check(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be true or false, got {value!r}")
        return value

    def from_text(self, text: str) -> bool:
        if text.lower() not in self._TEXT:
            raise ValueError(f"must be true or false, got {text!r}")
        return self._TEXT[text.lower()]

    def parse(self, text: str) -> bool:
        return self.from_text(text)


class PathValue(Check):
    none = "none"
    metavar = "DIR"

    def check(self, name: str, value: Any) -> Path | None:
        if value is None or isinstance(value, Path):
            return value
        if isinstance(value, str) and value:
            return Path(value)
        raise TypeError(f"{name} must be a folder path, got {value!r}")


class Text(Check):
    metavar = "TEXT"

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {value!r}")
        return value


class UpstreamSpec(Check):
    """None (in memory), ``http(s)://...``, ``emulated:/DIR?...`` or a local folder."""

    metavar = "SPEC"

    def check(self, name: str, value: Any) -> str | None:
        if value is None or value == "memory":
            return None
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise TypeError(f"{name} must be a URL or a folder path, got {value!r}")
        scheme = urlsplit(value).scheme if "://" in value or value.startswith("emulated:") else ""
        if scheme not in ("", "http", "https", "emulated") or (
            scheme.startswith("http") and not urlsplit(value).hostname
        ):
            raise ValueError(
                f"{name} must be 'memory', http://HOST:PORT[/PATH], a folder, or "
                f"emulated:/DIR?bandwidth=B&latency=L, got {value!r}"
            )
        return value

    def parse(self, text: str) -> str | None:
        return None if text.lower() in ("memory", "none") else text
