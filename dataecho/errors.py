"""The base of dataecho's own exceptions.

Each of them also derives from the built-in exception a caller would catch without knowing
dataecho (``ValueError`` for a bad value, ``OSError`` for a failed read, ...), so
``except DataechoError`` catches every error the project raises on purpose and the usual
``except ValueError`` keeps working. A plain built-in exception that reaches a caller is a bug.
"""


class DataechoError(Exception):
    """An error dataecho raises on purpose: its message names the value, the range and the fix."""


class DataechoValueError(DataechoError, ValueError):
    """A value dataecho cannot take (out of range, not one of the choices, inconsistent with
    another setting, data of the wrong shape or format)."""


class DataechoTypeError(DataechoError, TypeError):
    """A value of a type dataecho cannot take (a string where a number goes, a non-callable
    where a function goes)."""


class DataechoAttributeError(DataechoError, AttributeError):
    """A name that has no meaning on this object (an examples counter of a stage that counts
    whole batches): the message names the one to read instead."""


__all__ = ["DataechoAttributeError", "DataechoError", "DataechoTypeError", "DataechoValueError"]
