"""Argument checks shared by every public entry point, the library's and the application's.

Each error names the value seen, the valid range and the likely fix, as grain's options do.
There are two forms of one set of rules:

- functions (``positive_int(value, name=...)``, ``echo_factor``, ``one_of``, ``seed``) for a
  plain argument of a library call;
- value kinds (:class:`Int`, :class:`Real`, :class:`Choice`, :class:`EchoFactor`, :class:`Bool`,
  :class:`Text`, :class:`PathValue`, :class:`OptionalCallable`) for a setting that may also come
  as text, from a command-line flag or a config file. ``check(name, value)`` returns the value
  normalised or raises; ``parse(text)`` reads the value from text; ``describe()`` gives the
  valid values for ``--help``; ``argparse_type(name)`` is the same check as an argparse
  ``type=``, so a flag, a TOML file and Python give the same message.
"""

from __future__ import annotations

import argparse
import inspect
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from dataecho.errors import DataechoTypeError, DataechoValueError

# Ceilings of counts. Past them a loader or a run would start that many processes or hold that
# many items, and grow its memory for minutes before failing (or hang), so each is refused up
# front with its reason. The machine fact behind two of them:
CPU_COUNT = os.cpu_count() or 1
# A worker is a process that reads, decodes and echoes on a core: past 8 per core they only add
# memory and start-up time (8, not 1, since a worker waiting on slow storage leaves its core to
# others); never below 32, so a setting that suits I/O-bound reading runs on a small machine.
MAX_WORKERS = max(32, 8 * CPU_COUNT)
WORKERS_WHY = (
    f"each worker is a process: at most 8 per CPU core and at least 32, and this machine has "
    f"{CPU_COUNT} CPU cores, os.cpu_count(); use about one worker per core, e.g. "
    f"num_workers={min(CPU_COUNT, 8)}"
)
# A buffer (shuffle, reuse, read-ahead) holds its items in memory: 2**24 is 13 times ImageNet's
# training set, more than any buffer that mixes or reuses data needs.
MAX_BUFFER = 2**24
BUFFER_WHY = "a buffer holds its items in memory; a few batches' worth, e.g. 10000, is plenty"
# A batch is collated in memory at once; the largest batches trained (LARS, LAMB) are 64k.
MAX_BATCH = 2**20
BATCH_WHY = "a batch is collated in memory at once; the largest batches trained are ~65536"


def echo_factor(value: object, *, name: str = "factor", auto_ok: bool = False) -> float:
    """Return ``value`` as a float echo factor in [1, inf), or raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        auto = ' or "auto" (echo only while fresh data is late)' if auto_ok else ""
        raise DataechoTypeError(
            f"{name} must be a real number >= 1 (e.g. 2 or 2.5){auto}, got {value!r} "
            f"of type {type(value).__name__}; pass a float such as {name}=2.0"
        )
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise DataechoValueError(
            f"{name} must be a finite number >= 1, got {value!r}; "
            f"use {name}=1 for no echoing or a finite factor such as 2"
        )
    if value < 1:
        raise DataechoValueError(
            f"{name} must be >= 1 (1 = no echoing, 2 = every item twice), got {value!r}; "
            f"an echo stage cannot drop data, so use {name}=1 to turn echoing off"
        )
    return value


def non_negative_int(
    value: object, *, name: str, hint: str = "", high: int | None = None, why: str = ""
) -> int:
    """Return ``value`` as an int >= 0 (and <= ``high``, ``why`` saying the reason), or raise
    a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        Int(0, high=high, hint=hint).check(name, value)  # raises the type error
    # An Int without ``none`` never returns None.
    return cast(int, Int(0, high=high, why=why, hint=hint or "use 0 to disable").check(name, value))


def buffer_size(value: object, *, low: int, hint: str, name: str = "buffer_size") -> int:
    """Return ``value`` as an item count of a stage's buffer: an int from ``low`` (0 or 1) to
    :data:`MAX_BUFFER`, or raise naming the range, the reason and ``hint``."""
    check = positive_int if low == 1 else non_negative_int
    return check(value, name=name, hint=hint, high=MAX_BUFFER, why=BUFFER_WHY)


def positive_int(
    value: object, *, name: str, hint: str = "", high: int | None = None, why: str = ""
) -> int:
    """Return ``value`` as an int >= 1 (and <= ``high``, ``why`` saying the reason), or raise
    a clear error."""
    return cast(int, Int(1, high=high, why=why, hint=hint).check(name, value))  # never None


