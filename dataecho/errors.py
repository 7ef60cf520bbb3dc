"""The base of dataecho's own exceptions.

Each of them also derives from the built-in exception a caller would catch without knowing
dataecho (``ValueError`` for a bad value, ``OSError`` for a failed read, ...), so
``except DataechoError`` catches every error the project raises on purpose and the usual
``except ValueError`` keeps working.
"""


class DataechoError(Exception):
    """An error dataecho raises on purpose: its message names the value, the range and the fix."""


__all__ = ["DataechoError"]
