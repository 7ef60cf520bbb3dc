"""Argument checks shared by every public entry point.

Each error names the value seen, the valid range and the likely fix, as grain's options do.
"""

from __future__ import annotations

import math
import numbers


def echo_factor(value: object, *, name: str = "factor", auto_ok: bool = False) -> float:
    """Return ``value`` as a float echo factor in [1, inf), or raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        auto = ' or "auto" (echo only while fresh data is late)' if auto_ok else ""
        raise TypeError(
            f"{name} must be a real number >= 1 (e.g. 2 or 2.5){auto}, got {value!r} "
            f"of type {type(value).__name__}; pass a float such as {name}=2.0"
        )
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(
            f"{name} must be a finite number >= 1, got {value!r}; "
            f"use {name}=1 for no echoing or a finite factor such as 2"
        )
    if value < 1:
        raise ValueError(
            f"{name} must be >= 1 (1 = no echoing, 2 = every item twice), got {value!r}; "
            f"an echo stage cannot drop data, so use {name}=1 to turn echoing off"
        )
    return value


def non_negative_int(value: object, *, name: str, hint: str = "") -> int:
    """Return ``value`` as an int >= 0, or raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer >= 0, got {value!r} of type {type(value).__name__}"
            + (f"; {hint}" if hint else "")
        )
    if value < 0:
        raise ValueError(
            f"{name} must be >= 0, got {value!r}" + (f"; {hint}" if hint else "; use 0 to disable")
        )
    return int(value)


def positive_int(value: object, *, name: str, hint: str = "") -> int:
    """Return ``value`` as an int >= 1, or raise a clear error."""
    n = non_negative_int(value, name=name, hint=hint)
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}" + (f"; {hint}" if hint else ""))
    return n


def one_of(value: object, choices: tuple[str, ...], *, name: str) -> str:
    """Return ``value`` if it is one of ``choices``, or raise a clear error."""
    if value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return value  # type: ignore[return-value]


def seed(value: object) -> int | None:
    """Accept None or a non-negative integer seed."""
    if value is None:
        return None
    return non_negative_int(value, name="seed", hint="pass a non-negative int or None")