def one_of(value: object, choices: tuple[str, ...], *, name: str) -> str:
    """Return ``value`` if it is one of ``choices``, or raise a clear error."""
    if value not in choices:
        raise DataechoValueError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return value


def seed(value: object) -> int | None:
    """Accept None or a non-negative integer seed."""
    if value is None:
        return None
    return non_negative_int(value, name="seed", hint="pass a non-negative int or None")


def timeout(value: object) -> float:
    """Accept a finite number of seconds >= 0 (0: wait for a worker's batch without limit)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataechoTypeError(
            f"timeout must be a number of seconds >= 0 (0: no limit), got {value!r} of type "
            f"{type(value).__name__}; pass e.g. timeout=0 or timeout=120"
        )
    if not math.isfinite(value) or value < 0:
        raise DataechoValueError(
            f"timeout must be a finite number of seconds >= 0 (0: no limit), got {value!r}; "
            "pass timeout=0 to wait without limit, or the seconds a worker may take per batch"
        )
    return float(value)


def saved_state(state: dict[str, Any], keys: tuple[str, ...], *, holds: str) -> None:
    """Refuse a state that lacks any of ``keys``: another stage's, or one saved by another
    version of dataecho, which would resume at the wrong place if read with defaults."""
    missing = [key for key in keys if key not in state]
    if missing:
        raise DataechoValueError(
            f"this state holds no {holds} of this dataecho (missing {', '.join(missing)}; "
            f"keys: {', '.join(sorted(state))}): it comes from another stage or another "
            "version of dataecho; resume it with the dataecho that wrote it, or start the run "
            "anew"
        )


class Check:
    """A kind of value: ``check(name, value)`` normalises or raises; ``parse`` reads text."""

    none = ""  # the word that stands for None ("off": nothing, "default": derived); "": no None
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

    def argparse_type(self, name: str) -> Callable[[str], Any]:
        """This check as an argparse ``type=``: text in, the checked value out."""

        def convert(text: str) -> Any:
            try:
                return self.check(name, self.parse(text))
            except (TypeError, ValueError) as err:
                raise argparse.ArgumentTypeError(str(err)) from None

        convert.__name__ = name
        return convert

    def _or_none(self) -> str:
        return f" or '{self.none}'" if self.none else ""


def checked(name: str, check: Check, value: Any) -> Any:
    """``check.check(name, value)``. An error it raises carries ``setting = name``, so that
    the edge a value came through (a flag, a TOML key) can say where it came from."""
    try:
        return check.check(name, value)
    except (TypeError, ValueError) as err:
        err.setting = name  # type: ignore[union-attr]  # read back by the edge (config_file)
        raise


def _fix(hint: str) -> str:
    return f"; {hint}" if hint else ""


@dataclass(frozen=True)
class Int(Check):
    """An integer >= ``low`` (and <= ``high`` when given). ``why``: the reason for ``high`` and
    the fix, said when a value is above it; ``hint``: the fix, said with every error."""

    low: int
    none: str = ""
    high: int | None = None
    why: str = ""
    hint: str = ""
    metavar = "N"

    def check(self, name: str, value: Any) -> int | None:
        if value is None and self.none:
            return None
        off, fix = self._or_none(), _fix(self.hint)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise DataechoTypeError(
                f"{name} must be {self.describe()}{off}, got {value!r} of type "
                f"{type(value).__name__}{fix}"
            )
        if value < self.low:
            raise DataechoValueError(f"{name} must be >= {self.low}{off}, got {value!r}{fix}")
        if self.high is not None and int(value) > self.high:  # numbers.Integral has no >
            why = f" ({self.why})" if self.why else ""
            raise DataechoValueError(
                f"{name} must be {self.describe()}{off}, got {value!r}{why}{fix}"
            )
        return int(value)

    def describe(self) -> str:
        if self.high is None:
            return f"an integer >= {self.low}"
        return f"an integer in {self.low}..{self.high}"

    def from_text(self, text: str) -> int:
        try:
            return int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise DataechoValueError(f"must be {self.describe()}, got {text!r}") from None


@dataclass(frozen=True)
class Real(Check):
    """A finite number in the range the bounds give (``why``: the reason for a finite ``high``
    and the fix, said when a value is above it; ``hint``: the fix, said with every error)."""

    low: float
    high: float = float("inf")
    low_open: bool = False
    high_open: bool = False
    none: str = ""
    why: str = ""
    hint: str = ""
    metavar = "X"

    def describe(self) -> str:
        if self.high == float("inf"):
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"a number in {left}{self.low:g}, {self.high:g}{right}"

    def check(self, name: str, value: Any) -> float | None:
        if value is None and self.none:
            return None
        off, fix = self._or_none(), _fix(self.hint)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise DataechoTypeError(
                f"{name} must be {self.describe()}{off}, got {value!r} of type "
                f"{type(value).__name__}{fix}"
            )
        v = float(value)
        inside = (v > self.low if self.low_open else v >= self.low) and (
            v < self.high if self.high_open else v <= self.high
        )
        if not inside or v == float("inf"):
            why = f" ({self.why})" if self.why and v > self.high else ""
            raise DataechoValueError(
                f"{name} must be {self.describe()}{off}, got {value!r}{why}{fix}"
            )
        return v

    def from_text(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise DataechoValueError(f"must be {self.describe()}, got {text!r}") from None


@dataclass(frozen=True)
class Choice(Check):
    """One of ``choices`` (or None, spelt ``none``, when that is non-empty)."""

    choices: tuple[str, ...]
    none: str = ""

    @property
    def metavar(self) -> str:  # type: ignore[override]  # read only, as Check's is in use
        return "{" + ",".join(self.choices) + "}"

    def check(self, name: str, value: Any) -> str | None:
        if value is None and self.none:
            return None
        return one_of(value, self.choices, name=name)


@dataclass(frozen=True)
class EchoFactor(Check):
    """An echo factor >= 1 (:func:`echo_factor`), or ``"auto"``; at most ``high``, where
    ``why`` says the reason and the fix."""

    high: float = float("inf")
    why: str = ""
    metavar = "E"

    def describe(self) -> str:
        if self.high == float("inf"):
            return "a number >= 1, or 'auto'"
        return f"a number in [1, {self.high:g}], or 'auto'"

    def check(self, name: str, value: Any) -> float | str:
        if value == "auto":
            return value
        factor = echo_factor(value, name=name, auto_ok=True)
        if factor > self.high:
            why = f": {self.why}" if self.why else ""
            raise DataechoValueError(f"{name} must be at most {self.high:g}, got {value!r}{why}")
        return factor

    def from_text(self, text: str) -> float | str:
        if text == "auto":
            return text
        try:
            return float(text)
        except ValueError:
            raise DataechoValueError(f"must be a number >= 1 or 'auto', got {text!r}") from None


class Bool(Check):
    """True or False (from text: true/false, yes/no, on/off, 1/0)."""

    _TEXT = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}  # fmt: skip

    def check(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise DataechoTypeError(f"{name} must be true or false, got {value!r}")
        return value

    def from_text(self, text: str) -> bool:
        if text.lower() not in self._TEXT:
            raise DataechoValueError(f"must be true or false, got {text!r}")
        return self._TEXT[text.lower()]

    def parse(self, text: str) -> bool:
        return self.from_text(text)


class PathValue(Check):
    """A folder path, or None."""

    none = "none"
    metavar = "DIR"

    def check(self, name: str, value: Any) -> Path | None:
        if value is None or isinstance(value, Path):
            return value
        if isinstance(value, str) and value:
            return Path(value)
        raise DataechoTypeError(f"{name} must be a folder path, got {value!r}")


class Text(Check):
    metavar = "TEXT"

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise DataechoTypeError(f"{name} must be a string, got {value!r}")
        return value


@dataclass(frozen=True)
class OptionalCallable(Check):
    """None, or a function of one ``what`` (an example, a batch) returning another."""

    what: str

    def check(self, name: str, value: Any) -> Any:
        if value is not None and not callable(value):
            raise DataechoTypeError(
                f"{name} must be a callable ({self.what} -> {self.what}) or None, got "
                f"{type(value).__name__}"
            )
        return value


def check_takes_generator(fn: Callable[..., Any]) -> None:
    """Refuse a ``device_transform`` that cannot be called as ``fn(batch, generator=g)``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    if any(p.name == "generator" and p.kind is not p.POSITIONAL_ONLY for p in params):
        return
    raise DataechoTypeError(
        f"device_transform={fn!r} takes no generator= argument: it is called as "
        "fn(batch, generator=g) so its random draws are seeded and resumed with the loader; "
        "add a generator=None parameter and draw from it (e.g. torch.rand(..., generator="
        "generator)), or use an op of dataecho.augment"
    )
